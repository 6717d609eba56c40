"""Policy losses are looked up by name: the built-in `ppo_clip`, and one a user registers."""

from __future__ import annotations

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.algorithms.clipped_loss import clipped_policy_loss, ppo_clip_loss
from textgym.algorithms.registry import (
    ADVANTAGES,
    POLICY_LOSSES,
    AdvantageInputs,
    PolicyLossInputs,
    UnknownNameError,
    get_policy_loss,
    register_advantage,
    register_policy_loss,
)
from textgym.config import ConfigError, GRPOConfig, RunConfig
from textgym.models import load_model
from textgym.pipeline import preflight
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.seeding import seed_everything


@pytest.fixture
def unregister():
    names: list[str] = []
    yield names
    for name in names:
        POLICY_LOSSES.unregister(name)
        ADVANTAGES.unregister(name)


def grpo_cfg(**over) -> GRPOConfig:
    base = {
        "env": ENV,
        "steps": 1,
        "prompts_per_step": 2,
        "group_size": 4,
        "sampling": {"max_new_tokens": 8},
    }
    return GRPOConfig.model_validate({**base, **over})


def test_ppo_clip_is_registered_and_computes_the_clipped_surrogate_with_the_configs_settings():
    assert "ppo_clip" in POLICY_LOSSES and get_policy_loss("ppo_clip") is ppo_clip_loss
    torch.manual_seed(0)
    B, L = 6, 5
    logprobs = (-torch.rand(B, L)).requires_grad_()
    old, ref = -torch.rand(B, L), -torch.rand(B, L)
    adv, mask = torch.randn(B), (torch.rand(B, L) > 0.2).float()
    cfg = grpo_cfg(
        clip_low=0.1, clip_high=0.3, dual_clip=3.0, loss_aggregation="token_mean", kl_estimator="k2"
    )
    x = PolicyLossInputs(logprobs, old, adv, mask, cfg, ref_logprobs=ref, kl_coef=0.05, num_seqs=6.0)
    loss, stats = ppo_clip_loss(x)
    expected, expected_stats = clipped_policy_loss(
        logprobs, old, adv, mask, clip_low=0.1, clip_high=0.3, dual_clip=3.0, aggregation="token_mean",
        ref_logprobs=ref, kl_coef=0.05, kl_estimator="k2", num_seqs=6.0, norm_len=8,
    )  # fmt: skip
    assert torch.equal(loss, expected) and stats == expected_stats


def test_an_unknown_policy_loss_lists_the_registered_ones_and_a_name_is_taken_once(unregister):
    with pytest.raises(UnknownNameError, match=r"unknown policy loss 'nope'; registered: .*ppo_clip"):
        get_policy_loss("nope")
    unregister.append("twice")
    register_policy_loss("twice")(ppo_clip_loss)
    with pytest.raises(ValueError, match="already registered"):
        register_policy_loss("twice")(lambda x: ppo_clip_loss(x))
    with pytest.raises(ValueError, match=r"ppo_clip.*already registered"):
        register_policy_loss("ppo_clip")(lambda x: ppo_clip_loss(x))


def test_a_user_registered_loss_is_what_the_update_minimises(warm_model_dir, tmp_path, unregister):
    """A loss that delegates to ppo_clip gives bitwise the default's step; one that returns 0
    (with a gradient path) leaves the policy where it was."""
    unregister += ["test_delegate", "test_zero", "test_spread"]
    calls: list[PolicyLossInputs] = []

    # Advantages that are never all zero, whatever the samples' rewards (on some kernels all 8
    # samples of the warm model score the same), so every step has a real gradient.
    @register_advantage("test_spread")
    def spread(x: AdvantageInputs):
        return torch.linspace(-1.0, 1.0, len(x.rewards)), {}

    @register_policy_loss("test_delegate")
    def delegate(x: PolicyLossInputs):
        calls.append(x)
        loss, stats = ppo_clip_loss(x)
        return loss, {**stats, "loss/test_calls": float(len(calls))}

    @register_policy_loss("test_zero")
    def zero(x: PolicyLossInputs):
        return (x.logprobs * 0.0).sum(), {"loss/policy": 0.0}

    finals = {}
    for name in ("ppo_clip", "test_delegate", "test_zero"):
        seed_everything(0)
        model, tok = load_model(warm_model_dir)
        before = {k: v.clone() for k, v in model.state_dict().items()}
        cfg = grpo_cfg(policy_loss=name, advantage_estimator="test_spread", micro_batch_size=4, kl_coef=0.05)
        metrics = GRPOTrainer(cfg, model, tok, tmp_path / name).train_step()
        finals[name] = {k: v.clone() for k, v in model.state_dict().items()}
        if name == "test_delegate":
            assert len(calls) == 2 and metrics["loss/test_calls"] > 0  # 8 sequences, micro-batches of 4
            assert calls[0].logprobs.requires_grad and calls[0].logprobs.shape == calls[0].mask.shape
            assert calls[0].ref_logprobs is not None and calls[0].kl_coef == 0.05 and calls[0].config is cfg
        if name == "test_zero":
            assert all(torch.equal(v, before[k]) for k, v in finals[name].items())
    assert all(torch.equal(v, finals["ppo_clip"][k]) for k, v in finals["test_delegate"].items())
    assert any(not torch.equal(v, before[k]) for k, v in finals["ppo_clip"].items())


def test_the_config_checks_the_policy_loss_name_before_work(unregister):
    for stage in ("grpo", "ppo"):
        cfg = RunConfig.model_validate(
            {"name": "t", "model": {"init_preset": "tiny"}, stage: {"env": ENV, "policy_loss": "test_late"}}
        )
        with pytest.raises(
            ConfigError, match=rf"{stage}\.policy_loss: unknown policy loss 'test_late'; registered: "
        ):
            preflight(cfg)
    unregister.append("test_late")
    register_policy_loss("test_late")(ppo_clip_loss)
    preflight(cfg)


def test_the_policy_losses_old_home_names_the_new_one():
    with pytest.raises(
        ModuleNotFoundError,
        match=r"textgym\.trainers\.losses has moved to .*textgym\.algorithms\.clipped_loss",
    ):
        from textgym.trainers.losses import clipped_policy_loss  # noqa: F401
