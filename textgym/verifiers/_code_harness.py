"""Test harness run INSIDE the sandbox by `CodeVerifier` (standard library only).

Reads a nonce from stdin, loads `spec.json` (the solution `program`, the trusted test
`setup` and the test units), runs the program, then the setup and each unit. Results go,
one line per unit, to a private copy of the original stdout, prefixed by the nonce; the
program's own prints are sent to stderr. A program that exits early (`sys.exit`,
`os._exit`) or hangs leaves units without a result line, and those count as failed.

The tests cannot be rebound by the solution, and a returned object cannot fake a result:
- the tests run in their own namespace, with a copy of the builtins taken before the program
  ran; after the program, every module loaded before it (`builtins`, `math`, `sys`, ...) gets
  its attributes back, so a patched `abs`, `math.isclose` or `sys.exit` is undone;
- the tests see the program's functions and classes by name (never a name that shadows a
  builtin, unless the task names it as its entry point), and each function through a guard
  that turns its return value into plain data of exact built-in types (int, float, complex,
  str, bytes, bool, None, and list, tuple, dict, set, frozenset of them; `collections`'
  deque, OrderedDict and defaultdict; a Counter becomes a dict; C types a program cannot
  patch, such as `re.Match`, `range`, `Decimal`, `datetime`; an iterator yields its items
  through the same guard): an object whose `__eq__` always answers True, or a subclass of
  int, fails the unit ("returned a X, not plain data").
What stays out of reach: code that inspects the harness's own frames (the nonce lives there);
the sandbox isolates the host from it, and the verifier does not claim more.
"""

import ast
import builtins
import collections
import contextlib
import datetime
import decimal
import json
import os
import re
import sys
import traceback
import types
from typing import Any

_EXACT = (
    int, float, complex, str, bytes, bool, type(None), type(Ellipsis), range, slice,
    re.Match, re.Pattern, decimal.Decimal,
    datetime.date, datetime.datetime, datetime.time, datetime.timedelta,
)  # fmt: skip
"""Built-in values, and C types whose behaviour a program cannot patch, passed through as they are."""
_SEQUENCES: dict[type, Any] = {
    list: list, tuple: tuple, set: set, frozenset: frozenset, collections.deque: collections.deque,
}  # fmt: skip
_MAPPINGS: dict[type, Any] = {
    dict: dict, collections.OrderedDict: collections.OrderedDict, collections.Counter: dict,
}  # fmt: skip
_PRELOAD = (
    "math", "cmath", "re", "string", "collections", "itertools", "functools", "heapq", "bisect",
    "operator", "random", "fractions", "decimal", "statistics", "copy", "typing", "json", "hashlib",
)  # fmt: skip
_type, _isinstance, _len, _repr, _TypeError = type, isinstance, len, repr, TypeError


def _plain(value, depth=0):
    """`value` rebuilt from exact built-in types, or TypeError naming what is not plain data."""
    t = _type(value)
    if t in _EXACT:
        return value
    if depth > 200:
        raise _TypeError("the solution returned data nested more than 200 levels deep")
    if t in _SEQUENCES:
        return _SEQUENCES[t](_plain(x, depth + 1) for x in value)
    if t in _MAPPINGS:
        return _MAPPINGS[t]((_plain(k, depth + 1), _plain(v, depth + 1)) for k, v in value.items())
    if _isinstance(value, types.GeneratorType) or (hasattr(t, "__next__") and hasattr(t, "__iter__")):
        return _plain_items(value)  # an iterator: its items are checked as they are drawn
    if t is collections.defaultdict:
        out: Any = collections.defaultdict(value.default_factory)
        for k, v in value.items():
            out[_plain(k, depth + 1)] = _plain(v, depth + 1)
        return out
    raise _TypeError(f"the solution returned a {t.__name__}, not plain data (built-in values only)")


def _plain_items(iterator):
    """A generator of `iterator`'s items, each through `_plain`."""
    for item in iterator:
        yield _plain(item)


def _guard(fn):
    """`fn` whose return values go through `_plain`."""

    def guarded(*args, **kwargs):
        return _plain(fn(*args, **kwargs))

    guarded.__name__ = getattr(fn, "__name__", "guarded")
    guarded.__doc__ = getattr(fn, "__doc__", None)
    return guarded


def _test_imports(sources):
    """Top-level module names the trusted test code imports."""
    names: set[str] = set()
    for src in sources:
        try:
            tree = ast.parse(src)
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):  # before the program runs: the real isinstance
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module.split(".")[0])
    return names


def _snapshot(wanted):
    """Import `wanted` (where it can), then copy every loaded module's attributes."""
    for name in sorted(wanted):
        with contextlib.suppress(BaseException):
            __import__(name)
    modules = dict(sys.modules)
    return modules, {name: dict(vars(m)) for name, m in modules.items() if _isinstance(m, types.ModuleType)}


def _restore(modules, attributes):
    """Put back every module object and attribute the program replaced.

    What it added to `builtins` is removed, and so are tracing and profiling hooks.
    """
    sys.settrace(None)
    sys.setprofile(None)
    for name, module in modules.items():
        sys.modules[name] = module
    for name, saved in attributes.items():
        current = vars(modules[name])
        for key, value in saved.items():
            if key not in current or current[key] is not value:
                with contextlib.suppress(BaseException):
                    current[key] = value
        if modules[name] is builtins:
            for key in [k for k in current if k not in saved]:
                del current[key]


def _exports(namespace, clean_builtins, modules, entry_points):
    """What the tests see of the program: its functions (guarded), classes, real modules, plain data.

    A name that shadows a builtin is left out, unless the task names it as an entry point
    (MBPP's `sum(a, b)`).
    """
    out = {}
    for name, value in namespace.items():
        if name.startswith("__") or (name in clean_builtins and name not in entry_points):
            continue
        if _isinstance(value, types.FunctionType):
            out[name] = _guard(value)
        elif _isinstance(value, type):
            out[name] = value
        elif _isinstance(value, types.ModuleType):
            if modules.get(value.__name__) is value:
                out[name] = value
        else:
            with contextlib.suppress(BaseException):
                out[name] = _plain(value)
    return out


def _describe(exc):
    lines = traceback.format_exception(_type(exc), exc, exc.__traceback__)
    return "".join(lines[-6:])[-2000:]


def main():
    """Run the spec; print `NONCE {"unit": i, "ok": bool, "error": str}` per unit."""
    nonce = sys.stdin.readline().strip()
    with open("spec.json", encoding="utf-8") as f:
        spec = json.load(f)
    os.remove("spec.json")
    report = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the program's prints go to stderr, never into the result channel

    def emit(record):
        report.write(nonce + " " + json.dumps(record) + "\n")
        report.flush()

    setup, tests = spec.get("setup", ""), spec["tests"]
    modules, attributes = _snapshot(set(_PRELOAD) | _test_imports([setup, *tests]))
    clean_builtins = dict(vars(builtins))
    program_ns = {"__name__": "__main__", "__builtins__": builtins}
    try:
        exec(compile(spec["program"], "solution.py", "exec"), program_ns)
    except BaseException as e:
        emit({"unit": "program", "ok": False, "error": _describe(e)})
        os._exit(0)
    _restore(modules, attributes)
    tests_ns = {"__name__": "__main__", "__builtins__": clean_builtins}
    tests_ns.update(_exports(program_ns, clean_builtins, modules, set(spec.get("entry_points", []))))
    try:
        if setup:
            exec(compile(setup, "test_setup.py", "exec"), tests_ns)
    except BaseException as e:
        emit({"unit": "program", "ok": False, "error": "the test setup failed: " + _describe(e)})
        os._exit(0)
    emit({"unit": "program", "ok": True})
    for i, unit in enumerate(tests):
        try:
            exec(compile(unit, f"test_{i}.py", "exec"), tests_ns)
        except BaseException as e:
            emit({"unit": i, "ok": False, "error": _describe(e)})
            if spec.get("stop_at_first_failure", False):
                break
        else:
            emit({"unit": i, "ok": True})
    os._exit(0)


if __name__ == "__main__":
    main()
