"""The package's shape: no import cycles, no module over 500 lines, rollouts that do not know the trainer.

The import graph is read with `ast` from the source files, so imports inside functions (the lazy
ones that keep `import textgym` light) count as edges too. `from pkg import name` is an edge to
`pkg.name` when that is a module, else to `pkg` (its `__init__`).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import textgym

PACKAGE_DIR = Path(textgym.__file__).resolve().parent
MAX_LINES = 500


def _modules() -> dict[str, Path]:
    """Every module of the package: dotted name -> source path (`pkg/__init__.py` is `pkg`)."""
    modules = {}
    for path in sorted(PACKAGE_DIR.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE_DIR.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    return modules


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The innermost textgym module that `name` names, or None if outside the package."""
    while name:
        if name in modules:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The textgym modules `module` imports anywhere in its file (function bodies included)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = ".".join(base_parts[: len(base_parts) - drop])
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            # `from pkg import name`: the submodule if `name` is one, else the package itself.
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names
            ]
        else:
            continue
        for name in names:
            target = _resolve(name, modules)
            if target is not None and target != module:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """The package's import graph: module -> the textgym modules it imports."""
    modules = _modules()
    return {module: _imports(module, path, modules) for module, path in modules.items()}


def _is_parent_package(importer: str, imported: str) -> bool:
    """`a.b.c` importing `a.b` runs `a/b/__init__.py` first anyway: that edge is not a cycle of ours."""
    return importer.startswith(imported + ".")


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None if the graph is acyclic.

    Edges from a submodule to one of its parent packages are left out: Python imports a package's
    `__init__` before any of its submodules, so such an edge adds no ordering constraint.
    """
    edges = {m: sorted(t for t in targets if not _is_parent_package(m, t)) for m, targets in graph.items()}
    state: dict[str, int] = {}  # 1 = on the stack, 2 = done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state:
                cycle = visit(nxt)
                if cycle:
                    return cycle
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            cycle = visit(start)
            if cycle:
                return cycle
    return None


def test_the_import_graph_reader_resolves_relative_and_from_imports():
    graph = import_graph()
    assert "textgym.envs" in graph["textgym"]
    assert "textgym.algorithms.registry" in graph["textgym.trainers.rl.grpo"]  # a `from a.b import c`
    assert "textgym.algorithms.policy_losses" in graph["textgym.trainers.rl.update"]  # `from a import module`


def test_the_cycle_finder_reports_the_cycle_it_finds():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None
    assert find_cycle({"p.x": {"p"}, "p": {"p.x"}}) is None


def test_textgym_has_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_module_in_textgym_is_over_500_lines():
    too_long = {
        str(path.relative_to(PACKAGE_DIR.parent)): n
        for path in PACKAGE_DIR.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > MAX_LINES
    }
    assert not too_long, f"modules over {MAX_LINES} lines: {too_long}"


def test_agents_do_not_import_the_trainers():
    graph = import_graph()
    offenders = {
        module: sorted(t for t in targets if t == "textgym.trainers" or t.startswith("textgym.trainers."))
        for module, targets in graph.items()
        if module == "textgym.agents" or module.startswith("textgym.agents.")
    }
    offenders = {m: t for m, t in offenders.items() if t}
    assert not offenders, f"rollouts import the trainers: {offenders}"


def _imports_of(prefix: str, graph: dict[str, set[str]], forbidden: str) -> dict[str, list[str]]:
    """Modules under `prefix` that import a module under `forbidden` (both dotted package names)."""

    def under(module: str, package: str) -> bool:
        return module == package or module.startswith(package + ".")

    found = {
        module: sorted(t for t in targets if under(t, forbidden))
        for module, targets in graph.items()
        if under(module, prefix)
    }
    return {m: t for m, t in found.items() if t}


def test_the_algorithms_import_nothing_from_the_rest_of_textgym():
    """`textgym.algorithms` is pure tensor maths: torch in, torch out, no config, no model, no env."""
    graph = import_graph()
    outside = {
        module: sorted(t for t in targets if not t.startswith("textgym.algorithms") and t != "textgym")
        for module, targets in graph.items()
        if module.startswith("textgym.algorithms")
    }
    outside = {m: t for m, t in outside.items() if t}
    assert not outside, f"textgym.algorithms imports the rest of textgym: {outside}"
    assert (
        "textgym.algorithms.aggregate" in graph["textgym.algorithms.auxiliary"]
    )  # the reader sees its edges


def test_the_training_machinery_never_imports_the_trainers():
    """`textgym.training` (batching, log-probs, checkpoints, rollout sources) serves every trainer."""
    offenders = _imports_of("textgym.training", import_graph(), "textgym.trainers")
    assert not offenders, f"textgym.training imports the trainers: {offenders}"
    fake = {
        "textgym.training.x": {"textgym.trainers.rl.grpo"},
        "textgym.trainers.sft": {"textgym.training.x"},
    }
    assert _imports_of("textgym.training", fake, "textgym.trainers") == {
        "textgym.training.x": ["textgym.trainers.rl.grpo"]
    }


def trainer_parameters(source: str) -> list[str]:
    """`function(parameter)` for each parameter of a function or method in `source` that takes a
    trainer: named `trainer`, or annotated with a type whose name holds `Trainer` or `Trainable`."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = [*a.posonlyargs, *a.args, *a.kwonlyargs, *(p for p in (a.vararg, a.kwarg) if p)]
        for p in params:
            hint = ast.unparse(p.annotation) if p.annotation is not None else ""
            if p.arg == "trainer" or "Trainer" in hint or "Trainable" in hint:
                found.append(f"{node.name}({p.arg})")
    return found


def test_no_function_or_constructor_in_training_takes_the_trainer():
    """`textgym.training` gets narrow inputs (a rollout request, a policy, callables), never the
    trainer: a dependency on a trainer's attributes is one neither the import graph nor a type sees."""
    offenders = {
        str(path.relative_to(PACKAGE_DIR.parent)): found
        for path in sorted((PACKAGE_DIR / "training").rglob("*.py"))
        if (found := trainer_parameters(path.read_text()))
    }
    assert not offenders, f"textgym.training functions that take a trainer: {offenders}"
    source = (
        "class A:\n    def __init__(self, trainer: Any): ...\n"
        "def f(x, *, loop: 'OnPolicyTrainer'): ...\ndef g(t: Trainable): ...\ndef h(policy, source): ...\n"
    )
    assert sorted(trainer_parameters(source)) == ["__init__(trainer)", "f(loop)", "g(t)"]


def _reexports(path: Path) -> list[str]:
    """The names in a module's `__all__` that it imports from another textgym module."""
    tree = ast.parse(path.read_text(), filename=str(path))
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("textgym"))
        for alias in node.names
    }
    exported: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported = [e.value for e in getattr(node.value, "elts", []) if isinstance(e, ast.Constant)]
    return sorted(set(exported) & imported)


def test_no_module_but_a_package_init_re_exports_another_modules_names():
    """A moved module goes in `textgym._moved.MOVED` (an error naming the new place), not a shim."""
    shims = {
        str(path.relative_to(PACKAGE_DIR.parent)): names
        for path in PACKAGE_DIR.rglob("*.py")
        if path.name != "__init__.py" and (names := _reexports(path))
    }
    assert not shims, f"modules re-exporting other modules' names: {shims}"


def test_the_reexport_reader_sees_a_shim(tmp_path):
    shim = tmp_path / "shim.py"
    shim.write_text(
        'from textgym.offline.store import SCHEMA, read_trajectories\n__all__ = ["SCHEMA", "x"]\n'
    )
    assert _reexports(shim) == ["SCHEMA"]


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between textgym's top-level packages (`textgym.agents`, ...): module edges
    collapsed onto the package (or top-level module) each end belongs to; self-edges dropped."""

    def top(module: str) -> str:
        return ".".join(module.split(".")[:2])

    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "textgym":
            continue
        out.setdefault(top(module), set()).update(
            top(t) for t in targets if t != "textgym" and top(t) != top(module)
        )
    return out


def test_no_import_cycle_between_packages():
    cycle = find_cycle(package_graph(import_graph()))
    assert cycle is None, "packages import each other: " + " -> ".join(cycle or [])


LAYERS: list[set[str]] = [
    {"textgym.__main__"},
    {"textgym.cli"},
    {"textgym.pipeline", "textgym.serve"},
    {"textgym.stages"},
    {"textgym.trainers"},
    {"textgym.training", "textgym.evaluation"},
    {"textgym.offline"},
    {"textgym.agents", "textgym.config", "textgym.model_init"},
    {"textgym.envs", "textgym.models"},
    {"textgym.tools", "textgym.verifiers", "textgym.model_pull"},
    {"textgym.tracking", "textgym.model_convert", "textgym.model_progress"},
    {
        "textgym.algorithms",
        "textgym.sandbox",
        "textgym.distributed",
        "textgym.types",
        "textgym._lazy",
        "textgym._moved",
    },
]
"""The floors of docs/design.md's "The house", top to bottom: a package imports only floors below its own."""


def _upward_imports(graph: dict[str, set[str]]) -> list[str]:
    floor = {package: i for i, packages in enumerate(LAYERS) for package in packages}
    bad = []
    for package, targets in package_graph(graph).items():
        for target in targets:
            if target in floor and package in floor and floor[target] <= floor[package]:
                bad.append(f"{package} -> {target}")
    return sorted(bad)


def test_every_package_is_on_one_floor_of_the_house_and_imports_only_go_down():
    graph = import_graph()
    placed = {package for packages in LAYERS for package in packages}
    unplaced = sorted(set(package_graph(graph)) - placed)
    assert not unplaced, f"packages on no floor of LAYERS (add them, and to docs/design.md): {unplaced}"
    assert not _upward_imports(graph), f"imports that go up or sideways: {_upward_imports(graph)}"
    # the checker sees a sideways edge (training and evaluation share a floor)
    assert _upward_imports({"textgym.training.x": {"textgym.evaluation.y"}}) == [
        "textgym.training -> textgym.evaluation"
    ]


def test_an_old_module_path_fails_with_an_error_naming_the_new_place():
    import importlib

    from textgym._moved import MOVED

    for old, new in MOVED.items():
        with pytest.raises(ModuleNotFoundError, match=f"{old} has moved to .*{new.split(':')[0][:24]}"):
            importlib.import_module(old)
    with pytest.raises(ModuleNotFoundError, match=r"textgym\.store has moved to textgym\.offline\.store"):
        from textgym import store  # noqa: F401
    with pytest.raises(ModuleNotFoundError, match=r"No module named 'textgym\.nosuch'"):
        importlib.import_module("textgym.nosuch")


MAX_FUNCTION_LINES = 80
LONG_REASON = "# long: "


def long_functions(source: str) -> list[tuple[str, int, int, bool]]:
    """Functions over `MAX_FUNCTION_LINES` lines, `def` to end, docstring excluded: (name, line, length,
    whether the line above the `def` or its first decorator is a `# long: <reason>` comment)."""
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        n = node.end_lineno - node.lineno + 1  # type: ignore[operator]
        first = node.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            n -= first.end_lineno - first.lineno + 1  # type: ignore[operator]
        if n > MAX_FUNCTION_LINES:
            top = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            above = lines[top - 2].strip() if top >= 2 else ""
            found.append(
                (
                    node.name,
                    node.lineno,
                    n,
                    above.startswith(LONG_REASON) and len(above) > len(LONG_REASON) + 10,
                )
            )
    return found


def test_no_function_is_over_80_lines_without_a_one_line_reason_above_it():
    unexplained = {
        f"{path.relative_to(PACKAGE_DIR.parent)}:{line} {name} ({n} lines)"
        for path in PACKAGE_DIR.rglob("*.py")
        for name, line, n, reasoned in long_functions(path.read_text())
        if not reasoned
    }
    assert not unexplained, (
        f"functions over {MAX_FUNCTION_LINES} lines (docstrings excluded) with no `{LONG_REASON}<why>` "
        f"comment above them: {sorted(unexplained)}"
    )


def test_the_long_function_reader_counts_code_not_the_docstring_and_sees_the_reason():
    body = "".join(f"    x{i} = {i}\n" for i in range(80))  # with the `def` line: 81
    doc = '    """' + "\n" * 30 + '    """\n'
    assert long_functions(f"def f():\n{doc}{body[: -len('    x79 = 79') - 1]}") == []  # 80 lines
    assert long_functions(f"def f():\n{doc}{body}") == [("f", 1, 81, False)]
    reasoned = f"# long: one table of the paper's steps\n@decorator\ndef f():\n{body}"
    assert long_functions(reasoned) == [("f", 3, 81, True)]
