"""Test harness run INSIDE the sandbox by `CodeVerifier` (standard library only).

Reads a nonce from stdin, loads `spec.json` (the program and the test units), then
executes the program and each test unit in one namespace. Results go, one line per
unit, to a private copy of the original stdout, prefixed by the nonce; the program's
own prints are sent to stderr. A program that exits early (`sys.exit`, `os._exit`) or
hangs leaves units without a result line, and those count as failed.
"""

import json
import os
import sys
import traceback


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines[-6:])[-2000:]


def main() -> None:
    """Run the spec; print `NONCE {"unit": i, "ok": bool, "error": str}` per unit."""
    nonce = sys.stdin.readline().strip()
    with open("spec.json", encoding="utf-8") as f:
        spec = json.load(f)
    os.remove("spec.json")
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the program's prints go to stderr, never into the result channel

    def emit(record: dict) -> None:
        report.write(nonce + " " + json.dumps(record) + "\n")
        report.flush()

    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    try:
        exec(compile(spec["program"], "solution.py", "exec"), namespace)
    except BaseException as e:
        emit({"unit": "program", "ok": False, "error": _describe(e)})
        os._exit(0)
    emit({"unit": "program", "ok": True})
    for i, unit in enumerate(spec["tests"]):
        try:
            exec(compile(unit, f"test_{i}.py", "exec"), namespace)
        except BaseException as e:
            emit({"unit": i, "ok": False, "error": _describe(e)})
            if spec.get("stop_at_first_failure", False):
                break
        else:
            emit({"unit": i, "ok": True})
    os._exit(0)


if __name__ == "__main__":
    main()
