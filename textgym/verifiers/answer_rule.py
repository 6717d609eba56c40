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
   than one distinct candidate for it: two boxes with different values (compared exactly by
   math-verify: `15\frac{39}{40}` and `\frac{639}{40}` are one value); `or`, `either`,
   `\lor`, `\vee` in the final answer or in the final line without a marker; `\pm`/`\mp`
   where the gold has none; a list or set (a comma or semicolon that is not a thousands
   separator) where the gold is a single value; or, after the last box, another number
   within `_NEAR_WORDS` words after `or`, `either`, `maybe`, `perhaps`, ... (`offers_another`:
   an operand of a computation, `148 - 63 = 85, or ...`, is no candidate, and a closing
   addressed to the reader, "Let me know if ... or ...", offers nothing).
3. **A number is written as a number.** When the gold answer is a number (an integer, a
   decimal, a fraction `a/b` or `\frac{a}{b}`), the final answer must be a number literal:
   digits with an optional sign, thousands separators, decimals or one fraction, with
   optional units around it (`\$`, `\%`, `^\circ`, `\text{...}`, words after a space) and
   an optional `x =` in front; an equation whose last side is the number states it
   (`a+b=4`, `\angle ABC = 120^\circ`: `answer_text.equation_value`), and an `\approx` remark
   after the answer is dropped (`\frac{14}{3} \approx 4.67`). `85+63`, `150-2`, `\sqrt{25}` earn 0
   (`refused: "expression"`). A fraction is a number only in lowest
   terms (denominator above 1, numerator and denominator coprime), whatever the gold:
   `\frac{84}{12}`, `6/4`, `\frac{7}{1}` are divisions left to do (`refused: "expression"`)
   unless the gold is written as that same fraction; `7`, `3/2`, `1.5` are numbers.
4. **Not the question again** (`textgym.verifiers.restatement.restates`). The answer earns 0
   (`refused: "restated"`) when it is the question's own expression, in any notation: its
   canonical form (`textgym.verifiers.expression_forms`, read with math-verify's LaTeX parser
   without evaluating: numbers stay as written; notation, operand order, signs, parentheses
   and identities such as `+0`, `\cdot 1`, `^1`, `/1`, `+5-5`, `\frac{2x}{2}` forgotten) is
   the form of an expression the question writes, or of a fraction of whole numbers it writes
   (`\dfrac{84}{12}`, `84 \div 12`, `(84)/(12)` for "Compute 84/12."). So is an answer with
   maths in it that is the question's own text (at least 3 characters). A single number or
   symbol is never a restatement, and the gold answer as written (or any answer of its form)
   is not one: `\sqrt{242}` for "Simplify $\sqrt{242}$." is the question, not its answer,
   whatever sympy says, while `11\sqrt2` is paid. A marked answer whose structure cannot be
   read within the time budget (or longer than 600 characters, or nested deeper than 16
   brackets) earns 0 (`refused: "unchecked"`). Without a marker, the check reads what
   math-verify's extraction takes from the completion's tail (`extracted_tail`), the text the
   equivalence check compares.
5. **In the form asked for** (`textgym.verifiers.answer_forms`). When the question asks for a
   form (a common fraction, a mixed number, a decimal, simplest radical form, a rational
   denominator, factored, interval notation, "in the form $Ar^2+Br+C$") that the gold is in,
   an answer not in it earns 0 (`refused: "form"`).

The completion, question and gold are read after `answer_text.normalize_unicode` (a minus
sign written U+2212 or a dash is `-`; fullwidth and other scripts' digits are digits), the
normalisation every answer reader applies. Exactness (a decimal is the number it writes) is
the comparison's, in `textgym.verifiers.math.MathVerifier`.

Before rules 2-5 the answer is `unwrap`ped (`textgym.verifiers.answer_text`): typesetting
around it (`\text{}`, `\textbf{}`, `\mathrm{}`, `\mathbf{}`, `\displaystyle`, `\,`, braces) is
dropped, so `\boxed{\text{148}}` is 148 while `\boxed{\text{either 147 or 148}}` is still a
hedge and `\boxed{\text{85+63}}` still the question.

Legitimate answers keep full reward: `\boxed{148}.`, `$\boxed{148}$`, `\boxed{148.0}`,
"I first thought 147, but it is \boxed{148}", `\boxed{\$18}`, `#### 1,000`, `\boxed{\mathbf{148}}`.
No peer grader reads the question: math-verify's defaults, TRL's `accuracy_reward`, the
`verifiers` library's boxed grader and verl's DAPO grader each pay for some of these
(`bench/reward_hacks.py` measures them side by side).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from textgym.verifiers.answer_forms import requested_forms
from textgym.verifiers.answer_text import (
    _NUMBER_IN_TEXT,
    _NUMERIC_HEDGE,
    _same_value,
    _without_thousands,
    before_approx,
    equation_value,
    fraction_parts,
    in_lowest_terms,
    normalize_unicode,
    number_literal,
    unwrap,
    without_closings,
)
from textgym.verifiers.extraction import MAX_SCAN_CHARS, Extracted, all_boxed, extract_answer
from textgym.verifiers.math_pool import math_equal, read_forms
from textgym.verifiers.restatement import restates

_HEDGE = re.compile(r"\\lor\b|\\vee\b|∨|\\text\{\s*or\s*\}|\bor\b|\beither\b", re.IGNORECASE)
_PLUS_MINUS = re.compile(r"\\pm\b|\\mp\b|±|∓")
FALLBACK_CHARS = 2_000
"""Without a marker and with a symbolic gold, the completion's last FALLBACK_CHARS characters
go to math-verify's own extraction."""
_AFTER_BOX_HEDGE = re.compile(r"\b(?:or|either|maybe|perhaps|possibly|alternatively)\b", re.IGNORECASE)
_OPERATOR_AFTER = re.compile(r"\s*(?:[-+*/^=<>×÷]|\\(?:cdot|times|div|pm|le|ge|neq)(?![A-Za-z]))")
_OPERATOR_BEFORE = re.compile(r"(?:[-+*/^=<>×÷]|\\(?:cdot|times|div|pm|le|ge|neq))\s*$")
_CLAUSE_END = re.compile(r"[.!?;\n](?![0-9])")
_NEAR_WORDS = 5
"""A number offered after the box stands within this many words after `or`, `maybe`, ... (2 before `or`)."""


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


def _candidate(text: str, m: re.Match[str]) -> bool:
    """Whether the number `m` matched in `text` stands alone, not as an operand of a computation."""
    return not _OPERATOR_AFTER.match(text, m.end()) and not _OPERATOR_BEFORE.search(text[: m.start()])


_CLAUSE_START = re.compile(r"(?:^|[.;:!?(\n]|--|—)\s*$")
_ABOUT_THE_ANSWER = re.compile(
    r"\b(?:answer|result|solution|value|could|might|may|also|instead|otherwise|maybe|perhaps|possibly"
    r"|alternatively|either)\b",
    re.IGNORECASE,
)


def _alternative_or(text: str, m: re.Match[str]) -> bool:
    """Whether the `or` matched at `m` (in the text after the box) can join the answer to another."""
    before = text[: m.start()]
    if len(before.split()) <= 3 or _CLAUSE_START.search(before):
        return True
    clause = _CLAUSE_END.split(before)[-1] + " " + _CLAUSE_END.split(text[m.end() :], maxsplit=1)[0]
    return _ABOUT_THE_ANSWER.search(clause) is not None


def offers_another(tail: str, answer: str) -> bool:
    r"""Whether the text after the last box offers another answer (rule 2): a number near an alternative word.

    A number other than `answer` counts when it stands within `_NEAR_WORDS` words after `or`,
    `either`, `maybe`, `perhaps`, `possibly` or `alternatively` (or 2 words before an `or`), in
    the same clause, and is not an operand of a computation (`148 - 63 = 85`: a check, not a
    candidate). A plain `or` offers an alternative only right after the box (3 words), at the
    start of a clause ("Or it could be 147"), or in a clause about the answer ("could also be
    147 or 146"): "Only \boxed{49} leaves 1 when divided by 2, 3, 4, or 6" offers none. A
    closing addressed to the reader ("Let me know if ... or ...") offers nothing.

    Examples:
        >>> offers_another(", or maybe 147", "148"), offers_another(" Check: 148 - 63 = 85, or ...", "148")
        (True, False)
        >>> offers_another(" Let me know if you want step 2 or step 3 in more detail.", "148")
        False
        >>> offers_another(" has a remainder of 1 when divided by 2, 3, 4, or 6.", "49")
        False
    """
    text = without_closings(_plain_prose(tail))
    for m in _AFTER_BOX_HEDGE.finditer(text):
        if m.group(0).lower() == "or" and not _alternative_or(text, m):
            continue
        ahead = _CLAUSE_END.split(text[m.end() : m.end() + 200], maxsplit=1)[0]
        n = _NUMBER_IN_TEXT.search(ahead)
        near = n is not None and len(ahead[: n.start()].split()) <= _NEAR_WORDS
        if n is not None and near and _candidate(ahead, n) and not _same_value(n.group(0), answer):
            return True
        if m.group(0).lower() != "or":
            continue
        behind = _CLAUSE_END.split(text[max(0, m.start() - 80) : m.start()])[-1]
        numbers = list(_NUMBER_IN_TEXT.finditer(behind))
        last = numbers[-1] if numbers else None
        near = last is not None and len(behind[last.end() :].split()) <= 2
        if last is not None and near and _candidate(behind, last) and not _same_value(last.group(0), answer):
            return True
    return False


_MAX_SAME_BOXES = 4
"""Up to this many differently written boxes are compared by value (more are a hedge outright)."""


def _one_value(boxes: list[str], timeout_s: float) -> bool:
    r"""Whether differently written boxes all hold one value (`15\frac{39}{40}` and `\frac{639}{40}`).

    Compared exactly by math-verify (`math_equal(exact=True)`) with the last box; a list of more
    than `_MAX_SAME_BOXES` is not compared. The last box is the one graded, by every rule.
    """
    if len(boxes) > _MAX_SAME_BOXES:
        return False
    last = boxes[-1]
    for other in boxes[:-1]:
        res = math_equal(
            [f"\\boxed{{{last}}}", last], [f"\\boxed{{{other}}}", other], exact=True, timeout_s=timeout_s
        )
        if not res["equal"]:
            return False
    return True


def _form_verdict(
    answer: str, question: str, gold: str, timeout_s: float, marked: bool = True
) -> tuple[str, str] | None:
    """Rule 5: (refused, reason) when the question asks for a form the gold is in and `answer` is not."""
    forms = requested_forms(question)
    if not forms:
        return None
    asked = [{"name": f.name, "template": f.template} for f in forms]
    reply = read_forms("in_form", answer, timeout_s, {"gold": gold, "forms": asked})
    if reply is None:
        if not marked:
            return None
        return "unchecked", "the final answer's form could not be read (in time)"
    if reply["failed"] is None:
        return None
    phrase = next(f.phrase for f in forms if f.name == reply["failed"])
    how = "cannot be read as" if reply["unreadable"] else "is not written in"
    return "form", f"the question asks for {phrase!r} ({reply['failed']}) and the final answer {how} it"


def extracted_tail(text: str, timeout_s: float = 10.0) -> str | None:
    """What math-verify's extraction takes from a completion's last `FALLBACK_CHARS` (an unmarked answer).

    The text the equivalence check compares, read in the math-verify worker; None when it
    extracts nothing or does not answer in time.
    """
    reply = read_forms("extract", text[-FALLBACK_CHARS:], timeout_s)
    return None if reply is None else reply.get("extracted")


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
    text = normalize_unicode(completion[-MAX_SCAN_CHARS:])
    question, gold = normalize_unicode(question), normalize_unicode(gold)
    numeric_gold = number_literal(gold) is not None
    single = _single_valued(gold)
    ext: Extracted | None = extract_answer(text)
    if ext is not None and ext.kind == "boxed" and gold.count("\\boxed") <= 1:  # the last box is graded
        boxes = all_boxed(text)
        distinct: list[str] = []
        for b, _ in boxes:
            if b.strip() and not any(_same_value(b, d) for d in distinct):
                distinct.append(b)
        if len(distinct) > 1 and not _one_value(distinct, timeout_s):
            return AnswerCheck(
                ext.text, ext.kind, None, "hedge", f"{len(distinct)} different boxed answers", len(distinct)
            )
        tail = text[boxes[-1][1] :] if boxes else ""
        if offers_another(tail, ext.text):
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
                verdict = verdict or _form_verdict(check.compare, question, gold, timeout_s)
                if verdict is not None:
                    return AnswerCheck(check.answer, kind, None, *verdict)
            return check
        if _NUMERIC_HEDGE.search(prose[-FALLBACK_CHARS:]):
            return AnswerCheck(
                None, kind, None, "hedge", "the answer offers alternatives (a number or another)", 2
            )
        if ext is None:
            extracted = extracted_tail(text, timeout_s)  # what the equivalence check will compare
            if extracted:
                value = before_approx(extracted)
                verdict = _not_the_question(value, None, question, gold, timeout_s, marked=False)
                verdict = verdict or _form_verdict(value, question, gold, timeout_s, marked=False)
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
    value = before_approx(plain)  # `\frac{14}{3} \approx 4.67` states 14/3
    literal = number_literal(value)
    if numeric_gold and literal is None:
        literal = equation_value(value)  # `a+b=4`, `\angle ABC = 120^\circ`
    if numeric_gold and literal is None:
        reason = "the gold answer is a number and the final answer is not a number literal (evaluate it)"
        return AnswerCheck(answer, ext.kind, None, "expression", reason)
    verdict = _not_the_question(value, literal, question, gold, timeout_s)
    verdict = verdict or _form_verdict(
        literal if numeric_gold and literal else value, question, gold, timeout_s
    )
    if verdict is not None:
        return AnswerCheck(answer, ext.kind, None, *verdict)
    return AnswerCheck(
        answer, ext.kind, literal if numeric_gold else before_approx(unwrap(answer, keep_words=True))
    )
