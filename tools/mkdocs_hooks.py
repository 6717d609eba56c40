"""MkDocs hook: the learning figures in the docs are rendered from `bench/results/learning.json`.

A page that holds `<!-- learning:quickstart -->` (or `quickstart_<machine>`) or
`<!-- learning:algorithms -->` gets, in its place, the table `bench/learning.py` renders from
the recorded results, with the commit, date, machine and command that produced them. A figure
in those tables cannot drift from the run it came from: rerunning `python bench/learning.py
run ...` rewrites the JSON, and the next `mkdocs build` shows it. A marker whose results are
missing fails the build.

The same for the other benchmarks that keep a history: `<!-- bench:NAME -->` becomes
`bench/NAME.py`'s `render` of `bench/results/NAME.json` (e.g. `bench:llm_step`).
"""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- learning:(\w+) -->")
BENCH = re.compile(r"<!-- bench:(\w+) -->")


def _bench(name: str = "learning") -> Any:
    """`bench/NAME.py` as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"bench_{name}", ROOT / "bench" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bench_table(m: re.Match[str]) -> str:
    """`bench/NAME.py`'s `render` of `bench/results/NAME.json` for a `<!-- bench:NAME -->` marker."""
    path = ROOT / "bench" / "results" / f"{m.group(1)}.json"
    if not path.exists():
        raise FileNotFoundError(f"{m.group(0)}: no {path.relative_to(ROOT)}")
    return str(_bench(m.group(1)).render(json.loads(path.read_text())))


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each `<!-- learning:NAME -->` marker with the recorded table NAME, and each bench marker.

    Raises:
        KeyError: a marker names results `bench/results/learning.json` does not hold.
        FileNotFoundError: a `<!-- bench:NAME -->` marker without `bench/results/NAME.json`.
    """
    markdown = BENCH.sub(_bench_table, markdown)
    if not MARKER.search(markdown):
        return markdown
    learning = _bench()
    results = learning.load()

    def table(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in results:
            raise KeyError(f"{m.group(0)}: bench/results/learning.json has no {name!r} results")
        return learning.renderer(name)(results[name])

    return MARKER.sub(table, markdown)
