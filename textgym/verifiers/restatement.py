r"""Rule 4 of the answer rule: whether an answer is the question's own expression written again.

`restates` reads the answer's text and structure without evaluating it: its canonical form
(`textgym.verifiers.expression_forms`) is compared with the forms of the expressions and fractions
the question writes, both read by the math-verify worker (`textgym.verifiers.math_pool.read_forms`).
Used by `textgym.verifiers.answer_rule.check_answer` and, with no gold answer, by the
reward-hacking telemetry (`textgym.verifiers.hack_telemetry`).
"""

from __future__ import annotations

import re

from textgym.verifiers.answer_text import fraction_parts, number_literal, squash, unwrap
from textgym.verifiers.expression_forms import MAX_DEPTH, MAX_FORM_CHARS, _depth
from textgym.verifiers.math_pool import read_forms

_MATHS = re.compile(r"[0-9+\-*/^=\\]")
"""Maths in a text (a digit, an operator, a command): words alone (`Evelyn`) may come from the question."""
_ATOM_TEXT = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+|[A-Za-z])$")


def restates(answer: str, question: str, gold: str | None = None, timeout_s: float = 10.0) -> bool | None:
    r"""Whether `answer` is the question's own expression again (rule 4), read without evaluating it.

    Two tests, on the answer unwrapped (`unwrap`):

    - its text: not a number literal, at least 3 characters, and part of the question's text
      (spaces, `$`, `\left`/`\right` ignored);
    - its structure: its canonical form (`textgym.verifiers.expression_forms`: numbers kept as
      written, notation, operand order, signs and identity operations forgotten) is the form
      of an expression the question writes, or of a fraction of whole numbers it writes. A
      single number or symbol is never a restatement (an answer may be a number the question
      mentions); a fraction is not a single number.

    Either way the gold answer as written (or an answer of the same form) is not a restatement.

    Args:
        answer: the final answer (as extracted; wrappers allowed).
        question: the task's question.
        gold: the gold answer, or None (telemetry: no gold known).
        timeout_s: budget in seconds for each parse (run in the math-verify worker).

    Returns:
        True or False, or None when the structure could not be read in time (or the answer is
        longer than `MAX_FORM_CHARS` or nested deeper than `MAX_DEPTH`, which no real answer is).

    Examples:
        >>> restates(r"\dfrac{84}{12}", "Compute 84/12."), restates("7", "Compute 84/12.")
        (True, False)
        >>> restates(r"1\cdot\left(4-k+3k-2\right)", r"Simplify $(-k + 4) + (-2 + 3k)$.", "2k+2")
        True
        >>> restates(r"\sqrt{242}", r"Simplify $\sqrt{242}$.", r"11\sqrt2")
        True
    """
    plain = unwrap(answer)
    gold_plain = unwrap(gold) if gold is not None else None
    a = squash(plain)
    literal = number_literal(plain)
    in_question = literal is None and len(a) >= 3 and bool(_MATHS.search(a)) and a in squash(unwrap(question))
    if in_question and (gold_plain is None or a != squash(gold_plain)):
        return True
    if (literal is not None and fraction_parts(literal) is None) or _ATOM_TEXT.match(a):
        return False
    if len(plain) > MAX_FORM_CHARS or _depth(plain) > MAX_DEPTH:
        return None
    posed = read_forms("posed", question, timeout_s)
    if not posed or not posed["forms"]:
        return False
    mine = read_forms("value_form", literal or plain, timeout_s)
    if mine is None:
        return None
    if mine["form"] is None or mine["atom"] or mine["form"] not in posed["forms"]:
        return False
    if gold_plain is not None:
        theirs = read_forms("value_form", number_literal(gold_plain) or gold_plain, timeout_s)
        if theirs is not None and theirs["form"] == mine["form"]:
            return False
    return True
