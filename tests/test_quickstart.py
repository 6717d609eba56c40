"""The tiny-model quickstart (`make quickstart-tiny`), end to end through the console script.

GRPO must add at least `bench/learning.py`'s `bar`: the recorded seed-0 gain for this machine's
kernels and threads minus 10 points, never below +15 (the floor where no run on such kernels is
recorded); `make learning-check` is the same check from the command line. The run takes 5 to 10
minutes, so it is marked `long` (`make test-long`); CI's learning check on a real model is
tests/test_smollm2_learning.py.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import THREADS

ROOT = Path(__file__).resolve().parents[1]


def learning_module():
    """`bench/learning.py` as a module (bench/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_learning", ROOT / "bench" / "learning.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_learning_bar_follows_the_record_for_the_same_kernels_only():
    learning = learning_module()
    record = {
        "machine": {"flags": ["avx2"]},
        "rows": [
            {"seed": 0, "kernel": "own", "threads": 2, "gain": 52.0},
            {"seed": 0, "kernel": "default", "threads": 1, "gain": 20.0},
            {"seed": 1, "kernel": "own", "threads": 2, "gain": 60.0},
        ],
    }
    assert learning.bar(record, "avx2", 2) == 42.0  # "own" on an AVX2 machine is avx2
    assert learning.bar(record, "default", 1) == 15.0  # never below the floor
    assert learning.bar(record, "avx512", 2) == 15.0  # not recorded: the floor
    assert learning.bar(record, "avx2", 1) == 15.0
    assert learning.bar(None, "avx2", 2) == 15.0  # nothing recorded
    # one record per machine: an AVX-512 machine's seed 0 bars runs on AVX-512 kernels only
    other = {"machine": {"flags": ["avx2", "avx512f"]}, "rows": [{"seed": 0, "kernel": "own", "threads": 2,
                                                                  "gain": 38.0}]}  # fmt: skip
    results = {"quickstart": record, "quickstart_avx512": other, "algorithms": {}}
    assert learning.least_gain(results, "avx512", 2) == 28.0
    assert learning.least_gain(results, "avx2", 2) == 42.0
    assert learning.least_gain({}, "avx2", 2) == 15.0
    assert learning.renderer("quickstart_avx512") is learning.render
    table = learning.render({**record, "date": "2026-11-25", "commit": "abc1234", "command": "x",
                             "machine": {"cpu": "CPU", "cores": 2, "flags": ["avx2"]},
                             "rows": [{**r, "sft_steps": 200, "before": 0.3, "after": 0.8, "wall_s": 300}
                                      for r in record["rows"]]})  # fmt: skip
    assert "| 0 | own (AVX2) | 2 | 200 | 0.300 | 0.800 | +52.0 points | 300 s |" in table
    assert "at commit `abc1234`" in table and "kernel flags: avx2" in table


def test_the_llm_matrix_records_a_finished_run_and_renders_it(tmp_path):
    # `bench/learning.py llm --collect`: the row of a finished configs/smollm2_grpo.yaml run
    learning = learning_module()
    run = tmp_path / "m_s1_default_t1"
    (run / "grpo").mkdir(parents=True)
    summary = {"accuracy_before": 0.17, "accuracy_after": 0.53, "stage_times_s": {"grpo": 455.2},
               "wall_time_s": 530.6, "peak_rss_mb": 4124.2}  # fmt: skip
    (run / "summary.json").write_text(json.dumps(summary))
    for when, tokens in (("before", 46.38), ("after", 10.49)):
        (run / f"eval_{when}.json").write_text(json.dumps({"mean_response_tokens": tokens}))
    steps = [{"step": 1, "rollout/overlong_frac": 0.265625, "time/step_s": 100.71},
             {"step": 2, "rollout/overlong_frac": 0.1, "time/step_s": 108.0,
              "eval/accuracy": 0.38}]  # fmt: skip
    (run / "grpo" / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    row = learning.llm_row(run, 1, "default", 1, side_by_side=True)
    assert row["gain"] == 36.0 and row["cut_step1"] == 0.266 and row["grpo_s"] == 455 and row["wall_s"] == 531
    assert row["heldout_during"] == {"2": 0.38} and row["step_s"] == [100.7, 108.0] and row["steps"] == 2
    record = {"date": "2026-11-28", "commit": "abc1234", "command": "python bench/learning.py llm",
              "machine": {"cpu": "CPU", "cores": 2, "flags": ["avx2"]}, "rows": [row]}  # fmt: skip
    table = learning.renderer("smollm2_grpo")(record)
    assert (  # a row recorded before the format-controlled baseline existed
        "| 1 | `ATEN_CPU_CAPABILITY=default` | 1 (two side by side) | 2 | 0.17 | — | 0.53 | — | — | "
        "step 1: 27% | 455 s | 531 s | 4,124 MB |" in table
    )
    assert "Gains over the untrained model +36 to +36 points over 1 runs. " in table
    # a run with the baseline: its variant, budget, the gain above it, stated answers and cut shares
    baseline = {"accuracy_baseline": 0.31, "gain_above_baseline": 0.22, "stated_accuracy_before": 0.19,
                "stated_accuracy_after": 0.55, "cut_share_before": 0.41, "cut_share_after": 0.0,
                "baseline": {"variant": "env stem 1 (e.g. '85+63 = ')", "max_new_tokens": 64},
                "error_split_before": {"carry": {"n": 53, "correct": 8}}}  # fmt: skip
    (run / "summary.json").write_text(json.dumps({**summary, **baseline}))
    row = learning.llm_row(run, 1, "default", 1, side_by_side=True)
    assert row["baseline"] == 0.31 and row["gain_above_baseline"] == 22.0
    assert row["error_split_before"] == {"carry": {"n": 53, "correct": 8}}
    table = learning.render_llm({**record, "rows": [row]})
    assert (
        "| 0.17 | 0.31 (env stem 1 (e.g. '85+63 = '), 64 tokens) | 0.53 | +22 points | 0.19 → 0.55 | "
        "41% → 0% | 455 s |" in table
    )
    assert "+36 to +36 points over 1 runs; above the format-controlled baseline +22 to +22." in table
    with pytest.raises(FileNotFoundError):  # an unfinished run
        learning.llm_row(tmp_path, 0, "own", 2, side_by_side=False)


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(os.environ.get("TEXTGYM_RUN_LONG") != "1", reason="TEXTGYM_RUN_LONG=1 (5-10 min)")
def test_quickstart_gain_holds_against_the_recorded_figure(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "textgym",
        "train",
        str(ROOT / "configs" / "quickstart.yaml"),
        f"out_dir={tmp_path}",
        f"threads={THREADS}",
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    summary = json.loads((tmp_path / "quickstart" / "summary.json").read_text())
    print(json.dumps(summary, indent=2))
    assert summary["n_eval"] >= 200 and summary["decoding"]["temperature"] == 0.0
    # GRPO starts from a measured state: SFT stopped once the probe reached its target.
    assert summary["sft_target"]["target_reached"] and summary["sft_target"]["probe_accuracy"] >= 0.3
    learning = learning_module()
    kernels = learning.kernels_of(os.environ.get("ATEN_CPU_CAPABILITY", "own"), learning.machine()["flags"])
    least = learning.least_gain(learning.load(), kernels, THREADS)
    gain = 100 * (summary["accuracy_after"] - summary["accuracy_before"])
    print(f"gain {gain:+.1f} points; the bar for {kernels} kernels, {THREADS} threads: {least:+.1f}")
    assert gain >= least
    assert "accuracy" in r.stdout and "before" in r.stdout  # the printed before/after table
