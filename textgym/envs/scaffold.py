"""`textgym env new NAME`: write a working environment project to start from.

`write_env_project(name, out, multi_turn=False)` writes three files into `out`:

- `NAME.py`: the environment (tasks with a `train` / `test` split, a verifier in a rubric or a
  multi-turn `respond`, an oracle and a random action) and its registration as `NAME/Name-v0`;
- `test_NAME.py`: pytest tests (`textgym env check` passes, oracle 1.0, random below it);
- `train_NAME.yaml`: a run config that imports `NAME` and trains the tiny model on it with GRPO,
  evaluating on the test split.

The generated project passes `textgym env check NAME:NAME/Name-v0` and `textgym train
train_NAME.yaml` runs from `out` as it is (tests/envs/test_env_from_anywhere.py runs both).
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

_SINGLE = '''"""__MODULE__: a single-turn textgym environment (written by `textgym env new __MODULE__`).

The task: spell a short random string backwards. Edit `make_tasks` (the problems), `Exact` (the
verifier) and `INSTRUCTION`; keep the registration at the bottom. Check the env with

    textgym env check __MODULE__:__ID__

and train on it with `textgym train train___MODULE__.yaml` (run both from this folder).
"""

from __future__ import annotations

import random
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.envs import SingleTurnEnv
from textgym.types import Task
from textgym.verifiers import Rubric, RubricTerm, Score

INSTRUCTION = "Reply with the reversed string only."
SPLIT_SEEDS = {"train": 0, "test": 1}
"""Each split draws its strings from its own seed; the test strings never occur in train."""


def make_tasks(split: str, n: int) -> list[Task]:
    """`n` tasks of `split` ("train" or "test"): reverse a string of 3 to 5 letters a-e."""
    if split not in SPLIT_SEEDS:
        raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
    rng = random.Random(SPLIT_SEEDS[split])
    held_out = {s for s in _strings(random.Random(SPLIT_SEEDS["test"]), 200)}
    strings = [s for s in _strings(rng, 4 * n) if split == "test" or s not in held_out][:n]
    return [
        Task(task_id=f"__MODULE__/{split}/{i}", prompt=f"Spell '{s}' backwards.", answer=s[::-1],
             solution=s[::-1])
        for i, s in enumerate(strings)
    ]


def _strings(rng: random.Random, n: int) -> list[str]:
    return ["".join(rng.choice("abcde") for _ in range(rng.randint(3, 5))) for _ in range(n)]


class Exact:
    """Verifier: 1.0 when the reply's last line, stripped of spaces, quotes and dots, is the answer."""

    def __call__(self, completion: str, task: Task) -> Score:
        lines = completion.strip().splitlines()
        said = lines[-1].strip(" .'\\"`").lower() if lines else ""
        return Score(reward=float(said == task.answer), details={"said": said[:100]})


class OneWord:
    """Verifier (logged, weight 0): 1.0 when the reply is a single word."""

    def __call__(self, completion: str, task: Task) -> Score:
        return Score(reward=float(len(completion.split()) == 1))


class __CLASS__(SingleTurnEnv):
    """Spell a random string backwards; one turn, scored by `Exact` (the `correct` term).

    Args:
        split: "train" (1000 tasks) or "test" (100 tasks, strings never in train).
        n: number of tasks (default 1000 for train, 100 for test).
        **kwargs: `SingleTurnEnv`'s (system_prompt, max_action_chars, render_mode, ...).
    """

    def __init__(self, split: str = "train", n: int | None = None, **kwargs: Any):
        tasks = make_tasks(split, n or (1000 if split == "train" else 100))
        rubric = Rubric([RubricTerm("correct", Exact(), 1.0), RubricTerm("one_word", OneWord(), 0.0)])
        super().__init__(tasks, rubric, instruction=INSTRUCTION, **kwargs)

    def random_action(self, rng: np.random.Generator) -> str:
        """A random string of the same letters (what `textgym eval --agent random` replies)."""
        return "".join(str(c) for c in rng.choice(list("abcde"), size=int(rng.integers(3, 6))))


gym.register(id="__ID__", entry_point=__CLASS__)
'''

_MULTI = '''"""__MODULE__: a multi-turn textgym environment (`textgym env new __MODULE__ --multi-turn`).

The task: guess a number from 1 to 32; each wrong guess is answered "higher" or "lower", at most
7 turns (registered with `max_episode_steps=7`). Edit `initial_messages`, `respond` and the task
list; keep the registration at the bottom. Check the env with

    textgym env check __MODULE__:__ID__

and train on it with `textgym train train___MODULE__.yaml` (run both from this folder).
"""

from __future__ import annotations

import re
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.envs import TextEnv
from textgym.types import Message, Task
from textgym.verifiers.answer_text import normalize_unicode

LOW, HIGH = 1, 32


def make_tasks(split: str) -> list[Task]:
    """The targets of `split`: "test" holds every fourth number, "train" the rest."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    targets = [t for t in range(LOW, HIGH + 1) if (t % 4 == 0) == (split == "test")]
    return [Task(task_id=f"__MODULE__/{split}/{t}", prompt=f"Guess my number from {LOW} to {HIGH}.",
                 answer=str(t)) for t in targets]


class __CLASS__(TextEnv):
    """Guess a hidden number with "higher"/"lower" hints; reward 1.0 (`reward/correct`) on the right guess.

    A reply without exactly one number (none, or several: "either 3 or 4" is not a guess) costs
    a turn and is answered with what was wrong (never raised on).

    Args:
        split: "train" (24 targets) or "test" (8 targets: the multiples of 4).
        **kwargs: `TextEnv`'s (system_prompt, max_action_chars, render_mode, ...).
    """

    def __init__(self, split: str = "train", **kwargs: Any):
        super().__init__(make_tasks(split), **kwargs)

    def initial_messages(self, task: Task) -> list[Message]:
        """The question and the reply format."""
        return [{"role": "user", "content": f"{task.prompt} Reply with one number."}]

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Compare the reply's one number with the target: solved, or a hint."""
        assert self.task is not None
        # Read as every textgym reader does: "−7" (U+2212) is minus 7, "٣" is 3, so a look-alike sign
        # or digit is no way around "one guess per reply".
        numbers = set(re.findall(r"-?[0-9]+", normalize_unicode(action)))
        if len(numbers) != 1:
            ask = [{"role": "user", "content": "Reply with one number."}]
            return ask, 0.0, False, {"reward/correct": 0.0}
        guess, target = int(numbers.pop()), int(self.task.answer)
        if guess == target:
            return [], 1.0, True, {"reward/correct": 1.0}
        hint = "higher" if guess < target else "lower"
        return [{"role": "user", "content": hint}], 0.0, False, {"reward/correct": 0.0}

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """An unusable reply (empty, too long) costs a turn instead of ending the episode."""
        say = [{"role": "user", "content": f"Invalid reply ({reason})."}]
        return say, 0.0, False, {"reward/correct": 0.0}

    def oracle_action(self, messages: list[Message]) -> str:
        """Binary search on the hints so far (what `textgym eval --agent oracle` replies)."""
        low, high = LOW, HIGH
        for asked, said in zip(messages, messages[1:]):
            numbers = re.findall(r"-?\\d+", str(asked.get("content", "")))
            if asked.get("role") != "assistant" or not numbers:
                continue
            if said.get("content") == "higher":
                low = max(low, int(numbers[-1]) + 1)
            elif said.get("content") == "lower":
                high = min(high, int(numbers[-1]) - 1)
        return str((low + high) // 2)

    def random_action(self, rng: np.random.Generator) -> str:
        """A random number in range (what `textgym eval --agent random` replies)."""
        return str(int(rng.integers(LOW, HIGH + 1)))


gym.register(id="__ID__", entry_point=__CLASS__, max_episode_steps=7)
'''

_TEST = '''"""Tests of __MODULE__ (written by `textgym env new`): run `pytest` in this folder."""

from textgym.evaluation import OracleAgent, RandomAgent, check_env, evaluate_scripted

ENV_ID = "__MODULE__:__ID__"


def test_env_check_passes():
    failed = [r.line() for r in check_env(ENV_ID) if r.status == "fail"]
    assert not failed, failed


def test_the_oracle_solves_every_test_task_and_a_random_agent_few():
    oracle = evaluate_scripted(OracleAgent(), ENV_ID, {"split": "test"}, n=8)
    random = evaluate_scripted(RandomAgent(0), ENV_ID, {"split": "test"}, n=8)
    assert oracle.accuracy == 1.0
    assert random.accuracy < 0.5
'''

_CONFIG = """# Train the tiny model on __ID__ with GRPO, evaluate on the held-out test split.
# Run from this folder: textgym train train___MODULE__.yaml   (a few minutes on 2 CPU cores)
name: __MODULE__
imports: [__MODULE__]        # registers __ID__ (this folder is on the import path)
seed: 0
threads: 2
model:
  init_preset: tiny
grpo:
  env: {id: __ID__, kwargs: {split: train}}
  steps: 20
  prompts_per_step: 8
  group_size: 4
  sampling: {temperature: 1.0, max_new_tokens: 16}
  optim: {lr: 3.0e-4}
  checkpoint_every: 10
eval:
  env: {id: __ID__, kwargs: {split: test}}
  n: 8
  sampling: {temperature: 0.0, max_new_tokens: 16}
"""


def class_name(module: str) -> str:
    """The generated class: `"reverse"` -> `"ReverseEnv"`, `"my_env"` -> `"MyEnv"` (no doubled "Env")."""
    camel = "".join(part[:1].upper() + part[1:] for part in module.split("_") if part)
    return camel if camel.endswith("Env") else camel + "Env"


def env_id_of(module: str) -> str:
    """The id the generated module registers: `module/ClassNameWithoutEnv-v0`."""
    return f"{module}/{class_name(module).removesuffix('Env') or 'Env'}-v0"


def write_env_project(
    name: str, out: str | Path, *, multi_turn: bool = False, force: bool = False
) -> list[Path]:
    """Write `NAME.py`, `test_NAME.py` and `train_NAME.yaml` into `out` (created if needed).

    Args:
        name: the module name (a lowercase Python identifier, e.g. "reverse" or "my_env").
        out: the folder to write into.
        multi_turn: write the multi-turn template (guess a number) instead of the single-turn one.
        force: overwrite existing files.

    Returns:
        The paths written.

    Raises:
        ValueError: `name` is not a lowercase identifier, or a keyword, or a file exists without `force`.
    """
    if not re.fullmatch(r"[a-z][a-z0-9_]*", name) or keyword.iskeyword(name):
        raise ValueError(
            f"NAME must be a lowercase Python identifier such as 'reverse' or 'my_env', got {name!r}"
        )
    out = Path(out)
    files = {
        out / f"{name}.py": _MULTI if multi_turn else _SINGLE,
        out / f"test_{name}.py": _TEST,
        out / f"train_{name}.yaml": _CONFIG,
    }
    existing = [str(p) for p in files if p.exists()]
    if existing and not force:
        raise ValueError(f"refusing to overwrite {', '.join(existing)} (pass --force)")
    out.mkdir(parents=True, exist_ok=True)
    for path, template in files.items():
        text = (
            template.replace("__MODULE__", name)
            .replace("__CLASS__", class_name(name))
            .replace("__ID__", env_id_of(name))
        )
        path.write_text(text, encoding="utf-8")
    return list(files)
