"""Math answer equivalence (math-verify), bounded in time.

The final answer is read by `textgym.verifiers.extraction.extract_answer` (a `\\boxed{}`,
an `<answer>` tag, `#### N` or "the answer is"). Before any equivalence check,
`MathVerifier` applies the final-answer rule of `textgym.verifiers.answer_rule`: one answer
(without a marker, the last line's), no hedging, a number written as a number when the gold
is one, and not the question restated.

Equivalence is decided by Hugging Face's `math-verify` (`parse` + `verify`, backed by
sympy), never by string matching. It runs in a child process (see `_math_worker`) that
the caller kills and restarts when one comparison overruns `timeout_s`, so input such
as `\\boxed{10^{10^{10}}}`, a 200 kB string or NUL bytes costs at most `timeout_s`
seconds and returns a 0.0 score with the reason, never an exception.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import re
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

from textgym.types import Task
from textgym.verifiers.answer_rule import check_answer
from textgym.verifiers.base import Score
from textgym.verifiers.extraction import MAX_ANSWER_CHARS, extract_answer


class _Worker:
    """One `_math_worker` child process with line-based JSON I/O and a hard per-request timeout."""

    def __init__(self) -> None:
        env = dict(os.environ, PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "textgym.verifiers._math_worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self._buf = b""
        ready = self._readline(timeout_s=120.0)
        if ready is None or not json.loads(ready).get("ready"):
            self.kill()
            raise RuntimeError("math-verify worker did not start (is math-verify installed?)")

    def _readline(self, timeout_s: float) -> str | None:
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:  # the worker died
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line.decode("utf-8")

    def request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Send one request; return the reply, or None on timeout or a dead worker."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(req) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            return None
        line = self._readline(timeout_s)
        return None if line is None else json.loads(line)

    def kill(self) -> None:
        """Kill the child process and reap it."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class MathVerifyPool:
    """A process-wide pool of math-verify workers, shared by every `MathVerifier` instance.

    Workers start lazily (about 1 s each: importing sympy); a worker whose request
    overruns is killed and replaced before its slot is released. Thread-safe.
    """

    def __init__(self, size: int = 1):
        self.size = size
        self._idle: queue.Queue[_Worker] = queue.Queue()
        self._started = 0
        self._lock = threading.Lock()
        atexit.register(self.close)

    def _acquire(self) -> _Worker:
        with self._lock:
            if self._idle.empty() and self._started < self.size:
                self._started += 1
                try:
                    return _Worker()
                except Exception:
                    self._started -= 1
                    raise
        return self._idle.get()

    def request(self, req: dict[str, Any], timeout_s: float) -> dict[str, Any] | None:
        """Run one comparison; None when it overran `timeout_s` seconds (the worker is replaced)."""
        worker = self._acquire()
        reply = worker.request(req, timeout_s)
        if reply is None:
            worker.kill()
            with self._lock:
                self._started -= 1
            return None
        self._idle.put(worker)
        return reply

    def close(self) -> None:
        """Kill all idle workers."""
        while not self._idle.empty():
            self._idle.get_nowait().kill()
        with self._lock:
            self._started = 0


POOL = MathVerifyPool(size=int(os.environ.get("TEXTGYM_MATH_WORKERS", str(min(4, os.cpu_count() or 1)))))
_RESULTS: OrderedDict[str, dict[str, Any]] = OrderedDict()
_RESULTS_MAX = 65536
_RESULTS_LOCK = threading.Lock()
"""math_equal is pure: the last _RESULTS_MAX answers are kept (GRPO groups repeat completions)."""


def math_equal(
    gold: str | list[str],
    pred: str | list[str],
    *,
    gold_match: tuple[str, ...] = ("latex", "expr"),
    pred_match: tuple[str, ...] = ("latex", "expr"),
    float_rounding: int = 6,
    strict: bool = True,
    allow_set_relation_comp: bool = False,
    timeout_s: float = 10.0,
) -> dict[str, Any]:
    r"""Decide whether `pred` is mathematically equivalent to `gold` with math-verify.

    Args:
        gold: the reference, as a string or a list of candidate renderings tried in order
            until math-verify parses one (e.g. `["\boxed{x}", "x"]`).
        pred: the prediction, likewise.
        gold_match: math-verify extraction configs for gold ("latex", "latex_default", "expr").
        pred_match: the same for the prediction.
        float_rounding: decimal places numbers are rounded to (`math_verify.verify`).
        strict: `math_verify.verify`'s strict mode (variables must match, etc.).
        allow_set_relation_comp: let `math_verify.verify` compare sets with relations.
        timeout_s: wall-clock budget in seconds for parsing and comparing together.

    Returns:
        `{"equal": bool, "gold_parsed": str|None, "pred_parsed": str|None}`, plus
        `"error"` when the comparison timed out or failed (then `equal` is False).

    Examples:
        >>> math_equal("0.5", r"\frac{1}{2}")["equal"]
        True
        >>> math_equal("1000", "1,000")["equal"], math_equal("2", "3")["equal"]
        (True, False)
    """
    req = {
        "gold": [gold] if isinstance(gold, str) else list(gold),
        "pred": [pred] if isinstance(pred, str) else list(pred),
        "gold_match": list(gold_match),
        "pred_match": list(pred_match),
        "float_rounding": float_rounding,
        "strict": strict,
        "allow_set_relation_comp": allow_set_relation_comp,
        "timeout_s": max(1.0, timeout_s / 3),
    }
    key = json.dumps(req, sort_keys=True)
    with _RESULTS_LOCK:
        cached = _RESULTS.get(key)
        if cached is not None:
            _RESULTS.move_to_end(key)
            return dict(cached)
    reply = POOL.request(req, timeout_s)
    if reply is None:
        error = f"math-verify did not answer within {timeout_s}s (timed out or ran out of memory)"
        return {"equal": False, "gold_parsed": None, "pred_parsed": None, "error": error}
    if "error" not in reply:
        with _RESULTS_LOCK:
            _RESULTS[key] = reply
            if len(_RESULTS) > _RESULTS_MAX:
                _RESULTS.popitem(last=False)
    if "error" in reply:
        return {"equal": False, "gold_parsed": None, "pred_parsed": None, "error": reply["error"]}
    return reply


_FORMS: OrderedDict[str, dict[str, Any]] = OrderedDict()
_FORMS_MAX = 16384


def read_forms(op: str, text: str, timeout_s: float = 10.0) -> dict[str, Any] | None:
    r"""Ask a math-verify worker for the structural form of `text` (`textgym.verifiers.expression_forms`).

    The parse runs in the killable worker because latex2sympy's parser takes seconds on some
    adversarial inputs; replies are cached (the last `_FORMS_MAX` texts).

    Args:
        op: "value_form" (`text` is an answer: `{"form": str|None, "atom": bool}`) or "posed"
            (`text` is a question: `{"forms": [...], "fractions": [[a, b]...], "expressions": [...]}`).
        text: the answer or question.
        timeout_s: wall-clock budget in seconds.

    Returns:
        The reply, or None when the worker did not answer in time, failed, or could not start.

    Raises:
        ValueError: an unknown `op` (a programming error).

    Examples:
        >>> read_forms("value_form", r"\frac{84}{12}") == read_forms("value_form", "84 \\div 12")
        True
        >>> read_forms("posed", "Compute 84/12.")["fractions"]
        [[84, 12]]
    """
    if op not in ("value_form", "posed"):
        raise ValueError(f"unknown form request {op!r}")
    key = f"{op}\n{text}"
    with _RESULTS_LOCK:
        cached = _FORMS.get(key)
        if cached is not None:
            _FORMS.move_to_end(key)
            return cached
    try:
        reply = POOL.request({"op": op, "text": text}, timeout_s)
    except Exception:  # the worker could not start: no form
        return None
    if reply is None or "error" in reply:
        return None
    with _RESULTS_LOCK:
        _FORMS[key] = reply
        if len(_FORMS) > _FORMS_MAX:
            _FORMS.popitem(last=False)
    return reply


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
    math-verify (in a killable worker: `math_equal`). Set `require_marker=True` to score an
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
    """

    def __init__(self, timeout_s: float = 10.0, require_marker: bool = False, float_rounding: int = 6):
        self.timeout_s = timeout_s
        self.require_marker = require_marker
        self.float_rounding = float_rounding

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
        )
        details["parsed"] = res["pred_parsed"]
        if "error" in res:
            details["error"] = res["error"]
        elif res["pred_parsed"] is None:
            details["error"] = "final answer could not be parsed"
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
