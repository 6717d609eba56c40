"""Generate MBPP's hidden tests: type-aware mutations of the shown inputs, graded by the reference.

`MBPP-v0` shows one of a task's asserts in the prompt and grades on hidden ones too (issue 61):
MBPP's other `test_list` asserts, the full set's `challenge_test_list`, and the tests this tool
writes to `textgym/data/mbpp/hidden_tests.jsonl`. The env reads that file; it never generates.

How a task's tests are made (the idea of EvalPlus's type-aware input mutation, Liu et al. 2023,
arXiv:2305.01210; written anew here):

1. Templates: each `test_list` assert of the task that calls one of the reference's functions
   once, with literal arguments, in one of MBPP's shapes: `assert E == Y`,
   `assert math.isclose(E, Y, ...)`, `assert E` or `assert not E`, where `E` holds the call
   (`E` may wrap it: the sanitized set's `set(f(x)) == set(y)`).
2. Inputs: the templates' arguments mutated by type, keeping what all templates share
   (`profile`): ints keep their sign and stay near the shown range; floats keep their sign and
   decimals; strings are edited with the letters (digits, for digit strings) the templates
   use, keeping a length every template shares; lists and sets gain, lose and mutate elements
   unless every template's has one length; tuples and rectangular rows keep their length;
   sorted and duplicate-free sequences stay so; dict values mutate, keys stay; an int that
   equals (or bounds) another argument's length keeps doing so; sequences of one length stay
   of one length. Each input mutates some of the arguments of a template or of an input made
   before (seeded `random.Random`).
3. Outputs: `E` with the new arguments runs on the reference solution in textgym's sandbox
   (the `process` backend: bubblewrap), each input in a forked process of its own, twice in
   it, in two sandbox runs (two string-hash seeds). An input is kept when the reference
   returns within `--max-call-s` every time, the same value every time, and that value is
   plain data whose `repr` reads back equal (None, bool, int, finite float, str, bytes, and
   lists, tuples, sets and dicts of these; a dict or tuple subclass counts as the plain type;
   floats nested in a container only with at most 6 significant digits). A reference that
   reads the clock, randomness, `id`, `hash` or `sys.getsizeof` is not used at all.
4. Asserts: `assert E' == <value>` (`assert E'` / `assert not E'` for a truthiness template),
   a float as `math.isclose(E', value, rel_tol=1e-6, abs_tol=1e-9)` (or the template's own
   tolerance). Up to `--per-task` of them per task, chosen to spread over different outputs.
5. Check: every reference solution (the subset's own) runs the task's whole graded list
   through `CodeVerifier` (the judge the env uses), twice; a generated test it fails is
   dropped and the check repeats.

Run from the repository root (needs bubblewrap; a few minutes on 2 cores):

    python tools/mbpp_hidden_tests.py --seed 61 --per-task 6

It rewrites `textgym/data/mbpp/hidden_tests.jsonl` and prints the counts that
`textgym/data/mbpp/PROVENANCE.md` records.
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import random
import re
import sys
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from textgym.envs.code import MBPP_HIDDEN_FILE, mbpp_rows, mbpp_task
from textgym.sandbox import ExecRequest, get_backend
from textgym.verifiers.code import CodeVerifier

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "textgym" / "data" / "mbpp" / MBPP_HIDDEN_FILE
UNPORTABLE = re.compile(r"getsizeof|\brandom\b|\btime\b|datetime|\bid\(|\bhash\(|\buuid\b")
"""References whose outputs depend on the interpreter, the clock or chance: no tests generated."""
MAX_REPR = 300
"""Longest argument list or expected value (characters of `repr`) a generated assert holds."""
FLOAT_TOLERANCE = "rel_tol=1e-06, abs_tol=1e-09"

# --- templates --------------------------------------------------------------------------------------


@dataclass
class Template:
    """One shown-or-hidden MBPP assert, as a shape to fill with new arguments.

    Attributes:
        source: the assert as MBPP writes it.
        expr: the expression holding the call (`E`), an AST.
        call: the call node inside `expr`.
        args: the call's positional arguments (values).
        kwargs: its keyword arguments (values).
        kind: "eq", "isclose", "truthy" (`assert E`) or "falsy" (`assert not E`).
        tolerance: the keywords of a template's `math.isclose` (source text), else "".
    """

    source: str
    expr: ast.expr
    call: ast.Call
    args: list[Any]
    kwargs: dict[str, Any]
    kind: str
    tolerance: str = ""


def _calls(node: ast.AST, names: set[str]) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in names
    ]


def parse_template(source: str, names: set[str]) -> Template | None:
    """The template of an MBPP assert, or None when it has no shape this tool fills (module doc)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.Assert):
        return None
    test = tree.body[0].test
    if len(_calls(test, names)) != 1:
        return None
    kind, tolerance, expr = "eq", "", None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq):
        sides = [test.left, test.comparators[0]]
        holding = [s for s in sides if _calls(s, names)]
        expr = holding[0]
    elif (
        isinstance(test, ast.Call)
        and ast.unparse(test.func) == "math.isclose"
        and len(test.args) == 2
        and all(isinstance(k.arg, str) and k.arg.endswith("_tol") for k in test.keywords)
    ):
        kind = "isclose"
        expr = next(a for a in test.args if _calls(a, names))
        tolerance = ", ".join(ast.unparse(k) for k in test.keywords)
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        kind, expr = "falsy", test.operand
    elif _calls(test, names) and isinstance(test, ast.Call):
        kind, expr = "truthy", test
    if expr is None:
        return None
    call = _calls(expr, names)[0]
    try:
        args = [ast.literal_eval(a) for a in call.args]
        kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return None  # an argument built by the test setup (MBPP's Node trees, Pair objects)
    if any(isinstance(a, ast.Starred) for a in call.args) or len(kwargs) != len(call.keywords):
        return None
    return Template(source, expr, call, args, kwargs, kind, tolerance)


def fill(template: Template, args: list[Any], kwargs: dict[str, Any]) -> str:
    """The expression `E` of `template` with the call's arguments replaced (source text)."""
    expr = copy.deepcopy(template.expr)
    call = next(
        n for n in ast.walk(expr) if isinstance(n, ast.Call) and ast.dump(n) == ast.dump(template.call)
    )
    call.args = [ast.parse(repr(a), mode="eval").body for a in args]
    call.keywords = [
        ast.keyword(arg=k, value=ast.parse(repr(v), mode="eval").body) for k, v in kwargs.items()
    ]
    return ast.unparse(expr)


TRUTHINESS = ("truthy", "falsy")
"""Templates that test what the call's value is worth as a bool (`assert E`, `assert not E`)."""


def probe(template: Template, expr: str) -> str:
    """What the sandbox evaluates for `expr`: `E`, or `[bool(E), E is False]` for a truthiness template.

    (A truthiness template's reference may return a regex match, which is not plain data; what
    the assert needs is its truth, and whether it is False itself: then the generated assert is
    `E == False`, which a reply of None fails, as it fails `assert E`.)
    """
    return f"(lambda v: [bool(v), v is False])({expr})" if template.kind in TRUTHINESS else expr


def weak(test: str) -> bool:
    """Whether a reply that returns None passes the generated assert `test` (`assert not E`)."""
    return test.startswith("assert not ")


def assert_source(template: Template, expr: str, value: Any) -> str:
    """The generated assert for `expr` whose reference value is `value` (module doc, step 4)."""
    if template.kind in TRUTHINESS:  # value: `[bool(E), E is False]` (`probe`)
        truthy, exact_false = value
        return (
            f"assert {expr}" if truthy else f"assert {expr} == False" if exact_false else f"assert not {expr}"
        )
    if type(value) is float:
        tolerance = template.tolerance or FLOAT_TOLERANCE
        return f"import math\nassert math.isclose({expr}, {value!r}, {tolerance})"
    return f"assert {expr} == {value!r}"


# --- profiles: what every template shares at one argument position -------------------------------------


@dataclass
class Profile:
    """What the shown values of one argument position share, which mutations keep.

    Attributes:
        kind: the values' type name ("mixed" when they differ).
        low, high: the smallest and largest number seen (ints, floats; also list elements).
        sign: "pos" (all > 0), "nonneg" (all >= 0) or "any".
        decimals: most decimals a float shows.
        fixed_len: every value has the same length (strings, sequences).
        length: that length.
        nonempty: no value is empty.
        sorted: "asc", "desc" or "" (sequences of 3+ elements, all sorted one way).
        unique: no value repeats an element (sequences of 3+ elements).
        alphabet: the letters (or digits, for digit-only strings) the strings use.
        digits: every string is made of digits.
        rect: every value is a sequence of sequences of one length (rows keep their length).
        element: the profile of the elements (all values' elements together).
        key, value: the profiles of a dict's keys and values.
    """

    kind: str
    low: float = 0.0
    high: float = 0.0
    sign: str = "any"
    decimals: int = 1
    fixed_len: bool = False
    length: int = 0
    nonempty: bool = True
    sorted: str = ""
    unique: bool = False
    alphabet: str = ""
    digits: bool = False
    rect: bool = False
    element: Profile | None = None
    key: Profile | None = None
    value: Profile | None = None


def _kind(value: Any) -> str:
    return type(value).__name__


def _sortable(xs: Iterable[Any]) -> bool:
    items = list(xs)
    try:
        sorted(items)
    except TypeError:
        return False
    return True


def profile(values: list[Any]) -> Profile:
    """The `Profile` of the values one argument position takes across a task's templates."""
    kinds = {_kind(v) for v in values}
    kind = kinds.pop() if len(kinds) == 1 else "mixed"
    p = Profile(kind)
    numbers = [v for v in values if type(v) in (int, float)]
    if numbers:
        p.low, p.high = min(numbers), max(numbers)
        p.sign = "pos" if p.low > 0 else "nonneg" if p.low >= 0 else "any"
        p.decimals = max(
            [len(repr(v).split(".")[1]) for v in numbers if type(v) is float and "." in repr(v)] or [1]
        )
    if kind == "str":
        text = "".join(values)
        p.digits = bool(text) and text.isdigit()
        p.alphabet = "".join(sorted({c for c in text if (c.isdigit() if p.digits else c.isalpha())}))
    if kind in ("str", "list", "tuple", "set", "dict"):
        lengths = {len(v) for v in values}
        p.fixed_len = len(lengths) == 1
        p.length = next(iter(lengths)) if p.fixed_len else 0
        p.nonempty = 0 not in lengths
    if kind in ("list", "tuple", "set"):
        seqs = [list(v) for v in values]
        elements = [x for s in seqs for x in s]
        if elements:
            p.element = profile(elements)
        long = [s for s in seqs if len(s) >= 3]
        if kind != "set" and long and all(_sortable(s) for s in seqs):
            if all(s == sorted(s) for s in seqs):
                p.sorted = "asc"
            elif all(s == sorted(s, reverse=True) for s in seqs):
                p.sorted = "desc"
        if long:
            p.unique = all(len(set(map(repr, s))) == len(s) for s in seqs)
        rows = [s for s in seqs if s and all(type(x) in (list, tuple, str) for x in s)]
        p.rect = len(rows) == len(seqs) and all(len({len(x) for x in s}) == 1 for s in rows)
        if p.rect and p.element is not None:
            p.element.fixed_len = True
    if kind == "dict":
        keys = [k for v in values for k in v]
        vals = [x for v in values for x in v.values()]
        p.key = profile(keys) if keys else None
        p.value = profile(vals) if vals else None
    return p


# --- mutation ---------------------------------------------------------------------------------------


def _signed(x: float, p: Profile) -> bool:
    return x > 0 if p.sign == "pos" else x >= 0 if p.sign == "nonneg" else True


def mutate(value: Any, p: Profile | None, rng: random.Random, depth: int = 0) -> Any:
    """`value` changed once by its type, within what `p` says every shown value shares (module doc)."""
    if p is None or depth > 6:
        return value
    t = type(value)
    if t is bool:
        return not value
    if t is int:
        span = max(int(p.high - p.low), abs(int(p.high)), 4)
        for _ in range(10):
            new = value + rng.choice([-1, 1, -2, 2, 3, rng.randint(-span, span) // 2 or 1])
            if new != value and _signed(new, p) and new <= max(2 * p.high, p.high + 10):
                return new
        return value
    if t is float:
        for _ in range(10):
            new = round(value + rng.uniform(-1, 1) * max(abs(value), 1.0) * 0.5, max(p.decimals, 1))
            if new != value and _signed(new, p):
                return new
        return value
    if t is str:
        return _mutate_str(value, p, rng)
    if t in (list, tuple):
        return t(_mutate_seq(list(value), p, rng, depth, resize=t is list or not p.fixed_len))
    if t is set:
        return set(_mutate_seq(list(value), p, rng, depth, resize=True))
    if t is dict and value:
        out = dict(value)
        key = rng.choice(list(out))
        out[key] = mutate(out[key], p.value, rng, depth + 1)
        return out
    return value


def _mutate_str(value: str, p: Profile, rng: random.Random) -> str:
    chars = list(value)
    alphabet = p.alphabet
    spots = [i for i, c in enumerate(chars) if (c.isdigit() if p.digits else c.isalpha())]
    ops = ["replace"] if spots else []
    if not p.fixed_len and alphabet:
        ops.append("insert")
        if len(spots) > 1:
            ops.append("delete")
    if not ops or not alphabet:
        return value
    op = rng.choice(ops)
    if op == "replace":
        i = rng.choice(spots)
        same_case = [c for c in alphabet if c.isupper() == chars[i].isupper()] or list(alphabet)
        chars[i] = rng.choice(same_case)
    elif op == "insert":
        if spots:
            i = rng.choice(spots)
            same_case = [c for c in alphabet if c.isupper() == chars[i].isupper()] or list(alphabet)
            chars.insert(i + rng.randint(0, 1), rng.choice(same_case))
        else:
            chars.append(rng.choice(alphabet))
    else:
        del chars[rng.choice(spots)]
    if p.digits and len(chars) > 1 and chars[0] == "0" and value[:1] != "0":
        chars[0] = rng.choice([c for c in alphabet if c != "0"] or ["1"])
    return "".join(chars)


def _mutate_seq(items: list[Any], p: Profile, rng: random.Random, depth: int, resize: bool) -> list[Any]:
    ops = ["element"] if items and p.element is not None else []
    if resize and not p.fixed_len:
        if items:
            ops.append("add")
        if len(items) > 1 or (items and not p.nonempty):
            ops.append("remove")
    if not ops:
        return items
    op = rng.choice(ops)
    if op == "element":
        i = rng.randrange(len(items))
        items[i] = mutate(items[i], p.element, rng, depth + 1)
    elif op == "add":
        items.insert(rng.randint(0, len(items)), mutate(rng.choice(items), p.element, rng, depth + 1))
    else:
        del items[rng.randrange(len(items))]
    if p.unique:
        seen: set[str] = set()
        items = [x for x in items if not (repr(x) in seen or seen.add(repr(x)))]  # type: ignore[func-returns-value]
    if p.sorted and _sortable(items):
        items = sorted(items, reverse=p.sorted == "desc")
    return items


@dataclass
class Relations:
    """Relations between the arguments that every template of a signature keeps.

    Attributes:
        length_of: int position -> (sequence position, offset): the int equals that length + offset.
        bounded_by: (int position, sequence position, strict): the int is below (or at) that length.
        ordered: (int position, int position, strict): the first is below (or at) the second.
        same_length: groups of sequence positions that always have one length.
    """

    length_of: dict[int, tuple[int, int]] = field(default_factory=dict)
    bounded_by: list[tuple[int, int, bool]] = field(default_factory=list)
    ordered: list[tuple[int, int, bool]] = field(default_factory=list)
    same_length: list[tuple[int, int]] = field(default_factory=list)


def relations(rows: list[list[Any]]) -> Relations:
    """The `Relations` that hold in every row of arguments (one row per template)."""
    r = Relations()
    n = len(rows[0])
    ints = [i for i in range(n) if all(type(row[i]) is int for row in rows)]
    seqs = [i for i in range(n) if all(type(row[i]) in (list, tuple, str, set, dict) for row in rows)]
    for i in ints:
        for j in seqs:
            for offset in (0, -1):
                if all(row[i] == len(row[j]) + offset for row in rows) and i not in r.length_of:
                    r.length_of[i] = (j, offset)
            if i not in r.length_of:
                if all(row[i] < len(row[j]) for row in rows):
                    r.bounded_by.append((i, j, True))
                elif all(row[i] <= len(row[j]) for row in rows):
                    r.bounded_by.append((i, j, False))
    for a in ints:
        for b in ints:
            if a < b:
                if all(row[a] == row[b] for row in rows):
                    r.ordered += [(a, b, False), (b, a, False)]
                elif all(row[a] < row[b] for row in rows):
                    r.ordered.append((a, b, True))
                elif all(row[a] > row[b] for row in rows):
                    r.ordered.append((b, a, True))
    for a in seqs:
        for b in seqs:
            if a < b and all(len(row[a]) == len(row[b]) for row in rows):
                r.same_length.append((a, b))
    return r


def _keeps(args: list[Any], r: Relations) -> bool:
    for i, j, strict in r.bounded_by:
        if not (args[i] < len(args[j]) if strict else args[i] <= len(args[j])):
            return False
    for a, b, strict in r.ordered:
        if not (args[a] < args[b] if strict else args[a] <= args[b]):
            return False
    return all(len(args[a]) == len(args[b]) for a, b in r.same_length)


def candidate_inputs(
    templates: list[Template], rng: random.Random, count: int, attempts: int = 400
) -> list[tuple[Template, list[Any], dict[str, Any]]]:
    """Up to `count` new `(template, args, kwargs)`, mutated from the templates (module doc, step 2)."""
    groups: dict[tuple[int, tuple[str, ...]], list[Template]] = {}
    for t in templates:
        groups.setdefault((len(t.args), tuple(t.kwargs)), []).append(t)
    plans = []
    for group in groups.values():
        rows = [t.args + list(t.kwargs.values()) for t in group]
        profiles = [profile([row[i] for row in rows]) for i in range(len(rows[0]))]
        rel = relations(rows)
        for a, b in rel.same_length:
            profiles[a].fixed_len = profiles[b].fixed_len = True
        plans.append((group, profiles, rel))
    seen = {repr((t.args, t.kwargs)) for t in templates}
    pool = [(plan, list(t.args) + list(t.kwargs.values()), t) for plan in plans for t in plan[0]]
    out: list[tuple[Template, list[Any], dict[str, Any]]] = []
    for _ in range(attempts):
        if len(out) >= count or not pool:
            break
        (group, profiles, rel), base, template = rng.choice(pool)
        if not base:
            continue
        args = copy.deepcopy(base)
        chosen = [i for i in range(len(args)) if i not in rel.length_of and rng.random() < 0.5]
        free = [i for i in range(len(args)) if i not in rel.length_of]
        if not chosen and free:
            chosen = [rng.choice(free)]
        for i in chosen:
            args[i] = mutate(args[i], profiles[i], rng)
        for i, (j, offset) in rel.length_of.items():
            args[i] = len(args[j]) + offset
        if not _keeps(args, rel):
            continue
        npos = len(template.args)
        pos, kw = args[:npos], dict(zip(template.kwargs, args[npos:], strict=True))
        key = repr((pos, kw))
        if key in seen or len(repr(args)) > MAX_REPR:
            continue
        seen.add(key)
        pool.append(((group, profiles, rel), args, template))
        out.append((template, pos, kw))
    return out


# --- running the reference in the sandbox --------------------------------------------------------------

DRIVER = r"""
import json, math, os, select, signal, time
spec = json.load(open("spec.json"))
ns = {"__name__": "__main__"}
out = []
try:
    exec(compile(spec["code"], "reference.py", "exec"), ns)
    if spec["setup"]:
        exec(compile(spec["setup"], "setup.py", "exec"), ns)
except BaseException as e:
    print("@@RESULT@@ " + json.dumps({"load_error": repr(e)[:300]}), flush=True)
    os._exit(0)

PLAIN = (type(None), bool, int, float, str, bytes)

def plain(v, top=True):
    t = type(v)
    if t is float:
        return (math.isfinite(v) and (top or len(repr(abs(v)).replace(".", "").strip("0")) <= 6)), v
    if t in PLAIN:
        return True, v
    if isinstance(v, dict):
        items = [(plain(k, False), plain(x, False)) for k, x in v.items()]
        return all(a[0] and b[0] for a, b in items), {a[1]: b[1] for a, b in items}
    if isinstance(v, tuple) and t is not tuple and not hasattr(t, "_fields"):
        return False, v
    if t in (list, tuple, set) or isinstance(v, tuple):
        items = [plain(x, False) for x in v]
        kind = tuple if isinstance(v, tuple) else t
        return all(a for a, _ in items), kind(b for _, b in items)
    return False, v

for src in spec["exprs"]:
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            reps, secs = [], []
            for _ in range(2):
                t0 = time.perf_counter()
                value = eval(src, ns)
                secs.append(time.perf_counter() - t0)
                ok, value = plain(value)
                if not ok:
                    raise TypeError("not plain data: " + type(value).__name__)
                reps.append(repr(value))
            msg = {"ok": True, "reprs": reps, "seconds": max(secs)}
        except BaseException as e:
            msg = {"ok": False, "error": type(e).__name__}
        data = json.dumps(msg).encode()
        while data:
            data = data[os.write(w, data[:65536]):]
        os._exit(0)
    os.close(w)
    chunks, deadline, done = [], time.monotonic() + spec["call_timeout_s"], False
    while not done:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([r], [], [], left)[0]:
            break
        chunk = os.read(r, 65536)
        if not chunk:
            done = True
        chunks.append(chunk)
    if not done:
        os.kill(pid, signal.SIGKILL)
    os.close(r)
    os.waitpid(pid, 0)
    try:
        out.append(json.loads(b"".join(chunks)) if done else {"ok": False, "error": "timeout"})
    except ValueError:
        out.append({"ok": False, "error": "no answer"})
print("@@RESULT@@ " + json.dumps(out), flush=True)
"""
"""The program run in the sandbox: load the reference, evaluate each expression in a fork of its own."""


def reference_runs(
    jobs: list[tuple[str, str, list[str]]], call_timeout_s: float
) -> list[list[dict[str, Any]]]:
    """Run each `(code, setup, expressions)` job in the sandbox; one answer per expression.

    An answer is `{"ok": True, "reprs": [repr, repr], "seconds": s}` or `{"ok": False, "error": ...}`.

    Raises:
        SandboxUnavailableError: when the `process` backend cannot run here.
    """
    backend = get_backend("process")
    requests = [
        ExecRequest(
            files={
                "driver.py": DRIVER,
                "spec.json": json.dumps(
                    {"code": code, "setup": setup, "exprs": exprs, "call_timeout_s": call_timeout_s}
                ),
            },
            cmd=("python3", "-I", "driver.py"),
            timeout_s=30 + call_timeout_s * len(exprs),
            memory_mb=1024,
            max_output_bytes=4 * 1024 * 1024,
        )
        for code, setup, exprs in jobs
    ]
    answers = []
    for (_, _, exprs), result in zip(jobs, backend.run_batch(requests), strict=True):
        line = next((x for x in result.stdout.splitlines() if x.startswith("@@RESULT@@ ")), "")
        data = json.loads(line[len("@@RESULT@@ ") :]) if line else []
        if not isinstance(data, list) or len(data) != len(exprs):
            data = [{"ok": False, "error": "the run failed"}] * len(exprs)
        answers.append(data)
    return answers


def _shape(v: Any) -> Any:
    """The value's exact type structure (a tuple is not a list; an int is not a float)."""
    if type(v) in (list, tuple, set):
        return (type(v).__name__, sorted(map(repr, map(_shape, v))))
    if type(v) is dict:
        return ("dict", sorted(repr((_shape(k), _shape(x))) for k, x in v.items()))
    return type(v).__name__


def agreed_value(answers: list[dict[str, Any]], max_call_s: float) -> tuple[bool, Any]:
    """The one value every run of one input gave, when all ran fast and agree and it reads back."""
    values = []
    for a in answers:
        if not a.get("ok") or a["seconds"] > max_call_s:
            return False, None
        for rep in a["reprs"]:
            if len(rep) > MAX_REPR:
                return False, None
            try:
                value = ast.literal_eval(rep)
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                return False, None
            values.append(value)
    first = values[0]
    if first is None or any(v != first or _shape(v) != _shape(first) for v in values[1:]):
        return False, None
    try:
        if ast.literal_eval(repr(first)) != first:
            return False, None
    except (ValueError, SyntaxError):
        return False, None
    return True, first


def spread(picks: list[tuple[str, str]], shown_output: str, k: int) -> list[str]:
    """Up to `k` asserts from `(assert, output repr)` pairs, round robin over distinct outputs.

    Outputs in order of first appearance, the shown assert's output after them, so that a
    constant reply matches as few generated tests as the outputs allow; last, and only when
    nothing else is left, the asserts a reply of None passes (`weak`); ties keep generation
    order.
    """
    groups: dict[str, list[str]] = {}
    for test, out in picks:
        groups.setdefault(out, []).append(test)
    strong = [o for o in groups if not weak(groups[o][0])]
    order = [o for o in strong if o != shown_output] + [o for o in strong if o == shown_output]
    chosen: list[str] = []
    for rotation in (order, [o for o in groups if o not in strong]):
        while len(chosen) < k and any(groups[o] for o in rotation):
            for o in rotation:
                if groups[o] and len(chosen) < k:
                    chosen.append(groups[o].pop(0))
    return chosen


# --- the whole run --------------------------------------------------------------------------------------


def entry_names(code: str) -> set[str]:
    """Top-level function names of a reference solution."""
    try:
        return {
            n.name for n in ast.parse(code).body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
    except SyntaxError:
        return set()


def generate(
    subset: str,
    seed: int,
    per_task: int,
    candidates: int,
    call_timeout_s: float,
    max_call_s: float,
    only: set[int] | None = None,
) -> dict[int, list[str]]:
    """Generated tests for the tasks of `subset` (steps 1-4 of the module doc): task_id -> asserts.

    `only`: these task ids alone (a trial run); None: every task.
    """
    rows = [r for r in mbpp_rows(subset) if only is None or r["task_id"] in only]
    jobs: list[tuple[str, str, list[str]]] = []
    plans: list[tuple[dict[str, Any], list[tuple[Template, str]], Template | None, bool]] = []
    for row in rows:
        code = row["code"].replace("\r\n", "\n")
        names = entry_names(code)
        templates = [t for t in (parse_template(s, names) for s in row["test_list"]) if t is not None]
        if UNPORTABLE.search(code) or not templates:
            plans.append((row, [], None, False))
            continue
        rng = random.Random(f"{seed}/{subset}/{row['task_id']}")
        inputs = candidate_inputs(templates, rng, candidates)
        exprs = [fill(t, a, k) for t, a, k in inputs]
        probes = [probe(t, e) for (t, _, _), e in zip(inputs, exprs, strict=True)]
        shown = templates[0] if templates[0].source == row["test_list"][0] else None
        plans.append((row, [(t, e) for (t, _, _), e in zip(inputs, exprs, strict=True)], shown, True))
        prefix = "\n".join(row.get("test_imports", []))
        setup = row.get("test_setup_code", "").replace("\r\n", "\n")
        jobs.append(
            (
                prefix + "\n" + code,
                setup,
                probes + ([probe(shown, fill(shown, shown.args, shown.kwargs))] if shown else []),
            )
        )
    print(
        f"{subset}: running {sum(len(j[2]) for j in jobs)} inputs of {len(jobs)} tasks, twice",
        file=sys.stderr,
    )
    first = reference_runs(jobs, call_timeout_s)
    second = reference_runs(jobs, call_timeout_s)
    out: dict[int, list[str]] = {}
    runs = iter(zip(first, second, strict=True))
    for row, items, shown, has_job in plans:
        if not has_job:
            out[row["task_id"]] = []
            continue
        a, b = next(runs)
        shown_output = ""
        if shown is not None:
            ok, value = agreed_value([a[-1], b[-1]], max_call_s)
            shown_output = repr(value) if ok else ""
        picks = []
        for i, (template, expr) in enumerate(items):
            ok, value = agreed_value([a[i], b[i]], max_call_s)
            if ok:
                picks.append((assert_source(template, expr, value), repr(value)))
        out[row["task_id"]] = spread(picks, shown_output, per_task)
    return out


def verify(subset: str, hidden: dict[int, list[str]], rounds: int = 2) -> tuple[dict[int, list[str]], int]:
    """Drop generated tests that the subset's reference fails under the env's judge (step 5).

    Returns the kept tests and how many were dropped.
    """
    verifier = CodeVerifier("process", mode="binary", timeout_s=30.0)
    dropped = 0
    rows = {r["task_id"]: r for r in mbpp_rows(subset)}
    full = {r["task_id"]: r for r in mbpp_rows("full")}
    todo = sorted(hidden)
    for _ in range(50):
        failing: set[int] = set()
        for _ in range(rounds):
            tasks = [mbpp_task(rows[i], subset, full[i], hidden[i]) for i in todo]
            scores = verifier.score_batch([str(t.solution) for t in tasks], tasks)
            for i, s in zip(todo, scores, strict=True):
                if s.reward != 1.0:
                    failing.add(i)
                    test = str(s.details.get("failed_test", ""))
                    if test in hidden[i]:
                        hidden[i] = [t for t in hidden[i] if t != test]
                        dropped += 1
                    elif hidden[i]:
                        raise RuntimeError(
                            f"{subset} mbpp/{i}: the reference fails an MBPP test: {s.details}"
                        )
        if not failing:
            break
        todo = sorted(failing)
    return hidden, dropped


def main(argv: list[str] | None = None) -> int:
    """Generate, check and write `hidden_tests.jsonl`; print the counts (module doc)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seed", type=int, default=61)
    parser.add_argument("--per-task", type=int, default=6, help="most generated tests per task")
    parser.add_argument("--candidates", type=int, default=40, help="mutated inputs tried per task")
    parser.add_argument("--call-timeout-s", type=float, default=2.0, help="a reference call killed after")
    parser.add_argument("--max-call-s", type=float, default=0.05, help="slowest reference call kept (s)")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--subset", choices=["full", "sanitized", "both"], default="both")
    args = parser.parse_args(argv)
    subsets = ["full", "sanitized"] if args.subset == "both" else [args.subset]
    lines = []
    if args.out.is_file():  # the rows of a subset not made this time stay as they were
        kept = [x for x in args.out.read_text(encoding="utf-8").splitlines() if x.strip()]
        lines = [x for x in kept if json.loads(x)["subset"] not in subsets]
    for subset in subsets:
        hidden = generate(
            subset, args.seed, args.per_task, args.candidates, args.call_timeout_s, args.max_call_s
        )
        hidden, dropped = verify(subset, hidden)
        counts = [len(v) for v in hidden.values()]
        some, full_count = sum(c > 0 for c in counts), sum(c == args.per_task for c in counts)
        print(
            f"{subset}: {len(counts)} tasks, {sum(counts)} generated tests, {some} tasks with some, "
            f"{full_count} with {args.per_task}, {dropped} dropped at the check"
        )
        lines += [
            json.dumps({"subset": subset, "task_id": i, "tests": hidden[i]})
            for i in sorted(hidden)
            if hidden[i]
        ]
        lines.sort(key=lambda x: (json.loads(x)["subset"], json.loads(x)["task_id"]))
        args.out.write_text("\n".join(lines) + "\n", encoding="utf-8")  # after each subset
        print(f"wrote {len(lines)} rows to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
