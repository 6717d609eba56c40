r"""The final-answer rule of the math verifiers: one answer, stated, not an expression to evaluate.

An RL policy optimises what the verifier pays for. A verifier that pays for any string
math-verify finds equivalent pays for answers that solve nothing: the question's own
expression restated (`\boxed{85+63}` for "Compute 85+63."), any unevaluated expression equal
to the answer (`\boxed{100+48}`), and hedges that offer several candidates (`either 147 or
148`, `\boxed{147} or \boxed{148}`, `\boxed{147 \lor 148}`). The rule, applied before any
equivalence check (`check_answer`):

1. **One final answer.** It is the last `\boxed{}` (or the last `<answer>`, `#### N`, "the
   answer is ..." marker: `textgym.verifiers.math.extract_answer`). Without any marker it is
   the completion's last non-empty line, after its last `=` when it has one, and for a
   numeric gold the one number written there (a final line with two different numbers and
   no marker names no single answer).
2. **No hedging.** The answer earns 0 (`refused: "hedge"`) when the response offers more
   than one distinct candidate for it: two boxes with different values; `or`, `either`,
   `\lor`, `\vee` in the final answer or in the final line without a marker; `\pm`/`\mp`
   where the gold has none; a list or set (a comma or semicolon that is not a thousands
   separator) where the gold is a single value; or, after the last box, an `or`/`maybe`
   with another number.
3. **A number is written as a number.** When the gold answer is a number (an integer, a
   decimal, a fraction `a/b` or `\frac{a}{b}`), the final answer must be a number literal:
   digits with an optional sign, thousands separators, decimals or one fraction, with
   optional units around it (`\$`, `\%`, `^\circ`, `\text{...}`, words after a space) and
   an optional `x =` in front. `85+63`, `150-2`, `\sqrt{25}` earn 0
   (`refused: "expression"`). Digits are ASCII digits. A fraction is a number only in lowest
   terms (denominator above 1, numerator and denominator coprime), whatever the gold:
   `\frac{84}{12}`, `6/4`, `\frac{7}{1}` are divisions left to do (`refused: "expression"`)
   unless the gold is written as that same fraction; `7`, `3/2`, `1.5` are numbers.
4. **Not the question again** (`restates`). The answer earns 0 (`refused: "restated"`)
   when it is the question's own expression, in any notation: its canonical form
   (`textgym.verifiers.expression_forms`, read with math-verify's LaTeX parser without
   evaluating: numbers stay as written; notation, operand order, signs, parentheses and
   identities such as `+0`, `\cdot 1`, `^1`, `/1`, `+5-5`, `\frac{2x}{2}` forgotten) is the
   form of an expression the question writes, or of a fraction of whole numbers it writes
   (`\dfrac{84}{12}`, `84 \div 12`, `(84)/(12)` for "Compute 84/12."). So is an answer with
   maths in it that is the question's own text (at least 3 characters). A single number or
   symbol is never a restatement, and the gold answer as written (or any answer of its form)
   is not one: `\sqrt{242}` for "Simplify $\sqrt{242}$." is the question, not its answer,
   whatever sympy says, while `11\sqrt2` is paid. A marked answer whose structure cannot
   be read within the time budget (or longer than 600 characters, or nested deeper than 16
   brackets) earns 0 (`refused: "unchecked"`).

Before rules 2-4 the answer is `unwrap`ped: typesetting around it (`\text{}`, `\textbf{}`,
`\mathrm{}`, `\mathbf{}`, `\displaystyle`, `\,`, braces) is dropped, so `\boxed{\text{148}}`
is 148 while `\boxed{\text{either 147 or 148}}` is still a hedge and `\boxed{\text{85+63}}`
still the question.

Legitimate answers keep full reward: `\boxed{148}.`, `$\boxed{148}$`, `\boxed{148.0}`,
"I first thought 147, but it is \boxed{148}", `\boxed{\$18}`, `#### 1,000`, `\boxed{\mathbf{148}}`.
No peer grader reads the question: math-verify's defaults, TRL's `accuracy_reward`, the
`verifiers` library's boxed grader and verl's DAPO grader each pay for some of these
(`bench/reward_hacks.py` measures them side by side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from math import gcd
from typing import Any

from textgym.verifiers.expression_forms import MAX_DEPTH, MAX_FORM_CHARS
from textgym.verifiers.extraction import MAX_SCAN_CHARS, Extracted, all_boxed, extract_answer

_SPACES = re.compile(r"\\[!,;: ]|\\(?:left|right|displaystyle)\b|~|\s+")
_DOLLARS = re.compile(r"(?<!\\)\$")
_HEDGE = re.compile(r"\\lor\b|\\vee\b|∨|\\text\{\s*or\s*\}|\bor\b|\beither\b", re.IGNORECASE)
_PLUS_MINUS = re.compile(r"\\pm\b|\\mp\b|±|∓")
FALLBACK_CHARS = 2_000
"""Without a marker and with a symbolic gold, the completion's last FALLBACK_CHARS characters
go to math-verify's own extraction."""
_AFTER_BOX_HEDGE = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|alternatively)\b", re.IGNORECASE)
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
    r"|\\(?:,|;|!|\s)|\s+[A-Za-z][A-Za-z ]*\.?)$"
)


@dataclass(frozen=True)
class AnswerCheck:
    r"""What the final-answer rule read from a completion.

    Attributes:
        answer: the final answer's text (None when there is none).
        kind: its marker ("boxed", "answer_tag", "hashes", "answer_is", "last_line").
        compare: the text to compare with the gold answer (the bare number for a numeric
            gold; the answer, unwrapped, otherwise), or None when the answer is refused or absent.
        refused: None, or why the answer earns 0: "hedge", "expression", "restated",
            "unchecked" (its structure could not be read in time), "several_numbers", "no_answer".
        reason: a sentence saying why, for `details["error"]`.
        candidates: distinct final-answer candidates the response offers (boxes with
            different values, or the parts of a hedge); 1 for a plain answer, 0 for none.

    Examples:
        >>> check = check_answer(r"\boxed{147 \lor 148}", "Compute 85+63.", "148")
        >>> check.answer, check.refused, check.candidates
        ('147 \\lor 148', 'hedge', 2)
        >>> check_answer(r"\boxed{148 \text{ apples}}", "Compute 85+63.", "148").compare
        '148'
    """

    answer: str | None
    kind: str | None
    compare: str | None
    refused: str | None = None
    reason: str | None = None
    candidates: int = 1


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
    t = re.sub(r"\\[!;]\s*|\\,", "", t.replace("{,}", ","))
    for _ in range(4):  # units after the number, innermost last
        stripped = _UNIT.sub("", t).strip()
        if stripped == t:
            break
        t = stripped
    t = _CURRENCY.sub("", _ASSIGN.sub("", t)).strip()
    if not _NUMBER_RE.match(t):
        return None
    return _THOUSANDS.sub("", re.sub(r"\s+", "", t))


def _without_thousands(text: str) -> str:
    r"""`text` squashed, its thousands separators (`1,000`, `10{,}080`, `11,\! 111`) removed first."""
    t = re.sub(r"\\!\s*", "", text.replace("{,}", ","))
    return squash(_THOUSANDS.sub("", t))


def _single_valued(gold: str) -> bool:
    """Whether the gold answer is one value.

    A number, or an expression with no list, tuple, interval, set, inequality, `\\pm`, "and"
    or several boxes in it.
    """
    if number_literal(gold) is not None:
        return True
    g = _without_thousands(gold)
    if any(c in g for c in ",;<>") or _PLUS_MINUS.search(gold) or gold.count("\\boxed") > 1:
        return False
    return not re.search(r"\\(?:le|ge|leq|geq|neq|cup|cap|in)\b|\band\b", gold)


def _hedge_in(text: str, gold: str, lists: bool = True) -> str | None:
    """The hedge `text` (a final answer, or with `lists=False` a final line) makes against `gold`."""
    if _HEDGE.search(text) and not _HEDGE.search(gold):
        return "it offers alternatives (or / either / \\lor)"
    if _PLUS_MINUS.search(text) and not _PLUS_MINUS.search(gold):
        return "it offers two values (\\pm) where the answer is one"
    if lists and _single_valued(gold):
        t = _without_thousands(text)
        if "," in t or ";" in t:
            return "it lists several values where the answer is one"
    return None


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


_FINAL_ANSWER_COLON = re.compile(r"final answer\s*:", re.IGNORECASE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=\$\$)\s+|(?<=\\\])\s+|\n+")
_COMMAND = re.compile(r"\\(?![dtc]?frac(?![A-Za-z]))[A-Za-z]+")
_DELIMITERS_ONLY = re.compile(r"^[\s$.\\()\[\]]*$")


def _plain_prose(text: str) -> str:
    """`text` with LaTeX thousands groups joined and commands other than `\\frac` turned to spaces."""
    return _COMMAND.sub(" ", re.sub(r"\\[!,]\s*", "", text.replace("{,}", ",")))


def _numbers(text: str) -> list[str]:
    r"""The distinct number literals written in `text` (ASCII digits, not inside words), in order.

    LaTeX spacing and thousands groups (`14{,}916`, `10,\!080`) are read as one number, and a
    command other than `\frac` does not glue to the digits after it (`x \approx11`).
    """
    text = _plain_prose(text)
    values: list[str] = []
    for m in _NUMBER_IN_TEXT.finditer(text):
        if not any(_same_value(m.group(0), v) for v in values):
            values.append(m.group(0))
    return values


def _prose_answer(text: str, gold: str, kind: str) -> AnswerCheck:
    """The prose regime of rule 1: the one number of the answer's sentence (a numeric gold).

    `text` is what an "answer is" marker holds, or (kind "last_line") the whole completion:
    then the sentence is the last one that writes a number, after a "Final Answer:" when
    there is one. After the sentence's last `=`, exactly one distinct number must be left.
    """
    if kind == "last_line":
        colon = list(_FINAL_ANSWER_COLON.finditer(text))
        tail = text[colon[-1].end() :] if colon else text
        sentences = [x for x in _SENTENCE_END.split(tail) if x.strip() and not _DELIMITERS_ONLY.match(x)]
        with_number = [x for x in sentences if _NUMBER_IN_TEXT.search(_plain_prose(x))]
        if not with_number:
            return AnswerCheck(None, None, None, "no_answer", "no final answer found", 0)
        text = with_number[-1].strip()
    if _NUMERIC_HEDGE.search(text):
        return AnswerCheck(
            text, kind, None, "hedge", "the answer offers alternatives (a number or another)", 2
        )
    segment = text.rsplit("=", 1)[-1] if "=" in text else text
    values = _numbers(segment)
    if not values:
        return AnswerCheck(text, kind, None, "no_answer", "no final answer found", 0)
    if len(values) > 1:
        reason = f"the answer's sentence writes {len(values)} different numbers and no marked answer"
        return AnswerCheck(text, kind, None, "several_numbers", reason, len(values))
    return AnswerCheck(values[0], kind, number_literal(values[0]) or values[0])


_MATHS = re.compile(r"[0-9+\-*/^=\\]")
"""Maths in a text (a digit, an operator, a command): words alone (`Evelyn`) may come from the question."""
_ATOM_TEXT = re.compile(r"^[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+|[A-Za-z])$")
_MATH_IN_LINE = re.compile(r"(?<!\\)\$\$?(.+?)(?<!\\)\$\$?|\\\[(.+?)\\\]|\\\((.+?)\\\)")


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
    from textgym.verifiers.math import read_forms

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


def _not_the_question(
    answer: str, literal: str | None, question: str, gold: str, timeout_s: float, marked: bool = True
) -> tuple[str, str] | None:
    """Rule 4 and the fraction half of rule 3 for an answer that passed rules 1-3: (refused, reason) or None.

    A marked answer whose structure could not be read in time is refused ("unchecked"); an
    unmarked final line (prose, possibly long) is then let through to math-verify.
    """
    said = restates(answer, question, gold, timeout_s)
    if said is None and marked:
        return "unchecked", "the final answer could not be compared with the question in time"
    if said:
        return "restated", "the final answer restates the question (its own expression, in another form)"
    if literal is not None and not in_lowest_terms(literal):
        gold_literal = number_literal(unwrap(gold))
        if gold_literal is None or fraction_parts(gold_literal) != fraction_parts(literal):
            return "expression", "the final answer is a fraction not in lowest terms (a division left to do)"
    return None


def _final_expression(line: str) -> str:
    """The expression a final line ends on: its last math segment, after its last `=`."""
    segments = [next(g for g in m.groups() if g is not None) for m in _MATH_IN_LINE.finditer(line)]
    text = segments[-1] if segments else line
    return text.rsplit("=", 1)[-1].strip().rstrip(".").strip()


def check_answer(completion: str, question: str, gold: str, timeout_s: float = 10.0) -> AnswerCheck:
    r"""Read the final answer of `completion` by the rule of the module docstring.

    Pure and bounded: regular expressions over at most `MAX_SCAN_CHARS` characters. A
    marked answer in a math container (`\boxed{}`, `<answer>`, `#### N`) must be the answer
    alone (rule 3 strictly); one in prose ("the answer is ...", "Final Answer: ...", or no
    marker at all) is the one number its sentence writes, for a numeric gold. Without a
    marker and with a symbolic gold, the completion's tail goes to math-verify's own
    extraction, after the hedge check.

    Args:
        completion: the model's text.
        question: the task's question (`Task.prompt`), for rule 4.
        gold: the gold answer, which decides rules 2 and 3 (a numeric gold asks for a number
            literal; a gold with `\pm`, a list, an inequality or several boxes allows them).
        timeout_s: budget in seconds for reading an expression's structure (rule 4, in the
            math-verify worker).

    Returns:
        The `AnswerCheck`; `compare` is what to test for equivalence with `gold`.

    Examples:
        >>> check_answer(r"85+63 = \boxed{148}", "Compute 85+63.", "148").compare
        '148'
        >>> check_answer(r"\boxed{85+63}", "Compute 85+63.", "148").refused
        'expression'
        >>> check_answer(r"\boxed{147} or \boxed{148}", "Compute 85+63.", "148").refused
        'hedge'
        >>> check_answer("either 147 or 148", "Compute 85+63.", "148").refused
        'hedge'
        >>> check_answer(r"I first thought 147, but it is \boxed{148}.", "Compute 85+63.", "148").compare
        '148'
        >>> check_answer("So she has 148 apples left.", "How many?", "148").compare
        '148'
    """
    text = completion[-MAX_SCAN_CHARS:]
    numeric_gold = number_literal(gold) is not None
    single = _single_valued(gold)
    ext: Extracted | None = extract_answer(text)
    if ext is not None and ext.kind == "boxed" and gold.count("\\boxed") <= 1:  # the last box is graded
        boxes = all_boxed(text)
        distinct: list[str] = []
        for b, _ in boxes:
            if b.strip() and not any(_same_value(b, d) for d in distinct):
                distinct.append(b)
        if len(distinct) > 1:
            return AnswerCheck(
                ext.text, ext.kind, None, "hedge", f"{len(distinct)} different boxed answers", len(distinct)
            )
        tail = text[boxes[-1][1] :] if boxes else ""
        others = [v for v in _numbers(tail) if not _same_value(v, ext.text)]
        if others and _AFTER_BOX_HEDGE.search(tail):
            return AnswerCheck(
                ext.text, ext.kind, None, "hedge", "another answer is offered after the box", 2
            )
    if ext is None or ext.kind == "answer_is":
        prose = text if ext is None else ext.text
        kind = "last_line" if ext is None else ext.kind
        if numeric_gold:
            check = _prose_answer(prose, gold, kind)
            if check.refused is None and check.answer is not None and check.compare is not None:
                verdict = _not_the_question(check.answer, check.compare, question, gold, timeout_s)
                if verdict is not None:
                    return AnswerCheck(check.answer, kind, None, *verdict)
            return check
        if _NUMERIC_HEDGE.search(prose[-FALLBACK_CHARS:]):
            return AnswerCheck(
                None, kind, None, "hedge", "the answer offers alternatives (a number or another)", 2
            )
        if ext is None:
            line = _last_line(text)
            if line is not None:
                expression = _final_expression(line)
                verdict = _not_the_question(expression, None, question, gold, timeout_s, marked=False)
                if verdict is not None:
                    return AnswerCheck(None, kind, None, *verdict)
            return AnswerCheck(None, kind, text[-FALLBACK_CHARS:] if text.strip() else None, None, None)
    answer = ext.text
    plain = unwrap(answer)
    if not plain:
        return AnswerCheck(answer, ext.kind, None, "no_answer", "empty final answer", 0)
    hedge = _hedge_in(plain, gold, lists=single)
    if hedge is not None:
        return AnswerCheck(answer, ext.kind, None, "hedge", f"the final answer hedges: {hedge}", 2)
    literal = number_literal(plain)
    if numeric_gold and literal is None:
        reason = "the gold answer is a number and the final answer is not a number literal (evaluate it)"
        return AnswerCheck(answer, ext.kind, None, "expression", reason)
    verdict = _not_the_question(plain, literal, question, gold, timeout_s)
    if verdict is not None:
        return AnswerCheck(answer, ext.kind, None, *verdict)
    return AnswerCheck(answer, ext.kind, literal if numeric_gold else unwrap(answer, keep_words=True))


MANY_ANSWERS = 3
"""`hack_signals`' `many_answers`: a response offering more than this many final-answer candidates."""


def answer_candidates_offered(completion: str) -> int:
    r"""How many distinct final answers a response offers, without knowing the gold.

    The distinct `\boxed{}` contents; a single box, or a reply without one, counts the items
    its final answer lists (top-level commas, `or`, `\lor`, `\pm` count as separators), a
    reply without a marker its final line's "a or b" alternatives.

    Examples:
        >>> answer_candidates_offered(r"\boxed{3}"), answer_candidates_offered(r"\boxed{1} or \boxed{2}")
        (1, 2)
        >>> answer_candidates_offered(r"\boxed{1, 2, 3, 4}"), answer_candidates_offered("either 7 or 8")
        (4, 2)
    """
    text = completion[-MAX_SCAN_CHARS:]
    distinct: list[str] = []
    for b, _ in all_boxed(text):
        if b.strip() and not any(_same_value(b, d) for d in distinct):
            distinct.append(b)
    if len(distinct) > 1:
        return len(distinct)
    ext = extract_answer(text)
    final = ext.text if ext is not None else (_last_line(text) or "")
    if ext is None:
        return 1 + len(_NUMERIC_HEDGE.findall(final)) if final else 0
    parts = re.split(r",|;|\\lor\b|\\vee\b|\bor\b|\\pm\b|\\mp\b|±", _without_thousands(final))
    return max(1, sum(1 for p in parts if p.strip()))


def hack_signals(completion: str, question: str, timeout_s: float = 10.0) -> dict[str, bool]:
    r"""Reward-hacking signs in one response, read without the gold answer (for telemetry).

    `hedge`: more than one final-answer candidate (`answer_candidates_offered`);
    `many_answers`: more than `MANY_ANSWERS` of them; `restates`: the final answer (without a
    marker, the last line's final expression) is the question's own expression or fraction,
    in any notation (`restates`, rule 4 of the module docstring, with no gold to exempt; a
    structure not read within `timeout_s` counts as no). A trainer logs their shares among the
    rewarded responses (`textgym.training.rollout_metrics.rollout_metrics`): a verifier that
    pays for these is being gamed.

    Args:
        completion: the response.
        question: the task's question (the episode's first user message).
        timeout_s: budget in seconds for reading an expression's structure (math-verify worker).

    Returns:
        `{"hedge": bool, "many_answers": bool, "restates": bool}`.

    Examples:
        >>> hack_signals(r"\boxed{85+63}", "Compute 85+63.")
        {'hedge': False, 'many_answers': False, 'restates': True}
        >>> hack_signals(r"\boxed{147} or \boxed{148}", "Compute 85+63.")["hedge"]
        True
        >>> hack_signals(r"\boxed{84 \div 12}", "Compute 84/12.")["restates"]
        True
    """
    n = answer_candidates_offered(completion)
    text = completion[-MAX_SCAN_CHARS:]
    ext = extract_answer(text)
    final = ext.text if ext is not None else _final_expression(_last_line(text) or "")
    restated = bool(final.strip()) and bool(restates(final, question, None, timeout_s))
    return {"hedge": n > 1, "many_answers": n > MANY_ANSWERS, "restates": restated}


def hack_shares(episodes: list[tuple[float, dict[str, float], list[dict[str, Any]]]]) -> dict[str, float]:
    """Shares of the rewarded episodes (return > 0) that show a reward-hacking sign.

    `hack/hedge_frac`, `hack/many_answers_frac`, `hack/restates_frac`: `hack_signals` of the
    last assistant message against the first user message; `hack/format_only_frac`: paid
    although the accuracy term `reward/correct` is 0 (format or shaping terms alone). Logged
    by the trainers (`rollout_metrics`) and reported by `textgym eval`.

    Args:
        episodes: `(return, reward terms, messages)` of each episode.

    Returns:
        The four shares, or {} when no episode was rewarded.
    """
    return shares_of([hack_signs(*e) for e in episodes])


def hack_signs(
    reward: float, terms: dict[str, float], messages: list[dict[str, Any]]
) -> dict[str, int] | None:
    """One episode's reward-hacking signs (0/1 each, `hack_shares`'s four), or None when it was not paid.

    Args:
        reward: the episode's return.
        terms: its reward terms (`reward/correct` read).
        messages: its conversation (the first user and last assistant messages read).
    """
    if reward <= 0:
        return None
    question = next((m.get("content", "") for m in messages if m.get("role") == "user"), "")
    answer = next((m.get("content", "") for m in reversed(messages) if m.get("role") == "assistant"), "")
    signs = {k: int(v) for k, v in hack_signals(str(answer), str(question)).items()}
    signs["format_only"] = int(terms.get("reward/correct", 1.0) <= 0.0)
    return signs


def shares_of(signs: list[dict[str, int] | None]) -> dict[str, float]:
    """`hack/<sign>_frac` over the paid episodes' `hack_signs` (None: not paid); {} when none was paid."""
    paid = [s for s in signs if s is not None]
    if not paid:
        return {}
    return {f"hack/{k}_frac": sum(s[k] for s in paid) / len(paid) for k in paid[0]}
