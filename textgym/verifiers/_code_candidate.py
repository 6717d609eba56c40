"""The candidate process of the code judge: runs the solution, answers calls with plain data.

The trusted judge (`_code_harness.py`) forks this process off first thing, before it reads
the nonce or the tests, so the child holds none of them; `serve` then moves the judge's two
pipes to private descriptors (requests in, answers out), points stdin at /dev/null and stdout
at stderr (the solution's prints), and answers requests. Nothing here is trusted once the
solution is loaded: it shares this process and may rewrite any of it. The judge decodes
every answer into its own objects (`_code_wire.decode`), so all a rewrite can change is which
plain data comes back, which is what a solution computes anyway.

Requests (one JSON line each) and answers:
- `{"op": "load", "program": src, "entry_points": [names], "classes": [names]}` → `{"ok": true,
  "kinds": {name: "function" | "missing" | <type name>}}`, or `{"ok": false, "error": text}`;
- `{"op": "call", "fn": name, "args": [...], "kwargs": {...}}` → `{"ok": true, "value": v,
  "args": [...]}` (the arguments after the call, for functions that change a list in place),
  or `{"ok": false, "error": <exception type name>, "message": text}`. Only a plain function
  (`def` or `lambda`) is called: a class, a callable object or a builtin is refused.
"""

from __future__ import annotations

import functools
import os
import traceback
import types
from typing import Any

import _code_wire as wire

_WRAPPERS = (functools.partial, type(functools.lru_cache(None)(lambda: None)))


def _is_function(value: Any) -> bool:
    """A plain function, or one behind a bound method, `functools.partial` or `lru_cache`/`cache`.

    Exact types only: a class, a callable object or anything claiming to wrap a function
    (`__wrapped__` on a class) is not one. What it returns still crosses as plain data.
    """
    for _ in range(8):
        if type(value) in (types.FunctionType, types.BuiltinFunctionType):
            return True
        if type(value) is types.MethodType:
            value = value.__func__
        elif type(value) in _WRAPPERS:
            value = value.func if type(value) is functools.partial else value.__wrapped__
        else:
            return False
    return False


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines[-6:])[-2000:]


def serve(requests_fd: int, answers_fd: int, cwd: str) -> None:
    """Serve the judge's requests from `requests_fd` on `answers_fd` until the judge closes it."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # the solution reads nothing of the judge's stdin
    os.dup2(2, 1)  # and its prints go to stderr
    os.close(devnull)
    os.chdir(cwd)
    requests = os.fdopen(requests_fd, "r", encoding="utf-8")
    answers = os.fdopen(answers_fd, "w", encoding="utf-8")
    namespace: dict[str, Any] = {"__name__": "__main__", "__builtins__": __builtins__}
    classes: frozenset[str] = frozenset()

    stand_ins: dict[str, type] = {}

    def make_object(name: str, attrs: dict[str, Any]) -> Any:
        cls = namespace.get(name)
        if not isinstance(cls, type):  # a task class the solution does not define: its attributes
            cls = stand_ins.setdefault(name, type(name, (), {}))
        obj: Any = object.__new__(cls)
        obj.__dict__.update(attrs)
        return obj

    while True:
        try:
            request = wire.receive(requests)
        except wire.WireError:
            return
        if request is None:
            return
        if request.get("op") == "load":
            classes = frozenset(request.get("classes", []))
            try:
                exec(compile(request["program"], "solution.py", "exec"), namespace)
            except BaseException as e:  # the solution's failure is data
                wire.send(answers, {"ok": False, "error": _describe(e)})
                continue
            kinds = {}
            for name in request.get("entry_points", []):
                value = namespace.get(name)
                kind = "function" if _is_function(value) else type(value).__name__
                kinds[name] = kind if name in namespace else "missing"
            wire.send(answers, {"ok": True, "kinds": kinds})
            continue
        fn: Any = namespace.get(request.get("fn", ""))
        try:
            if not _is_function(fn):
                raise wire.WireError(f"{request.get('fn')} is a {type(fn).__name__}, not a function")
            args = wire.decode(request.get("args", []), make_object)
            kwargs = wire.decode(request.get("kwargs", {"t": "dict", "v": []}), make_object)
            value = fn(*args, **kwargs)
            answer = {"ok": True, "value": wire.encode(value, classes), "args": wire.encode(args, classes)}
        except BaseException as e:  # the solution's failure is data
            answer = {"ok": False, "error": type(e).__name__, "message": _describe(e)}
        try:
            wire.send(answers, answer)
        except wire.WireError as e:
            wire.send(answers, {"ok": False, "error": "WireError", "message": str(e)})
