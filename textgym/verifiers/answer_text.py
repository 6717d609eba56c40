r"""The text of an answer: the lexical helpers the answer rule and its telemetry read answers with.

Regular expressions and string operations only, no parser: `normalize_unicode` (the one
normalisation of look-alike characters every answer reader applies first), `squash` (spaces, `$` and LaTeX
spacing dropped), `unwrap` (typesetting wrappers dropped), `number_literal` (the bare number a
text writes, or None), `fraction_parts` and `in_lowest_terms` (a fraction literal and whether it
is reduced), and the final line's expression and the comparison of two answers' texts. The
rules they serve are numbered as in `textgym.verifiers.answer_rule`.
"""

from __future__ import annotations

import re
import unicodedata
from math import gcd

_DASHES = "\u2010\u2011\u2012\u2013\u2014\u2015\u2212\u2796\u02d7\u2e3a\u2e3b\ufe58\ufe63\uff0d"
"""Characters read as a minus sign: hyphens, dashes and minus signs of other blocks (U+2212 ...)."""
_SUPERSCRIPT = dict(zip("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻⁽⁾", "0123456789+-()", strict=True))
_SUBSCRIPT = dict(zip("₀₁₂₃₄₅₆₇₈₉₊₋₍₎", "0123456789+-()", strict=True))
_SCRIPT_RUN = re.compile(f"[{''.join(_SUPERSCRIPT)}]+|[{''.join(_SUBSCRIPT)}]+")
_CHARACTERS = str.maketrans(dict.fromkeys(_DASHES, "-") | {"\u2044": "/", "\u2215": "/"})


_LOOKALIKE = re.compile(f"[{_DASHES}]\\s*\\d|(?![0-9])\\d")


def has_lookalikes(text: str) -> bool:
    """Whether `text` writes a sign or a digit with a look-alike code point (`−148`, `１４８`, `١٤٨`).

    `normalize_unicode` reads them as `-148` and `148`; the hack telemetry counts the answers
    that use them (a policy probing for a reader that drops the sign).

    Examples:
        >>> has_lookalikes("The answer is \u2212148."), has_lookalikes("x\u00b2 = 4, so 2 - 1 = 1")
        (True, False)
    """
    return not text.isascii() and _LOOKALIKE.search(text) is not None


def _script_run(m: re.Match[str]) -> str:
    """A run of superscript (subscript) characters as `^{...}` (`_{...}`)."""
    run = m.group(0)
    if run[0] in _SUPERSCRIPT:
        return "^{" + "".join(_SUPERSCRIPT[c] for c in run) + "}"
    return "_{" + "".join(_SUBSCRIPT[c] for c in run) + "}"


def normalize_unicode(text: str) -> str:
    r"""`text` with look-alike characters written as the ASCII they stand for: what every answer reader reads.

    The one normalisation applied before an answer is read, by every reader (the math answer
    rule and `extract_answer`, the hack telemetry, the GSM8K, arithmetic, tool, game and web
    envs' answer readers): a policy must not gain or lose reward by the code point it writes a
    sign or a digit with.

    - minus signs, hyphens and dashes (U+2212, U+2010-2015, U+FE58, U+FE63, U+FF0D, ...) are `-`;
    - superscript and subscript runs are `^{...}` and `_{...}` (`x²` is `x^{2}`, not `x2`), and a
      vulgar fraction after a digit is set apart (`3½` is `3 1/2`, not `31/2`);
    - then Unicode NFKC (fullwidth forms, `½` as `1/2`, non-breaking spaces, ligatures), the
      fraction slash `⁄` and division slash `∕` as `/`;
    - and every decimal digit of another script (Arabic-Indic, Devanagari, ...) as its ASCII
      digit (`unicodedata.decimal`).

    Pure ASCII text is returned as it is (the common case costs one `isascii`). Lengths change,
    so offsets must be taken in the normalised text. Raises nothing.

    Examples:
        >>> normalize_unicode("The answer is \u2212148."), normalize_unicode("\\boxed{\u2013 50}")
        ('The answer is -148.', '\\boxed{- 50}')
        >>> normalize_unicode("\u0661\u0664\u0668"), normalize_unicode("\uff11\uff14\uff18")
        ('148', '148')
        >>> normalize_unicode("x\u00b2 + 3\u00bd")
        'x^{2} + 3 1/2'
    """
    if text.isascii():
        return text
    t = _SCRIPT_RUN.sub(_script_run, text)
    t = re.sub(r"(?<=[0-9])(?=[\u00bc-\u00be\u2150-\u215e])", " ", t)
    t = unicodedata.normalize("NFKC", t).translate(_CHARACTERS)
    if t.isascii():
        return t
    return "".join(str(unicodedata.decimal(c)) if c.isdecimal() and not c.isascii() else c for c in t)


_SPACES = re.compile(r"\\[!,;: ]|\\(?:left|right|displaystyle)\b|~|\s+")
_DOLLARS = re.compile(r"(?<!\\)\$")
_THOUSANDS = re.compile(r"(?<=[0-9]),(?=[0-9]{3}(?![0-9]))")

_INT = r"[0-9]+"
_DEC = r"(?:[0-9]{1,3}(?:,[0-9]{3})+|[0-9]{1,3}(?: [0-9]{3})+(?![0-9])|[0-9]+)(?:\.[0-9]+)?|\.[0-9]+"
_FRAC_ARG_NUM = r"(?:\{\s*[+-]?[0-9]+\s*\}|[0-9])"
_FRAC_ARG_DEN = r"(?:\{\s*[0-9]+\s*\}|[0-9])"
_LATEX_FRAC = rf"\\[dtc]?frac\s*{_FRAC_ARG_NUM}\s*{_FRAC_ARG_DEN}"
_NUMBER_CORE = rf"(?:{_LATEX_FRAC}|{_INT}\s*/\s*{_INT}|{_DEC})"
_NUMBER_RE = re.compile(rf"^[+-]?\s*{_NUMBER_CORE}$")
_NUMBER_IN_TEXT = re.compile(rf"(?<![0-9.A-Za-z])[+-]?{_NUMBER_CORE}(?![0-9A-Za-z])")
_NUMERIC_HEDGE = re.compile(
    rf"{_NUMBER_CORE}\s*\$?\s*,?\s*(?:\bor\b|\\lor\b|\\vee\b|∨|\\text\{{\s*or\s*\}})\s*\$?\s*"
    rf"(?:[A-Za-z]\s*=\s*)?\$?\s*[+-]?{_NUMBER_CORE}",
    re.IGNORECASE,
)
_ASSIGN = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?\s*=\s*")
_CURRENCY = re.compile(r"^(?:\\\$|\\text\{\s*\\?\$\s*\}|\$|£|€)\s*")
_UNIT = re.compile(
    r"\s*(?:\\(?:text|textnormal|textit|mbox|mathrm|textrm|textbf)\s*\{[^{}]*\}|\\%|%|\^\s*\\circ|\^\s*\{\s*\\circ\s*\}|°"
    r"|\\(?:,|;|!|\s)|\s+[A-Za-z][A-Za-z ]*\.?"
    r"|\s*/\s*(?:\\(?:text|textnormal|textit|mbox|mathrm|textrm)\s*\{\s*[A-Za-z][A-Za-z ]*\}|[A-Za-z]{2,}))$"
)
"""A unit after a number: `\\text{...}`, `\\%`, degrees, a word, or a rate `/\\text{day}`, `/day`
(a bare word after `/` has two letters or more: `18/x` is a division)."""


def squash(text: str) -> str:
    r"""`text` without spaces, `$`, `\left`/`\right`, LaTeX spacing commands or a trailing period.

    Examples:
        >>> squash(r"$ \left( 3, \frac{\pi}{2} \right) $.")
        '(3,\\frac{\\pi}{2})'
    """
    t = _DOLLARS.sub("", _SPACES.sub("", text))
    return t.rstrip(".")


_STYLE = re.compile(
    r"\\(?:displaystyle|textstyle|scriptstyle|scriptscriptstyle|bf|rm|it|sf|tt|normalfont|boldmath)(?![A-Za-z])"
    r"|\\color\s*\{[^{}]*\}"
)
_SPACING = re.compile(
    r"(?<!\\)\\[,;:> ]|\\(?:q?quad|thinspace|medspace|thickspace|enspace|enskip)(?![A-Za-z])|~"
)
_WRAPPER = re.compile(
    r"\\(?:text(?:bf|it|rm|sf|tt|normal|up|md|sl)?|math(?:rm|bf|it|sf|tt|normal)|boldsymbol|bm|mbox|hbox|emph"
    r"|underline|textcolor\s*\{[^{}]*\})\s*\{"
)
_MAX_WRAPPERS = 64
_MAX_UNWRAP_CHARS = 4_000


def _closing(text: str, start: int) -> int | None:
    """The index of the `}` closing the brace opened just before `start`, or None."""
    depth = 1
    for j in range(start, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


_WORD = re.compile(r"(?<![\\A-Za-z])[A-Za-z]{2,}")
_NOT_WORDS = re.compile(rf"{_WRAPPER.pattern}[^{{}}]*\}}|\\(?:begin|end)\s*\{{[^{{}}]*\}}")


def unwrap(text: str, keep_words: bool = False) -> str:
    r"""`text` without the typesetting around its maths: what the answer rule and the comparison read.

    Font and text wrappers keep their content (`\text{148}`, `\textbf{}`, `\mathrm{}`,
    `\mathbf{}`, `\mathit{}`, `\boldsymbol{}`, `\mbox{}`, `\emph{}`, `\textcolor{c}{}`, up
    to `_MAX_WRAPPERS` of them), style switches go (`\displaystyle`, `{\bf ...}`, `\color{c}`),
    spacing commands become a space (`\,`, `\;`, `\quad`, `~`; `\!` goes), runs of white space
    one space, and braces around the whole are dropped. Words stay words: `\text{either 3 or 4}`
    is still a hedge and `\text{85+63}` still the question.

    Args:
        text: an answer.
        keep_words: leave the wrappers whose content has a word of two letters or more
            (`\text{ inches}`, `\text{Devon}`) as they are: math-verify reads units and names
            in them (the text compared with a symbolic gold).

    Examples:
        >>> unwrap(r"\text{148}"), unwrap(r"\mathbf{148}"), unwrap(r"\displaystyle 148"), unwrap("{148}")
        ('148', '148', '148', '148')
        >>> unwrap(r"\textbf{\frac{3}{2}}\,\text{cm}")
        '\\frac{3}{2} cm'
    """
    if len(text) > _MAX_UNWRAP_CHARS:  # no real answer is that long (MathVerifier refuses it anyway)
        return text.strip()
    t = _SPACING.sub(" ", _STYLE.sub(" ", re.sub(r"\\!\s*", "", text)))
    start = 0
    for _ in range(_MAX_WRAPPERS):
        m = _WRAPPER.search(t, start)
        if m is None:
            break
        end = _closing(t, m.end())
        if end is None:
            break
        if keep_words and _WORD.search(_NOT_WORDS.sub(" ", t[m.end() : end])):
            start = end + 1
            continue
        t = f"{t[: m.start()]} {t[m.end() : end]} {t[end + 1 :]}"
        start = m.start()
    t = re.sub(r"\s+", " ", t).strip()
    while t.startswith("{") and _closing(t, 1) == len(t) - 1:
        t = t[1:-1].strip()
    return t


_FRACTION_LITERAL = re.compile(
    r"^([+-]?)(?:\\[dtc]?frac\{?([+-]?[0-9]+)\}?\{?([0-9]+)\}?|([+-]?[0-9]+)/([0-9]+))$"
)


def fraction_parts(literal: str) -> tuple[int, int] | None:
    r"""(numerator, denominator) of a fraction literal (`number_literal`'s output), or None when not one.

    The sign goes to the numerator.

    Examples:
        >>> fraction_parts(r"\frac{6}{4}"), fraction_parts(r"-\frac{-3}{2}"), fraction_parts("3/2")
        ((6, 4), (3, 2), (3, 2))
        >>> fraction_parts("1.5") is None
        True
    """
    m = _FRACTION_LITERAL.match(literal)
    if m is None:
        return None
    sign, *groups = m.groups()
    a, b = (int(g) for g in groups if g is not None)
    return (-a if sign == "-" else a), b


def in_lowest_terms(literal: str) -> bool:
    r"""Whether a number literal is not a fraction left to reduce (rule 3).

    True for integers and decimals, and for a fraction `a/b` with `b > 1` and gcd(a, b) = 1;
    False for `\frac{84}{12}`, `6/4`, `\frac{7}{1}`, `1/0`.

    Examples:
        >>> [in_lowest_terms(x) for x in ("3/2", r"\frac{6}{4}", "7", "14/2")]
        [True, False, True, False]
    """
    parts = fraction_parts(literal)
    return parts is None or (parts[1] > 1 and gcd(parts[0], parts[1]) == 1)


def number_literal(text: str) -> str | None:
    r"""The bare number `text` writes, or None when `text` is not a number literal (rule 3).

    Units, a currency sign and a leading `x =` are allowed around the number; thousands
    separators are dropped from the result.

    Examples:
        >>> number_literal(r"\$1,250.50"), number_literal("148 apples"), number_literal(r"x = \frac{3}{4}")
        ('1250.50', '148', '\\frac{3}{4}')
        >>> number_literal("85+63"), number_literal(r"\sqrt{25}"), number_literal("١٤٨")
        (None, None, None)
    """
    t = _DOLLARS.sub("", text.strip()).strip().rstrip(".").strip()
    t = without_units(re.sub(r"\\[!;]\s*|\\,", "", t.replace("{,}", ",")))
    t = _CURRENCY.sub("", _ASSIGN.sub("", t)).strip()
    if not _NUMBER_RE.match(t):
        return None
    return _THOUSANDS.sub("", re.sub(r"\s+", "", t))


def without_units(text: str) -> str:
    r"""`text` without the units after it (up to 4: `\text{}` words, `\%`, degrees, a rate `/\text{day}`).

    Examples:
        >>> without_units(r"18/\text{day}"), without_units(r"90^\circ"), without_units(r"3.5\text{ cm}")
        ('18', '90', '3.5')
    """
    t = text.strip()
    for _ in range(4):  # units after the number, innermost last
        stripped = _UNIT.sub("", t).strip()
        if stripped == t:
            break
        t = stripped
    return t


_APPROX = re.compile(r"\\(?:approx|simeq|thickapprox|doteq)(?![A-Za-z])|≈|≃")
_EQUALS = re.compile(r"(?<![<>!:\\])=(?!=)")


def before_approx(answer: str) -> str:
    r"""The exact value an answer states before an `\approx` (`≈`): what follows is a remark about it.

    Examples:
        >>> before_approx(r"\frac{14}{3} \approx 4.67"), before_approx("148")
        ('\\frac{14}{3}', '148')
    """
    m = _APPROX.search(answer)
    return answer if m is None or not answer[: m.start()].strip() else answer[: m.start()].strip()


def equation_value(answer: str) -> str | None:
    r"""The number an equation ends on (`a+b=4`, `\angle ABC = 120^\circ`), as `number_literal` writes it.

    None unless the last side of the chain is a number literal and no other side is a number
    literal of another value (`147 = 148` states no value).

    Examples:
        >>> equation_value("a+b=4"), equation_value(r"\angle ABC = 120^\circ"), equation_value("147 = 148")
        ('4', '120', None)
    """
    sides = _EQUALS.split(answer)
    if len(sides) < 2:
        return None
    value = number_literal(sides[-1])
    if value is None:
        return None
    for side in sides[:-1]:
        other = number_literal(side)
        if other is not None and not _same_value(other, value):
            return None
    return value


_CLOSING = re.compile(
    r"(?:^|(?<=[.!?\n]))\s*(?:please\s+|and\s+|so\s+)?(?:let\s+me\s+know|feel\s+free|(?:i\s+)?hope\s+(?:this|that|it)"
    r"\s+helps|happy\s+to\s+help|glad\s+to\s+help|thank\s+you|thanks|if\s+you\s+have\s+(?:any\s+)?(?:more\s+|further\s+"
    r"|other\s+)?questions)\b[^.!?\n]*[.!?]?",
    re.IGNORECASE,
)


def without_closings(text: str) -> str:
    """`text` without the closing sentences addressed to the reader ("Let me know if ... or ...").

    A sentence that starts with "Let me know", "Feel free", "Hope this helps", "Thank you",
    "If you have any questions", ... offers no answer, so the hedge checks after a final answer
    (the math answer rule's and WikiSearch's) do not read its "or".

    Examples:
        >>> without_closings(". Let me know if you want more detail or a shorter proof.").strip()
        '.'
        >>> without_closings(", or maybe 147. Hope this helps!")
        ', or maybe 147. '
    """
    return _CLOSING.sub(" ", text)


def _without_thousands(text: str) -> str:
    r"""`text` squashed, its thousands separators (`1,000`, `10{,}080`, `11,\! 111`) removed first."""
    t = re.sub(r"\\!\s*", "", text.replace("{,}", ","))
    return squash(_THOUSANDS.sub("", t))


def _same_value(a: str, b: str) -> bool:
    """Whether two answers are the same text (squashed, unwrapped) or the same number literal."""
    a, b = unwrap(a), unwrap(b)
    if squash(a) == squash(b):
        return True
    na, nb = number_literal(a), number_literal(b)
    if na is None or nb is None or "frac" in na + nb or "/" in na + nb:
        return False
    try:
        return float(na) == float(nb)
    except ValueError:
        return False


def _last_line(text: str) -> str | None:
    """The completion's last non-empty line (stripped), or None."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else None


_MATH_IN_LINE = re.compile(r"(?<!\\)\$\$?(.+?)(?<!\\)\$\$?|\\\[(.+?)\\\]|\\\((.+?)\\\)")


def _final_expression(line: str) -> str:
    """The expression a final line ends on: its last math segment, after its last `=`."""
    segments = [next(g for g in m.groups() if g is not None) for m in _MATH_IN_LINE.finditer(line)]
    text = segments[-1] if segments else line
    return text.rsplit("=", 1)[-1].strip().rstrip(".").strip()
