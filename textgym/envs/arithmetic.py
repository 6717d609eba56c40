"""`textgym/Arithmetic-v0`: generated arithmetic problems with an exact integer answer."""

from __future__ import annotations

import re
import sys
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any, overload

import numpy as np

from textgym.envs.arithmetic_expressions import (
    evaluate,
    fact_key,
    parse_expression,
    worked_solution,
)
from textgym.envs.arithmetic_expressions import worked_steps as worked_steps  # re-exported
from textgym.envs.base import SingleTurnEnv, math_rubric
from textgym.types import Message, Task
from textgym.verifiers.answer_text import normalize_unicode
from textgym.verifiers.base import RubricTerm, Score
from textgym.verifiers.extraction import extract_answer
from textgym.verifiers.math import DigitMatchVerifier
from textgym.verifiers.steps import split_steps

STREAM_LENGTH = sys.maxsize
"""`len()` of the train split: the stream is unbounded, every index is a valid task."""


_STEP_RE = re.compile(r"^(-?\d+)\s*([-+*/])\s*(-?\d+)\s*=\s*(-?\d+)$")


def check_steps(response: str, numbers: Sequence[int], ops: Sequence[str]) -> list[float]:
    r"""Score each step (non-empty line, `split_steps`) of a worked response: 1.0 right, 0.0 wrong.

    The checker keeps the expression as the response has rewritten it so far, starting from the
    problem. A line `a op b = c` is matched to the first adjacent `a op b` of that expression
    (preferring one whose reduction keeps the expression's value), which it then replaces by
    `c`; the step is right when `c` is `a op b` exactly **and** the rewritten expression still
    evaluates to the problem's answer (consistency with the problem: an operation taken out of
    precedence order, e.g. `5+12=17` in `5+12*3`, changes the value and is wrong, and after a
    wrong result every later operation is wrong too, since the expression no longer has the
    problem's value). A line holding `\boxed{...}` is right when the boxed integer is the
    answer. Any other line (prose, an operation not in the expression) is wrong and leaves the
    expression as it was. The response is read after `answer_text.normalize_unicode` (a minus
    sign written U+2212 is `-`), like every answer reader.

    Args:
        response: the agent's text.
        numbers: the problem's operands (`parse_expression`).
        ops: its operators.

    Returns:
        One reward per step, in order ([] for a response without a non-empty line).

    Examples:
        >>> check_steps("12*3=36\n5+36=41\n\\boxed{41}", [5, 12, 3], ["+", "*"])
        [1.0, 1.0, 1.0]
        >>> check_steps("5+12=17\n17*3=51\n\\boxed{51}", [5, 12, 3], ["+", "*"])
        [0.0, 0.0, 0.0]
        >>> check_steps("12*3=35\n5+35=40\n\\boxed{40}", [5, 12, 3], ["+", "*"])
        [0.0, 0.0, 0.0]
        >>> check_steps("So:\n12*3=36\n5+36=41\n\\boxed{41}", [5, 12, 3], ["+", "*"])
        [0.0, 1.0, 1.0, 1.0]
    """
    response = normalize_unicode(response)  # `5 − 3 = 2` written with U+2212 is a step too
    answer = evaluate(numbers, ops)
    nums, rest = [Fraction(n) for n in numbers], list(ops)
    rewards = []
    for span in split_steps(response):
        line = response[span.start : span.end]
        m = _STEP_RE.match(line)
        if m is None:
            boxed = extract_answer(line) if "boxed" in line else None
            rewards.append(float(boxed is not None and _as_int(boxed.text) == answer))
            continue
        a, op, b, c = Fraction(m[1]), m[2], Fraction(m[3]), Fraction(m[4])
        matches = [i for i, o in enumerate(rest) if o == op and nums[i] == a and nums[i + 1] == b]
        if not matches:
            rewards.append(0.0)
            continue
        exact = _exact(a, op, b)
        keeps = [i for i in matches if _value([*nums[:i], exact, *nums[i + 2 :]], rest, i) == answer]
        i = (keeps or matches)[0]
        nums[i : i + 2] = [c]
        del rest[i]
        rewards.append(float(exact == c and _value(nums, rest) == answer))
    return rewards


def _as_int(text: str) -> int | None:
    try:
        return int(text.strip())
    except ValueError:
        return None


def _exact(a: Fraction, op: str, b: Fraction) -> Fraction | None:
    """`a op b`, or None for a division by 0 or with a remainder."""
    if op == "/" and (b == 0 or (a / b).denominator != 1):
        return None
    return a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b


def _value(nums: Sequence[Fraction | None], ops: list[str], drop: int | None = None) -> Fraction | None:
    """The value of an expression (with operator `drop` removed), or None when it cannot be computed."""
    ints = [int(n) for n in nums if n is not None and n.denominator == 1]
    if len(ints) != len(nums):
        return None
    try:
        return evaluate(ints, [o for k, o in enumerate(ops) if k != drop])
    except (ZeroDivisionError, ValueError):
        return None


class WorkedStepsVerifier:
    r"""The step checker of worked Arithmetic as a rubric term: the share of right steps.

    `Score.reward` is the mean of `check_steps` (0.0 without a step); `details` hold
    `step_rewards` (one per step) and `step_ends` (each step's end offset in the completion,
    `textgym.verifiers.steps.split_steps`). The problem is read from `task.metadata["expression"]`.

    Examples:
        >>> from textgym.types import Message, Task
        >>> task = Task("t", "Compute 5+12*3.", "41", metadata={"expression": "5+12*3"})
        >>> score = WorkedStepsVerifier()("12*3=36\n5+36=40\n\\boxed{40}", task)
        >>> score.reward, score.details
        (0.3333333333333333, {'step_rewards': [1.0, 0.0, 0.0], 'step_ends': [7, 15, 26]})
    """

    def __call__(self, completion: str, task: Task) -> Score:
        """Check each step of `completion` against the task's expression."""
        numbers, ops = parse_expression(str(task.metadata["expression"]))
        rewards = check_steps(completion, numbers, ops)
        ends = [s.end for s in split_steps(completion)]
        mean = sum(rewards) / len(rewards) if rewards else 0.0
        return Score(mean, {"step_rewards": rewards, "step_ends": ends})


class ArithmeticTasks(Sequence[Task]):
    """Seeded generator of arithmetic tasks, indexable like a dataset.

    Task *i* of a split is a pure function of `(generator_seed, split, i)`. The test
    split holds `n_test` problems of distinct facts; the train split is an unbounded stream
    (`len == sys.maxsize`) that never poses a test problem's fact (rejection sampling by
    `fact_key`: when `85+63` is a test problem, neither it nor `63+85` is ever trained, and the
    same for `×` and longer expressions rearranged), so the test split is held out by fact,
    not by its text.

    Args:
        split: "train" or "test".
        operators: the operator characters to draw from, a subset of "+-*/".
        digits: operands are uniform integers in `[0, 10**digits)`.
        n_terms: operands per expression (2 = one operation; 3+ = multi-step, usual precedence).
        n_test: size of the held-out test split (default: 500, or a quarter of the problem
            space when that is smaller, e.g. 25 for 1-digit a+b).
        generator_seed: seed of the task generator (independent of the env's reset seed).
        worked_steps: the tasks' `solution` is the worked computation (`worked_solution`: one
            operation per line in precedence order, then the boxed answer) instead of the
            boxed answer alone. The problems are the same either way.

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
        worked_steps: bool = False,
    ):
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        if not operators or set(operators) - set("+-*/"):
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
        self.worked_steps = worked_steps
        self._test: list[Task] = []
        seen: set[str] = set()
        j = 0
        while len(self._test) < n_test:
            expr, ans = self._draw(np.random.default_rng([generator_seed, 0, j]))
            j += 1
            key = fact_key(*parse_expression(expr))
            if key not in seen:
                seen.add(key)
                self._test.append(self._task("test", len(self._test), expr, ans))
        self._test_facts = frozenset(seen)

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
        solution = worked_solution(*parse_expression(expr)) if self.worked_steps else f"\\boxed{{{ans}}}"
        return Task(
            task_id=f"arithmetic/{split}/{i}",
            prompt=f"Compute {expr}.",
            answer=str(ans),
            solution=solution,
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
            if fact_key(*parse_expression(expr)) not in self._test_facts:
                return self._task("train", i, expr, ans)


@lru_cache(maxsize=32)
def _cached_tasks(
    split: str, operators: str, digits: int, n_terms: int, n_test: int | None, seed: int, worked: bool
) -> ArithmeticTasks:
    return ArithmeticTasks(split, operators, digits, n_terms, n_test, seed, worked)


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

    With `worked_steps=True` the gold solution shows the work, one operation per line in
    precedence order ("12*3=36\n5+36=41\n\\boxed{41}" for "5+12*3", `worked_solution`), and
    each step of a response is checked (`check_steps`: its arithmetic, and that the expression
    it rewrites still has the problem's value): `info["step_rewards"]` holds one reward per
    step (non-empty line; 1.0 right, 0.0 wrong), `info["step_ends"]` each step's end offset in
    the action (one past its last non-whitespace character), and the `steps` term (weight
    `steps_weight`, default 0.0: logged only) is the share of right steps. The rollout puts each
    step reward on the token holding the step's last character (docs: "Process rewards").

    With `prefill=True` the reply is prefilled with the problem's answer stem, `85+63 = `
    (`answer_stems`; `reset`'s `info["reply_prefix"]`): the policy writes only the value and the
    env scores stem and value together. The format is then given, so what training gains is
    the sums themselves (the main job, `configs/smollm2_grpo.yaml`).

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
        Compute 8+6. Put the final answer, one number, in \boxed{}.
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

        A prefilled reply: the policy writes the value after the stem, the env scores both:

        >>> env = gym.make("textgym/Arithmetic-v0", split="test", operators="+", digits=1, prefill=True)
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> info["reply_prefix"]
        '8+6 = '
        >>> env.step(info["reply_prefix"] + "14")[1]
        1.0

        Worked steps, each one checked:

        >>> env = gym.make("textgym/Arithmetic-v0", split="test", operators="+*", digits=1, n_terms=3,
        ...                worked_steps=True, instruction="")
        >>> obs, info = env.reset(options={"task_index": 2})
        >>> print(obs[0]["content"])
        Compute 2+6*3.
        >>> print(env.unwrapped.task.solution)
        6*3=18
        2+18=20
        \boxed{20}
        >>> obs, reward, terminated, truncated, info = env.step("6*3=18\n2+18=21\n\\boxed{21}")
        >>> reward, info["step_rewards"], info["step_ends"], info["reward/steps"]
        (0.0, [1.0, 0.0, 0.0], [6, 14, 25], 0.3333333333333333)
    """

    def __init__(
        self,
        split: str = "train",
        operators: str = "+-",
        digits: int = 2,
        n_terms: int = 2,
        n_test: int | None = None,
        generator_seed: int = 0,
        instruction: str = "Put the final answer, one number, in \\boxed{}.",
        correct_weight: float = 1.0,
        format_weight: float = 0.0,
        digit_match_weight: float = 0.0,
        worked_steps: bool = False,
        steps_weight: float = 0.0,
        **kwargs: Any,
    ):
        tasks = _cached_tasks(split, operators, digits, n_terms, n_test, generator_seed, worked_steps)
        rubric = math_rubric(correct_weight, format_weight)
        rubric.terms.append(RubricTerm("digit_match", DigitMatchVerifier(), digit_match_weight))
        if worked_steps:
            rubric.terms.append(RubricTerm("steps", WorkedStepsVerifier(), steps_weight))
        elif steps_weight:
            raise ValueError("steps_weight needs worked_steps=True")
        if worked_steps and kwargs.get("prefill"):
            raise ValueError("prefill=True prefills the answer; a worked_steps task is scored on its steps")
        self.worked_steps = worked_steps
        super().__init__(tasks, rubric, instruction=instruction, **kwargs)

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score the action; with worked steps, also put `step_rewards` and `step_ends` in `info`."""
        obs, reward, terminated, info = super().respond(action)
        steps = info["details"].get("steps") if self.worked_steps else None
        if steps is not None:
            info["step_rewards"], info["step_ends"] = steps["step_rewards"], steps["step_ends"]
        return obs, reward, terminated, info

    def answer_stems(self, task: Task) -> list[str]:
        """Prefills that give the answer format for `task` (the format-controlled baseline's stems).

        The expression and an equals sign, `85+63 = `, which the model completes with the value:
        the form of an answer this env's verifier pays (`textgym.evaluation.figures`).
        """
        return [f"{task.metadata['expression']} = "]

    def task_category(self, task: Task) -> str:
        """Where `task`'s difficulty lies, for error splits (`textgym.evaluation.figures.error_split`).

        A sum of two: "carry" when a column's digits sum past 9 and carry into a column the
        operands share (`85+67`), else "no carry" (`85+63`: the tens' 14 only writes a leading 1).
        A difference of two: "borrow", "no borrow" or "negative". Otherwise "".
        """
        numbers, ops = parse_expression(str(task.metadata["expression"]))
        if len(ops) != 1 or ops[0] not in "+-":
            return ""
        a, b = numbers
        if ops[0] == "+":
            carry, x, y = 0, a, b
            while x and y:  # the columns both operands have digits in
                carry = (x % 10 + y % 10 + carry) // 10
                x, y = x // 10, y // 10
                if carry and (x or y):
                    return "carry"
            return "no carry"
        if a < b:
            return "negative"
        x, y = a, b
        while y:
            if x % 10 < y % 10:
                return "borrow"
            x, y = x // 10, y // 10
        return "no borrow"

    def oracle_tool_call(self, tools: Sequence[str] = ("calculator",)) -> tuple[str, dict[str, str]] | None:
        """The call a scripted expert makes first, given the names of the `tools` offered.

        The calculator on the expression, or, without a calculator, a `python` program printing
        it; None before `reset()` or when neither is offered.
        """
        if self.task is None:
            return None
        expr = str(self.task.metadata["expression"])
        if "calculator" in tools:
            return "calculator", {"expression": expr}
        return ("python", {"code": f"print({expr})"}) if "python" in tools else None
