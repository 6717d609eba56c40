"""The agent-RL config and its matched-compute control train the same SFT on the same task.

`configs/smollm2_agent_sft_control.yaml` is "the same SFT continued": only its length (steps,
demonstrations) may differ from `configs/smollm2_agent_rl.yaml`'s SFT, and both are evaluated
on the same held-out env. `bench/agent_rl.py` sizes the control to the RL run's time.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from textgym.config import load_config

ROOT = Path(__file__).resolve().parents[1]


def test_the_control_is_the_rl_runs_sft_continued():
    rl = load_config(ROOT / "configs" / "smollm2_agent_rl.yaml")
    control = load_config(ROOT / "configs" / "smollm2_agent_sft_control.yaml")
    assert rl.sft is not None and control.sft is not None and rl.grpo is not None
    assert control.grpo is None and control.ppo is None
    assert control.sft.env == rl.sft.env == rl.grpo.env
    assert control.eval == rl.eval and control.model == rl.model
    assert control.sft.optim == rl.sft.optim and control.sft.batch_size == rl.sft.batch_size
    rl_demos, control_demos = rl.sft.demonstrations, control.sft.demonstrations
    assert rl_demos is not None and control_demos is not None
    assert control_demos.model_copy(update={"n": rl_demos.n}) == rl_demos  # the same expert, more of it
    assert control_demos.n >= rl_demos.n and control.sft.steps > rl.sft.steps


def test_the_control_trains_at_least_as_long_as_the_rl_run(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_agent_rl", ROOT / "bench" / "agent_rl.py")
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    run = tmp_path / "a_s0"
    run.mkdir()
    (run / "config.yaml").write_text("sft:\n  steps: 12\n")
    (run / "summary.json").write_text(json.dumps({"stage_times_s": {"sft": 120.0, "grpo": 301.0}}))
    # 10 s per SFT step; 421 s of SFT + GRPO -> 43 steps (42 would be 420 s, short of it)
    assert bench.control_steps(run, margin=1.0) == 43
    assert bench.control_steps(run) == 53  # with the default 25% margin: 526.25 s
