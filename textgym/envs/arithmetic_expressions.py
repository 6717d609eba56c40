"""Arithmetic expressions `n0 op0 n1 ...`: their exact value, the fact they pose, their worked steps.

The pure functions behind `textgym/Arithmetic-v0` (`textgym.envs.arithmetic`, which re-exports
them): `evaluate` with the usual precedence, `parse_expression`, `fact_key` (what holds a
test problem and its rearrangements apart from training ones) and `worked_steps` /
`worked_solution` (the step-by-step solution the worked-steps reward checks).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from fractions import Fraction

_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2}


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


def parse_expression(expr: str) -> tuple[list[int], list[str]]:
    """The operands and operators of a problem's expression: "5+12*3" -> ([5, 12, 3], ["+", "*"])."""
    tokens = re.findall(r"\d+|[-+*/]", expr)
    return [int(t) for t in tokens[::2]], tokens[1::2]


def fact_key(numbers: Sequence[int], ops: Sequence[str]) -> str:
    """The fact an expression poses, the same for every rearrangement that commutes or associates.

    The expression is read with the usual precedence into a sum of signed terms, each a product
    of factors with exponent ±1 (a division); the key is the sorted multiset of each, so
    `63+85` and `85+63` share a key, as do `3*4` and `4*3`, `2+6*3` and `3*6+2`, and `9-3+2`
    and `2-3+9` (not `9-3` and `3-9`, nor `8/2` and `2/8`). Held-out problems are kept apart
    from training ones by this key, not by their text.

    Examples:
        >>> fact_key([85, 63], ["+"]) == fact_key([63, 85], ["+"])
        True
        >>> fact_key([9, 3], ["-"]) == fact_key([3, 9], ["-"])
        False
    """
    terms: list[tuple[str, list[tuple[int, int]]]] = []  # (sign, [(factor, ±1)])
    sign, factors = "+", [(int(numbers[0]), 1)]
    for op, n in zip(ops, numbers[1:], strict=True):
        if op in "*/":
            factors.append((int(n), 1 if op == "*" else -1))
        else:
            terms.append((sign, factors))
            sign, factors = op, [(int(n), 1)]
    terms.append((sign, factors))
    return "".join(sorted(s + "*".join(f"{f}^{e}" for f, e in sorted(fs)) for s, fs in terms))


def worked_steps(numbers: Sequence[int], ops: Sequence[str]) -> list[tuple[int, str, int, int]]:
    """The operations of `n0 op0 n1 ...` in precedence order, as `(a, op, b, result)` tuples.

    Each step reduces the leftmost operator of the highest precedence left (× ÷ before + −, left
    to right), which is the order `evaluate` computes in.

    Raises:
        ZeroDivisionError, ValueError: as `evaluate` (a division by 0 or with a remainder).

    Examples:
        >>> worked_steps([5, 12, 3], ["+", "*"])
        [(12, '*', 3, 36), (5, '+', 36, 41)]
        >>> worked_steps([9, 3, 2], ["-", "+"])
        [(9, '-', 3, 6), (6, '+', 2, 8)]
    """
    nums, rest = [Fraction(n) for n in numbers], list(ops)
    out = []
    while rest:
        top = max(_PRECEDENCE[o] for o in rest)
        i = next(k for k, o in enumerate(rest) if _PRECEDENCE[o] == top)
        values = [nums[i], nums[i + 1]]
        _apply(values, rest[i])
        out.append((int(nums[i]), rest[i], int(nums[i + 1]), int(values[0])))
        nums[i : i + 2] = values
        del rest[i]
    return out


def worked_solution(numbers: Sequence[int], ops: Sequence[str]) -> str:
    r"""The worked computation: one operation per line in precedence order, then the boxed answer.

    Examples:
        >>> print(worked_solution([5, 12, 3], ["+", "*"]))
        12*3=36
        5+36=41
        \boxed{41}
    """
    lines = [f"{a}{op}{b}={c}" for a, op, b, c in worked_steps(numbers, ops)]
    return "\n".join([*lines, f"\\boxed{{{evaluate(numbers, ops)}}}"])
