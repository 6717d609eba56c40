r"""Rule 5 of the answer rule: the form the question asks for, and whether an answer is written in it.

"Express your answer as a common fraction" asks for `\frac{14}{3}`, not `4.666667`; "in simplest
radical form" for `3\sqrt{13}`, not `\sqrt{117}`. An equivalence checker pays both, so a policy
learns to skip the last step of every problem. A **form** is a property of the written answer,
not of its value, that a question names with one of these phrases (`requested_forms`):

- `common_fraction` ("common fraction", "improper fraction", "as a fraction", "in lowest terms",
  "simplest fractional form"): no decimal, no mixed number, every fraction of whole numbers in
  lowest terms (`\frac{14}{3}`, `\frac{\pi}{6}`; not `4.666667`, `4\frac{2}{3}`, `\frac{28}{6}`);
- `mixed_number` ("mixed number"): `a\frac{b}{c}` or `a b/c` with `0 < b < c` coprime (or a whole
  number, or a proper fraction);
- `decimal` ("as a decimal", "to a terminating decimal", "to the nearest tenth", ...): a decimal
  number literal, units allowed (not `\frac{9}{2}`);
- `radical` ("simplest radical form", "radical form"): every root of a number is of a whole number
  free of that power (not `\sqrt{117}`: 9 divides 117), no radical in a denominator, coefficients
  reduced (not `\frac{6\sqrt{13}}{4}`), no decimal;
- `rational_denominator` ("rational denominator", "rationalize the denominator"): no root of a
  number in a denominator (not `\frac{1}{\sqrt3}`, `\frac{1}{1+\sqrt2}`);
- `factored` ("Factor ...", "factor completely", "factored form"): a product whose every factor is
  irreducible over the rationals with coprime integer coefficients (not `x(x^2-4)`, `(6x+3)(x+1)`);
- `interval` ("interval notation"): intervals `(a, b]` joined by `\cup`, `x \in` allowed in front
  (not a set `\{x \mid x > 5\}`, an inequality, `\mathbb{R}`, `\mathbb{R} \setminus [2,3]`);
- `template` ("express / enter / write your answer (the equation, ...) in the form $T$"): `T` with
  numbers for its placeholders, the letters of `T` the gold does not use (`6r^2-4r-24` for
  `Ar^2+Br+C`, `y = -2x` for `y = mx + b`; a placeholder 0 drops its term, 1 its factor, and a
  sign moves in front; not `2(3r^2-2r-12)`). "Can be written in the form ..." describes a step,
  not the answer, and asks for nothing.

A form is checked only when the gold answer, as written, is in it (`check_forms`): the gold
defines what the phrase means for the task, so no gold answer can fail its own rule, and a
phrase the checker reads differently from the task's author checks nothing. The checks read the
written structure (`textgym.verifiers.expression_forms`: math-verify's LaTeX parser with numbers
kept as written) and, for `factored`, sympy's irreducibility test over the rationals. They run in
the math-verify worker (op "in_form", `textgym.verifiers.math_pool.read_forms`), killed past its
time budget. "Simplify" alone names no form here: the restatement rule (rule 4) covers the
question's own expression.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from math import gcd
from typing import Any

from textgym.verifiers.answer_text import normalize_unicode, number_literal, squash
from textgym.verifiers.expression_forms import _RELATIONS, MAX_DEPTH, Form, Key
from textgym.verifiers.form_templates import _form_of, _has_symbols, _keys, _plain, _sympy, matches_template

FORMS = (
    "common_fraction",
    "mixed_number",
    "decimal",
    "radical",
    "rational_denominator",
    "factored",
    "interval",
    "template",
)
"""The forms a question can ask for (module table)."""

_PHRASES: dict[str, re.Pattern[str]] = {
    "common_fraction": re.compile(
        r"\b(?:common|improper|simplified|reduced)\s+fraction|\bas\s+an?\s+(?:single\s+)?fraction\b"
        r"|\bsimplest\s+fractional\s+form|\bfraction\s+in\s+(?:simplest|lowest)\s+(?:form|terms)"
        r"|\bin\s+lowest\s+terms",
        re.IGNORECASE,
    ),
    "mixed_number": re.compile(r"\bmixed\s+number", re.IGNORECASE),
    "decimal": re.compile(
        r"\b(?:as|to|into)\s+a\s+(?:terminating\s+)?decimal\b|\bin\s+decimal\s+form|\bdecimal\s+to\s+the\s+nearest"
        r"|\bnearest\s+(?:tenth|hundredth|thousandth|ten-thousandth)s?\b",
        re.IGNORECASE,
    ),
    "radical": re.compile(r"\bradical\s+form", re.IGNORECASE),
    "rational_denominator": re.compile(
        r"\brational\s+denominator|\brationali[sz]e\s+(?:the\s+)?denominator", re.IGNORECASE
    ),
    "factored": re.compile(
        r"(?:^|[.!?:]\s+)(?:completely\s+|fully\s+)?factor(?:i[sz]e)?\s+(?!of\b)|\bfactored\s+form"
        r"|\bfactor\s+(?:it\s+)?(?:completely|fully)|\b(?:completely|fully)\s+factor",
        re.IGNORECASE,
    ),
    "interval": re.compile(r"\binterval\s+notation", re.IGNORECASE),
}
_TEMPLATE = re.compile(
    r"\b(?:express|enter|write|give|put|present|state)\s+(?:your\s+answer|the\s+(?:answer|result|equation"
    r"|expression|polynomial|line|plane|quadratic)(?:\s+of\s+(?:this|the)\s+\w+)?|it)\s+in\s+the\s+form"
    r"\s*:?\s*[\"“]?\s*(?:\$\$(?P<a>.+?)\$\$|\$(?P<b>.+?)\$|\\\[(?P<c>.+?)\\\]|\\\((?P<d>.+?)\\\))",
    re.IGNORECASE | re.DOTALL,
)


@dataclass(frozen=True)
class RequestedForm:
    """A form a question asks its answer to be written in.

    Attributes:
        name: one of `FORMS`.
        phrase: the question's words that ask for it.
        template: for "template", the form's LaTeX (`Ar^2 + Br + C`); else None.
    """

    name: str
    phrase: str
    template: str | None = None


def requested_forms(question: str) -> list[RequestedForm]:
    r"""The forms `question` asks its answer to be written in (module table), in `FORMS` order.

    Args:
        question: the task's question.

    Returns:
        One `RequestedForm` per form asked for ([] for most questions).

    Examples:
        >>> [f.name for f in requested_forms("What is $f(-2)$? Express your answer as a common fraction.")]
        ['common_fraction']
        >>> requested_forms(r"Simplify it, and express your answer in the form $Ar^2 + Br + C$.")[0].template
        'Ar^2 + Br + C'
        >>> requested_forms("The quadratic can be written in the form $(x+b)^2+c$. What is $b+c$?")
        []
    """
    q = normalize_unicode(question)
    out = []
    for name, pattern in _PHRASES.items():
        m = pattern.search(q)
        if m is not None:
            out.append(RequestedForm(name, m.group(0).strip(" .!?:")))
    m = _TEMPLATE.search(q)
    if m is not None:
        template = next(g for g in m.group("a", "b", "c", "d") if g is not None).strip().rstrip(".,;: ")
        out.append(RequestedForm("template", m.group(0).strip(), template))
    return out


# --- lexical checks ---------------------------------------------------------------------------------

_DECIMAL_IN_TEXT = re.compile(r"(?<![0-9A-Za-z_])[0-9]*\.[0-9]+")
_MIXED = re.compile(r"[0-9]\s*\\[dtc]?frac|(?<![0-9.])[0-9]+\s+[0-9]+\s*/\s*[0-9]+")
_MIXED_NUMBER = re.compile(
    r"[+-]?(?P<whole>[0-9]+)\s*(?:\\[dtc]?frac\s*\{?\s*(?P<n1>[0-9]+)\s*\}?\s*\{?\s*(?P<d1>[0-9]+)\s*\}?"
    r"|(?P<n2>[0-9]+)\s*/\s*(?P<d2>[0-9]+))"
)
_DECIMAL_LITERAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]+)?|\.[0-9]+)")
_IN_SET = re.compile(r"^[A-Za-z]\s*\\in(?![A-Za-z])\s*")


def _mixed_number(text: str) -> bool:
    """Whether `text` is a mixed number with a proper fraction part, a whole number or a proper fraction."""
    literal = number_literal(text)
    if literal is not None:
        if re.fullmatch(r"[+-]?[0-9]+", literal):
            return True
        m = re.fullmatch(r"[+-]?\\[dtc]?frac\{?([0-9]+)\}?\{?([0-9]+)\}?|[+-]?([0-9]+)/([0-9]+)", literal)
        if m is not None:
            n, d = (int(g) for g in m.groups() if g is not None)
            return 0 < n < d and gcd(n, d) == 1
        return False
    m = _MIXED_NUMBER.fullmatch(squash(text).replace("\\frac", "\\frac ").strip()) or _MIXED_NUMBER.fullmatch(
        text.strip()
    )
    if m is None:
        return False
    n, d = int(m.group("n1") or m.group("n2")), int(m.group("d1") or m.group("d2"))
    return 0 < n < d and gcd(n, d) == 1


def _interval_notation(text: str) -> bool:
    r"""Whether `text` is intervals `(a, b]` joined by `\cup` (or `U`), with an optional `x \in` in front."""
    t = _IN_SET.sub("", squash(text))
    if t in ("\\emptyset", "\\varnothing", "\\{\\}"):
        return True
    pieces, depth, start = [], 0, 0
    i = 0
    while i < len(t):
        c = t[i]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and (t.startswith("\\cup", i) or c == "U"):
            pieces.append(t[start:i])
            i += 4 if c == "\\" else 1
            start = i
            continue
        i += 1
    pieces.append(t[start:])
    for p in pieces:
        if len(p) < 5 or p[0] not in "([" or p[-1] not in ")]" or "\\{" in p:
            return False
        inner, depth, commas = p[1:-1], 0, 0
        for c in inner:
            depth += c in "([{"
            depth -= c in ")]}"
            commas += depth == 0 and c == ","
        if commas != 1 or depth != 0:
            return False
    return True


# --- structural checks (run in the math-verify worker) -------------------------------------------------


def _numeric_radical(key: Key) -> bool:
    """Whether `key` holds a root of a number (`\\sqrt{2}`, `3^{1/3}`)."""
    return any(
        isinstance(exp, Fraction) and exp.denominator > 1 and not _has_symbols(base)
        for k in _keys(key)
        if k[0] == "mul"
        for base, exp in k[1]
    )


def _radical_in_denominator(key: Key) -> bool:
    """Whether a root of a number sits in a denominator (a negative power of something holding one)."""
    for k in _keys(key):
        if k[0] != "mul":
            continue
        for base, exp in k[1]:
            if isinstance(exp, Fraction) and exp < 0 and (exp.denominator > 1 or _numeric_radical(base)):
                return True
    return False


def _coefficients_reduced(key: Key) -> bool:
    """Whether each product's whole-number numerator and denominator are coprime (not `6\\sqrt2/4`)."""
    for k in _keys(key):
        if k[0] != "mul":
            continue
        top = bottom = 1
        for base, exp in k[1]:
            if (
                base[0] == "num"
                and isinstance(exp, Fraction)
                and exp.denominator == 1
                and base[1].denominator == 1
            ):
                if exp > 0:
                    top *= int(base[1]) ** int(exp)
                else:
                    bottom *= int(base[1]) ** int(-exp)
        if bottom > 1 and gcd(top, bottom) != 1:
            return False
    return True


def _radicands_simplified(key: Key) -> bool:
    """Whether each root of a number is of a whole number free of that power (not `\\sqrt{117}`: 9 | 117)."""
    from sympy import factorint

    for k in _keys(key):
        if k[0] != "mul":
            continue
        for base, exp in k[1]:
            if not isinstance(exp, Fraction) or exp.denominator == 1 or _has_symbols(base):
                continue
            if base[0] != "num" or base[1].denominator != 1:
                return False  # a root of a fraction, a decimal or an expression of numbers
            value = int(base[1])
            if value > 10**15:
                continue
            if any(e >= exp.denominator for e in factorint(value, limit=10**6).values()):
                return False
    return True


def _factored(form: Form) -> bool | None:
    """Whether `form` is a product of irreducible, primitive factors over Q (None: not a polynomial)."""
    import sympy

    key = form[1]
    factors = list(key[1]) if key[0] == "mul" else [(key, Fraction(1))]
    for base, exp in factors:
        if not _has_symbols(base):
            continue
        if not isinstance(exp, Fraction) or exp.denominator != 1 or exp < 0:
            return None
        expr = _sympy(base)
        try:
            poly = sympy.Poly(expr, *sorted(expr.free_symbols, key=str))
        except sympy.PolynomialError:
            return None
        if poly.total_degree() < 1:
            continue
        if poly.get_domain() not in (sympy.ZZ, sympy.QQ):
            return None
        if not poly.is_irreducible or (poly.get_domain() == sympy.ZZ and abs(poly.content()) != 1):
            return False
    return True


# --- templates ------------------------------------------------------------------------------------------


# --- the check -------------------------------------------------------------------------------------------


def in_form(answer: str, form: str, template: str | None = None, gold: str | None = None) -> bool | None:
    r"""Whether `answer` is written in `form` (module table); None when its structure cannot be read.

    Args:
        answer: the answer (LaTeX; wrappers and units allowed).
        form: one of `FORMS`.
        template: the form's LaTeX, for "template".
        gold: the gold answer, for "template" (which letters are placeholders).

    Raises:
        ValueError: an unknown `form` (a programming error).

    Examples:
        >>> in_form(r"\frac{14}{3}", "common_fraction"), in_form("4.666667", "common_fraction")
        (True, False)
        >>> in_form(r"3\sqrt{13}", "radical"), in_form(r"\sqrt{117}", "radical")
        (True, False)
        >>> in_form(r"\frac{1}{\sqrt3}", "rational_denominator"), in_form(r"\{x \mid x > 5\}", "interval")
        (False, False)
        >>> in_form("(a+5)(b+2)", "factored"), in_form("x(x^2-4)", "factored")
        (True, False)
    """
    if form not in FORMS:
        raise ValueError(f"unknown form {form!r}; forms: {', '.join(FORMS)}")
    text = _plain(answer)
    if not text:
        return False
    if form == "mixed_number":
        return _mixed_number(text)
    if form == "decimal":
        literal = number_literal(text)
        return literal is not None and _DECIMAL_LITERAL.fullmatch(literal) is not None
    if form == "interval":
        return _interval_notation(text)
    if form == "template":
        return None if template is None else matches_template(text, template, gold)
    if form in ("common_fraction", "radical") and (_DECIMAL_IN_TEXT.search(text) or _MIXED.search(text)):
        return False
    parsed = _form_of(text)
    for _ in range(MAX_DEPTH):  # an equation states its last side (`ab+5b+2a+10 = (a+5)(b+2)`)
        if parsed is not None and parsed[1][0] == "node" and parsed[1][1] in (*_RELATIONS, "And"):
            parsed = parsed[1][2][-1]
    if parsed is None:
        return None
    try:
        return _structural(parsed, form)
    except Exception:  # sympy on a structure it does not take: unreadable, not a verdict
        return None


def _structural(parsed: Form, form: str) -> bool | None:
    """The structural check of `form` on a parsed answer (`in_form`)."""
    if form == "common_fraction":
        return _coefficients_reduced(parsed[1])
    if form == "rational_denominator":
        return not _radical_in_denominator(parsed[1])
    if form == "radical":
        key = parsed[1]
        return _radicands_simplified(key) and not _radical_in_denominator(key) and _coefficients_reduced(key)
    return _factored(parsed)


def check_forms(answer: str, gold: str | None, forms: list[dict[str, Any]]) -> dict[str, Any]:
    r"""Rule 5 for one answer: the first requested form the gold is in and the answer is not.

    Args:
        answer: the final answer.
        gold: the gold answer (a form it is not in, or that cannot be read in it, is not checked);
            None to check every form (the hack telemetry, which reads no gold).
        forms: the requested forms, as `{"name": ..., "template": ...}`.

    Returns:
        `{"failed": name or None, "unreadable": bool, "checked": [names]}`: `unreadable` when a
        checked form could not be read in the answer.

    Examples:
        >>> check_forms("4.666667", r"\frac{14}{3}", [{"name": "common_fraction"}])["failed"]
        'common_fraction'
        >>> check_forms(r"\frac{1}{4}", "0.25", [{"name": "common_fraction"}])["checked"]  # a decimal gold
        []
    """
    checked: list[str] = []
    for f in forms:
        name, template = str(f["name"]), f.get("template")
        if gold is not None and in_form(gold, name, template, gold) is not True:
            continue
        checked.append(name)
        verdict = in_form(answer, name, template, gold)
        if verdict is None:
            return {"failed": name, "unreadable": True, "checked": checked}
        if not verdict:
            return {"failed": name, "unreadable": False, "checked": checked}
    return {"failed": None, "unreadable": False, "checked": checked}
