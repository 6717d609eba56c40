"""Training and evaluation log their rollouts to the trajectory store."""

from __future__ import annotations

import json

from conftest import WARM_ENV

import textgym  # noqa: F401
from textgym.models import load_model
from textgym.offline.store import read_trajectories


def test_grpo_logs_its_rollouts_and_a_resume_keeps_the_store_consistent(warm_model_dir, tmp_path):
    import shutil

    from textgym.config import GRPOConfig
    from textgym.trainers.rl.grpo import GRPOTrainer

    cfg = GRPOConfig.model_validate(
        {"env": WARM_ENV, "steps": 3, "prompts_per_step": 4, "group_size": 2, "checkpoint_every": 2,
         "keep_checkpoints": 5, "sampling": {"max_new_tokens": 6}, "log_trajectories": True}
    )  # fmt: skip
    model, tok = load_model(warm_model_dir)
    GRPOTrainer(cfg, model, tok, tmp_path).train()
    t = read_trajectories(tmp_path / "trajectories")
    assert t.num_rows == 3 * 8 and sorted(set(t.column("policy_version").to_pylist())) == [0, 1, 2]
    assert set(t.column("source").to_pylist()) == {"train"}
    # Simulate a kill after step 3's rollouts but before its checkpoint: resume from step 2.
    shutil.rmtree(tmp_path / "checkpoints" / "step_3")
    model, tok = load_model(warm_model_dir)
    trainer = GRPOTrainer(cfg, model, tok, tmp_path, resume=True)
    assert trainer.step == 2 and read_trajectories(tmp_path / "trajectories").num_rows == 2 * 8
    trainer.train()
    t = read_trajectories(tmp_path / "trajectories")
    assert (
        t.num_rows == 3 * 8 and sorted(t.column("policy_version").to_pylist()) == [0] * 8 + [1] * 8 + [2] * 8
    )


def test_eval_logs_trajectories(warm_model_dir, tmp_path):
    from typer.testing import CliRunner

    from textgym.cli import app

    args = ["eval", "--env", WARM_ENV["id"], "--env-kwargs", "digits=1", "--env-kwargs", "instruction=",
            "--model", str(warm_model_dir), "--n", "6", "--max-new-tokens", "8", "--out", str(tmp_path),
            "--log-trajectories", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    t = read_trajectories(tmp_path / "trajectories")
    assert t.num_rows == 6 and set(t.column("source").to_pylist()) == {"eval"}
    assert (
        json.loads(res.stdout.strip().splitlines()[-1])["accuracy"] == sum(t.column("reward").to_pylist()) / 6
    )
