"""Base classes of textgym environments: task selection, action checks, rubric scoring.

A `TextEnv` owns a sequence of `Task`s. `reset(options={"task_index": i})` poses task
*i*; without it the task index is drawn from `self.np_random`, so the same seed gives
the same task. Actions are text; observations are lists of chat messages.
`SingleTurnEnv` scores the one action with a `Rubric` and terminates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, SupportsFloat, overload

import gymnasium as gym

from textgym.envs.spaces import ChatMessages, UnicodeText
from textgym.types import Message, Task
from textgym.verifiers.base import Rubric, RubricTerm
from textgym.verifiers.format import FormatVerifier
from textgym.verifiers.math import HedgeVerifier, MathVerifier

DEFAULT_MAX_ACTION_CHARS = 100_000
"""Actions longer than this many characters are scored `invalid_action_reward` without verification."""


class LazyTasks(Sequence[Task]):
    """A task set built on demand: subclasses give `__len__` and `task(index)`, this class the indexing.

    `tasks[i]` accepts negative indices (from the end) and slices (a list); an index outside
    `[-len, len)` raises `IndexError`. Used by the envs whose tasks are seeds or a generator's
    items (reasoning-gym, TextWorld, TextArena, OpenEnv).
    """

    def __len__(self) -> int:
        raise NotImplementedError

    def task(self, index: int) -> Task:
        """Task `index`, with `0 <= index < len(self)` already checked."""
        raise NotImplementedError

    @overload
    def __getitem__(self, index: int) -> Task: ...
    @overload
    def __getitem__(self, index: slice) -> list[Task]: ...
    def __getitem__(self, index: int | slice) -> Task | list[Task]:
        """Task `index` (negative indices count from the end; a slice gives a list).

        Raises:
            IndexError: outside `[-len(self), len(self))`.
        """
        n = len(self)
        if isinstance(index, slice):
            return [self.task(i) for i in range(*index.indices(n))]
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError(f"task index {index} out of range [0, {n})")
        return self.task(index)


class TextEnv(gym.Env[list[Message], str]):
    """A Gymnasium environment whose actions are text and whose observations are chat messages.

    Subclasses implement `initial_messages(task)` and `respond(action)`; the base class
    selects tasks, checks actions and keeps the transcript for `render()`.

    Args:
        tasks: the task set; `len(env.unwrapped.tasks)` is the task count.
        system_prompt: prepended as a `system` message to the first observation when set.
        max_action_chars: longer actions are rejected with `invalid_action_reward` (characters).
        invalid_action_reward: reward for an action that is not a usable string.
        render_mode: None or "ansi" (`render()` returns the transcript as text).
    """

    metadata: dict[str, Any] = {"render_modes": ["ansi"], "render_fps": 1}  # noqa: RUF012 (gymnasium API)
    accuracy_term: str = "correct"
    """The reward term that defines accuracy: an episode is correct when `reward/<accuracy_term>`,
    summed over its turns, reaches 1. Shown by `textgym env check` and in eval reports."""

    def __init__(
        self,
        tasks: Sequence[Task],
        *,
        system_prompt: str | None = None,
        max_action_chars: int = DEFAULT_MAX_ACTION_CHARS,
        invalid_action_reward: float = 0.0,
        render_mode: str | None = None,
    ):
        if render_mode is not None and render_mode not in self.metadata["render_modes"]:
            raise ValueError(
                f"render_mode must be one of {self.metadata['render_modes']}, got {render_mode!r}"
            )
        if max_action_chars <= 0:
            raise ValueError(f"max_action_chars must be positive, got {max_action_chars}")
        self.tasks = tasks
        self.system_prompt = system_prompt
        self.max_action_chars = int(max_action_chars)
        self.invalid_action_reward = float(invalid_action_reward)
        self.render_mode = render_mode
        self.observation_space = ChatMessages()
        self.action_space = UnicodeText()
        self.task: Task | None = None
        self.task_index: int | None = None
        self._transcript: list[Message] = []
        self._done = False

    # -- hooks -------------------------------------------------------------------------
    def initial_messages(self, task: Task) -> list[Message]:
        """Return the messages that pose `task` (without the system prompt)."""
        raise NotImplementedError

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """React to a valid action: return (observation, reward, terminated, info)."""
        raise NotImplementedError

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """React to an unusable action (wrong type, empty, too long). Single-turn default: end, score 0."""
        return [], self.invalid_action_reward, True, {"error": reason}

    # -- gymnasium API -----------------------------------------------------------------
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode on task `options["task_index"]`, or a task drawn from `np_random`.

        Raises:
            ValueError: if `task_index` is not an int in `[0, len(tasks))`, or `options` has unknown keys.
        """
        super().reset(seed=seed)
        options = dict(options or {})
        unknown = set(options) - {"task_index"}
        if unknown:
            raise ValueError(f"unknown reset option(s) {sorted(unknown)}; supported: ['task_index']")
        n = len(self.tasks)
        if "task_index" in options:
            index = options["task_index"]
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < n:
                raise ValueError(f"task_index must be an int in [0, {n}), got {index!r}")
        else:
            index = int(self.np_random.integers(n))
        self.task_index = index
        self.task = self.tasks[index]
        obs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        obs += self.initial_messages(self.task)
        self._transcript = [dict(m) for m in obs]
        self._done = False
        return obs, self._base_info()

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Apply the agent's text. Unusable actions are scored, never raised on.

        Raises:
            RuntimeError: if called before `reset()` or after the episode ended.
        """
        if self.task is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode has ended; call reset() to start a new one")
        reason = self._check_action(action)
        if reason is None:
            self._transcript.append({"role": "assistant", "content": action})
            obs, reward, terminated, extra = self.respond(action)
        else:
            self._transcript.append({"role": "assistant", "content": repr(action)[:200]})
            obs, reward, terminated, extra = self.invalid_action(reason)
        self._transcript += [dict(m) for m in obs]
        self._done = terminated
        info = self._base_info()
        info.update(extra)
        if reason is not None:  # counted per episode by `rollout` (`Trajectory.counts`)
            info["invalid_action"] = True
        return obs, float(reward), terminated, False, info

    def render(self) -> str | None:  # type: ignore[override]
        """Return the transcript as text when `render_mode == "ansi"`."""
        if self.render_mode != "ansi":
            return None
        return "\n".join(f"[{m['role']}] {m['content']}" for m in self._transcript)

    # -- scripted experts --------------------------------------------------------------
    def oracle_action(self, messages: list[Message]) -> str:
        """What a scripted expert that reads the hidden solution replies next.

        Default: the task's gold `solution`, else its gold answer in `\\boxed{}`. Multi-turn
        envs override it. Used by `textgym eval --agent oracle` and the tests.

        Raises:
            RuntimeError: before `reset()`.
        """
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        return self.task.solution or f"The final answer is \\boxed{{{self.task.answer}}}."

    # -- helpers -----------------------------------------------------------------------
    def _check_action(self, action: Any) -> str | None:
        if not isinstance(action, str):
            return f"action must be a str, got {type(action).__name__}"
        if not action.strip():
            return "empty action"
        if len(action) > self.max_action_chars:
            return f"action too long: {len(action)} chars > max_action_chars={self.max_action_chars}"
        return None

    def _base_info(self) -> dict[str, Any]:
        assert self.task is not None
        return {"task_id": self.task.task_id, "task_index": self.task_index, "answer": self.task.answer}


class SingleTurnEnv(TextEnv):
    r"""One question, one answer: the action is scored by a `Rubric` and the episode terminates.

    `info` after `step` holds every rubric term as `"reward/<name>"` and the terms'
    details under `"details"`; an unusable action scores `invalid_action_reward` with
    every term 0.0 and the reason in `info["error"]`.

    `instruction` follows the task's prompt in the user message. With `prefill=True` (for an
    env that defines `answer_stems(task)`), `reset` announces the task's answer stem as
    `info["reply_prefix"]` and the rollout prefills each reply with it (see `reset`).

    Examples:
        A new single-turn env is a list of tasks and a rubric:

        >>> from textgym.envs import SingleTurnEnv
        >>> from textgym.types import Task
        >>> from textgym.verifiers import Rubric, RubricTerm, Score
        >>> def exact(completion, task):
        ...     return Score(float(completion.strip() == task.answer))
        >>> tasks = [Task(task_id="reverse/0", prompt="Reverse 'abc'.", answer="cba")]
        >>> rubric = Rubric([RubricTerm("correct", exact)])
        >>> env = SingleTurnEnv(tasks, rubric, instruction="Reply with the word only.")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> obs
        [{'role': 'user', 'content': "Reverse 'abc'. Reply with the word only."}]
        >>> obs, reward, terminated, truncated, info = env.step("cba")
        >>> reward, terminated, info["reward/correct"]
        (1.0, True, 1.0)
    """

    def __init__(
        self,
        tasks: Sequence[Task],
        rubric: Rubric,
        *,
        instruction: str = "",
        prefill: bool = False,
        **kwargs: Any,
    ):
        super().__init__(tasks, **kwargs)
        self.rubric = rubric
        self.instruction = instruction
        self.prefill = bool(prefill)
        if self.prefill and not callable(getattr(self, "answer_stems", None)):
            name = type(self).__name__
            raise ValueError(f"prefill=True needs an env with answer_stems(task); {name} has none")

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Start an episode (`TextEnv.reset`); with `prefill`, `info["reply_prefix"]` is the task's stem.

        The stem is `answer_stems(task)[0]` (Arithmetic: `85+63 = `). An LLM rollout starts the
        reply with it, as context the policy does not own, and steps the env with the whole
        reply (stem and continuation); an agent that ignores it writes a whole reply itself.
        The answer format is then given, not learned: what a run gains on such an env is the
        answers themselves (the format-controlled baseline's `env stem` variant, as a task).

        Raises:
            ValueError: as `TextEnv.reset`.
        """
        obs, info = super().reset(seed=seed, options=options)
        if self.prefill:
            assert self.task is not None
            stems = list(self.answer_stems(self.task))  # type: ignore[attr-defined]
            if stems:
                info["reply_prefix"] = str(stems[0])
        return obs, info

    def initial_messages(self, task: Task) -> list[Message]:
        """One user message: the task's prompt followed by the env's instruction."""
        content = f"{task.prompt} {self.instruction}" if self.instruction else task.prompt
        return [{"role": "user", "content": content}]

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the action with the rubric and end the episode."""
        assert self.task is not None
        score = self.rubric(action, self.task)
        info: dict[str, Any] = {k: v for k, v in score.details.items() if k.startswith("reward/")}
        info["details"] = {k: v for k, v in score.details.items() if not k.startswith("reward/")}
        errors = [d["error"] for d in info["details"].values() if isinstance(d, dict) and "error" in d]
        if errors:
            info["error"] = "; ".join(errors)
        return [], score.reward, True, info

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score 0 on every term and end the episode, saying why."""
        obs, reward, terminated, info = super().invalid_action(reason)
        info.update({f"reward/{t.name}": 0.0 for t in self.rubric.terms})
        return obs, reward, terminated, info


def math_rubric(correct_weight: float = 1.0, format_weight: float = 0.0, timeout_s: float = 10.0) -> Rubric:
    """Rubric of math envs: `correct`, `format` and `hedge`.

    `correct` is the answer rule then math-verify equivalence, `format` whether an answer
    marker is present, and `hedge` whether the answer was refused for offering several
    candidates.

    With the default `format_weight=0.0` the format term is a logged metric only; `hedge` is
    always logged only (weight 0).
    """
    return Rubric(
        [
            RubricTerm("correct", MathVerifier(timeout_s=timeout_s), correct_weight),
            RubricTerm("format", FormatVerifier(), format_weight),
            RubricTerm("hedge", HedgeVerifier(), 0.0),
        ]
    )
