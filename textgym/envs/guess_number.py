r"""`textgym/GuessNumber-v0`: find a hidden number from higher/lower feedback, in few guesses.

A game whose feedback must be used over several turns: each wrong guess is answered with
"too low" or "too high" and the range still open, and only a policy that narrows the range
(bisection: guess its middle) finds the number within the guess limit. Seven guesses suffice
for 1 to 100 exactly when every guess halves what is left (2**7 = 128 >= 100); a random guess
finds it about 7% of the time.
"""

from __future__ import annotations

import math
import re
from typing import Any, SupportsFloat

import numpy as np

from textgym.envs.base import LazyTasks, TextEnv
from textgym.envs.spaces import ChatMessages
from textgym.types import Message, Task
from textgym.verifiers.answer_text import normalize_unicode, unwrap
from textgym.verifiers.extraction import boxed_spans

MAX_GUESSES = 7
"""The default guess limit: bisection needs 7 for 1 to 100 (2**7 = 128 >= 100)."""
STREAM_LENGTH = 2**62
"""`len()` of the train split: an unbounded stream of hidden numbers, task *i* seeded by *i*."""

_GUESS_TAG_RE = re.compile(r"<guess>(.*?)</guess>", re.DOTALL)
_INT_RE = re.compile(r"[+-]?[0-9]{1,9}")


def parse_number_guess(action: str) -> int | None:
    r"""The guess in a reply: the integer in its last `\boxed{n}` (or `<guess>n</guess>`).

    Else the reply itself when it is one integer. Returns None for anything else, and when
    the reply offers more than one distinct guess (`\boxed{25} or \boxed{26}`: one guess
    per turn). At most 9 digits are read, so a 100,000-digit reply costs nothing to parse.
    The reply is read after `normalize_unicode` (`\boxed{−5}` is -5, `\boxed{٤٢}` 42), and the
    box's typesetting is dropped (`\boxed{\text{42}}` is 42: `answer_text.unwrap`).

    Examples:
        >>> parse_number_guess(r"The middle is \boxed{50}."), parse_number_guess(" 37 ")
        (50, 37)
        >>> parse_number_guess(r"\boxed{25} or \boxed{26}") is None
        True
        >>> parse_number_guess("25 or 26") is None, parse_number_guess(r"\boxed{2.5}") is None
        (True, True)
        >>> parse_number_guess(r"\boxed{\text{42}}"), parse_number_guess(r"\boxed{\mathbf{42}}")
        (42, 42)
    """
    action = normalize_unicode(action)
    found = [unwrap(b) for b, _, _ in boxed_spans(action)] + _GUESS_TAG_RE.findall(action)
    offered = {g.strip() for g in found if g.strip()}
    if len(offered) > 1:
        return None
    text = offered.pop() if offered else action.strip().rstrip(".!")
    return int(text) if _INT_RE.fullmatch(text) else None


class _Secrets(LazyTasks):
    """Task *i*: a hidden number, drawn from `(seed, i)` (train) or `low + i` (test: each once)."""

    def __init__(self, split: str, low: int, high: int, seed: int, prompt: str, oracle_prefix: int = 0):
        self.split, self.low, self.high, self.seed, self.prompt = split, low, high, seed, prompt
        self.oracle_prefix = oracle_prefix

    def __len__(self) -> int:
        return STREAM_LENGTH if self.split == "train" else self.high - self.low + 1

    def task(self, index: int) -> Task:
        if self.split == "train":
            secret = int(np.random.default_rng([self.seed, index]).integers(self.low, self.high + 1))
        else:
            secret = self.low + index
        metadata = {}
        if self.oracle_prefix:
            depth = int(np.random.default_rng([self.seed, index, 1]).integers(0, self.oracle_prefix + 1))
            metadata["oracle_prefix"] = depth
        task_id = f"guess/{self.split}/{index}"
        return Task(task_id=task_id, prompt=self.prompt, answer=str(secret), metadata=metadata)


class GuessNumberEnv(TextEnv):
    r"""Guess the number: a hidden whole number in `[low, high]`, higher/lower feedback each turn.

    ## Description
    The policy is told the range and the guess limit; after each wrong guess the env says
    whether the number is higher or lower and which range is still open (the interval
    narrowed by every guess so far), so the next guess is a function of the last message.
    Bisection (guess the middle of the open range) always wins within `ceil(log2(high - low
    + 2))` guesses; 7 for the default 1 to 100.

    ## Action Space
    `UnicodeText`: the reply; the guess is the integer in its last `\boxed{n}` (or
    `<guess>n</guess>`, or a reply that is just the integer). Anything else is an invalid
    action: it costs a guess, is answered with how to reply, and is counted in
    `info["invalid_action"]`.

    ## Observation Space
    `ChatMessages`: the rules after `reset` (with `oracle_prefix`, followed by the played
    guesses as assistant messages and their feedback); after each wrong guess one user
    message ("50 is too high. The number is from 1 to 49. 6 guesses left.").

    ## Rewards
    `correct`: 1.0 on the step that names the number, else 0.0; accuracy reads it.
    `progress` (weight `progress_weight`, default 0: logged only): potential-based shaping
    (Ng, Harada & Russell 1999, "Policy invariance under reward transformations", Theorem 1)
    with the potential Φ = −log2(numbers still open) / log2(numbers in the range), paid as
    Φ(after) − Φ(before) on each step: the bits of the range a guess removes, as a share of
    the bits to find. With γ = 1 the terms telescope, so an episode's progress is Φ(end) −
    Φ(start) ∈ [0, 1], 1 exactly when the open range is down to the number; an invalid or
    out-of-range guess earns 0, and no sequence of guesses earns more than finding the
    number does. Being potential-based, it leaves the optimal policy unchanged while giving a
    failed game credit for how far it narrowed the range.

    ## Episode End
    Terminates when the number is found; truncates when `max_guesses` guesses (default 7)
    are spent without it. `textgym/GuessNumber-v0` also registers gymnasium's `TimeLimit`
    at 7 steps; for another limit pass both, `gym.make(id, max_guesses=5,
    max_episode_steps=5)`.

    ## Arguments
    - `low`, `high`: the range (inclusive; default 1 and 100).
    - `max_guesses`: the guess limit (default 7), counted down in every feedback message.
    - `progress_weight`: the weight of the `progress` term in the reward (default 0).
    - `oracle_prefix`: restarts from the expert's states (default 0: every game starts at the
      rules). Task *i* draws a depth *d* uniformly from 0 to `oracle_prefix` (from `(seed, i)`)
      and its episode opens after *d* of the oracle's bisection guesses, already played: the
      observation after `reset` is the rules, then each played guess as an assistant message
      and its feedback as a user message, and the guess count starts at *d*. The prefix stops
      one guess short of the number (and of the guess limit), so the policy always has a guess
      to make. Its guesses earn nothing: the policy is scored on its own turns only. This is
      the restart distribution of learning from a demonstration's states (Kakade & Langford
      2002, "Approximately optimal approximate RL", sec. 4; Salimans & Chen 2018, "Learning
      Montezuma's Revenge from a single demonstration"): deep states of the bisection tree,
      which a game from the start reaches rarely, are each met by whole GRPO groups. For
      training only; evaluate on games from the start.
    - `invalid_action_reward` (`TextEnv`'s): the reward of an unreadable or unusable reply
      (default 0; e.g. -0.1 makes a wasted guess cost more than a wrong one).
    - `split`: "train" (an unbounded stream, task *i*'s number drawn from `(seed, i)`) or
      "test" (every number of the range once, in order, so that a greedy policy's accuracy
      on the test split is its exact success rate over a uniform hidden number).
    - `seed`: the train stream's generator seed.

    ## Version History
    - v0: initial version.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/GuessNumber-v0", split="test")
        >>> obs, info = env.reset(options={"task_index": 36})   # the hidden number is 37
        >>> obs, reward, terminated, truncated, info = env.step(r"\boxed{50}")
        >>> print(obs[0]["content"])
        50 is too high. The number is from 1 to 49. 6 guesses left.
        >>> env.unwrapped.oracle_action(obs)
        '\\boxed{25}'
        >>> env.step(r"\boxed{37}")[1:3]
        (1.0, True)
    """

    def __init__(
        self,
        *,
        low: int = 1,
        high: int = 100,
        max_guesses: int = MAX_GUESSES,
        progress_weight: float = 0.0,
        oracle_prefix: int = 0,
        split: str = "train",
        seed: int = 0,
        **kwargs: Any,
    ):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if any(isinstance(v, bool) or not isinstance(v, int) for v in (low, high)):
            raise ValueError(f"low and high must be ints, got {low!r} and {high!r}")
        if high <= low:
            raise ValueError(f"high must be greater than low, got low={low}, high={high}")
        if isinstance(max_guesses, bool) or not isinstance(max_guesses, int) or max_guesses < 1:
            raise ValueError(f"max_guesses must be a positive int, got {max_guesses!r}")
        if not math.isfinite(progress_weight) or progress_weight < 0:
            raise ValueError(f"progress_weight must be a finite number >= 0, got {progress_weight!r}")
        if isinstance(oracle_prefix, bool) or not isinstance(oracle_prefix, int) or oracle_prefix < 0:
            raise ValueError(f"oracle_prefix must be an int >= 0, got {oracle_prefix!r}")
        self.low, self.high, self.max_guesses = low, high, max_guesses
        self.progress_weight = float(progress_weight)
        rules = (
            f"I picked a whole number from {low} to {high}. Find it in at most {max_guesses} "
            "guesses. After each wrong guess I say if it is higher or lower. Reply with your guess "
            "as \\boxed{n}."
        )
        super().__init__(_Secrets(split, low, high, seed, rules, oracle_prefix), **kwargs)
        if oracle_prefix:
            # the opening observation holds the prefix's guesses as assistant turns
            self.observation_space = ChatMessages(roles=("system", "user", "assistant"))
        self.lo, self.hi = low, high
        self.guesses = 0

    def initial_messages(self, task: Task) -> list[Message]:
        """The rules (the range, the guess limit, the reply format), then any oracle prefix."""
        self.lo, self.hi, self.guesses = self.low, self.high, 0
        messages: list[Message] = [{"role": "user", "content": task.prompt}]
        secret = int(task.answer)
        for _ in range(int(task.metadata.get("oracle_prefix", 0))):
            guess = (self.lo + self.hi) // 2
            if guess == secret or self.guesses + 1 >= self.max_guesses:
                break
            feedback, *_ = self.respond(f"\\boxed{{{guess}}}")
            messages += [{"role": "assistant", "content": f"\\boxed{{{guess}}}"}, *feedback]
        return messages

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Compare the guess with the hidden number; narrow the open range; end on the number."""
        assert self.task is not None
        secret = int(self.task.answer)
        guess = parse_number_guess(action)
        self.guesses += 1
        if guess is None:
            return self._say("I could not read a guess: reply with \\boxed{n}, one whole number.", None, True)
        before = self._potential()
        if guess == secret:
            self.lo = self.hi = secret
            progress = self._potential() - before
            reward = 1.0 + self.progress_weight * progress
            info = {"reward/correct": 1.0, "reward/progress": progress, "guess": guess}
            return [], reward, True, {**info, "guesses": self.guesses}
        if guess < secret:
            self.lo = max(self.lo, guess + 1)
            side = "too low"
        else:
            self.hi = min(self.hi, guess - 1)
            side = "too high"
        text = f"{guess} is {side}. The number is from {self.lo} to {self.hi}."
        return self._say(text, guess, False, self._potential() - before)

    def _potential(self) -> float:
        """Φ = −log2(numbers still open) / log2(numbers in the range): −1 at the start, 0 when one is left."""
        return -math.log2(self.hi - self.lo + 1) / math.log2(self.high - self.low + 1)

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """An unusable reply (empty, not text, too long) costs a guess and says why."""
        self.guesses += 1
        return self._say(f"Invalid reply ({reason}); reply with \\boxed{{n}}.", None, True)

    def _say(
        self, text: str, guess: int | None, invalid: bool, progress: float = 0.0
    ) -> tuple[list[Message], float, bool, dict[str, Any]]:
        left = self.max_guesses - self.guesses
        if left > 0:
            text += f" {left} guess{'' if left == 1 else 'es'} left."
        info: dict[str, Any] = {
            "reward/correct": 0.0,
            "reward/progress": progress,
            "guess": guess,
            "guesses": self.guesses,
        }
        if invalid:
            info["invalid_action"] = True
        reward = self.progress_weight * progress + (self.invalid_action_reward if invalid else 0.0)
        return [{"role": "user", "content": text}], reward, False, info

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """`TextEnv.step`, truncated once `max_guesses` guesses are spent without the number."""
        obs, reward, terminated, truncated, info = super().step(action)
        spent = not terminated and self.guesses >= self.max_guesses
        return obs, reward, terminated, truncated or spent, info

    def oracle_action(self, messages: list[Message]) -> str:
        """Bisection: the middle of the range still open (the expert never reads the number)."""
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        return f"\\boxed{{{(self.lo + self.hi) // 2}}}"

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random number of the range (what `textgym eval --agent random` plays)."""
        return f"\\boxed{{{int(rng.integers(self.low, self.high + 1))}}}"
