r"""The expressions a question writes: found in its text, then read as structural forms.

The question half of the answer rule's rule 4 (`textgym.verifiers.restatement`): `posed_texts`
cuts a question into the expressions it writes (its math segments, split at relations and
commas, and arithmetic written in prose), `posed_fractions` finds the fractions of whole numbers
it writes, and `posed` reads both as canonical forms (`textgym.verifiers.expression_forms`), in
the math-verify worker (`textgym.verifiers._math_worker`, op "posed"). The reward-hack probes
(`textgym.evaluation.hack_probes`) build restated replies from `posed_texts` and `posed_fractions`.
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

from textgym.verifiers.answer_text import normalize_unicode
from textgym.verifiers.expression_forms import _RELATIONS, _product, _read, form_key, is_atom

MAX_SEGMENTS = 64
"""At most this many expressions of one question are read."""

_MATH_SEGMENT = re.compile(
    r"(?<!\\)\$\$(.+?)(?<!\\)\$\$|(?<!\\)\$(.+?)(?<!\\)\$|\\\[(.+?)\\\]|\\\((.+?)\\\)"
    r"|\\begin\{(?:align|equation|gather|multline|eqnarray)\*?\}(.+?)\\end\{(?:align|equation|gather|multline|eqnarray)\*?\}",
    re.DOTALL,
)
_OPERAND = (
    r"(?:[0-9]+(?:\.[0-9]+)?|\\[dtc]?frac\s*\{[^{}]*\}\s*\{[^{}]*\}|\\sqrt\s*\{[^{}]*\}"
    r"|[０-９]+|[\u0660-\u0669]+|[\u06f0-\u06f9]+)"
)
_PLAIN_OP = r"(?:[-+*/^×÷·⋅−∗∕⁄:]|\*\*|\\(?:times|div|cdot))"
_PLAIN_EXPR = re.compile(
    rf"[(\[]*\s*[-+−]?\s*{_OPERAND}\s*[)\]]*(?:\s*{_PLAIN_OP}\s*[(\[]*\s*[-+−]?\s*{_OPERAND}\s*[)\]]*)*"
)
_SPLIT_AT = re.compile(
    r"\\(?:le|leq|ge|geq|ne|neq|approx|equiv|quad|qquad|implies|iff|Rightarrow|text\s*\{\s*(?:and|or)\s*\})(?![A-Za-z])"
    r"|\\\\|&|=|<|>|,|;"
)


def _top_level_parts(segment: str) -> list[str]:
    """`segment` split at relations, commas, `&`, `\\\\` and `\\quad` outside brackets."""
    parts, depth, start, i = [], 0, 0, 0
    while i < len(segment):
        c = segment[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth = max(0, depth - 1)
        if depth == 0:
            m = _SPLIT_AT.match(segment, i)
            if m and m.end() > i:
                parts.append(segment[start:i])
                start = i = m.end()
                continue
        i += 1
    parts.append(segment[start:])
    return [p.strip() for p in parts if p.strip()]


def _balanced(text: str) -> str:
    """`text` without unmatched leading `(`/`[` or trailing `)`/`]` (a plain span cut from prose)."""
    t = text.strip()
    for _ in range(len(t)):
        if t[:1] in "([" and t.count(t[0]) > t.count(")" if t[0] == "(" else "]"):
            t = t[1:].strip()
        elif t[-1:] in ")]" and t.count(t[-1]) > t.count("(" if t[-1] == ")" else "["):
            t = t[:-1].strip()
        else:
            break
    return t


def posed_texts(question: str) -> list[str]:
    r"""The expressions `question` writes, as text: its math segments' parts, and arithmetic in prose.

    Math segments are `$...$`, `$$...$$`, `\[...\]`, `\(...\)` and align/equation
    environments, each split at relations (`=`, `<`, `\le`, ...), commas, `&` and line breaks
    outside brackets. Outside them, a run of numbers (or `\frac{}{}`/`\sqrt{}`) joined by
    operators (`84/12`, `5+12*3`, `7 × 8`) is an expression too. Runs without an operator are
    left out, and at most `MAX_SEGMENTS` texts are returned.

    Examples:
        >>> posed_texts("Compute 84/12.")
        ['84/12']
        >>> posed_texts(r"If $f(x) = \frac{3x-2}{x-2}$, what is $f(-2)$?")
        ['f(x)', '\\frac{3x-2}{x-2}', 'f(-2)']
    """
    texts: list[str] = []
    prose_parts: list[str] = []
    last = 0
    for m in _MATH_SEGMENT.finditer(question):
        prose_parts.append(question[last : m.start()])
        last = m.end()
        segment = next(g for g in m.groups() if g is not None)
        texts.extend(_top_level_parts(segment))
    prose_parts.append(question[last:])
    for prose in prose_parts:
        for m in _PLAIN_EXPR.finditer(prose):
            span = _balanced(m.group(0))
            if re.search(_PLAIN_OP, span[1:]) or "\\" in span:
                texts.append(span)
    seen: list[str] = []
    for t in (x.rstrip(".,;: ") for x in texts):
        if t and t not in seen:
            seen.append(t)
    return seen[:MAX_SEGMENTS]


_FRACTION_TEXT = re.compile(
    r"\\[dtc]?frac\s*\{\s*(-?[0-9]+)\s*\}\s*\{\s*([0-9]+)\s*\}|\\[dtc]?frac\s*([0-9])\s*([0-9])"
    r"|(?<![0-9.}])(-?[0-9]+)\s*(?:/|\\div(?![A-Za-z])|÷|∕|⁄)\s*([0-9]+)(?![0-9]|\.[0-9])"
)
"""A fraction of whole numbers a question writes: `\\frac{a}{b}`, `\\frac ab`, `a/b`, `a \\div b`, `a ÷ b`."""


def posed_fractions(question: str) -> list[list[int]]:
    r"""The fractions of whole numbers `question` writes, `[numerator, denominator]`, in order, once each.

    `\frac{a}{b}` (`\dfrac`, `\tfrac`, `\frac ab`), `a/b`, `a \div b`, `a ÷ b` (fullwidth and other
    decimal digits read as digits); a zero denominator is left out.

    Examples:
        >>> posed_fractions(r"Compute 84/12. Then $\dfrac{-3}{4}$, and 5 ÷ 0.")
        [[84, 12], [-3, 4]]
    """
    out: list[list[int]] = []
    for m in _FRACTION_TEXT.finditer(normalize_unicode(question)):
        a, b = (int(g) for g in m.groups() if g is not None)
        if b != 0 and [a, b] not in out:
            out.append([a, b])
    return out


def posed(question: str) -> dict[str, Any]:
    r"""What `question` poses: the forms of its expressions, its fractions and the expressions' text.

    Each text of `posed_texts` is read by `value_form`'s parser; an equation, inequality, list or
    set contributes each side or element. Forms of a single number or symbol are left out (an
    answer may be a number the question writes). Every division of two whole numbers written
    anywhere in the question (`\frac{84}{12}` inside a larger expression, too) is a posed form
    and a posed fraction.

    Args:
        question: the task's question (`Task.prompt`).

    Returns:
        `{"forms": [form_key...], "fractions": [[a, b]...], "expressions": [text...]}`, the
        expressions being the texts with at least one posed form, in question order.

    Examples:
        >>> from textgym.verifiers.expression_forms import value_form
        >>> p = posed("Compute 84/12.")
        >>> p["fractions"], p["expressions"], form_key(value_form(r"\dfrac{84}{12}")) in p["forms"]
        ([[84, 12]], ['84/12'], True)
    """
    forms: list[str] = []
    fractions: list[list[int]] = []
    expressions: list[str] = []
    for text in posed_texts(question):
        read = _read(text)
        if read is None:
            continue
        found = False
        stack = [read[0]]
        while stack:
            f = stack.pop()
            key = f[1]
            if key[0] == "node" and key[1] in (*_RELATIONS, "And", "Or", "FiniteSet", "Tuple", "Interval"):
                stack.extend(key[2])
                continue
            if is_atom(f):
                continue
            found = True
            if form_key(f) not in forms:
                forms.append(form_key(f))
        if found:
            expressions.append(text)
    for a, b in posed_fractions(question):
        fractions.append([a, b])
        numerator = [] if abs(a) == 1 else [(("num", Fraction(abs(a))), Fraction(1))]
        written = form_key(_product(-1 if a < 0 else 1, [*numerator, (("num", Fraction(b)), Fraction(-1))]))
        if written not in forms:
            forms.append(written)
    return {"forms": forms, "fractions": fractions, "expressions": expressions}
