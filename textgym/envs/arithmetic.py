"""`textgym/Arithmetic-v0`: generated arithmetic problems with an exact integer answer."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, overload

import numpy as np

from textgym.envs.base import SingleTurnEnv, math_rubric
from textgym.types import Task
from textgym.verifiers.base import RubricTerm
from textgym.verifiers.math import DigitMatchVerifier

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}
STREAM_LENGTH = sys.maxsize
"""`len()` of the train split: the stream is unbounded, every index is a valid task."""


def evaluate(numbers: Sequence[int], ops: Sequence[str]) -> Fraction:
    """Evaluate `n0 op0 n1 op1 n2 ...` with the usual precedence (× ÷ before + −), exactly.

    Raises:
        ZeroDivisionError: when a divisor is 0.
        ValueError: when a division step has a remainder (problems use exact division only).
    """
    # Shunting-yard over a flat infix expression without parentheses.
    values: list[Fraction] = [Fraction(numbers[0])]
    pending: list[str] = []
    for op, n in zip(ops, numbers[1:], strict=True):
        while pending and _PRECEDENCE[pending[-1]] >= _PRECEDENCE[op]:
            _apply(values, pending.pop())
        pending.append(op)
        values.append(Fraction(n))
    while pending:
        _apply(values, pending.pop())
    return values[0]


def _apply(values: list[Fraction], op: str) -> None:
    b, a = values.pop(), values.pop()
    if op == "/" and (a / b).denominator != 1:
        raise ValueError(f"{a}/{b} is not an exact division")
    values.append(a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b)


class ArithmeticTasks(Sequence[Task]):
    """Seeded generator of arithmetic tasks, indexable like a dataset.

    Task *i* of a split is a pure function of `(generator_seed, split, i)`. The test
    split holds `n_test` distinct problems; the train split is an unbounded stream
    (`len == sys.maxsize`) that never poses a test problem (rejection sampling), so
    the test split is held out.

    Args:
        split: "train" or "test".
        operators: the operator characters to draw from, a subset of "+-*/".
        digits: operands are uniform integers in `[0, 10**digits)`.
        n_terms: operands per expression (2 = one operation; 3+ = multi-step, usual precedence).
        n_test: size of the held-out test split (default: 500, or a quarter of the problem
            space when that is smaller, e.g. 25 for 1-digit a+b).
        generator_seed: seed of the task generator (independent of the env's reset seed).

    Raises:
        ValueError: on an empty/unknown operator set, digits outside 1..9, n_terms < 2,
            or a test split larger than the problem space allows.
    """

    def __init__(
        self,
        split: str = "train",
        operators: str = "+-",
        digits: int = 2,
        n_terms: int = 2,
        n_test: int | None = None,
        generator_seed: int = 0,
    ):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not operators or set(operators) - set(_PRECEDENCE):
            raise ValueError(f"operators must be a non-empty subset of '+-*/', got {operators!r}")
        if not 1 <= digits <= 9:
            raise ValueError(f"digits must be in 1..9, got {digits}")
        if n_terms < 2:
            raise ValueError(f"n_terms must be >= 2, got {n_terms}")
        space = (10**digits) ** n_terms * len(operators) ** (n_terms - 1)
        if n_test is None:
            n_test = min(500, space // 4)
        if not 1 <= n_test <= space // 4:
            raise ValueError(f"n_test must be in 1..{space // 4} for this problem space, got {n_test}")
        self.split, self.operators, self.digits = split, operators, digits
        self.n_terms, self.n_test, self.generator_seed = n_terms, n_test, generator_seed
        self._test: list[Task] = []
        seen: set[str] = set()
        j = 0
        while len(self._test) < n_test:
            expr, ans = self._draw(np.random.default_rng([generator_seed, 0, j]))
            j += 1
            if expr not in seen:
                seen.add(expr)
                self._test.append(self._task("test", len(self._test), expr, ans))
        self._test_exprs = frozenset(seen)

    def _draw(self, rng: np.random.Generator) -> tuple[str, int]:
        for _ in range(1000):
            nums = [int(x) for x in rng.integers(0, 10**self.digits, size=self.n_terms)]
            ops = [
                self.operators[int(k)] for k in rng.integers(0, len(self.operators), size=self.n_terms - 1)
            ]
            try:
                value = evaluate(nums, ops)
            except (ZeroDivisionError, ValueError):
                continue
            if value.denominator == 1:
                expr = str(nums[0]) + "".join(f"{o}{n}" for o, n in zip(ops, nums[1:], strict=True))
                return expr, int(value)
        raise RuntimeError("could not draw an integer-valued problem in 1000 tries")

    def _task(self, split: str, i: int, expr: str, ans: int) -> Task:
        return Task(
            task_id=f"arithmetic/{split}/{i}",
            prompt=f"Compute {expr}.",
            answer=str(ans),
            solution=f"\\boxed{{{ans}}}",
            metadata={"expression": expr},
        )

    def __len__(self) -> int:
        return STREAM_LENGTH if self.split == "train" else self.n_test

    @overload
    def __getitem__(self, i: int) -> Task: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Task]: ...
    def __getitem__(self, i: int | slice) -> Task | Sequence[Task]:
        """Return task `i` (negative indices count from the end of the test split)."""
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if self.split == "test":
            return self._test[i]
        if not 0 <= i < STREAM_LENGTH:
            raise IndexError(i)
        return self._train_task(i)

    def _train_task(self, i: int) -> Task:
        rng = np.random.default_rng([self.generator_seed, 1, i])
        while True:
            expr, ans = self._draw(rng)
            if expr not in self._test_exprs:
                return self._task("train", i, expr, ans)


@lru_cache(maxsize=32)
def _cached_tasks(
    split: str, operators: str, digits: int, n_terms: int, n_test: int | None, seed: int
) -> ArithmeticTasks:
    return ArithmeticTasks(split, operators, digits, n_terms, n_test, seed)


class ArithmeticEnv(SingleTurnEnv):
    r"""Generated arithmetic, one question per episode.

    ## Description
    "Compute 37+58." with a configurable operator set, operand size and number of
    terms (multi-step expressions use the usual precedence). The generator is seeded
    (`generator_seed`); the `test` split is a fixed held-out set of `n_test` distinct
    problems that the unbounded `train` stream never poses.

    ## Action Space
    `UnicodeText`: the agent's reply, any string.

    ## Observation Space
    `ChatMessages`: after `reset`, one user message (plus a system message when
    `system_prompt` is set); after `step`, the empty list.

    ## Rewards
    `correct_weight · correct + format_weight · format + digit_match_weight · digit_match`
    where `correct` is 1.0 when the final answer (`\boxed{}`, `<answer>`, ... see
    `textgym.verifiers.math`) equals the gold integer by math-verify, `format` is 1.0 when a
    final-answer marker is present, and `digit_match` is the share of the answer's digit
    places that are right (`textgym.verifiers.math.DigitMatchVerifier`: partial credit, 1.0
    only for the exact answer). Defaults: 1.0, 0.0 and 0.0 (format and digit_match are
    logged only). Accuracy is always the `correct` term.

    ## Episode End
    Terminates after one step.

    ## Version History
    - v0: initial version.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/Arithmetic-v0", split="test", operators="+", digits=1)
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> print(obs[0]["content"])
        Compute 8+6. Put the final answer in \boxed{}.
        >>> obs, reward, terminated, truncated, info = env.step(r"8 + 6 = \boxed{14}")
        >>> reward, terminated, info["reward/correct"], info["reward/format"]
        (1.0, True, 1.0, 1.0)

        Partial credit for a wrong sum, with the digit-match term weighted in:

        >>> env = gym.make("textgym/Arithmetic-v0", split="test", operators="+", digits=1,
        ...                digit_match_weight=0.5)
        >>> _ = env.reset(options={"task_index": 0})
        >>> obs, reward, terminated, truncated, info = env.step(r"\boxed{15}")
        >>> reward, info["reward/correct"], info["reward/digit_match"]
        (0.25, 0.0, 0.5)
    """

    def __init__(
        self,
        split: str = "train",
        operators: str = "+-",
        digits: int = 2,
        n_terms: int = 2,
        n_test: int | None = None,
        generator_seed: int = 0,
        instruction: str = "Put the final answer in \\boxed{}.",
        correct_weight: float = 1.0,
        format_weight: float = 0.0,
        digit_match_weight: float = 0.0,
        **kwargs: Any,
    ):
        tasks = _cached_tasks(split, operators, digits, n_terms, n_test, generator_seed)
        rubric = math_rubric(correct_weight, format_weight)
        rubric.terms.append(RubricTerm("digit_match", DigitMatchVerifier(), digit_match_weight))
        super().__init__(tasks, rubric, instruction=instruction, **kwargs)

    def oracle_tool_call(self) -> tuple[str, dict[str, str]] | None:
        """The call a scripted expert makes first when it has tools: the calculator on the expression."""
        if self.task is None:
            return None
        return "calculator", {"expression": str(self.task.metadata["expression"])}
