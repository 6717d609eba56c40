"""The client side of the math-verify worker: the process pool and the two requests it answers.

`math_equal` (is one answer mathematically equivalent to another?) and `read_forms` (the
structural form of an answer, or the expressions a question poses:
`textgym.verifiers.expression_forms`) send one JSON request each to a child process running
`textgym.verifiers._math_worker`. `MathVerifyPool` starts those workers lazily and kills and
replaces one whose request overruns its wall-clock budget, so no input can hang a caller.
Replies are cached, as both requests are pure. `textgym.verifiers.math` (the verifiers) and
`textgym.verifiers.restatement` (rule 4 of the answer rule) call it; it imports neither.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import select
import subprocess
import sys
import threading
import time
from collections import OrderedDict
from typing import Any


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
    exact: bool = False,
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
        exact: read every decimal as the exact rational it writes (`4.666667` is not 14/3):
            no rounding (`float_rounding` then only decides `approx_equal`).

    Returns:
        `{"equal": bool, "gold_parsed": str|None, "pred_parsed": str|None}`, plus
        `"approx_equal"` with `exact` (whether the rounded comparison says equal), and
        `"error"` when the comparison timed out or failed (then `equal` is False).

    Examples:
        >>> math_equal("0.5", r"\frac{1}{2}")["equal"]
        True
        >>> math_equal("1000", "1,000")["equal"], math_equal("2", "3")["equal"]
        (True, False)
        >>> math_equal(r"\frac{14}{3}", "4.666667")["equal"]
        True
        >>> math_equal(r"\frac{14}{3}", "4.666667", exact=True)
        {'equal': False, 'gold_parsed': '\\frac{14}{3}', 'pred_parsed': '4.666667', 'approx_equal': True}
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
    if exact:
        req["exact"] = True
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


def read_forms(
    op: str, text: str, timeout_s: float = 10.0, fields: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    r"""Ask a math-verify worker for the structural form of `text` (`textgym.verifiers.expression_forms`).

    The parse runs in the killable worker because latex2sympy's parser takes seconds on some
    adversarial inputs; replies are cached (the last `_FORMS_MAX` texts).

    Args:
        op: "value_form" (`text` is an answer: `{"form": str|None, "atom": bool}`), "posed"
            (`text` is a question: `{"forms": [...], "fractions": [[a, b]...], "expressions": [...]}`),
            "extract" (`text` is a completion's tail: `{"extracted": str|None}`, what math-verify
            compares) or "in_form" (`text` is an answer, `fields` gives `gold` and `forms`:
            `textgym.verifiers.answer_forms.check_forms`'s reply).
        text: the answer or question.
        timeout_s: wall-clock budget in seconds.
        fields: the request's other fields ("in_form").

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
    if op not in ("value_form", "posed", "extract", "in_form"):
        raise ValueError(f"unknown form request {op!r}")
    extra = dict(fields or {})
    if op == "extract":
        extra["timeout_s"] = max(1.0, timeout_s / 3)
    key = f"{op}\n{text}\n{json.dumps(extra, sort_keys=True)}"
    with _RESULTS_LOCK:
        cached = _FORMS.get(key)
        if cached is not None:
            _FORMS.move_to_end(key)
            return cached
    try:
        reply = POOL.request({**extra, "op": op, "text": text}, timeout_s)
    except Exception:  # the worker could not start: no form
        return None
    if reply is None or "error" in reply:
        return None
    with _RESULTS_LOCK:
        _FORMS[key] = reply
        if len(_FORMS) > _FORMS_MAX:
            _FORMS.popitem(last=False)
    return reply
