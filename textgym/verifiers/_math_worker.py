"""Child process that runs math-verify on request (`python -m textgym.verifiers._math_worker`).

Protocol: one JSON object per line on stdin, one JSON object per line on stdout.
Request: `{"gold": [str, ...], "pred": [str, ...], "gold_match": [...], "pred_match": [...],
"float_rounding": int, "strict": bool, "allow_set_relation_comp": bool, "timeout_s": float}`.
Each of `gold` / `pred` is a list of candidate renderings, tried in order until math-verify
parses one to a non-empty result. `*_match` names the extraction configs ("latex", "latex_default", "expr").
Reply: `{"equal": bool, "gold_parsed": str|None, "pred_parsed": str|None}` or `{"error": str}`.

Structural forms (`textgym.verifiers.expression_forms` and `.question_expressions`, for the answer
rule's restatement check):
`{"op": "value_form", "text": str}` -> `{"form": str|None, "atom": bool}`;
`{"op": "posed", "text": str}` -> `{"forms": [str], "fractions": [[int, int]], "expressions": [str]}`.

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
    """Answer a structural-form request (`op` "value_form" or "posed"; module docstring)."""
    from textgym.verifiers.expression_forms import form_key, is_atom, value_form
    from textgym.verifiers.question_expressions import posed

    if req["op"] == "posed":
        return posed(str(req["text"]))
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
    equal = False
    if gold and pred:
        equal = bool(
            verify(
                gold,
                pred,
                float_rounding=int(req.get("float_rounding", 6)),
                strict=bool(req.get("strict", True)),
                allow_set_relation_comp=bool(req.get("allow_set_relation_comp", False)),
                timeout_seconds=t,
            )
        )
    return {
        "equal": equal,
        "gold_parsed": str(gold[-1]) if gold else None,
        "pred_parsed": str(pred[-1]) if pred else None,
    }


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
