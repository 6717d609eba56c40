"""Template matching for the answer-form checks: an answer against "in the form $T$" questions.

`matches_template` reads a question's template (`$a\\sqrt{b}$`, `$\\frac{a}{b}$`, `$(x-a)(x-b)$`) and
an answer as written forms (`textgym.verifiers.expression_forms`) and says whether the answer
fills the template's placeholders with numbers; `_plain`, `_form_of`, `_keys` and `_has_symbols`
are the readers `textgym.verifiers.answer_forms` shares with it.
"""

from __future__ import annotations

import re
from fractions import Fraction
from itertools import permutations
from typing import Any

from textgym.verifiers.answer_text import normalize_unicode, unwrap
from textgym.verifiers.expression_forms import Form, Key, _read

_TRAILING_UNIT = re.compile(
    r"\s*(?:\\(?:text|textnormal|textit|textrm|textbf|mbox|mathrm)\s*\{[^{}]*[A-Za-z]{2,}[^{}]*\}"
    r"|\\%|%|\^\s*\\circ|\^\s*\{\s*\\circ\s*\}|°)$"
)


def _plain(text: str) -> str:
    """`text` in ASCII look-alikes, without typeset units after it (`\\text{ cm}`, degrees), unwrapped.

    A bare word after a space stays (`2x + 3 = y` ends on a variable, not a unit).
    """
    t = unwrap(normalize_unicode(text), keep_words=True).strip().rstrip(".").strip()
    for _ in range(4):
        stripped = _TRAILING_UNIT.sub("", t).strip()
        if stripped == t:
            break
        t = stripped
    return unwrap(t)


def _form_of(text: str) -> Form | None:
    """The written form of `text` (`expression_forms`), a lone `{x}` read as `x`; None when unreadable."""
    read = _read(text)
    if read is None:
        return None
    form = read[0]
    if form[1][0] == "node" and form[1][1] == "FiniteSet" and len(form[1][2]) == 1:
        return form[1][2][0]
    return form


def _keys(key: Key) -> list[Key]:
    """`key` and every key below it (bases, exponents, terms, children)."""
    out, stack = [], [key]
    while stack:
        k = stack.pop()
        out.append(k)
        if k[0] == "add" or k[0] == "node":
            stack.extend(f[1] for f in k[-1])
        elif k[0] == "mul":
            for base, exp in k[1]:
                stack.append(base)
                if not isinstance(exp, Fraction):
                    stack.append(exp[1])
        elif k[0] == "neg":
            stack.append(k[1])
    return out


def _has_symbols(key: Key) -> bool:
    """Whether `key` writes a variable (a sympy Symbol; constants such as pi are not)."""
    return any(k[0] == "sym" for k in _keys(key))


_ATOMS = {"Pi": "pi", "Exp1": "E", "ImaginaryUnit": "I", "Infinity": "oo", "NegativeInfinity": "-oo"}


def _sympy(key: Key) -> Any:
    """The sympy expression a form's key writes (evaluated: for algebra on one factor, not for its form)."""
    import sympy

    kind = key[0]
    if kind == "num":
        return sympy.Rational(key[1].numerator, key[1].denominator)
    if kind == "sym":
        return sympy.Symbol(key[1])
    if kind == "atom":
        return sympy.sympify(_ATOMS.get(key[1], key[2]))
    if kind == "neg":
        return -_sympy(key[1])
    if kind == "add":
        return sympy.Add(*[s * _sympy(k) for s, k in key[1]])
    if kind == "mul":
        return sympy.Mul(
            *[
                sympy.Pow(
                    _sympy(b),
                    sympy.Rational(e.numerator, e.denominator)
                    if isinstance(e, Fraction)
                    else e[0] * _sympy(e[1]),
                )
                for b, e in key[1]
            ]
        )
    function = getattr(sympy, key[1], None)
    if function is None:
        raise ValueError(f"no sympy function {key[1]!r}")
    return function(*[s * _sympy(k) for s, k in key[2]])


def _symbols(key: Key) -> set[str]:
    """The variable names `key` writes."""
    return {k[1] for k in _keys(key) if k[0] == "sym"}


def _is_placeholder(key: Key, placeholders: frozenset[str]) -> bool:
    return key[0] == "sym" and key[1] in placeholders


def _pairs(form: Form) -> list[tuple[Key, Any]]:
    """A term as (base, exponent) factors: a product's own, or the term itself to the power 1."""
    return list(form[1][1]) if form[1][0] == "mul" else [(form[1], Fraction(1))]


def _term_matches(template: Form, answer: Form, placeholders: frozenset[str]) -> bool:
    """Whether one answer term is one template term with numbers for its placeholder factors."""
    t_pairs = _pairs(template)
    free = [p for p in t_pairs if _is_placeholder(p[0], placeholders) and p[1] == 1]
    fixed = [p for p in t_pairs if p not in free]
    a_pairs = _pairs(answer)
    variable = [p for p in a_pairs if _has_symbols(p[0]) or not isinstance(p[1], Fraction)]
    constant = [p for p in a_pairs if p not in variable]
    if len(fixed) != len(variable):
        return False
    if not free and (constant or template[0] != answer[0]):
        return False
    return any(
        all(
            _matches((1, tb), (1, ab), placeholders)
            and (te == ae if isinstance(te, Fraction) else _matches(te, ae, placeholders))
            for (tb, te), (ab, ae) in zip(fixed, order, strict=True)
        )
        for order in permutations(variable)
    )


def _matches(template: Form, answer: Form, placeholders: frozenset[str]) -> bool:
    """Whether `answer` is `template` with numbers (no variables) written for its placeholders."""
    tk, ak = template[1], answer[1]
    if _is_placeholder(tk, placeholders):
        return not _has_symbols(ak)
    if tk[0] == "add":
        terms = list(ak[1]) if ak[0] == "add" else [answer]
        terms = [(answer[0] * s, k) for s, k in terms] if ak[0] == "add" else terms
        return _assign(list(tk[1]), terms, placeholders)
    if tk[0] == "mul":
        return _term_matches(template, answer, placeholders)
    if tk[0] == "node" and ak[0] == "node":
        pairs = {tk[1], ak[1]} <= {"Tuple", "Interval"}
        if tk[1] != ak[1] and not pairs:
            return False
        t_children, a_children = list(tk[2]), list(ak[2])
        if pairs:
            t_children, a_children = (
                t_children[:2] if tk[1] == "Interval" else t_children,
                a_children[:2] if ak[1] == "Interval" else a_children,
            )
        if len(t_children) != len(a_children) or template[0] != answer[0]:
            return False
        orders = [a_children, a_children[::-1]] if tk[1] == "Equality" else [a_children]
        return any(
            all(_matches(t, a, placeholders) for t, a in zip(t_children, o, strict=True)) for o in orders
        )
    if ak[0] == "add" and tk[0] != "add":
        return False
    return template == answer or (tk == ak and _has_placeholder(tk, placeholders))


def _has_placeholder(key: Key, placeholders: frozenset[str]) -> bool:
    return bool(_symbols(key) & placeholders)


def _assign(t_terms: list[Form], a_terms: list[Form], placeholders: frozenset[str]) -> bool:
    """Whether each answer term matches its own template term, the unmatched template terms dropping out."""
    if not a_terms:
        return all(_droppable(t, placeholders) for t in t_terms)
    first, rest = a_terms[0], a_terms[1:]
    for i, t in enumerate(t_terms):
        fits = _term_matches if t[1][0] == "mul" else _matches
        if fits(t, first, placeholders) and _assign(t_terms[:i] + t_terms[i + 1 :], rest, placeholders):
            return True
    return False


def _droppable(term: Form, placeholders: frozenset[str]) -> bool:
    """Whether a template term vanishes when a placeholder is 0 (`Bx` with B = 0, a lone `C`)."""
    return any(_is_placeholder(b, placeholders) and e == 1 for b, e in _pairs(term))


def matches_template(answer: str, template: str, gold: str | None = None) -> bool | None:
    r"""Whether `answer` is written in the form `template`, its placeholders filled with numbers.

    The placeholders are the letters of `template` that `gold` does not write (without a gold,
    every capital letter and every letter of `template` not in `answer`). A placeholder 0 drops
    its term, 1 its factor, and a negative number puts its sign in front of the term; the
    equation's sides may swap; each answer term fills one template term (`2r^2 + r^2` is not
    `Ar^2 + C`).

    Args:
        answer: the answer's LaTeX.
        template: the form's LaTeX (`Ar^2 + Br + C`, `y = mx + b`, `(r, \theta)`).
        gold: the gold answer, which tells variables from placeholders.

    Returns:
        True or False; None when either text is unreadable.

    Examples:
        >>> gold, form = "6r^2-4r-24", "Ar^2 + Br + C"
        >>> matches_template(gold, form, gold), matches_template("2(3r^2-2r-12)", form, gold)
        (True, False)
        >>> line, form = "y = 2x + 3", "y = mx + b"
        >>> matches_template("y = -2x", form, line), matches_template("y - 3 = 2x", form, line)
        (True, False)
    """
    t, a = _form_of(template), _form_of(_plain(answer))
    if t is None or a is None:
        return None
    if gold is not None:
        g = _form_of(_plain(gold))
        if g is None:
            return None
        placeholders = frozenset(_symbols(t[1]) - _symbols(g[1]))
    else:
        placeholders = frozenset(s for s in _symbols(t[1]) if s[:1].isupper() or s not in _symbols(a[1]))
    return _matches(t, a, placeholders)
