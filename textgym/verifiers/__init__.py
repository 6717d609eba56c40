"""Verifiers: callables `(completion, task) -> Score`, combined by a weighted `Rubric`.

`JudgeVerifier` (an LLM judge behind an OpenAI-compatible endpoint, `textgym.verifiers.judge`)
is imported on first use, so `import textgym` does not load its HTTP client.
"""

from typing import Any

from textgym.verifiers.answer_rule import AnswerCheck, check_answer
from textgym.verifiers.base import Rubric, RubricTerm, Score, Verifier
from textgym.verifiers.code import CodeVerifier, extract_code
from textgym.verifiers.extraction import extract_answer
from textgym.verifiers.format import FormatVerifier
from textgym.verifiers.math import DigitMatchVerifier, HedgeVerifier, MathVerifier, math_equal

_LAZY = {"JudgeItem", "JudgeVerifier"}


def __getattr__(name: str) -> Any:
    """`JudgeVerifier` and `JudgeItem`, imported from `textgym.verifiers.judge` when first asked for."""
    if name in _LAZY:
        from textgym.verifiers import judge

        return getattr(judge, name)
    raise AttributeError(f"module 'textgym.verifiers' has no attribute {name!r}")


__all__ = [
    "AnswerCheck",
    "CodeVerifier",
    "DigitMatchVerifier",
    "FormatVerifier",
    "HedgeVerifier",
    "JudgeItem",
    "JudgeVerifier",
    "MathVerifier",
    "Rubric",
    "RubricTerm",
    "Score",
    "Verifier",
    "check_answer",
    "extract_answer",
    "extract_code",
    "math_equal",
]
