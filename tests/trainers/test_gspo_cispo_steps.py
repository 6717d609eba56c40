"""GSPO, GSPO-token and CISPO through the real GRPO trainer on the tiny model: one off-policy step
with each loss, and gradient accumulation's invariance. The losses' maths (TRL parity, hand
values, the config's checks) is in tests/algorithms/test_gspo_cispo.py."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.algorithms import registry
from textgym.algorithms.registry import AdvantageInputs, register_advantage
from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.seeding import seed_everything


def grpo_cfg(**over) -> GRPOConfig:
    base = {"env": ENV, "steps": 1, "prompts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 8}}
    return GRPOConfig.model_validate({**base, **over})


@pytest.fixture
def spread_advantages():
    """Advantages that are never all zero (a random model's rewards are), so every step has a gradient."""

    @register_advantage("test_gspo_spread")
    def spread(x: AdvantageInputs):
        return torch.linspace(-1.0, 1.0, len(x.rewards)), {}

    yield "test_gspo_spread"
    registry.ADVANTAGES.unregister("test_gspo_spread")


LOSS_STATS = {
    "gspo": ("ratio/seq_mean", "ratio/seq_max", "ratio/seq_min", "clip/frac"),
    "gspo_token": ("ratio/seq_mean", "ratio/seq_max", "ratio/seq_min", "clip/frac"),
    "cispo": ("cispo/weight_mean", "ratio/max", "clip/frac_high"),
}


@pytest.mark.parametrize("name", list(LOSS_STATS))
def test_a_grpo_step_with_each_loss(tiny_model_dir, tmp_path, spread_advantages, name):
    """Two minibatches × two epochs, so the later updates are off-policy: ratios move off 1."""
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    over = {"clip_low": 3e-4, "clip_high": 4e-4} if name != "cispo" else {"cispo_clip_high": 0.01}
    cfg = grpo_cfg(
        policy_loss=name, advantage_estimator=spread_advantages, epochs=2, minibatch_size=4, kl_coef=0.02,
        optim={"lr": 1e-3}, **over,
    )  # fmt: skip
    metrics = GRPOTrainer(cfg, model, tok, tmp_path).train_step()
    for key in ("loss/total", "loss/policy", "grad_norm", "kl/ref", "kl/old_approx", *LOSS_STATS[name]):
        assert math.isfinite(metrics[key]), key
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    if name == "cispo":
        assert metrics["ratio/max"] > 1.01 and 0 < metrics["clip/frac_high"] < 1
        assert metrics["cispo/weight_mean"] <= 1.01
    else:
        assert metrics["ratio/seq_max"] > 1 + 4e-4 and 0 < metrics["clip/frac"] < 1


@pytest.mark.parametrize("name", ["gspo", "cispo"])
def test_gradient_accumulation_is_invariant(tiny_model_dir, tmp_path, name):
    """One micro-batch of 8 == 8 of 1, on a batch whose π_old is perturbed so the clips engage."""
    import gymnasium as gym

    from textgym.agents import LLMAgent, SamplingParams, rollout

    model, tok = load_model(tiny_model_dir)
    torch.manual_seed(3)
    envs = [gym.make(ENV["id"], **ENV["kwargs"]) for _ in range(8)]
    trajs = rollout(LLMAgent(model, tok), envs, [0, 1], SamplingParams(max_new_tokens=8), group_size=4)
    batch = RolloutBatch.from_trajectories(trajs, tok.pad_token_id)
    batch.old_logprobs = batch.old_logprobs + 0.05 * torch.randn(batch.old_logprobs.shape) * batch.loss_mask
    adv = torch.linspace(-1.0, 1.0, len(batch))
    grads = []
    for micro in (8, 1):
        m = copy.deepcopy(model)
        over = {"clip_low": 0.01, "clip_high": 0.01} if name == "gspo" else {"cispo_clip_high": 0.02}
        cfg = grpo_cfg(
            policy_loss=name, micro_batch_size=micro, kl_coef=0.05, optim={"max_grad_norm": None}, **over
        )
        stats = GRPOTrainer(cfg, m, tok, tmp_path / f"m{micro}").update(batch, adv)
        grads.append(torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]))
        assert 0 < stats["clip/frac"] < 1
    assert grads[0].abs().max() > 0
    rel = float((grads[1] - grads[0]).norm() / grads[0].norm())
    assert rel < 1e-5, f"relative gradient difference {rel:.2e}"
