"""Child process that runs math-verify on request (`python -m textgym.verifiers._math_worker`).

Protocol: one JSON object per line on stdin, one JSON object per line on stdout.
Request: `{"gold": [str, ...], "pred": [str, ...], "gold_match": [...], "pred_match": [...],
"float_rounding": int, "strict": bool, "allow_set_relation_comp": bool, "timeout_s": float}`.
Each of `gold` / `pred` is a list of candidate renderings, tried in order until math-verify
parses one to a non-empty result. `*_match` names the extraction configs ("latex", "latex_default", "expr").
With `"exact": true`, every decimal both sides write is read as the exact rational it writes
(`4.666667` is 4666667/1000000, never 14/3 rounded) before `verify`, so no rounding pays an
approximation of an exact value; the reply then adds `"approx_equal"`: whether math-verify's
rounded comparison (`float_rounding` places) would have said equal.
Reply: `{"equal": bool, "gold_parsed": str|None, "pred_parsed": str|None}` or `{"error": str}`.

Structural forms (`textgym.verifiers.expression_forms` and `.question_expressions`, for the answer
rule's restatement check):
`{"op": "value_form", "text": str}` -> `{"form": str|None, "atom": bool}`;
`{"op": "posed", "text": str}` -> `{"forms": [str], "fractions": [[int, int]], "expressions": [str]}`;
`{"op": "extract", "text": str, "timeout_s": float}` -> `{"extracted": str|None}`: the text
math-verify's extraction takes from a completion's tail (what an unmarked answer is compared as);
`{"op": "in_form", "text": str, "gold": str|None, "forms": [{"name", "template"}]}` ->
`answer_forms.check_forms`'s reply (rule 5 of the answer rule).

The parent process kills and restarts this worker when a request overruns its wall-clock
budget, so pathological input (huge powers, deep nesting) can never hang a caller; the
signal-based timeouts of math-verify below keep most such cases from reaching that point.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any


def _configs(match: tuple[str, ...]) -> list[Any]:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    out: list[Any] = []
    for m in match:
        if m == "latex":  # a \\boxed{} answer outranks every other LaTeX match
            out.append(LatexExtractionConfig(boxed_match_priority=0))
        elif m == "latex_default":  # math-verify's own default priorities
            out.append(LatexExtractionConfig())
        elif m == "expr":
            out.append(ExprExtractionConfig())
        else:
            raise ValueError(f"unknown match type {m!r}")
    return out


@lru_cache(maxsize=8192)
def _parse(text: str, match: tuple[str, ...], timeout_s: int) -> tuple[Any, ...]:
    from math_verify import parse

    return tuple(parse(text, extraction_config=_configs(match), parsing_timeout=timeout_s))


def _parse_first(candidates: list[str], match: tuple[str, ...], timeout_s: int) -> list[Any]:
    for text in candidates:
        parsed = _parse(text, match, timeout_s)
        if parsed:
            return list(parsed)
    return []


def forms(req: dict[str, Any]) -> dict[str, Any]:
    """Answer a structural-form request (`op`: "value_form", "posed", "extract", "in_form")."""
    from textgym.verifiers.answer_forms import check_forms
    from textgym.verifiers.expression_forms import form_key, is_atom, value_form
    from textgym.verifiers.question_expressions import posed

    if req["op"] == "posed":
        return posed(str(req["text"]))
    if req["op"] == "extract":
        t = max(1, int(req.get("timeout_s", 3)))
        parsed = _parse_first([str(req["text"])], ("latex", "expr"), t)
        return {"extracted": str(parsed[-1]) if parsed else None}
    if req["op"] == "in_form":
        gold = req.get("gold")
        return check_forms(str(req["text"]), None if gold is None else str(gold), list(req["forms"]))
    form = value_form(str(req["text"]))
    return {"form": None if form is None else form_key(form), "atom": form is not None and is_atom(form)}


def handle(req: dict[str, Any]) -> dict[str, Any]:
    """Parse gold and prediction and compare them with math-verify; return the reply dict."""
    from math_verify import verify

    if "op" in req:
        return forms(req)

    t = max(1, int(req.get("timeout_s", 3)))
    gold = _parse_first(req["gold"], tuple(req.get("gold_match", ("latex", "expr"))), t)
    pred = _parse_first(req["pred"], tuple(req.get("pred_match", ("latex", "expr"))), t)
    options = {
        "float_rounding": int(req.get("float_rounding", 6)),
        "strict": bool(req.get("strict", True)),
        "allow_set_relation_comp": bool(req.get("allow_set_relation_comp", False)),
        "timeout_seconds": t,
    }
    equal = approx_equal = False
    if gold and pred:
        if req.get("exact"):
            g, p = [_exact(x) for x in gold], [_exact(x) for x in pred]
            equal = bool(verify(g, p, **options))
            if not equal and (g != gold or p != pred):
                approx_equal = bool(verify(gold, pred, **options))
        else:
            equal = bool(verify(gold, pred, **options))
    reply: dict[str, Any] = {
        "equal": equal,
        "gold_parsed": str(gold[-1]) if gold else None,
        "pred_parsed": str(pred[-1]) if pred else None,
    }
    if req.get("exact"):
        reply["approx_equal"] = approx_equal
    return reply


def _exact(parsed: Any) -> Any:
    """A parsed answer with every sympy Float replaced by the exact rational its decimal digits write.

    math-verify reads `4.666667` as a Float and compares Floats after rounding to
    `float_rounding` places, which pays 4.666667 for 14/3; as the rational 4666667/1000000 it is
    compared exactly. Strings (math-verify's extracted text) are returned as they are.
    """
    import sympy

    def rational(f: Any) -> Any:
        try:
            return sympy.Rational(str(f))
        except (TypeError, ValueError):
            return sympy.nsimplify(f, rational=True)

    if isinstance(parsed, sympy.MatrixBase):
        return parsed.applyfunc(_exact)
    if isinstance(parsed, sympy.Basic) and parsed.has(sympy.Float):
        return parsed.replace(lambda e: isinstance(e, sympy.Float), rational)
    return parsed


def _limit_memory() -> None:
    """Cap the address space (TEXTGYM_MATH_WORKER_MEM_MB, default 4096 MB).

    A runaway sympy computation then fails with MemoryError (reported as a reply) or
    kills only this worker, instead of exhausting the machine.
    """
    import os
    import resource

    mb = int(os.environ.get("TEXTGYM_MATH_WORKER_MEM_MB", "4096"))
    if mb > 0:
        limit = mb * 1024 * 1024
        _, hard = resource.getrlimit(resource.RLIMIT_AS)
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    """Serve requests from stdin until it closes."""
    import logging

    _limit_memory()
    logging.disable(logging.CRITICAL)  # math-verify logs every timeout; the parent reports them
    import math_verify  # noqa: F401  (import before announcing readiness)

    out = sys.stdout
    out.write('{"ready": true}\n')
    out.flush()
    for line in sys.stdin:
        try:
            reply = handle(json.loads(line))
        except Exception as e:  # any failure is reported as a reply, never a dead worker
            reply = {"error": f"{type(e).__name__}: {e}"[:500]}
        out.write(json.dumps(reply) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
