"""`calculator`: evaluates arithmetic expressions safely (simpleeval: an AST walker, no `eval`)."""

from __future__ import annotations

import math

import simpleeval

from textgym.tools.base import Tool

MAX_EXPRESSION_CHARS = 500
_FUNCTIONS = {
    "sqrt": math.sqrt,
    "abs": abs,
    "round": round,
    "floor": math.floor,
    "ceil": math.ceil,
    "log": math.log,
    "exp": math.exp,
    "min": min,
    "max": max,
}


def calculate(expression: str) -> str:
    """Evaluate an arithmetic expression without `eval` (simpleeval walks its syntax tree).

    Operators + - * / // % ** and parentheses; functions sqrt, abs, round, floor, ceil, log,
    exp, min, max; constants pi, e. Integers stay exact; floats print with up to 12
    significant digits.

    Raises:
        ValueError: on an empty or over-long expression, or one simpleeval rejects (names,
            attribute access, huge powers, strings).
    """
    if not expression.strip():
        raise ValueError("empty expression")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    evaluator = simpleeval.SimpleEval(functions=_FUNCTIONS, names={"pi": math.pi, "e": math.e})
    try:
        value = evaluator.eval(expression.replace("^", "**").replace("×", "*").replace("÷", "/"))
    except (simpleeval.InvalidExpression, SyntaxError, ZeroDivisionError, OverflowError, TypeError) as e:
        raise ValueError(f"cannot evaluate {expression!r}: {type(e).__name__}: {e}") from None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{expression!r} is not a number")
    if isinstance(value, float):
        if value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return f"{value:.12g}"
    return str(value)


def calculator_tool() -> Tool:
    """The `calculator` tool (see `calculate`)."""
    return Tool(
        name="calculator",
        description="Evaluate an arithmetic expression, e.g. '(17 + 5) * 3 / 4' or 'sqrt(2) * pi'.",
        parameters={
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "The expression to evaluate."}},
            "required": ["expression"],
            "additionalProperties": False,
        },
        fn=calculate,
    )
