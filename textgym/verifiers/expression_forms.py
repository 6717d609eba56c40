r"""Structural forms of math expressions, read without evaluating them (for the answer rule's rule 4).

"Is this answer the question's own expression written again?" is a question about the
*written* expression, not its value: `\frac{84}{12}` and `7` have one value, but only the
first is the question "Compute 84/12." restated. `value_form` reads an expression with
math-verify's LaTeX parser (`latex2sympy2_extended`, which builds sympy trees with
`evaluate=False`) after hiding every number literal behind an opaque symbol, so that no
arithmetic between numbers is carried out (`\frac{84}{12}` stays a division of 84 by 12),
and then brings the tree to a canonical form that forgets notation only:

- notation: `a/b`, `\frac{a}{b}`, `\dfrac`, `a \div b`, `a \cdot b^{-1}`, `(a)/(b)`, `\cdot`,
  `\times`, `*`, implicit products, `\left( \right)`, redundant parentheses, `\sqrt{x}` =
  `x^{1/2}` = `x^{0.5}` (a numeric exponent is read as its value), unicode operators
  (`×`, `÷`, `−`, `·`, `⁄`, `²`), fullwidth and other decimal digits;
- order: the terms of a sum and the factors of a product are a multiset (commuted
  operands, regrouped sums and products are one form);
- signs: `-(b-a)` = `a-b`, `\frac{-a}{-b}` = `\frac{a}{b}`;
- identities: `+0`, `-0`, `\cdot 1`, `/1`, `^1`, `^0`, `0 \cdot x` (as a term), `--x`, a term
  added and subtracted (`x + 5 - 5`), a factor multiplied and divided (`\frac{2a}{2b}`),
  numbers in a sum that add up to 0 or in a product that multiply to ±1 (`x + 3 - 1 - 2`,
  `x \cdot (2-1)`, `x \cdot 4 \cdot \frac12 \cdot \frac12`; groups of up to 4, smallest
  first), `1/(1/x)`, `(x^{-1})^{-1}`, `(ab)^{-1}` = `a^{-1} b^{-1}`, powers whose exponents
  multiply to 1 (`(\sqrt{x})^2`, also `\sqrt{x^2}`), `e^{\ln x}` and `\ln(e^x)`.

Nothing else is rewritten: `4+3` and `7`, `x \cdot x` and `x^2`, `(x^2)^3` and `x^6`,
`\frac{168}{24}` and `\frac{84}{12}` have different forms, so a form equal to the question's
is the question's own operands and operations, in another notation. The only arithmetic
done is checking that a group of numbers combines to 0 or ±1, and numeric exponents.

These functions run latex2sympy's ANTLR parser, which is slow on adversarial input (seconds
for a few hundred nested brackets): the verifiers call them in the math-verify worker process,
which the caller kills when a request overruns its budget (`textgym.verifiers.math_pool.read_forms`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from fractions import Fraction
from itertools import combinations
from typing import Any

from textgym.verifiers.answer_text import normalize_unicode

MAX_FORM_CHARS = 600
"""Longer texts are not read (`form` returns None)."""
MAX_DEPTH = 16
"""Texts nested deeper than this (brackets and braces) are not read (`form` returns None)."""

Key = tuple[Any, ...]
Form = tuple[int, Key]
"""A canonical form: (sign, key). `key` is a nested tuple of str, Fraction and tuples; the sign is ±1."""

_ONE: Key = ("num", Fraction(1))
_ZERO: Key = ("num", Fraction(0))
_E: Key = ("atom", "Exp1", "E")

_OPERATORS = str.maketrans({"×": r" \times ", "÷": r" \div ", "·": r" \cdot ",
                            "⋅": r" \cdot ", "∙": r" \cdot ", "∗": "*", "∕": "/", "⁄": "/",
                            "√": r"\sqrt ", "π": r"\pi "})  # fmt: skip
_NUMBER = re.compile(r"_\{[^{}]*\}|_[0-9A-Za-z]|(?P<num>[0-9]+(?:\.[0-9]+)?|\.[0-9]+)")
_THOUSANDS = re.compile(r"(?<=[0-9])(?:,|\{,\})(?=[0-9]{3}(?![0-9]))")
_SQRT_BARE = re.compile(r"\\sqrt\s*([0-9]+|[A-Za-z])")
_BARE_EXPONENT = re.compile(r"\^\s*(-?\s*[0-9.]+|[A-Za-z])")
_PLACEHOLDERS = ("nu", "xi", "zeta", "eta", "kappa", "chi")


def _depth(text: str) -> int:
    """The deepest nesting of (), [] and {} in `text`."""
    depth = best = 0
    for c in text:
        if c in "([{":
            depth += 1
            best = max(best, depth)
        elif c in ")]}":
            depth -= 1
    return best


@dataclass
class _Parsed:
    """A parsed text: its sympy tree and the values of the number placeholders in it."""

    tree: Any
    numbers: dict[str, Fraction] = field(default_factory=dict)


def _parse(text: str) -> _Parsed | None:
    """Parse `text` (LaTeX or plain) into an unevaluated sympy tree with numbers as opaque symbols."""
    from latex2sympy2_extended import latex2sympy
    from latex2sympy2_extended.latex2sympy2 import ConversionConfig
    from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

    t = normalize_unicode(text).translate(_OPERATORS)  # minus signs, superscripts, digits: one reading
    t = t.replace("**", "^").strip().rstrip(".").strip()
    if not t or len(t) > MAX_FORM_CHARS or _depth(t) > MAX_DEPTH:
        return None
    config = NormalizationConfig(units=True, malformed_operators=True, nits=False, boxed="all")
    t = _BARE_EXPONENT.sub(r"^{\1}", _SQRT_BARE.sub(r"\\sqrt{\1}", _THOUSANDS.sub("", t)))
    t = normalize_latex(t, config)
    name = next((p for p in _PLACEHOLDERS if p not in t), None)
    if name is None:
        return None
    numbers: dict[str, Fraction] = {}

    def hide(m: re.Match[str]) -> str:
        if m.group("num") is None:
            return m.group(0)
        index = len(numbers) // 2
        numbers[f"{name}_{index}"] = numbers[f"{name}_{{{index}}}"] = Fraction(m.group("num"))
        return f"{{\\{name}_{{{index}}}}}"

    t = _NUMBER.sub(hide, t)
    conversion = ConversionConfig(interpret_as_mixed_fractions=False, lowercase_symbols=False)
    tree = latex2sympy(t, normalization_config=None, conversion_config=conversion)
    return _Parsed(tree, numbers)


class _UnreadableError(Exception):
    """A tree too deep or of a kind `_form` does not read."""


def _value(form: Form) -> Fraction | None:
    """The exact value of a form made of numbers, sums, products and small integer powers; else None."""
    sign, key = form
    kind = key[0]
    if kind == "num":
        return sign * key[1]
    if kind == "add":
        total = Fraction(0)
        for term in key[1]:
            v = _value(term)
            if v is None:
                return None
            total += v
        return sign * total
    if kind == "mul":
        product = Fraction(sign)
        for base, exp in key[1]:
            b = _value((1, base))
            if b is None or not isinstance(exp, Fraction) or exp.denominator != 1 or abs(exp) > 64:
                return None
            if abs(b.numerator) > 10**40 or b.denominator > 10**40:
                return None
            if b == 0 and exp < 0:
                return None
            product *= b ** int(exp)
            if abs(product.numerator) > 10**40 or product.denominator > 10**40:
                return None
        return product
    return None


def _sort(items: list[Any]) -> tuple[Any, ...]:
    """`items` in a canonical order (by their repr: keys mix str and Fraction)."""
    return tuple(sorted(items, key=repr))


_MAX_NEUTRAL_SUBSET = 4
"""Numeric terms (factors) are dropped in groups of up to this many that sum to 0 (multiply to 1)."""


def _drop_neutral(values: list[Fraction], product: bool) -> tuple[list[int], int]:
    r"""Indices of `values` left once groups summing to 0 (`product`: multiplying to ±1) are dropped.

    `x + 5 - 5`, `x \cdot 2 \cdot \frac{1}{2}`, `x \cdot (2-1)`, `x + 3 - 1 - 2`: an identity written
    with numbers around an expression. Groups of 1 to `_MAX_NEUTRAL_SUBSET` values are tried
    (up to pairs beyond 16 values), the smallest first (a padding by pairs cancels whatever
    numbers the expression holds), in index order. Also returns the sign the dropped factors
    multiply to (1 for sums).
    """
    left, sign = list(range(len(values))), 1
    while left:
        biggest = _MAX_NEUTRAL_SUBSET if len(left) <= 16 else 2
        found: tuple[int, ...] = ()
        for size in range(1, min(biggest, len(left)) + 1):
            for group in combinations(left, size):
                total = Fraction(1) if product else Fraction(0)
                for i in group:
                    total = total * values[i] if product else total + values[i]
                if (product and abs(total) == 1) or (not product and total == 0):
                    found = group
                    sign *= 1 if total >= 0 else -1
                    break
            if found:
                break
        if not found:
            break
        left = [i for i in left if i not in found]
    return left, sign


def _add(terms: list[Form], settle: bool = False) -> Form:
    """The canonical sum of `terms`: flattened, zeros dropped, opposite terms cancelled.

    With `settle` (the final pass, `_settled`), numbers summing to 0 are dropped too.
    """
    flat: list[Form] = []
    for sign, key in terms:
        if key == _ZERO:
            continue
        if key[0] == "add":
            flat.extend((sign * s, k) for s, k in key[1])
        else:
            flat.append((sign, key))
    kept: list[Form] = []
    for term in sorted(flat, key=lambda f: (repr(f[1]), f[0])):
        opposite = (-term[0], term[1])
        if opposite in kept:
            kept.remove(opposite)
        else:
            kept.append(term)
    if settle:
        numeric = [(f, _value(f)) for f in kept]
        numbers = [f for f, v in numeric if v is not None]
        left, _ = _drop_neutral([v for _, v in numeric if v is not None], product=False)
        kept = [f for f, v in numeric if v is None] + [numbers[i] for i in left]
    if not kept:
        return 1, _ZERO
    if len(kept) == 1:
        return kept[0]
    ordered = sorted(kept, key=lambda f: (repr(f[1]), f[0]))
    if ordered[0][0] < 0:  # the first term positive: -(b - a) and a - b are one form
        return -1, ("add", tuple((-s, k) for s, k in ordered))
    return 1, ("add", tuple(ordered))


def _mul(factors: list[Form]) -> Form:
    """The canonical product of `factors`: flattened, ones dropped, inverse factors cancelled."""
    sign = 1
    pairs: list[tuple[Key, Any]] = []  # (base, exponent): a Fraction, or a Form when symbolic
    for s, key in factors:
        sign *= s
        if key[0] == "mul":
            pairs.extend(key[1])
        else:
            pairs.append((key, Fraction(1)))
    return _product(sign, pairs)


def _negated(exp: Any) -> Any:
    """The opposite of an exponent (a Fraction or a Form)."""
    return -exp if isinstance(exp, Fraction) else (-exp[0], exp[1])


def _factor_value(base: Key, exp: Any) -> Fraction | None:
    """The value of a numeric factor `base ** exp` (an integer exponent), else None."""
    if not isinstance(exp, Fraction) or exp.denominator != 1:
        return None
    return _value((1, ("mul", ((base, exp),)) if exp != 1 else base))


def _product(sign: int, pairs: list[tuple[Key, Any]], settle: bool = False) -> Form:
    """The canonical product of `(base, exponent)` pairs and a sign: ones dropped, inverses cancelled.

    With `settle` (the final pass, `_settled`), numbers multiplying to ±1 are dropped too.
    """
    kept: list[tuple[Key, Any]] = []
    for base, exp in sorted(pairs, key=repr):
        if base == _ZERO:
            return 1, _ZERO
        if base == _ONE or (isinstance(exp, Fraction) and exp == 0):
            continue
        if base[0] == "neg" and isinstance(exp, Fraction) and exp.denominator == 1:  # (-x)^n = ±x^n
            base, sign = base[1], sign * (-1 if exp.numerator % 2 else 1)
        inverse = (base, _negated(exp))
        if inverse in kept:
            kept.remove(inverse)
        else:
            kept.append((base, exp))
    if settle:
        numeric = [(p, _factor_value(*p)) for p in kept]
        numbers = [p for p, v in numeric if v is not None]
        left, dropped_sign = _drop_neutral([v for _, v in numeric if v is not None], product=True)
        kept = [p for p, v in numeric if v is None] + [numbers[i] for i in left]
        sign *= dropped_sign
    if not kept:
        return sign, _ONE
    if len(kept) == 1 and kept[0][1] == 1:
        return sign, kept[0][0]
    return sign, ("mul", _sort(kept))


def _settled_base(base: Key) -> Form:
    """`_settled` of a product's base (a `("neg", key)` base is a negative form)."""
    if base[0] == "neg":
        sign, key = _settled((1, base[1]))
        return -sign, key
    return _settled((1, base))


def _settled(form: Form) -> Form:
    """The final pass: every sum and product, fully flattened now, drops its neutral groups of numbers.

    Run once on a whole tree rather than while building it: a product's numbers are only all
    known once its nested products are merged (`\frac{2(\frac{40}{8})}{2}`).
    """
    sign, key = form
    if key[0] == "add":
        s, k = _add([_settled(t) for t in key[1]], settle=True)
        return sign * s, k
    if key[0] == "mul":
        pairs = []
        for base, exp in key[1]:
            sb, kb = _settled_base(base)
            pairs.append((kb if sb > 0 else ("neg", kb), exp if isinstance(exp, Fraction) else _settled(exp)))
        s, k = _product(1, pairs, settle=True)
        return sign * s, k
    if key[0] == "node":
        return sign, ("node", key[1], tuple(_settled(c) for c in key[2]))
    return form


def _pow(base: Form, exp: Form) -> Form:
    """The canonical power `base ** exp`: a numeric exponent read as its value, ±1 powers unfolded."""
    sb, kb = base
    value = _value(exp)
    if value is None:  # a symbolic exponent
        return 1, ("mul", (((kb if sb > 0 else ("neg", kb)), exp),))
    sign = 1
    if sb < 0:
        if value.denominator == 1:
            sign = -1 if value.numerator % 2 else 1
        else:
            kb = ("neg", kb)
    if value == 0 or kb == _ONE:
        return sign, _ONE
    if value == 1:
        return sign, kb
    if kb[0] == "mul":
        if value == -1:  # (ab)^{-1} = a^{-1} b^{-1}, (x^e)^{-1} = x^{-e}
            return _product(sign, [(b, _negated(e)) for b, e in kb[1]])
        inner = kb[1][0][1] if len(kb[1]) == 1 else None
        if isinstance(inner, Fraction) and (inner == -1 or inner * value == 1):  # (x^{-1})^v, (\sqrt{x})^2
            return _product(sign, [(kb[1][0][0], inner * value)])
    return _product(sign, [(kb, value)])


def _form(e: Any, numbers: dict[str, Fraction], depth: int = 0) -> Form:
    """The canonical form of sympy tree `e` (numbers read from the placeholder symbols)."""
    import sympy

    if depth > 4 * MAX_DEPTH:
        raise _UnreadableError("too deep")
    if isinstance(e, sympy.MatrixBase):
        cells = tuple(_form(x, numbers, depth + 1) for row in e.tolist() for x in row)
        return 1, ("node", f"Matrix{e.rows}x{e.cols}", cells)
    atom = bool(getattr(e, "is_Atom", True))
    nested = [] if atom else [_form(a, numbers, depth + 1) for a in e.args]
    if isinstance(e, sympy.Symbol):
        if e.name in numbers:
            return 1, ("num", numbers[e.name])
        return 1, ("sym", e.name)
    if isinstance(e, sympy.Rational):
        v = Fraction(int(e.p), int(e.q))
        return (1 if v >= 0 else -1), ("num", abs(v))
    if isinstance(e, sympy.Float):
        v = Fraction(str(e))
        return (1 if v >= 0 else -1), ("num", abs(v))
    if isinstance(e, sympy.UnevaluatedExpr):
        return nested[0]
    if isinstance(e, sympy.Add):
        return _add(nested)
    if isinstance(e, sympy.Mul):
        return _mul(nested)
    if isinstance(e, sympy.Pow):
        return _pow(nested[0], nested[1])
    name = type(e).__name__
    if atom:
        return 1, ("atom", name, str(e))
    if name in ("FiniteSet", "Union", "Intersection"):
        return 1, ("node", name, _sort(nested))
    natural = len(nested) == 1 or (len(nested) == 2 and nested[1] == (1, _E))
    if name == "exp" and nested[0][1][0] == "node" and nested[0][1][1] == "log" and nested[0][0] > 0:
        inner = nested[0][1][2]
        if len(inner) == 1 or inner[1] == (1, _E):  # e^{\ln x} = x
            return inner[0]
    if name == "log" and natural and nested[0][1][:2] == ("node", "exp") and nested[0][0] > 0:
        return nested[0][1][2][0]  # \ln(e^x) = x
    return 1, ("node", name, tuple(nested))


def _read(text: str) -> tuple[Form, _Parsed] | None:
    """`text`'s form and its parse, or None when it does not parse or is too long or deep."""
    try:
        parsed = _parse(text)
        if parsed is None:
            return None
        return _settled(_form(parsed.tree, parsed.numbers)), parsed
    except Exception:  # any parser failure: the text has no form
        return None


_RELATIONS = ("Equality", "Unequality", "StrictLessThan", "LessThan", "StrictGreaterThan", "GreaterThan")


def value_form(text: str) -> Form | None:
    r"""The canonical form of the value `text` writes: the right side of its last relation, if any.

    Args:
        text: an answer (LaTeX or plain), at most `MAX_FORM_CHARS` characters.

    Returns:
        (sign, key), or None when `text` does not parse.

    Examples:
        >>> value_form(r"\frac{84}{12}") == value_form("12^{-1} \\cdot 84") == value_form("(84)/(12)")
        True
        >>> value_form("7") == value_form(r"\frac{84}{12}"), value_form("k = 2k+2") == value_form("2+2k")
        (False, True)
    """
    read = _read(text)
    if read is None:
        return None
    form = read[0]
    for _ in range(MAX_DEPTH):
        if form[1][0] == "node" and form[1][1] in (*_RELATIONS, "And"):
            form = form[1][2][-1]
        else:
            break
    return form


def is_atom(form: Form) -> bool:
    """Whether a form is one number or one symbol (no operation: never a restatement)."""
    return form[1][0] in ("num", "sym", "atom")


def form_key(form: Form) -> str:
    """A form as a string (what crosses the worker's JSON pipe and is compared)."""
    return repr(form)
