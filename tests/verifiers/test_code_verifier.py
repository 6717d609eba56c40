"""The code verifier on HumanEval / MBPP, run in the real sandboxes, and `textgym score` / `sandbox check`."""

from __future__ import annotations

import ast
import json
import os

import pytest
from conftest import FIRST_TEST_ONLY
from typer.testing import CliRunner

import textgym  # noqa: F401
from textgym import sandbox
from textgym.cli import app
from textgym.envs.code import humaneval_tasks, mbpp_tasks
from textgym.sandbox import SandboxUnavailableError, get_backend
from textgym.types import Task
from textgym.verifiers.code import CodeVerifier, entry_points, extract_code, split_check_function

REQUIRE_DOCKER = os.environ.get("TEXTGYM_REQUIRE_DOCKER") == "1"


def _verifier_or_skip(name: str, **kwargs) -> CodeVerifier:
    try:
        get_backend(name)
    except SandboxUnavailableError as e:
        if name == "docker" and not REQUIRE_DOCKER:
            pytest.skip(f"docker backend unavailable: {e}")
        raise
    return CodeVerifier(name, **kwargs)


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    sandbox.close_all()


@pytest.mark.parametrize(
    ("completion", "code"),
    [
        ("no fences at all\nx = 1", "no fences at all\nx = 1"),
        ("text\n```python\na = 1\n```\nmore\n```python\nb = 2\n```\nbye", "b = 2\n"),
        ("```py\nc = 3\n```", "c = 3\n"),
        ("```\nbare = 1\n```\n```python\nreal = 2\n```\n```\nlater_bare = 3\n```", "real = 2\n"),
        ("```\nbare = 1\n```", "bare = 1\n"),
        ("cut off:\n```python\ndef f():\n    return 1", "def f():\n    return 1"),
        ("    return x\r\n", "    return x\n"),
    ],
)
def test_extract_code(completion, code):
    assert extract_code(completion) == code


def test_humaneval_check_splits_into_statement_units():
    task = humaneval_tasks("binary")[0]
    units = split_check_function(task.metadata["setup"], "has_close_elements")
    assert units[0] == "candidate = has_close_elements"
    asserts = [u for u in units if u.startswith("assert")]
    assert len(asserts) == 7 and all(u == u.lstrip() for u in units)


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["process", "docker"])
def test_all_164_humaneval_canonical_solutions_pass(backend):
    v = _verifier_or_skip(backend)
    tasks = list(humaneval_tasks("binary"))
    assert len(tasks) == 164 and tasks[7].task_id == "HumanEval/7"
    bodies = v.score_batch([t.metadata["canonical_solution"] for t in tasks], tasks)
    assert [t.task_id for t, s in zip(tasks, bodies, strict=True) if s.reward != 1.0] == []
    fenced = v.score_batch([t.solution for t in tasks], tasks)  # the whole function in a ```python block
    assert sum(s.reward for s in fenced) == 164


@pytest.mark.sandbox
def test_humaneval_fraction_mode_counts_asserts():
    v = _verifier_or_skip("process", mode="fraction")
    tasks = list(humaneval_tasks("fraction"))
    scores = v.score_batch([t.metadata["canonical_solution"] for t in tasks], tasks)
    assert all(s.reward == 1.0 for s in scores)
    # has_close_elements: 7 asserts; a solution that always says False passes the 3 False ones
    s = v("    return False\n", tasks[0])
    assert s.details["total"] == 7 and s.details["passed"] == 3 and s.reward == pytest.approx(3 / 7)


@pytest.mark.sandbox
def test_fraction_mode_counts_only_units_that_call_the_solution():
    """HumanEval's `assert True` units and its check's module-level lines are not counted: a solution
    that returns None earned > 0 on 40 of 164 tasks for them. Now it earns only on units that call it
    and accept None (HumanEval/12's `candidate([]) == None`, HumanEval/52's `assert not candidate(...)`)."""
    from textgym.verifiers.code import counted_units

    v = _verifier_or_skip("process", mode="fraction")
    tasks = list(humaneval_tasks("fraction"))
    for t in tasks:
        counting = counted_units(t.metadata["tests"], t.metadata.get("setup", ""), entry_points(t))
        assert counting.must_call and counting.units
        assert all(t.metadata["tests"][i].strip() != "assert True" for i in counting.units), t.task_id
    scores = v.score_batch(["    return None\n"] * len(tasks), tasks)
    paid = {t.task_id: s for t, s in zip(tasks, scores, strict=True) if s.reward > 0}
    assert len(paid) <= 8, sorted(paid)
    for task_id, s in paid.items():  # partial credit only where a counted test accepts None
        task = next(t for t in tasks if t.task_id == task_id)
        accepts = [u for u in task.metadata["tests"] if "None" in u or u.startswith("assert not candidate")]
        assert s.reward < 1 and accepts, task_id


@pytest.mark.sandbox
def test_a_unit_that_never_calls_the_solution_is_not_paid():
    """A unit that passed without calling the solution (the judge counts the calls) drops out of the
    count: it pays nothing, and costs a correct solution nothing."""
    task = Task(
        task_id="t",
        prompt="",
        metadata={"tests": ["assert add(1, 2) == 3", "assert True or add(0, 0)", "assert add(2, 2) == 4"]},
    )
    v = _verifier_or_skip("process", mode="fraction")
    s = v("def add(a, b):\n    return None\n", task)
    assert s.details["total"] == 2 and s.details["passed"] == 0 and s.reward == 0.0
    right = v("def add(a, b):\n    return a + b\n", task)
    assert right.reward == 1.0 and right.details["total"] == 2
    only = Task(task_id="u", prompt="", metadata={"tests": ["assert True or add(0, 0)"]})
    assert v("def add(a, b):\n    return None\n", only).reward == 0.0
    assert CodeVerifier("process")("def add(a, b):\n    return None\n", only).reward == 0.0  # binary too


CANDIDATE_MADE = {  # correct answers in standard types that are not the plain data the wire names
    "defaultdict of a lambda": (
        "assert count('abca') == {'a': 2, 'b': 1, 'c': 1}",
        "import collections\ndef count(s):\n    d = collections.defaultdict(lambda: 0)\n"
        "    for ch in s:\n        d[ch] += 1\n    return d\n",
    ),
    "ChainMap": (
        "assert merged({'a': 1}, {'b': 2}) == {'a': 1, 'b': 2}",
        "import collections\ndef merged(x, y):\n    return collections.ChainMap(x, y)\n",
    ),
    "itertools.chain": (
        "assert list(flat([[1, 2], [3]])) == [1, 2, 3]",
        "import itertools\ndef flat(xs):\n    return itertools.chain.from_iterable(xs)\n",
    ),
    "itertools.islice": (
        "assert list(first(3)) == [0, 1, 2]",
        "import itertools\ndef first(n):\n    return itertools.islice(itertools.count(), n)\n",
    ),
    "MappingProxyType": (
        "assert frozen({'k': 1})['k'] == 1 and dict(frozen({'k': 1})) == {'k': 1}",
        "import types\ndef frozen(d):\n    return types.MappingProxyType(d)\n",
    ),
}


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["process", "docker"])
def test_candidate_made_mappings_and_iterators_are_paid_not_refused(backend):
    """They cross as their items: 1.0, and not counted as a refusal by the hack telemetry. A dict
    subclass whose `==` always says True crosses as its (wrong) items, and earns 0."""
    v = _verifier_or_skip(backend)
    tasks = [Task(task_id=n, prompt="", metadata={"tests": [t]}) for n, (t, _) in CANDIDATE_MADE.items()]
    scores = v.score_batch([code for _, code in CANDIDATE_MADE.values()], tasks)
    assert {t.task_id: (s.reward, s.details["refused"]) for t, s in zip(tasks, scores, strict=True)} == {
        n: (1.0, False) for n in CANDIDATE_MADE
    }
    liar = (
        "class D(dict):\n    def __eq__(self, other):\n        return True\ndef count(s):\n    return D()\n"
    )
    assert v(liar, tasks[0]).reward == 0.0


@pytest.mark.sandbox
@pytest.mark.parametrize(("subset", "n"), [("sanitized", 427), ("full", 974)])
def test_every_mbpp_reference_solution_passes(subset, n):
    """The sweep checks the harness against every reference, not the references' speed: mbpp/123
    (amicable numbers below 9,999) runs 4.9 s on an idle AVX2 EPYC core and 7.6 s on an AVX-512
    Xeon core, against the verifier's default wall-clock limit of 10 s. The sweep runs its
    programs side by side on 2 cores, beside the test process and whatever else the machine
    runs, so a program's wall time may be 2-3× its CPU time: 30 s holds the slowest reference
    at 3× the slowest measured."""
    v = _verifier_or_skip("process", timeout_s=30.0)
    tasks = list(mbpp_tasks(subset))
    assert len(tasks) == n
    scores = v.score_batch([t.solution for t in tasks], tasks)
    assert [t.task_id for t, s in zip(tasks, scores, strict=True) if s.reward != 1.0] == []


def shown_lookup(task: Task) -> str:
    """A solution that knows only what the prompt shows: right on the shown asserts' inputs, None elsewhere.

    The strongest lookup table of the shown asserts: on a shown input it returns what the
    reference returns (so it passes every shown assert whatever its shape), on any other input
    None. (Issue 61: a table of the shown asserts paid 1.0 on 426 of 427 sanitized tasks.)
    """
    names = entry_points(task)
    shown = []
    for line in task.prompt.splitlines():
        if line.lstrip().startswith("assert"):
            for node in ast.walk(ast.parse(line.strip())):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names:
                    args = "(" + "".join(ast.unparse(a) + ", " for a in node.args) + ")"
                    kwargs = (
                        "{" + ", ".join(f"{k.arg!r}: {ast.unparse(k.value)}" for k in node.keywords) + "}"
                    )
                    shown.append((node.func.id, args, kwargs))
    reference = task.metadata["prefix"] + "\n" + task.metadata["reference_code"]
    return (
        f"_ns = {{'__name__': 'reference'}}\nexec({reference!r}, _ns)\n_SHOWN = []\n"
        f"for _n, _a, _k in {shown!r}:\n"
        "    try:\n        _SHOWN.append((_n, eval(_a), eval(_k)))\n    except Exception:\n        pass\n\n"
        "def _lookup(name):\n    def call(*args, **kwargs):\n"
        "        if any(n == name and a == args and k == kwargs for n, a, k in _SHOWN):\n"
        "            return _ns[name](*args, **kwargs)\n"
        "        return None\n    return call\n\n"
    ) + "".join(f"{name} = _lookup({name!r})\n" for name in names)


@pytest.mark.parametrize("subset", ["sanitized", "full"])
def test_mbpp_prompts_show_at_most_one_assert(subset):
    for task in mbpp_tasks(subset):
        shown = [line for line in task.prompt.splitlines() if line.lstrip().startswith("assert")]
        assert len(shown) <= 1, task.task_id
        assert shown == task.metadata.get("shown_tests") == task.metadata["tests"][:1], task.task_id
        assert len(task.metadata["tests"]) >= 3, task.task_id  # the shown one and two or more hidden


@pytest.mark.sandbox
def test_a_lookup_table_of_the_shown_asserts_earns_at_most_a_third():
    """Every sanitized task grades on hidden tests a table of the prompt's assert cannot pass."""
    tasks = list(mbpp_tasks("sanitized"))
    lookups = [shown_lookup(t) for t in tasks]
    for mode in ("fraction", "binary"):
        scores = _verifier_or_skip("process", mode=mode, timeout_s=30.0).score_batch(lookups, tasks)
        assert all(s.details["passed"] >= 1 for s in scores)  # it does pass what the prompt shows
        over = {t.task_id: s.reward for t, s in zip(tasks, scores, strict=True) if s.reward > 1 / 3 + 1e-9}
        assert over == {}, mode
    assert max(s.reward for s in scores) == 0.0  # binary: a hidden test fails on every task


@pytest.mark.sandbox
def test_mbpp_sanitized_on_docker():
    v = _verifier_or_skip("docker", timeout_s=30.0)  # mbpp/123 is among them: see the sweep above
    tasks = list(mbpp_tasks("sanitized"))[:100]
    assert sum(s.reward for s in v.score_batch([t.solution for t in tasks], tasks)) == 100


HOSTILE = {
    "returns None": "def has_close_elements(numbers, threshold):\n    return None\n",
    "syntax error": "def has_close_elements(numbers, threshold) return True",
    "exit 0 early": "    import sys; sys.exit(0)\n",
    "os._exit early": "    import os; print('all tests passed'); os._exit(0)\n",
    "forged report": '    print(\'deadbeef {"unit": 0, "ok": true}\')\n    import os; os._exit(0)\n',
    "raises": "    raise ValueError('nope')\n",
    "infinite loop": "    while True:\n        pass\n",
    "memory hog": "    x = bytearray(10**10)\n",
    "kills itself": "    import os, signal; os.kill(os.getpid(), signal.SIGKILL)\n",
}


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["process", "docker"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_wrong_and_hostile_solutions_score_zero(backend, name):
    v = _verifier_or_skip(backend, timeout_s=2.0)
    task = humaneval_tasks("binary")[0]
    s = v(HOSTILE[name], task)
    assert s.reward == 0.0, s.details
    assert s.details["error"] and s.details["failed_test"]
    if name == "infinite loop":
        assert s.details["timed_out"] and "timed out" in s.details["error"]
    if name == "raises":
        assert "ValueError: nope" in s.details["error"]
    if name == "returns None":
        assert (
            s.details["failed_test"] == "check(has_close_elements)" and "AssertionError" in s.details["error"]
        )


@pytest.mark.sandbox
def test_mbpp_fraction_and_failing_details():
    v = _verifier_or_skip("process", mode="fraction")
    task = next(t for t in mbpp_tasks("sanitized") if t.task_id == "mbpp/2")  # similar_elements
    tests = task.metadata["tests"]
    assert len(tests) > 3  # its 3 asserts, then generated ones (hidden_tests.jsonl)
    s = v(FIRST_TEST_ONLY, task)
    n = len(tests)
    assert s.reward == pytest.approx(1 / n) and s.details["passed"] == 1 and s.details["total"] == n
    assert s.details["failed_test"] == tests[1]


@pytest.mark.sandbox
@pytest.mark.parametrize("backend", ["process", "docker"])
def test_score_cli_on_humaneval(tmp_path, backend):
    _verifier_or_skip(backend)
    tasks = humaneval_tasks("binary")[:16]  # all 164 pass through the verifier in the test above
    lines = [{"task_index": i, "completion": t.metadata["canonical_solution"]} for i, t in enumerate(tasks)]
    lines += [{"task_index": 0, "completion": ""}, {"task_index": 1, "completion": "    return None\n"}]
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    r = CliRunner().invoke(
        app,
        [
            "score",
            "--env",
            "textgym/HumanEval-v0",
            "--input",
            str(path),
            "--env-kwargs",
            f"sandbox={backend}",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    out = [json.loads(x) for x in r.output.strip().splitlines()]
    assert [o["reward"] for o in out] == [1.0] * 16 + [0.0, 0.0]
    assert out[-2]["reason"] == "empty action" and "AssertionError" in out[-1]["reason"]


@pytest.mark.sandbox
def test_sandbox_cli_check_and_bad_backend_kwarg():
    r = CliRunner().invoke(app, ["sandbox", "check"], catch_exceptions=False)
    assert r.exit_code == 0 and "process" in r.output and "bubblewrap" in r.output
    r = CliRunner().invoke(
        app,
        ["score", "--env", "textgym/HumanEval-v0", "--input", "x.jsonl", "--env-kwargs", "sandbox=nope"],
        catch_exceptions=False,
    )
    assert r.exit_code == 2 and "unknown sandbox backend 'nope'" in r.output
