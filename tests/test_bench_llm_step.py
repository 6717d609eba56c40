"""bench/llm_step.py's arithmetic and its page: the FLOP count, the means, the rendered table.

The benchmark itself (a SmolLM2 GRPO run on each side, ~25 minutes) is not run here; its
recorded result is (bench/results/llm_step.json), and docs/benchmarks.md renders it through
the MkDocs hook's `<!-- bench:llm_step -->` marker.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_useful_flops_count_prompts_once_and_generated_tokens_in_both_phases():
    bench = _module(ROOT / "bench" / "llm_step.py", "bench_llm_step")
    N, head = 100e6, 28e6
    s = {"prompt_tokens": [1000, 500]}
    side = {"steps": [
        {"step_s": 30.0, "rollout_s": 10.0, "update_s": 20.0, "generated_tokens": 2000.0},
        {"step_s": 15.0, "rollout_s": 5.0, "update_s": 10.0, "generated_tokens": 400.0},
    ]}  # fmt: skip
    bench.rates(s, side, N, head)
    first = side["steps"][0]
    assert first["rollout_gflops"] == pytest.approx((2 * N * 1000 + 2 * (N + head) * 2000) / 10.0 / 1e9)
    assert first["update_gflops"] == pytest.approx((6 * N * 3000 + 6 * head * 2000) / 20.0 / 1e9)
    mean = bench.summary(side, warmup=1, rows=128)
    assert mean["step_s"] == 15.0 and mean["sequences_per_s"] == pytest.approx(128 / 15.0)
    assert mean["decode_tokens_per_s"] == pytest.approx(400 / 5.0)


def test_the_recorded_run_renders_into_the_benchmarks_page():
    bench = _module(ROOT / "bench" / "llm_step.py", "bench_llm_step")
    runs = json.loads((ROOT / "bench" / "results" / "llm_step.json").read_text())
    table = bench.render(runs)
    last = runs[-1]
    assert f"**{last['ratio']:.2f}×**" in table and last["commit"] in table
    assert table.count("| textgym |") == len(runs) and table.count("| trl |") == len(runs)
    hooks = _module(ROOT / "tools" / "mkdocs_hooks.py", "mkdocs_hooks")
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    assert "<!-- bench:llm_step -->" in page
    rendered = hooks.on_page_markdown("before\n<!-- bench:llm_step -->\nafter")
    assert rendered == f"before\n{table}\nafter"
    with pytest.raises(FileNotFoundError, match="no_such_bench"):
        hooks.on_page_markdown("<!-- bench:no_such_bench -->")
