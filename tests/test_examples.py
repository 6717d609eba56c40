"""examples/minimal_grpo.py computes GRPOTrainer's loss, and runs end to end."""

from __future__ import annotations

import copy
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.seeding import seed_everything

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "minimal_grpo.py"
ENV = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 1, "instruction": ""}}


def load_example():
    spec = importlib.util.spec_from_file_location("minimal_grpo", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["minimal_grpo"] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_minimal_grpo_first_step_loss_equals_grpo_trainers(tiny_model_dir, tmp_path):
    ex = load_example()
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    start = copy.deepcopy(model)  # the weights the trainer's first loss is computed with
    cfg = GRPOConfig.model_validate(
        {
            "env": ENV,
            "steps": 1,
            "prompts_per_step": 4,
            "group_size": 4,
            "sampling": {"temperature": 1.0, "max_new_tokens": 6},
            "optim": {"lr": 1e-3, "max_grad_norm": None},  # the gradient stays as computed
        }
    )
    trainer = GRPOTrainer(cfg, model, tok, tmp_path / "grpo")
    # An untrained model scores 0 everywhere (zero advantages, zero loss); seeded random rewards
    # make every group informative. The spy keeps the exact trajectories the trainer trains on.
    seen = []
    sample = trainer.batch  # the step's trajectories, scored
    g = torch.Generator().manual_seed(1)

    def spy(metrics):
        trajs = sample(metrics)
        for t in trajs:
            t.reward = float(torch.rand((), generator=g))
        seen.extend(trajs)
        return trajs

    trainer.batch = spy  # type: ignore[method-assign]
    metrics = trainer.train_step()
    trainer.close()

    args = ex.Args(
        env_id=ENV["id"],
        env_kwargs=ENV["kwargs"],
        group_size=cfg.group_size,
        prompts_per_step=cfg.prompts_per_step,
        temperature=cfg.sampling.temperature,
        max_new_tokens=cfg.sampling.max_new_tokens,
        clip_eps=cfg.clip_low,
    )
    start.train()
    loss, stats = ex.grpo_loss_for_batch(start, seen, int(tok.pad_token_id), args)
    assert len(seen) == 16 and stats["adv/std"] > 0.5
    assert abs(float(loss.detach()) - metrics["loss/total"]) < 1e-6
    assert abs(stats["loss/policy"] - metrics["loss/policy"]) < 1e-6
    assert abs(stats["adv/std"] - metrics["adv/std"]) < 1e-6
    # At the first step ρ = 1 and each group's advantages sum to 0, so the loss's value is 0
    # whatever the model; its gradient is what trains, and it is the trainer's too.
    loss.backward()
    grads = dict(start.named_parameters())
    worst = 0.0
    for name, p in trainer.policy.named_parameters():
        assert p.grad is not None and grads[name].grad is not None, name
        worst = max(worst, float((p.grad - grads[name].grad).abs().max()))
    scale = max(float(p.grad.abs().max()) for p in trainer.policy.parameters() if p.grad is not None)
    assert scale > 1e-3
    assert worst < 1e-6 * max(scale, 1.0)


@pytest.mark.slow
def test_minimal_grpo_runs_two_steps_as_a_script(tiny_model_dir, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [
        sys.executable,
        str(EXAMPLE),
        "--model",
        str(tiny_model_dir),
        "--steps",
        "2",
        "--prompts-per-step",
        "2",
        "--group-size",
        "4",
        "--max-new-tokens",
        "6",
        "--env-kwargs",
        json.dumps(ENV["kwargs"]),
        "--out",
        str(tmp_path / "run"),
    ]
    done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "step    2" in done.stdout
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert all(r["rollout/response_length_mean"] > 0 and r["grad_norm"] >= 0 for r in records)
