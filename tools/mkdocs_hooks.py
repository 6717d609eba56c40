"""MkDocs hook: the learning figures in the docs are rendered from `bench/results/learning.json`.

A page that holds `<!-- learning:quickstart -->` (or `quickstart_<machine>`) or
`<!-- learning:algorithms -->` gets, in its place, the table `bench/learning.py` renders from
the recorded results, with the commit, date, machine and command that produced them. A figure
in those tables cannot drift from the run it came from: rerunning `python bench/learning.py
run ...` rewrites the JSON, and the next `mkdocs build` shows it. A marker whose results are
missing fails the build.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- learning:(\w+) -->")


def _learning() -> Any:
    """`bench/learning.py` as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "learning.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    """Replace each `<!-- learning:NAME -->` marker with the recorded table NAME.

    Raises:
        KeyError: a marker names results `bench/results/learning.json` does not hold.
    """
    if not MARKER.search(markdown):
        return markdown
    learning = _learning()
    results = learning.load()

    def table(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in results:
            raise KeyError(f"{m.group(0)}: bench/results/learning.json has no {name!r} results")
        return learning.renderer(name)(results[name])

    return MARKER.sub(table, markdown)
