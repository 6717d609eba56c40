"""Verifiers: callables `(completion, task) -> Score`, combined by a weighted `Rubric`.

`JudgeVerifier` (an LLM judge behind an OpenAI-compatible endpoint, `textgym.verifiers.judge`)
is imported on first use, so `import textgym` does not load its HTTP client.
"""

from textgym._lazy import lazy_exports
from textgym.verifiers.answer_rule import AnswerCheck, check_answer
from textgym.verifiers.base import Rubric, RubricTerm, Score, Verifier
from textgym.verifiers.code import CodeVerifier, extract_code
from textgym.verifiers.extraction import extract_answer
from textgym.verifiers.format import FormatVerifier
from textgym.verifiers.math import DigitMatchVerifier, HedgeVerifier, MathVerifier
from textgym.verifiers.math_pool import math_equal

# imported from `textgym.verifiers.judge` when first asked for
__getattr__ = lazy_exports(
    __name__, {"JudgeItem": "textgym.verifiers.judge", "JudgeVerifier": "textgym.verifiers.judge"}
)

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
