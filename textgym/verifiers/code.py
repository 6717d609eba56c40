"""Code verifier: run a task's unit tests against a completion's code in the sandbox.

The code is the completion's last fenced ```python block (```py, ```python3 too; an
unclosed final block counts, as in a generation cut at max tokens), else its last bare
``` block, else the whole completion. The program that runs is assembled from the task
(`task.metadata`, see `build_program`); the judge reports each test unit through a private
channel tagged with a per-run nonce, so `print("passed")`, `sys.exit(0)` or `os._exit(0)`
before the tests cannot fake a pass: units without a report fail.

Reward: 1.0 when the program loads and every counted unit passes, else 0.0
(`mode="binary"`, default); or the fraction of counted units that pass (`mode="fraction"`).
Details carry the first failing unit's source, its error, and the tail of stderr.

The judge never runs, holds or compares an object of the candidate's making
(`_code_harness`): the solution runs in a candidate process of its own, forked before the
judge reads the nonce or the tests; the judge runs the task's own code (`trusted_code`: the
prompt's helpers, the reference's classes), the setup and the tests, with each entry point a
proxy that sends plain data to the candidate process and decodes plain data back
(`_code_wire`). An object whose `__eq__` always returns True, a class or callable object as
the entry point, a redefined helper, patched builtins and the harness's objects reached
through `gc` or frames all fail.
"""

from __future__ import annotations

import ast
import builtins
import json
import re
import secrets
import textwrap
import warnings
from importlib import resources
from typing import Any, NamedTuple

from textgym.sandbox import ExecRequest, ExecResult, SandboxBackend, get_backend
from textgym.types import Task
from textgym.verifiers.base import Score

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_TAGS = ("python", "py", "python3")
_HERE = resources.files("textgym.verifiers")
HARNESS_FILES = {
    "harness.py": _HERE.joinpath("_code_harness.py").read_text(encoding="utf-8"),
    "_code_candidate.py": _HERE.joinpath("_code_candidate.py").read_text(encoding="utf-8"),
    "_code_wire.py": _HERE.joinpath("_code_wire.py").read_text(encoding="utf-8"),
}
"""The judge's files in the sandbox: the trusted judge, the candidate process, their wire."""
STDERR_TAIL_CHARS = 1500


def extract_code(completion: str) -> str:
    r"""The code in a completion: last ```python block, else last bare ``` block, else all of it.

    Line endings are normalised to "\n"; leading indentation is kept (HumanEval bodies
    continue the prompt's function).

    Examples:
        >>> extract_code("Here it is:\n```python\nprint(1)\n```\nDone.")
        'print(1)\n'
        >>> extract_code("print(2)")   # no code block: all of it
        'print(2)'
    """
    text = completion.replace("\r\n", "\n")
    blocks = [(m.group(1).lower(), m.group(2)) for m in _FENCE_RE.finditer(text)]
    for wanted in (_PYTHON_TAGS, ("",)):
        chosen = [body for tag, body in blocks if tag in wanted]
        if chosen:
            return chosen[-1]
    return text


def defines_function(code: str, name: str) -> bool:
    """True when `code` defines `name` at top level (`def name(` or `async def name(`)."""
    return re.search(rf"^(?:async\s+)?def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def split_check_function(test_source: str, entry_point: str) -> list[str]:
    """Split HumanEval's `def check(candidate): ...` into one unit per top-level statement.

    Returns the units in order: `candidate = <entry_point>`, then the module-level statements
    outside `check` (imports, METADATA), then each top-level statement of `check`'s body,
    dedented, so the asserts can be run (and counted) one by one.

    Raises:
        ValueError: when the source has no `check` function.
    """
    tree = ast.parse(test_source)
    lines = test_source.splitlines(keepends=True)
    units = [f"candidate = {entry_point}"]
    check = None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == "check":
            check = node
        else:
            units.append("".join(lines[node.lineno - 1 : node.end_lineno]))
    if check is None:
        raise ValueError("test source has no `def check(candidate)`")
    for stmt in check.body:
        segment = "".join(lines[stmt.lineno - 1 : stmt.end_lineno])
        units.append(textwrap.dedent(segment))
    return units


def _has_assert(source: str) -> bool:
    try:
        return any(isinstance(n, ast.Assert) for n in ast.walk(ast.parse(source)))
    except SyntaxError:
        return True


def _names_read(source: str) -> set[str]:
    try:
        return {n.id for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Name)}
    except SyntaxError:
        return set()


class Counted(NamedTuple):
    """The test units a score counts (`units`, in order), and whether they must call the solution."""

    units: list[int]
    must_call: bool


def _passed_without_a_call(record: dict[str, Any]) -> bool:
    return record.get("ok") is True and record.get("calls") == 0


def counted_units(tests: list[str], setup: str, names: list[str]) -> Counted:
    """The test units a score counts: the asserts that reach the solution.

    A unit reaches the solution when it names one of its functions (`names`) or an alias of
    one (`candidate = has_close_elements`, assigned in the setup or an earlier unit). HumanEval's
    `assert True` units and a check's module-level statements are not counted, so a solution
    that does nothing earns nothing for them in fraction mode. The judge also counts the calls
    each unit makes: a unit that passed without calling the solution (`assert True or f(0)`)
    drops out of the count (`must_call`). Falls back to every unit that reaches the solution,
    then to every unit, for tasks written otherwise.

    Returns:
        the counted units, and whether they must call the solution (not in the last fallback).
    """
    reaching = set(names)
    for source in (setup, *tests):
        for node in _top_level(source):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Name)):
                continue
            if node.value.id in reaching:
                reaching.update(t.id for t in node.targets if isinstance(t, ast.Name))
    calls = [i for i, t in enumerate(tests) if _names_read(t) & reaching]
    if not calls:
        return Counted(list(range(len(tests))), False)
    return Counted([i for i in calls if _has_assert(tests[i])] or calls, True)


def build_program(completion: str, task: Task) -> tuple[str, str, list[str]]:
    """Assemble `(program, setup, test_units)` for a code task from its metadata and the completion.

    `task.metadata` keys: `prefix` (code before the solution, e.g. imports), `prompt_code`
    and `entry_point` (HumanEval: the prompt the body continues; a completion that defines
    `entry_point` itself replaces the prompt's function instead), `tests` (list of test
    units), `setup` (trusted test code run after the solution, before the tests, in the
    tests' own namespace: e.g. `def check`). The program is the untrusted part: the
    harness runs the setup and the tests apart from it (`_code_harness`).

    Raises:
        KeyError: when the task lacks `tests` (it is not a code task).
    """
    meta = task.metadata
    code = extract_code(completion)
    prompt_code = meta.get("prompt_code", "")
    entry = meta.get("entry_point", "")
    if prompt_code:
        head = prompt_code if prompt_code.endswith("\n") else prompt_code + "\n"
        # a completion that defines the entry point replaces the prompt's function (whose body
        # becomes `pass`), keeping the prompt's imports and helpers; a bare body continues it
        program = head + "    pass\n\n" + code if entry and defines_function(code, entry) else head + code
    else:
        program = code
    prefix = meta.get("prefix", "")
    if prefix:
        program = prefix.rstrip("\n") + "\n" + program
    return program + "\n", meta.get("setup", ""), list(meta["tests"])


def _top_level(source: str) -> list[ast.stmt]:
    """The top-level statements of `source` (none when it does not parse)."""
    try:
        with warnings.catch_warnings():  # MBPP's references hold regexes in plain strings ("\\d")
            warnings.simplefilter("ignore")
            return ast.parse(source).body
    except SyntaxError:
        return []


def trusted_code(task: Task) -> tuple[str, list[str]]:
    """The task's own code the judge runs beside the tests, and the classes it defines.

    The code the solution must not be able to replace: the task's `prefix` (imports), the
    imports, helpers and constants of HumanEval's prompt (every top-level statement but the
    entry point's function, which the solution writes), and the imports and classes of MBPP's
    reference solution (the classes its test setup builds, e.g. `Node`). A solution that
    redefines a helper changes its own copy only; the tests call the task's.

    Returns:
        (source, class names): the source to run in the judge's namespace before the setup.
    """
    meta = task.metadata
    entry = meta.get("entry_point", "")
    parts = [meta.get("prefix", "")]
    prompt_code = meta.get("prompt_code", "")
    lines = prompt_code.splitlines(keepends=True)
    for node in _top_level(prompt_code):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == entry:
            continue
        start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        parts.append("".join(lines[start - 1 : node.end_lineno]))
    reference = meta.get("reference_code") or ""
    ref_lines = reference.splitlines(keepends=True)
    classes = []
    for node in _top_level(reference):
        if isinstance(node, (ast.Import, ast.ImportFrom, ast.ClassDef)):
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            parts.append("".join(ref_lines[start - 1 : node.end_lineno]))
            if isinstance(node, ast.ClassDef):
                classes.append(node.name)
    for node in _top_level(prompt_code):
        if isinstance(node, ast.ClassDef):
            classes.append(node.name)
    return "\n".join(p.rstrip("\n") for p in parts if p.strip()) + "\n", classes


def entry_points(task: Task) -> list[str]:
    """The names a code task's tests call in the solution.

    Its `entry_point`, and the top-level functions of its reference solution
    (`metadata["reference_code"]`, MBPP). A task that names neither (a user's task of bare
    `tests`): every name its setup and tests read but neither they, the task's trusted code
    (`trusted_code`) nor the builtins define.
    """
    names = [task.metadata["entry_point"]] if task.metadata.get("entry_point") else []
    defs = (ast.FunctionDef, ast.AsyncFunctionDef)
    names += [n.name for n in _top_level(task.metadata.get("reference_code") or "") if isinstance(n, defs)]
    if names:
        return names
    sources = [task.metadata.get("setup", ""), *task.metadata.get("tests", [])]
    read: list[str] = []
    bound = set(dir(builtins))
    for node in (n for src in sources for stmt in _top_level(src) for n in ast.walk(stmt)):
        if isinstance(node, ast.Name):
            (bound.add if isinstance(node.ctx, ast.Store) else read.append)(node.id)
        elif isinstance(node, (*defs, ast.ClassDef)):
            bound.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            bound.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.arg):
            bound.add(node.arg)
    for node in _top_level(trusted_code(task)[0]):
        bound.update(n.id for n in ast.walk(node) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store))
        if isinstance(node, (*defs, ast.ClassDef)):
            bound.add(node.name)
    return list(dict.fromkeys(n for n in read if n not in bound))


class CodeVerifier:
    r"""Reward a completion by running the task's tests on its code in a sandbox.

    Args:
        sandbox: backend name ("process", "docker", "unsafe_local") or a backend instance.
        mode: "binary" (1.0 iff all counted units pass) or "fraction" (share of counted units passed).
        timeout_s: wall-clock limit of one run (program + all its tests), seconds.
        memory_mb: address-space limit of the run, MiB.

    Raises:
        ValueError: on an unknown mode or backend.
        SandboxUnavailableError: when the backend cannot run on this machine.

    Examples:
        >>> from textgym.types import Task
        >>> task = Task(task_id="add", prompt="Write add(a, b).", answer="",
        ...             metadata={"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0"]})
        >>> verifier = CodeVerifier("process", mode="fraction")   # bubblewrap
        >>> verifier("def add(a, b):\n    return a + b", task).reward
        1.0
        >>> verifier("def add(a, b):\n    return 3", task).reward   # the second assert fails
        0.5
        >>> verifier("while True: pass", task).details["error"][:9]
        'timed out'
    """

    def __init__(
        self,
        sandbox: str | SandboxBackend = "process",
        mode: str = "binary",
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
    ):
        if mode not in ("binary", "fraction"):
            raise ValueError(f"mode must be 'binary' or 'fraction', got {mode!r}")
        self.backend = get_backend(sandbox)
        self.mode = mode
        self.timeout_s = float(timeout_s)
        self.memory_mb = int(memory_mb)

    def request(self, completion: str, task: Task) -> tuple[ExecRequest, str, list[str], Counted]:
        """The sandbox request for one completion, its nonce, its test units and those counted."""
        program, setup, tests = build_program(completion, task)
        trusted, classes = trusted_code(task)
        nonce = secrets.token_hex(16)
        names = entry_points(task)
        spec = {
            "program": program,
            "trusted": trusted,
            "setup": setup,
            "tests": tests,
            "entry_points": names,
            "classes": classes,
            "stop_at_first_failure": self.mode == "binary",
        }
        req = ExecRequest(
            files={**HARNESS_FILES, "spec.json": json.dumps(spec)},
            cmd=("python3", "-I", "harness.py"),
            stdin=nonce + "\n",
            timeout_s=self.timeout_s,
            memory_mb=self.memory_mb,
            report=True,
        )
        return req, nonce, tests, counted_units(tests, setup, names)

    def score_result(self, result: ExecResult, nonce: str, tests: list[str], counting: Counted) -> Score:
        """Turn a harness run into a `Score` (see the module docstring); `counting` from `counted_units`."""
        reports: dict[Any, dict[str, Any]] = {}
        for line in result.report.splitlines():
            if line.startswith(nonce + " "):
                try:
                    rec = json.loads(line[len(nonce) + 1 :])
                except json.JSONDecodeError:
                    continue
                unit = rec.get("unit")
                if unit in reports:  # the judge reports each unit once: a second report is forged
                    rec = {"unit": unit, "ok": False, "error": "the unit was reported twice"}
                reports[unit] = rec
        loaded = reports.get("program", {}).get("ok", False)
        idle = {
            i for i in counting.units if counting.must_call and _passed_without_a_call(reports.get(i, {}))
        }
        counted = [i for i in counting.units if i not in idle]
        passed = [i for i in counted if loaded and reports.get(i, {}).get("ok") is True]
        details: dict[str, Any] = {
            "passed": len(passed),
            "total": len(counted),
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "oom": result.oom,
            # the judge refused what the solution offered (a value that is not plain data, an
            # entry point that is not a function): hack telemetry counts these
            "refused": any(rec.get("refused") is True for rec in reports.values()),
        }
        failing = None
        if not loaded:
            rec = reports.get("program")
            details["failed_test"] = "(the program itself)"
            details["error"] = rec["error"] if rec else self._why_no_report(result)
        else:
            failing = next((i for i in range(len(tests)) if not reports.get(i, {}).get("ok", False)), None)
            if failing is not None:
                rec = reports.get(failing)
                details["failed_test"] = tests[failing]
                details["error"] = rec["error"] if rec else self._why_no_report(result)
        tail = result.stderr[-STDERR_TAIL_CHARS:]
        if tail:
            details["stderr_tail"] = tail
        if self.mode == "binary":
            reward = 1.0 if loaded and counted and len(passed) == len(counted) and failing is None else 0.0
        else:
            reward = len(passed) / len(counted) if counted else 0.0
        return Score(reward, details)

    @staticmethod
    def _why_no_report(result: ExecResult) -> str:
        if result.timed_out:
            return f"timed out after {result.duration_s:.1f} s"
        if result.oom:
            return "ran out of memory"
        return f"no result reported (the process exited with {result.exit_code} before the test ran)"

    def __call__(self, completion: str, task: Task) -> Score:
        """Score one completion (see the module docstring). Never raises on the completion's content.

        Raises:
            SandboxError: when the sandbox itself fails (not the code in it).
        """
        if not isinstance(completion, str):
            return Score(0.0, {"error": f"completion must be a str, got {type(completion).__name__}"})
        req, nonce, tests, counted = self.request(completion, task)
        return self.score_result(self.backend.execute(req), nonce, tests, counted)

    def score_batch(self, completions: list[str], tasks: list[Task]) -> list[Score]:
        """Score many completions through the backend's bounded worker pool; scores in order."""
        built = [self.request(c, t) for c, t in zip(completions, tasks, strict=True)]
        results = self.backend.run_batch([b[0] for b in built])
        return [self.score_result(r, *b[1:]) for r, b in zip(results, built, strict=True)]
