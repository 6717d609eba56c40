"""Math answer equivalence (math-verify), bounded in time.

The final answer is read by `textgym.verifiers.extraction.extract_answer` (a `\\boxed{}`,
an `<answer>` tag, `#### N` or "the answer is"). Before any equivalence check,
`MathVerifier` applies the final-answer rule of `textgym.verifiers.answer_rule`: one answer
(without a marker, the last line's), no hedging, a number written as a number when the gold
is one, not the question restated, and in the form the question asks for.

Exact answers are exact: every decimal is compared as the exact number it writes, so
`4.666667` is not `\\frac{14}{3}` (math-verify alone rounds both to 6 places and pays it),
while `0.5` and `\\frac{1}{2}` are one value; a gold written as a decimal is matched by an
answer of exactly that value.

Equivalence is decided by Hugging Face's `math-verify` (`parse` + `verify`, backed by
sympy), never by string matching. It runs in a child process (see `_math_worker`, and
`math_pool` for `math_equal`, its client) that the caller kills and restarts when one
comparison overruns `timeout_s`, so input such as `\\boxed{10^{10^{10}}}`, a 200 kB string
or NUL bytes costs at most `timeout_s` seconds and returns a 0.0 score with the reason,
never an exception.
"""

from __future__ import annotations

import re
from typing import Any

from textgym.types import Task
from textgym.verifiers.answer_rule import check_answer
from textgym.verifiers.base import Score
from textgym.verifiers.extraction import MAX_ANSWER_CHARS, extract_answer
from textgym.verifiers.math_pool import math_equal


def answer_candidates(answer: str) -> list[str]:
    """Renderings of an extracted or gold answer for math-verify, most specific first."""
    return [f"\\boxed{{{answer}}}", answer, f"${answer}$"]


class MathVerifier:
    r"""Reward 1.0 when the completion's one final answer is equivalent to the task's gold answer, else 0.0.

    The final answer is read by the answer rule (`textgym.verifiers.answer_rule.check_answer`):
    the last `\boxed{}` (or another marker of `extract_answer`), else the last line; a
    response that hedges (several candidates), restates the question, or gives an expression
    where the gold is a number earns 0 with the reason in `details["error"]` and the rule's
    verdict in `details["refused"]`. The answer left is compared with the gold by
    math-verify (in a killable worker: `math_equal`) with `exact=True` by default: a decimal
    is the exact number it writes, so a rounded decimal of an exact gold (`4.666667` for
    `\frac{14}{3}`) earns 0 with `refused: "approximate"`. Set `require_marker=True` to score an
    answer without a marker 0.0. Details: `extracted` (the answer text), `marker`,
    `candidates` (distinct final answers offered), `parsed` (math-verify's reading), `error`.

    No completion raises: a malformed or unparsable answer scores 0.0 with `error` set.

    Raises:
        ValueError: (when called) the task has no gold answer, a programming error.

    Examples:
        >>> from textgym.types import Task
        >>> task = Task(task_id="half", prompt="What fraction of a day is 12 hours?", answer="0.5")
        >>> score = MathVerifier()(r"Half is \boxed{\frac{1}{2}}.", task)
        >>> score.reward, score.details["extracted"], score.details["marker"]
        (1.0, '\\frac{1}{2}', 'boxed')
        >>> MathVerifier()(r"\boxed{0.25}", task).reward
        0.0
        >>> MathVerifier()(r"\boxed{0.5} or \boxed{0.25}", task).details["error"]
        '2 different boxed answers'
        >>> MathVerifier(require_marker=True)("It is 0.5", task).details["error"]
        'no final answer found'
        >>> third = Task(task_id="third", prompt="What fraction of a day is 8 hours?", answer=r"\frac{1}{3}")
        >>> MathVerifier()(r"\boxed{0.333333}", third).details["refused"]
        'approximate'
    """

    def __init__(
        self,
        timeout_s: float = 10.0,
        require_marker: bool = False,
        float_rounding: int = 6,
        exact: bool = True,
    ):
        """Set the comparison's budget, the marker rule and the exactness (see the class docstring).

        `float_rounding` is the decimal places math-verify rounds to, used only with
        `exact=False` (which pays rounded decimals).
        """
        self.timeout_s = timeout_s
        self.require_marker = require_marker
        self.float_rounding = float_rounding
        self.exact = exact

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` against `task.answer` (the answer rule first, then math-verify)."""
        if not task.answer:
            raise ValueError(f"task {task.task_id} has no gold answer to verify against")
        if not isinstance(completion, str):
            return Score(0.0, {"error": f"completion is {type(completion).__name__}, not str"})
        check = check_answer(completion, task.prompt, task.answer)
        details: dict[str, Any] = {
            "extracted": check.answer,
            "marker": check.kind,
            "candidates": check.candidates,
        }
        if check.answer is not None and not check.answer.strip():
            return Score(0.0, details | {"refused": "no_answer", "error": "empty final answer"})
        if self.require_marker and check.kind in (None, "last_line"):
            return Score(0.0, details | {"extracted": None, "marker": None, "error": "no final answer found"})
        if check.refused is not None or check.compare is None:
            return Score(0.0, details | {"refused": check.refused, "error": check.reason})
        if check.answer is None:  # no marker, symbolic gold: math-verify reads the completion's tail
            pred, details["marker"] = [check.compare], "math_verify"
        elif len(check.compare) > MAX_ANSWER_CHARS:
            details["extracted"] = check.compare[:80] + "…"
            details["error"] = f"final answer too long ({len(check.compare)} chars > {MAX_ANSWER_CHARS})"
            return Score(0.0, details)
        else:
            pred = answer_candidates(check.compare)
        res = math_equal(
            answer_candidates(task.answer),
            pred,
            float_rounding=self.float_rounding,
            timeout_s=self.timeout_s,
            exact=self.exact,
        )
        details["parsed"] = res["pred_parsed"]
        if "error" in res:
            details["error"] = res["error"]
        elif res["pred_parsed"] is None:
            details["error"] = "final answer could not be parsed"
        elif res.get("approx_equal"):
            details["refused"] = "approximate"
            details["error"] = "the final answer is a rounded decimal of the exact answer (write it exactly)"
        return Score(1.0 if res["equal"] else 0.0, details)


class HedgeVerifier:
    r"""1.0 when a response hedges its final answer (the answer rule's `refused` is "hedge"), else 0.0.

    A logged term (weight 0 in `math_rubric`): `reward/hedge` says why a math answer earned 0
    when it offered several candidates (`textgym.verifiers.answer_rule`, rule 2), and its
    share over a batch is a reward-hacking signal.

    Examples:
        >>> from textgym.types import Task
        >>> task = Task(task_id="t", prompt="Compute 85+63.", answer="148")
        >>> HedgeVerifier()("either 147 or 148", task).reward, HedgeVerifier()(r"\boxed{148}", task).reward
        (1.0, 0.0)
    """

    def __call__(self, completion: str, task: Task) -> Score:
        """Score whether `completion` hedges against `task.answer`."""
        if not isinstance(completion, str) or not task.answer:
            return Score(0.0, {})
        check = check_answer(completion, task.prompt, task.answer)
        hedged = check.refused in ("hedge", "several_numbers")
        return Score(1.0 if hedged else 0.0, {"reason": check.reason} if hedged else {})


_INTEGER_RE = re.compile(r"^[+-]?\d+$")


class DigitMatchVerifier:
    r"""Partial credit for an integer answer: the share of its digit places that are right.

    Outcome supervision scores only the final answer (1 or 0); process supervision scores
    the steps that lead to it (Lightman et al. 2023, "Let's Verify Step by Step",
    arXiv:2305.20050; Uesato et al. 2022, arXiv:2211.14275). For an integer answer the digit
    places are the smallest such steps that can be checked without a trace: with the final
    answer `p` (extracted by `extract_answer`, so `\boxed{}` etc.) and the gold integer `g`,
    both read as digit strings and aligned at the units place,

        reward = #{k : p_k = g_k} / max(len(p), len(g))

    (k = 0 is the units digit; a place one of them lacks counts as wrong, so a missing or
    extra digit costs a share, and a sign that differs from the gold's scores 0). The
    exact answer, and only it, scores 1.0. No answer, or one that is not an integer, scores
    0.0 with the reason in `details["error"]`. Use it next to the exact-match term
    (`MathVerifier`), which stays the measure of accuracy: a dense shaping term lets group
    methods tell apart the samples of a group that are all wrong, so a policy that is
    rarely right still gets a gradient.

    Raises:
        ValueError: if the task's gold answer is not an integer (a configuration error, not
            model output).

    Examples:
        >>> from textgym.types import Task
        >>> task = Task(task_id="sum", prompt="Compute 37+58.", answer="95")
        >>> DigitMatchVerifier()(r"\boxed{85}", task).reward   # units right, tens wrong
        0.5
        >>> DigitMatchVerifier()(r"\boxed{195}", task).details   # an extra digit costs a share
        {'extracted': '195', 'right': 2, 'places': 3}
        >>> DigitMatchVerifier()(r"\boxed{95}", task).reward
        1.0
    """

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` against the integer `task.answer`."""
        gold = (task.answer or "").strip()
        if not _INTEGER_RE.match(gold):
            raise ValueError(
                f"task {task.task_id}: DigitMatchVerifier needs an integer gold answer, got {gold!r}"
            )
        if not isinstance(completion, str):
            return Score(0.0, {"error": f"completion is {type(completion).__name__}, not str"})
        ext = extract_answer(completion)
        if ext is None:
            return Score(0.0, {"extracted": None, "error": "no final answer found"})
        text = ext.text.replace(",", "").replace(" ", "")
        if not _INTEGER_RE.match(text) or len(text) > MAX_ANSWER_CHARS:
            return Score(0.0, {"extracted": ext.text[:80], "error": "final answer is not an integer"})
        neg_p, neg_g = text.startswith("-"), gold.startswith("-")
        p, g = text.lstrip("+-"), gold.lstrip("+-")
        if neg_p != neg_g and int(p) != 0:
            return Score(0.0, {"extracted": ext.text, "error": "wrong sign"})
        p, g = p.lstrip("0") or "0", g.lstrip("0") or "0"
        places = max(len(p), len(g))
        right = sum(1 for a, b in zip(reversed(p), reversed(g), strict=False) if a == b)
        return Score(right / places, {"extracted": ext.text, "right": right, "places": places})
