"""`textgym/GSM8K-v0` and `textgym/MATH500-v0`: real math word problems, one per episode.

The data ship inside the package (`textgym/data/`, with licences and provenance);
task *i* is row *i* of the split's file.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from textgym.envs.base import SingleTurnEnv, math_rubric
from textgym.types import Task

DEFAULT_INSTRUCTION = "Please reason step by step, and put your final answer within \\boxed{}."
"""The usual math prompt (Qwen2.5-Math's); the envs add what the answer rule asks
(`textgym.verifiers.answer_rule`): one answer, a number written as a number."""
GSM8K_INSTRUCTION = DEFAULT_INSTRUCTION[:-1] + ", as one number."
MATH500_INSTRUCTION = DEFAULT_INSTRUCTION[:-1] + ": one answer, simplified."
_CALC_RE = re.compile(r"<<[^>]*>>")


def _read_jsonl(*parts: str) -> list[dict[str, Any]]:
    path = resources.files("textgym").joinpath("data", *parts)
    with path.open("r", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


@lru_cache(maxsize=4)
def gsm8k_tasks(split: str) -> tuple[Task, ...]:
    """Load GSM8K's `split` ("train": 7473 rows, "test": 1319) as tasks.

    The gold answer is the number after `####` (thousands separators removed); the
    gold solution is the worked answer without calculator annotations, ending in
    `\\boxed{answer}`.

    Raises:
        ValueError: on an unknown split.
    """
    if split not in ("train", "test"):
        raise ValueError(f"GSM8K split must be 'train' or 'test', got {split!r}")
    tasks = []
    for i, row in enumerate(_read_jsonl("gsm8k", f"{split}.jsonl")):
        reasoning, _, final = row["answer"].rpartition("####")
        answer = final.strip().replace(",", "")
        steps = _CALC_RE.sub("", reasoning).strip()
        tasks.append(
            Task(
                task_id=f"gsm8k/{split}/{i}",
                prompt=row["question"],
                answer=answer,
                solution=f"{steps}\nThe final answer is \\boxed{{{answer}}}.",
            )
        )
    return tuple(tasks)


@lru_cache(maxsize=1)
def math500_tasks() -> tuple[Task, ...]:
    """Load MATH-500 (500 rows) as tasks; gold answer = the dataset's `answer` (LaTeX)."""
    return tuple(
        Task(
            task_id=f"math500/{row['unique_id']}",
            prompt=row["problem"],
            answer=row["answer"],
            solution=row["solution"],
            metadata={"subject": row["subject"], "level": row["level"]},
        )
        for row in _read_jsonl("math500", "test.jsonl")
    )


class GSM8KEnv(SingleTurnEnv):
    r"""Grade-school math word problems (Cobbe et al. 2021, arXiv:2110.14168).

    ## Description
    One GSM8K question per episode, followed by `instruction`; `split="train"`
    (7473) or `"test"` (1319). The answer is a number.

    ## Action Space
    `UnicodeText`: the agent's reply, any string.

    ## Observation Space
    `ChatMessages`: one user message after `reset`; the empty list after `step`.

    ## Rewards
    `correct_weight · correct + format_weight · format` (see `textgym.envs.base.math_rubric`);
    defaults 1.0 and 0.0.

    ## Episode End
    Terminates after one step.

    ## Version History
    - v0: initial version.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/GSM8K-v0", split="test")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> obs[0]["content"][:34], info["answer"]
        ('Janet’s ducks lay 16 eggs per day.', '18')
        >>> obs, reward, terminated, truncated, info = env.step("9 eggs at $2 each. The answer is 18.")
        >>> reward, info["reward/correct"], info["reward/format"]  # format: no \boxed{}, logged only
        (1.0, 1.0, 0.0)
    """

    def __init__(
        self,
        split: str = "test",
        instruction: str = GSM8K_INSTRUCTION,
        correct_weight: float = 1.0,
        format_weight: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(
            gsm8k_tasks(split), math_rubric(correct_weight, format_weight), instruction=instruction, **kwargs
        )


class MATH500Env(SingleTurnEnv):
    r"""The 500-problem MATH test subset of Lightman et al. 2023 (arXiv:2305.20050).

    ## Description
    One competition problem per episode, followed by `instruction`. Gold answers
    are LaTeX (fractions, intervals, matrices, text choices).

    ## Action Space
    `UnicodeText`: the agent's reply, any string.

    ## Observation Space
    `ChatMessages`: one user message after `reset`; the empty list after `step`.

    ## Rewards
    `correct_weight · correct + format_weight · format` (see `textgym.envs.base.math_rubric`);
    defaults 1.0 and 0.0.

    ## Episode End
    Terminates after one step.

    ## Version History
    - v0: initial version.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/MATH500-v0")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> info["answer"]
        '\\left( 3, \\frac{\\pi}{2} \\right)'
        >>> env.step(r"$r = 3$ and $\theta = \pi/2$, so \boxed{(3, \frac{\pi}{2})}.")[1]
        1.0
    """

    def __init__(
        self,
        instruction: str = MATH500_INSTRUCTION,
        correct_weight: float = 1.0,
        format_weight: float = 0.0,
        **kwargs: Any,
    ):
        super().__init__(
            math500_tasks(), math_rubric(correct_weight, format_weight), instruction=instruction, **kwargs
        )
