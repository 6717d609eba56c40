r"""`textgym/ReasoningGym-v0`: any of reasoning-gym's procedural datasets as a single-turn textgym env.

[reasoning-gym](https://github.com/open-thought/reasoning-gym) generates ~100 families of
verifiable problems (arithmetic, algebra, logic, graphs, games, ciphers, ARC, ...). This env poses
one entry of `reasoning_gym.create_dataset(dataset, size=size, seed=..., **config)` and scores
the reply with that dataset's own `score_answer`, on the answer that reasoning-gym's own
`extract_answer` finds: the text inside the last `<answer>...</answer>`. Needs the
`reasoning-gym` package (`pip install 'textgym[interop]'`); nothing is downloaded at run time.

Rewards:
    `score`: `score_answer(extracted, entry)` as the dataset computes it (0..1, partial credit
    where the dataset gives some): this is the reward (weight 1).
    `correct`: 1.0 when `score >= 1`, else 0.0 (weight 0): accuracy is exact.

Datasets without a gold answer (`NO_GOLD_ANSWER`): boxnet, graph_color, propositional_logic,
rubiks_cube and rush_hour check the reply against the puzzle's constraints instead of comparing it
with a stored answer. They are scored like every other dataset, but `Task.answer` is `""`,
`Task.solution` is None (no SFT) and `oracle_action` raises.

Known upstream quirk: `game_of_life_halting`'s `score_answer` gives 1.0 to any non-empty reply
(reasoning-gym 0.1.25 compares `bool(answer)` strings), so its random-agent accuracy is 1.0.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import io
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from textgym.envs.base import LazyTasks, SingleTurnEnv
from textgym.envs.interop import require
from textgym.types import Task
from textgym.verifiers.base import Rubric, RubricTerm, Score

NO_GOLD_ANSWER = ("boxnet", "graph_color", "propositional_logic", "rubiks_cube", "rush_hour")
"""Datasets whose entries have no gold answer (`entry["answer"] is None`): scored by constraint
checks, no oracle, no SFT solution."""
SPLIT_SEED_OFFSET = {"train": 0, "test": 1_000_000_000}
"""Task *i* of `split` is reasoning-gym's item *i* with dataset seed `seed + SPLIT_SEED_OFFSET[split]`.

reasoning-gym derives item *i* from `Random(seed + i)`, so the two splits draw from disjoint
seed ranges for any `size` below 10⁹ (a small problem space can still repeat a question by chance)."""
DEFAULT_SIZE = 1000
"""Tasks per split unless `size=` says otherwise."""
DEFAULT_SYSTEM_PROMPT = (
    "Given a problem, your task is to answer the question by thinking step-by-step in a clear and "
    "specific manner.\nOnce you have thought about the reasoning process, provide the answer in the "
    "following format:\n<answer>answer here</answer>\nDo not explain your reasoning inside the answer "
    "tags, provide only the final answer. When an example is provided, you should strictly follow the "
    "format of the output/answer in that example.\n"
)
"""reasoning-gym's `SYSTEM_PROMPTS["default"]` (copied so the module imports without the package)."""
_RANDOM_WORDS = ("yes", "no", "none", "abc", "hello", "x", "left", "up", "RANDOM", "foo bar")
_INDEX_RE = re.compile(r"/(\d+)$")
_CACHE_SIZE = 4096


def dataset_names() -> list[str]:
    """The names `dataset=` accepts: every dataset registered in reasoning-gym, sorted.

    Raises:
        ImportError: without the `reasoning-gym` package.

    Examples:
        >>> names = dataset_names()
        >>> "leg_counting" in names and "propositional_logic" in names and len(names) > 90
        True
    """
    require("reasoning-gym", "reasoning_gym")
    with _quiet():
        from reasoning_gym.factory import DATASETS
    return sorted(DATASETS)


def extract_answer(completion: str) -> str | None:
    r"""The text inside the reply's last `<answer>...</answer>`, stripped; None when there is none.

    This calls reasoning-gym's own `reasoning_gym.utils.extract_answer`, so the env reads a reply
    exactly as reasoning-gym's evaluations do.

    Raises:
        ImportError: without the `reasoning-gym` package.

    Examples:
        >>> extract_answer("<think>2+2</think> <answer> 4 </answer>")
        '4'
        >>> extract_answer("<answer>1</answer> no, <answer>2</answer>"), extract_answer("4") is None
        ('2', True)
    """
    require("reasoning-gym", "reasoning_gym")
    from reasoning_gym.utils import extract_answer as rg_extract_answer

    return rg_extract_answer(completion)


@contextlib.contextmanager
def _quiet() -> Any:
    """Hide what a generator prints (the `bf` dataset's interpreter writes to stdout)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def _closest(name: str, names: Sequence[str]) -> str:
    close = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    return f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def _make_dataset(name: str, size: int, seed: int, config: Mapping[str, Any]) -> Any:
    require("reasoning-gym", "reasoning_gym")
    with _quiet():
        from reasoning_gym.factory import DATASETS, create_dataset
    if name not in DATASETS:
        raise ValueError(
            f"unknown reasoning-gym dataset {name!r}.{_closest(name, sorted(DATASETS))} "
            f"Known: {', '.join(sorted(DATASETS))}"
        )
    _, config_cls = DATASETS[name]
    fields = {f.name for f in dataclasses.fields(config_cls)}
    bad = sorted(set(config) - fields)
    if bad:
        raise ValueError(
            f"config keys {bad} are not options of reasoning-gym's {config_cls.__name__}; "
            f"it takes {sorted(fields - {'seed', 'size'})} (seed and size are the env's own kwargs)"
        )
    if {"seed", "size"} & set(config):
        raise ValueError("pass seed= and size= to the env, not inside config=")
    try:
        with _quiet():
            return create_dataset(name, size=size, seed=seed, **dict(config))
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"reasoning-gym rejects dataset={name!r} config={dict(config)}: {e}") from e


class ReasoningGymTasks(LazyTasks):
    """The entries of one reasoning-gym dataset as `Task`s, generated on demand (and cached).

    Task *i* is `Task(task_id="reasoning_gym/<dataset>/<split>/<i>", prompt=entry["question"],
    answer=entry["answer"] or "", solution="<answer>GOLD</answer>" (None without a gold answer),
    metadata=entry["metadata"])`.

    Args:
        dataset: the reasoning-gym `ProceduralDataset`.
        name: its registered name.
        split: "train" or "test" (only used in the task ids).
    """

    def __init__(self, dataset: Any, name: str, split: str):
        self.dataset, self.name, self.split = dataset, name, split
        self._cache: dict[int, dict[str, Any]] = {}

    def __len__(self) -> int:
        return len(self.dataset)

    def entry(self, index: int) -> dict[str, Any]:
        """reasoning-gym's entry *index* (`question`, `answer`, `metadata`).

        Raises:
            IndexError: outside `[0, len(self))`.
        """
        if not 0 <= index < len(self):
            raise IndexError(f"task index {index} out of range [0, {len(self)})")
        entry = self._cache.get(index)
        if entry is None:
            with _quiet():
                entry = self.dataset[index]
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[index] = entry
        return entry

    def task(self, index: int) -> Task:
        """Task `index` (see the class docstring)."""
        entry = self.entry(index)
        gold = entry.get("answer")
        answer = "" if gold is None else str(gold)
        return Task(
            task_id=f"reasoning_gym/{self.name}/{self.split}/{index}",
            prompt=str(entry["question"]),
            answer=answer,
            solution=None if gold is None else f"<answer>{answer}</answer>",
            metadata=dict(entry.get("metadata") or {}),
        )


class ReasoningGymScorer:
    """Verifier: the dataset's `score_answer` on `extract_answer(completion)` (a total function).

    A reply without `<answer>` tags is scored as reasoning-gym scores a missing answer (None, 0.0
    for every dataset); an exception inside `score_answer` on a malformed answer scores 0.0 with
    the error in the details. The last result is kept, so the rubric's two terms score once.

    Args:
        tasks: the env's `ReasoningGymTasks` (entries are looked up by the task id's index).
    """

    def __init__(self, tasks: ReasoningGymTasks):
        self.tasks = tasks
        self._last: tuple[str, str, Score] | None = None

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` on `task` (0..1 as the dataset computes it)."""
        if self._last is not None and self._last[:2] == (completion, task.task_id):
            return self._last[2]
        match = _INDEX_RE.search(task.task_id)
        if match is None:
            raise ValueError(f"not a reasoning-gym task id: {task.task_id!r}")
        entry = self.tasks.entry(int(match.group(1)))
        answer = extract_answer(completion)
        details: dict[str, Any] = {"extracted": answer}
        try:
            with _quiet():
                reward = float(self.tasks.dataset.score_answer(answer, entry))
        except Exception as e:  # score_answer may parse the answer (int(), json, ...)
            reward = 0.0
            details["error"] = f"score_answer failed on the answer: {type(e).__name__}: {e}"[:300]
        if answer is None:
            details["error"] = "no <answer>...</answer> in the reply"
        score = Score(reward=reward, details=details)
        self._last = (completion, task.task_id, score)
        return score


class _Exact:
    """The `correct` term: 1.0 when the scorer's reward reaches 1."""

    def __init__(self, scorer: ReasoningGymScorer):
        self.scorer = scorer

    def __call__(self, completion: str, task: Task) -> Score:
        return Score(reward=float(self.scorer(completion, task).reward >= 1.0 - 1e-9))


class ReasoningGymEnv(SingleTurnEnv):
    r"""A reasoning-gym dataset: one question, the answer in `<answer>...</answer>`, the dataset's score.

    ## Description
    Task *i* is entry *i* of `reasoning_gym.create_dataset(dataset, size=size,
    seed=seed + SPLIT_SEED_OFFSET[split], **config)`: the `train` and `test` splits draw from
    disjoint seed ranges. By default the system prompt is reasoning-gym's own
    (`SYSTEM_PROMPTS["default"]`: think, then `<answer>answer here</answer>`) and the user
    message is the dataset's question as it ships.

    ## Action Space
    `UnicodeText`: the reply; its answer is the text inside its last `<answer>...</answer>`.

    ## Observation Space
    `ChatMessages`: the system prompt and the question.

    ## Rewards
    `score` (the reward): the dataset's `score_answer` (partial credit where the dataset gives
    some). `correct` (weight 0, accuracy): 1.0 when `score >= 1`. Both are in `info` as
    `reward/score` and `reward/correct`; the extracted answer is in `info["details"]["score"]`.

    ## Episode End
    Terminates after the one reply.

    ## Version History
    - v0: initial version (reasoning-gym 0.1.25).

    Args:
        dataset: a reasoning-gym dataset name (`dataset_names()`); the env has no default.
        size: tasks per split (default 1000).
        seed: the base seed of the train split (default 0).
        split: "train" or "test" (the test split adds `SPLIT_SEED_OFFSET["test"]` to the seed).
        config: the dataset's own options (the fields of its config dataclass, e.g.
            `{"min_terms": 2, "max_terms": 3}` for chain_sum), without seed and size.
        system_prompt: defaults to reasoning-gym's default prompt; None for none.
        instruction: text appended to the question (default none).
        **kwargs: `max_action_chars`, `invalid_action_reward`, `render_mode` (see `TextEnv`).

    Raises:
        ImportError: without the `reasoning-gym` package.
        ValueError: for an unknown dataset (with the closest names), an unknown split, a
            non-positive size, config keys the dataset does not take, or values it rejects.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/ReasoningGym-v0", dataset="spell_backward", size=10)
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> info["task_id"], info["answer"]
        ('reasoning_gym/spell_backward/train/0', 'noremopyh')
        >>> print(obs[1]["content"])
        Spell this word backward (example: sun -> nus): hypomeron
        >>> reply = "<think>reverse the letters</think><answer>noremopyh</answer>"
        >>> obs, reward, terminated, truncated, info = env.step(reply)
        >>> reward, terminated, info["reward/correct"]
        (1.0, True, 1.0)
        >>> _ = env.reset(options={"task_index": 0})
        >>> env.step("noremopyh")[1]   # no <answer> tags: nothing to score
        0.0
        >>> _ = env.reset(options={"task_index": 0})
        >>> env.unwrapped.oracle_action([])
        '<answer>noremopyh</answer>'
    """

    def __init__(
        self,
        dataset: str | None = None,
        *,
        size: int = DEFAULT_SIZE,
        seed: int = 0,
        split: str = "train",
        config: Mapping[str, Any] | None = None,
        system_prompt: str | None = DEFAULT_SYSTEM_PROMPT,
        instruction: str = "",
        **kwargs: Any,
    ):
        if dataset is None or not isinstance(dataset, str):
            raise ValueError(
                "textgym/ReasoningGym-v0 needs dataset=NAME (a reasoning-gym dataset, e.g. "
                f"'leg_counting'; dataset_names() lists them), got {dataset!r}"
            )
        if split not in SPLIT_SEED_OFFSET:
            raise ValueError(f"split must be one of {sorted(SPLIT_SEED_OFFSET)}, got {split!r}")
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        if config is not None and not isinstance(config, Mapping):
            raise ValueError(f"config must be a mapping of the dataset's options, got {config!r}")
        ds = _make_dataset(dataset, size, seed + SPLIT_SEED_OFFSET[split], config or {})
        tasks = ReasoningGymTasks(ds, dataset, split)
        scorer = ReasoningGymScorer(tasks)
        rubric = Rubric([RubricTerm("score", scorer, 1.0), RubricTerm("correct", _Exact(scorer), 0.0)])
        super().__init__(tasks, rubric, instruction=instruction, system_prompt=system_prompt, **kwargs)
        self.dataset_name = dataset
        self.split = split
        self.has_gold_answer = dataset not in NO_GOLD_ANSWER

    def oracle_action(self, messages: list[Any]) -> str:
        """The gold answer in `<answer>` tags.

        Raises:
            RuntimeError: before `reset()`.
            NotImplementedError: for a dataset without gold answers (`NO_GOLD_ANSWER`).
        """
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        if self.task.solution is None:
            raise NotImplementedError(
                f"reasoning-gym's {self.dataset_name!r} has no gold answers (its replies are checked "
                f"against the puzzle's constraints), so there is no oracle; datasets without one: "
                f"{', '.join(NO_GOLD_ANSWER)}"
            )
        return self.task.solution

    def random_action(self, rng: np.random.Generator) -> str:
        """A random answer in `<answer>` tags, an integer in [0, 1000) or a word (`--agent random`).

        Examples:
            >>> import numpy as np
            >>> from textgym.envs.interop.reasoning_gym import ReasoningGymEnv
            >>> ReasoningGymEnv("leg_counting", size=5).random_action(np.random.default_rng(0))
            '<answer>x</answer>'
        """
        if rng.random() < 0.5:
            return f"<answer>{int(rng.integers(0, 1000))}</answer>"
        return f"<answer>{_RANDOM_WORDS[int(rng.integers(len(_RANDOM_WORDS)))]}</answer>"
