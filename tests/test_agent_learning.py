"""An agent that learns to act over several turns: a cut-down tool-use recipe (marker `long`).

`configs/agent_toolmath.yaml` (3-digit products, which the tiny model cannot compute in its
head; success needs a calculator call with the question's expression copied into it, then the
calculator's result copied into the answer) run end to end through the console script, cut
down: SFT on the oracle's multi-turn demonstrations until a probe of 32 episodes (every 20
steps) reaches 30% success, then 30 GRPO steps instead of 60. Success is the policy's own: held
out, sampled at T = 1 (the distribution GRPO optimises), 2 samples on each of 200 test problems,
before and after GRPO. The margin is set below the smallest gain measured over
init seeds and kernels (docs/training/agents.md, "The long check").

It left CI on 2026-11-28: on a 2-core AMD EPYC with AVX2 and no AVX-512 it took 1,000 s of a
3,044 s suite (SFT passed its probe target only at step 560, against 300 with AVX-512
kernels) and failed: the probe jumped from 0.28 to 0.53 between two checks, GRPO started at
0.61 and ended at 0.605. The recipe's start is not equally good on every CPU (the docs
section above), so the check runs when asked:

    TEXTGYM_RUN_LONG=1 .venv/bin/python -m pytest -q -m long tests/test_agent_learning.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import THREADS

ROOT = Path(__file__).resolve().parents[1]

CUT_DOWN = [
    "sft.steps=800", "sft.target.every=20", "sft.target.n=32", "grpo.steps=30", "grpo.checkpoint_every=1000",
    "eval.n=200", "eval.samples=2", "eval.sampling.temperature=1.0",
]  # fmt: skip
"""The overrides that cut `configs/agent_toolmath.yaml` down to a CI-sized run."""

MARGIN = 0.06
"""Held-out success must rise by this much (6 points) over GRPO's start."""


@pytest.mark.learning
@pytest.mark.slow
@pytest.mark.long
@pytest.mark.skipif(os.environ.get("TEXTGYM_RUN_LONG") != "1", reason="TEXTGYM_RUN_LONG=1 (10 to 17 min)")
def test_the_tool_use_agent_learns_over_turns_in_a_cut_down_run(tmp_path):
    cmd = [sys.executable, "-m", "textgym", "train", str(ROOT / "configs" / "agent_toolmath.yaml"),
           f"out_dir={tmp_path}", f"threads={THREADS}", *CUT_DOWN]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = tmp_path / "agent_toolmath"
    summary = json.loads((run / "summary.json").read_text())
    print(json.dumps(summary, indent=2))
    assert summary["n_eval"] == 200 and summary["decoding"]["temperature"] == 1.0
    assert summary["sft_target"]["target_reached"]
    before, after = summary["accuracy_before"], summary["accuracy_after"]
    print(f"held-out success {before:.3f} -> {after:.3f} ({100 * (after - before):+.1f} points)")
    assert after >= before + MARGIN
    # the episodes were multi-turn: a calculator call, then the answer
    rows = [json.loads(x) for x in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 30 and all(m["rollout/turns_mean"] >= 1.5 for m in rows)
    # a calculator call in (nearly) every episode: the last 10 steps' mean (640 episodes); one
    # step's 64 episodes are too few (0.766 to 0.984 over one run's steps)
    last = [m["rollout/tool_calls_mean"] for m in rows[-10:]]
    assert sum(last) / len(last) >= 0.8, last
