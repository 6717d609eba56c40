"""Verifiers: callables `(completion, task) -> Score`, combined by a weighted `Rubric`."""

from textgym.verifiers.base import Rubric, RubricTerm, Score, Verifier
from textgym.verifiers.code import CodeVerifier, extract_code
from textgym.verifiers.format import FormatVerifier
from textgym.verifiers.math import DigitMatchVerifier, MathVerifier, extract_answer, math_equal

__all__ = [
    "CodeVerifier",
    "DigitMatchVerifier",
    "FormatVerifier",
    "MathVerifier",
    "Rubric",
    "RubricTerm",
    "Score",
    "Verifier",
    "extract_answer",
    "extract_code",
    "math_equal",
]
