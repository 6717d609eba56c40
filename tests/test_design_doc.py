"""docs/design.md against the code: its house (the floors and every package's imports) is the real
import graph, and every module it names exists.

The graph is read from the source at test time (`test_layout.import_graph`), so a module added or an
import changed shows here as soon as the drawing and the code differ.
"""

from __future__ import annotations

import re
from pathlib import Path

from test_layout import LAYERS, PACKAGE_DIR, _modules, import_graph, package_graph

from textgym._moved import MOVED

ROOT = PACKAGE_DIR.parent
DESIGN = ROOT / "docs" / "design.md"

FLOOR_LINE = re.compile(r"^(?:floor\s+(\d+))?\s+([\w.]+)\s*(?:->\s*(.*))?$")


def _section(text: str, heading: str) -> str:
    """The text under `## heading`, up to the next `## ` heading."""
    start = text.index(f"## {heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else len(text)]


def _fenced_blocks(text: str) -> list[str]:
    return re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)


def parse_house(block: str) -> tuple[dict[int, set[str]], dict[str, set[str]]]:
    """The drawing's floors (number -> packages) and arrows (package -> packages it imports).

    A line is `floor N  package -> a, b, ...`, or `package -> ...` for the next package on the same
    floor; a package with no `->` imports nothing; a line after one that ends in `,` continues it.
    Names are short (`agents`), as in the drawing.
    """
    floors: dict[int, set[str]] = {}
    arrows: dict[str, set[str]] = {}
    floor: int | None = None
    package = ""
    continued = False
    for line in block.splitlines():
        if not line.strip():
            continue
        if continued:
            targets = line.strip()
        else:
            m = FLOOR_LINE.match(line)
            assert m, f"not a line of the house: {line!r}"
            if m.group(1) is not None:
                floor = int(m.group(1))
            assert floor is not None, f"a package before any floor: {line!r}"
            package = m.group(2)
            assert package not in arrows, f"{package} drawn twice"
            floors.setdefault(floor, set()).add(package)
            arrows[package] = set()
            targets = m.group(3) or ""
        arrows[package] |= {t.strip() for t in targets.split(",") if t.strip()}
        continued = targets.rstrip().endswith(",")
    return floors, arrows


def _short(name: str) -> str:
    return name.removeprefix("textgym.")


def _house() -> tuple[dict[int, set[str]], dict[str, set[str]]]:
    section = _section(DESIGN.read_text(), "The house")
    blocks = [b for b in _fenced_blocks(section) if re.search(r"^floor \d+", b, flags=re.M)]
    assert len(blocks) == 1, f"docs/design.md's house has {len(blocks)} floor blocks, not 1"
    return parse_house(blocks[0])


def test_the_house_parser_reads_floors_arrows_and_continuations():
    floors, arrows = parse_house(
        "floor 2   cli       -> pipeline, envs,\n"
        "                       types\n"
        "floor 1   pipeline  -> envs\n"
        "          envs\n"
        "floor 0   types\n"
    )
    assert floors == {2: {"cli"}, 1: {"pipeline", "envs"}, 0: {"types"}}
    assert arrows == {
        "cli": {"pipeline", "envs", "types"},
        "pipeline": {"envs"},
        "envs": set(),
        "types": set(),
    }


def test_the_house_has_the_floors_of_layers():
    floors, _ = _house()
    expected = {len(LAYERS) - 1 - i: {_short(p) for p in layer} for i, layer in enumerate(LAYERS)}
    differ = {
        n: {"drawn": sorted(floors.get(n, ())), "LAYERS": sorted(expected.get(n, ()))}
        for n in sorted(set(floors) | set(expected))
        if floors.get(n) != expected.get(n)
    }
    assert not differ, (
        "docs/design.md's floors (numbered from the ground) differ from tests/test_layout.py's LAYERS "
        f"(listed from the top): {differ}"
    )


def _edges(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    return {(a, b) for a, targets in graph.items() for b in targets}


def test_every_arrow_of_the_house_is_a_real_import_and_every_real_import_is_drawn():
    _, arrows = _house()
    real = {_short(p): {_short(t) for t in targets} for p, targets in package_graph(import_graph()).items()}
    drawn_only = sorted(_edges(arrows) - _edges(real))
    missing = sorted(_edges(real) - _edges(arrows))
    assert not drawn_only, f"docs/design.md draws imports the code does not make: {drawn_only}"
    assert not missing, f"imports between packages that docs/design.md's house does not draw: {missing}"
    assert set(arrows) == set(real), f"packages drawn / in the code: {sorted(set(arrows) ^ set(real))}"


def _map_rows(section: str) -> dict[str, tuple[list[str], str]]:
    """The rows of the house's tables: line -> (the paths of its first cell, the rest of the row)."""
    rows = {}
    for line in section.splitlines():
        if line.startswith("| `"):
            first, _, rest = line[1:].partition("|")
            rows[line] = (re.findall(r"`([^`]+)`", first), rest)
    return rows


def test_every_folder_and_top_level_module_of_textgym_has_its_row_in_the_house():
    rows = _map_rows(_section(DESIGN.read_text(), "The house")).values()
    named = {path for paths, _ in rows for path in paths}
    folders = {
        f"textgym/{p.parent.relative_to(PACKAGE_DIR).as_posix()}/"
        for p in PACKAGE_DIR.rglob("__init__.py")
        if p.parent != PACKAGE_DIR
    }
    modules = {f"textgym/{p.name}" for p in PACKAGE_DIR.glob("*.py") if p.name != "__init__.py"}
    missing = sorted((folders | modules) - named)
    assert not missing, f"no row in docs/design.md's house for: {missing}"


def _moved_path(path: str) -> bool:
    """Whether `path` (`trainers/reward_model.py`, with or without `textgym/`) is a module that moved."""
    dotted = "textgym." + path.removeprefix("textgym/").removesuffix(".py").replace("/", ".")
    return dotted in MOVED


PY_PATH = re.compile(r"(?<![\w./-])((?:[\w.-]+/)*\w+\.py)\b")


def test_every_module_file_design_md_names_exists():
    text = DESIGN.read_text()
    files_by_name = {p.name for p in PACKAGE_DIR.rglob("*.py")}
    missing = []
    # a file named in a row of the house's map lives in the folder of that row's first cell
    rows = _map_rows(_section(text, "The house"))
    for paths, rest in rows.values():
        folders = [ROOT / (p if p.endswith("/") else str(Path(p).parent)) for p in paths]
        for name in PY_PATH.findall(rest):
            if not any((folder / name).is_file() for folder in folders):
                missing.append(f"{name} (in the row of {', '.join(paths)})")
    # elsewhere: a path from the repository's root or from textgym/, or a file name somewhere in textgym/
    elsewhere = "\n".join(line for line in text.splitlines() if line not in rows)
    for path in PY_PATH.findall(elsewhere):
        if "/" in path:
            found = (ROOT / path).is_file() or (PACKAGE_DIR / path).is_file() or _moved_path(path)
        else:
            found = path in files_by_name
        if not found:
            missing.append(path)
    assert not missing, f"docs/design.md names files that do not exist: {sorted(set(missing))}"


DOTTED = re.compile(r"\btextgym(?:\.\w+)+")


def _defines(path: Path, name: str) -> bool:
    return bool(re.search(rf"^(?:class|def|async def)\s+{name}\b|^{name}\s*[:=]", path.read_text(), re.M))


def test_every_dotted_textgym_name_in_design_md_resolves():
    modules = _modules()
    unresolved = []
    for name in sorted(set(DOTTED.findall(DESIGN.read_text()))):
        if name in modules or name in MOVED:
            continue
        module, _, attribute = name.rpartition(".")
        if not (module in modules and _defines(modules[module], attribute)):
            unresolved.append(name)
    assert not unresolved, f"docs/design.md names modules or names that do not exist: {unresolved}"


def test_the_file_checks_see_a_missing_file_and_a_moved_one():
    assert PY_PATH.findall("`textgym/trainers/rl/critic.py` and `nosuch.py`, not a.pyc") == [
        "textgym/trainers/rl/critic.py",
        "nosuch.py",
    ]
    assert _moved_path("trainers/reward_model.py")
    assert not _moved_path("trainers/nosuch.py")
    assert _defines(PACKAGE_DIR / "trainers" / "rl" / "critic.py", "Critic")
