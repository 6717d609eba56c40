"""The README's main job, end to end through the console script: GRPO must add >= 15 points."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import THREADS

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.learning
@pytest.mark.slow
def test_quickstart_raises_held_out_accuracy_by_15_points(tmp_path):
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
    assert summary["accuracy_after"] - summary["accuracy_before"] >= 0.15
    assert "accuracy" in r.stdout and "before" in r.stdout  # the printed before/after table
