"""The trusted code judge, run inside the sandbox by `CodeVerifier` (standard library only).

It never runs, holds or compares an object of the candidate's making. The solution runs in a
process of its own (`_code_candidate.py`); this process runs the task's trusted code (the
helpers and imports the task's prompt defines, the classes of its reference solution, the
test setup) and the test units, in which each entry point is a proxy: calling it sends the
arguments to the candidate process as plain data and returns what comes back, decoded into
fresh objects of this process's own types (`_code_wire`). Whatever the solution defines
(a class whose instances equal everything, a redefined helper, patched builtins, a callable
object as the entry point) stays in its own process, and anything but plain data fails the
unit that asked for it.

Before it reads anything secret this process makes itself non-dumpable
(`prctl(PR_SET_DUMPABLE, 0)`): a process of the same uid can then neither trace it nor read
its memory or its descriptors through /proc, so the candidate cannot learn the nonce or
write to the result channel. The candidate process is forked off before the nonce and the
spec are read, so its copy of this process holds neither, and it closes its copy of the
report channel before anything else. Results go, one line per unit, prefixed by the nonce
read from stdin, to the sandbox's private report channel (`ExecRequest.report`: a pipe at the
descriptor `TEXTGYM_REPORT_FD` names, which no other process of the sandbox holds: not its
init, which keeps the stdin, stdout and stderr pipes that any process of the uid may open
through `/proc/1/fd`). Nothing is reported on stdout; everything printed goes to stderr. A
unit without a result line (the judge killed, the candidate hung past the sandbox's timeout)
counts as failed, and so does every unit when the sandbox gave no report channel.

Input: `spec.json` = {"program": the solution's source, "trusted": the task's trusted code,
"setup": test setup, "tests": [units], "entry_points": [names], "classes": [names],
"stop_at_first_failure": bool}; it is read and removed before the program is loaded.
"""

import ast
import builtins
import contextlib
import ctypes
import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _code_candidate as candidate_process
import _code_wire as wire

del sys.path[0]  # nothing the candidate writes later can be imported here

PR_SET_DUMPABLE = 4
REPORT_FD_ENV = "TEXTGYM_REPORT_FD"  # textgym.sandbox's name for the private report channel
_SAFE_ERRORS = {
    name: getattr(builtins, name)
    for name in (
        "ValueError", "TypeError", "KeyError", "IndexError", "ZeroDivisionError", "AttributeError",
        "ArithmeticError", "OverflowError", "RecursionError", "NotImplementedError", "LookupError",
        "UnicodeError", "RuntimeError",
    )
}  # fmt: skip
"""Exceptions the candidate may raise that a test may catch by type; any other is a CandidateError."""


class CandidateError(Exception):
    """The candidate's function raised an exception a test may not catch by its own type."""


class RefusedError(BaseException):
    """The judge refused what the solution offered: a value that is not plain data, or a non-function.

    (A non-function entry point: a class, a callable object.) A BaseException, so that no
    `except Exception` (or `except TypeError`) of a test can take it for the solution's own
    error: the unit fails.
    """


class CandidateGoneError(BaseException):
    """The candidate process died, or answered something that is not a message.

    A BaseException for the same reason as `RefusedError`: a test that catches everything
    cannot pass on it.
    """


def _non_dumpable() -> None:
    """Make this process non-dumpable (no ptrace, no /proc/<pid>/mem or fd by the same uid).

    Raises:
        OSError: when the kernel refuses it: the judge then reports no result at all.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def _describe(exc: BaseException) -> str:
    lines = traceback.format_exception(type(exc), exc, exc.__traceback__)
    return "".join(lines[-6:])[-2000:]


def _imports(sources):
    """Top-level module names some trusted source imports (imported before the candidate runs)."""
    names: set[str] = set()
    for src in sources:
        with contextlib.suppress(SyntaxError):
            for node in ast.walk(ast.parse(src)):
                if isinstance(node, ast.Import):
                    names.update(a.name.split(".")[0] for a in node.names)
                elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                    names.add(node.module.split(".")[0])
    return names


class Candidate:
    """The candidate process, seen from the judge: load the program, call its functions.

    It is forked before the judge reads anything secret (`fork`), then given the program.
    """

    def __init__(self, workdir, report_fd):
        requests_r, requests_w = os.pipe()
        answers_r, answers_w = os.pipe()
        run = os.path.join(workdir, "run")
        os.makedirs(run, exist_ok=True)
        sys.stdout.flush()
        sys.stderr.flush()
        self.pid = os.fork()
        if self.pid == 0:  # the candidate: the judge's ends of the pipes are not its to hold
            os.close(report_fd)
            os.close(requests_w)
            os.close(answers_r)
            try:
                candidate_process.serve(requests_r, answers_w, run)
            finally:
                os._exit(0)
        os.close(requests_r)
        os.close(answers_w)
        self.requests = os.fdopen(requests_w, "w", encoding="utf-8")
        self.answers = os.fdopen(answers_r, "r", encoding="utf-8")
        self.classes: frozenset[str] = frozenset()
        self.gone = None
        self.calls = 0  # calls of the solution's functions so far (a unit's count is reported)

    def ask(self, message):
        """Send one request and read its answer; CandidateGoneError once the process is gone."""
        if self.gone is not None:
            raise CandidateGoneError(self.gone)
        try:
            wire.send(self.requests, message)
            answer = wire.receive(self.answers)
        except (OSError, ValueError, wire.WireError) as e:
            answer, why = None, f"the candidate process broke the protocol: {e}"
        else:
            why = "the candidate process exited"
        if answer is None:
            self.gone = why
            raise CandidateGoneError(why)
        return answer


def _proxy(candidate, name, kind, make_object):
    """A function of the trusted namespace that calls `name` in the candidate process."""

    def call(*args, **kwargs):
        if kind == "missing":
            raise NameError(f"the solution does not define {name}")
        if kind != "function":
            raise RefusedError(f"the solution's {name} is a {kind}, not a function")
        candidate.calls += 1
        answer = candidate.ask(
            {"op": "call", "fn": name, "args": wire.encode(list(args), candidate.classes),
             "kwargs": wire.encode(dict(kwargs), candidate.classes)}
        )  # fmt: skip
        if answer.get("ok") is not True:
            kind_ = answer.get("error")
            message = str(answer.get("message", ""))[-2000:]
            if kind_ in ("WireError", "RefusedError"):  # the candidate could not send plain data
                raise RefusedError(f"the solution's {name} returned {message.strip().splitlines()[-1:]}")
            error = _SAFE_ERRORS.get(kind_) if type(kind_) is str else None
            raise (error or CandidateError)(f"the solution raised {kind_!s:.40}: {message}")
        try:
            value = wire.decode(answer.get("value"), make_object)
            _write_back(args, wire.decode(answer.get("args", []), make_object))
        except wire.WireError as e:
            raise RefusedError(f"the solution's {name} answered {e}") from None
        return value

    call.__name__ = name
    return call


def _write_back(args, after):
    """Apply the candidate's in-place changes to the caller's lists, dicts, sets and objects."""
    if type(after) is not list or len(after) != len(args):
        return
    for mine, theirs in zip(args, after, strict=True):
        if type(mine) is list and type(theirs) is list:
            mine[:] = theirs
        elif type(mine) in (dict, set) and type(theirs) is type(mine):
            mine.clear()
            mine.update(theirs)
        elif hasattr(mine, "__dict__") and type(theirs) is type(mine) and not isinstance(mine, type):
            vars(mine).clear()
            vars(mine).update(vars(theirs))


def _report_channel():
    """The sandbox's private report channel (`TEXTGYM_REPORT_FD`), no longer inheritable.

    Raises:
        OSError: when the sandbox gave none: the judge then reports nothing, and every unit fails.
    """
    fd = int(os.environ.pop(REPORT_FD_ENV, "-1"))
    os.fstat(fd)  # EBADF when absent
    os.set_inheritable(fd, False)
    return fd


def main():
    """Run the spec; write `NONCE {"unit": i, "ok": bool, "error" | "calls": ...}` per unit as its report.

    `calls` (on a passed unit) counts the calls of the solution's functions the unit made.
    """
    _non_dumpable()
    report_fd = _report_channel()
    workdir = os.path.dirname(os.path.abspath(__file__))
    candidate = Candidate(workdir, report_fd)  # forked before the nonce and the tests are read
    nonce = sys.stdin.readline().strip()
    with open(os.path.join(workdir, "spec.json"), encoding="utf-8") as f:
        spec = json.load(f)
    os.remove(os.path.join(workdir, "spec.json"))
    report = os.fdopen(report_fd, "w", encoding="utf-8")
    os.dup2(2, 1)  # prints (the tests', the candidate's) go to stderr

    def emit(record):
        report.write(nonce + " " + json.dumps(record) + "\n")
        report.flush()

    setup, tests, trusted = spec.get("setup", ""), spec["tests"], spec.get("trusted", "")
    for name in sorted(_imports([trusted, setup, *tests])):  # before the candidate can write files
        with contextlib.suppress(BaseException):
            __import__(name)
    classes = candidate.classes = frozenset(spec.get("classes", []))
    namespace = {"__name__": "__main__", "__builtins__": builtins}

    def make_object(name, attrs):
        cls = namespace.get(name)
        if name not in classes or not isinstance(cls, type):
            raise wire.WireError(f"an object of {name!r}, which is not one of the task's classes")
        obj: object = object.__new__(cls)
        vars(obj).update(attrs)
        return obj

    try:
        answer = candidate.ask(
            {"op": "load", "program": spec["program"], "entry_points": spec.get("entry_points", []),
             "classes": sorted(classes)}
        )  # fmt: skip
    except CandidateGoneError as e:
        emit({"unit": "program", "ok": False, "error": str(e)})
        os._exit(0)
    if answer.get("ok") is not True:
        error = str(answer.get("error", "the program failed"))[-2000:]
        emit({"unit": "program", "ok": False, "error": error})
        os._exit(0)
    kinds = answer.get("kinds") if type(answer.get("kinds")) is dict else {}
    try:
        exec(compile(trusted, "task.py", "exec"), namespace)  # the task's helpers and classes
        for name in spec.get("entry_points", []):
            namespace[name] = _proxy(candidate, name, str(kinds.get(name, "missing")), make_object)
        if setup:
            exec(compile(setup, "test_setup.py", "exec"), namespace)
    except BaseException as e:
        emit({"unit": "program", "ok": False, "error": "the test setup failed: " + _describe(e)})
        os._exit(0)
    emit({"unit": "program", "ok": True})
    for i, unit in enumerate(tests):
        calls = candidate.calls
        try:
            exec(compile(unit, f"test_{i}.py", "exec"), namespace)
        except BaseException as e:
            emit({"unit": i, "ok": False, "error": _describe(e), "refused": isinstance(e, RefusedError)})
            if spec.get("stop_at_first_failure", False):
                break
        else:
            emit({"unit": i, "ok": True, "calls": candidate.calls - calls})
    os._exit(0)


if __name__ == "__main__":
    main()
