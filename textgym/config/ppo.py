"""PPO's schemas: the stage (critic, GAE, adaptive KL) and its value model."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from textgym.config.base import OptimConfig, _Strict
from textgym.config.rl import _PolicyGradientConfig


class CriticConfig(_Strict):
    """PPO's value model: a transformer backbone with a scalar head per token."""

    path: str | None = None
    """HF folder to initialise the backbone from (default: the policy the PPO stage starts from)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer of the critic (its own learning rate)."""
    value_clip: float | None = Field(0.2, gt=0.0)
    """ε_v of value clipping around the rollout's values; null disables."""
    epochs: int = Field(1, ge=1)
    """Passes of the critic over each rollout batch; those beyond the policy's `epochs` train
    the critic alone (a cheap way to let the value model keep up)."""


class PPOConfig(_PolicyGradientConfig):
    """PPO with a per-token critic and GAE, RLHF style (Ouyang et al. 2022; Schulman et al. 2017)."""

    group_size: int = Field(1, ge=1)
    """Samples per task (PPO needs no groups; more than 1 just samples each task several times)."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token policy and value losses are reduced."""
    kl_coef: float = Field(0.05, ge=0.0)
    """β_0 of the KL penalty to the reference."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """KL estimator; k1 in the reward is unbiased."""
    kl_placement: Literal["loss", "reward"] = "reward"
    """KL in the per-token reward (RLHF) or in the loss."""
    kl_target: float | None = Field(None, gt=0.0)
    """Adaptive KL controller target (nats per sequence); null keeps β fixed."""
    kl_horizon: int = Field(10000, ge=1)
    """Adaptive controller horizon in sequences."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount per policy token."""
    lam: float = Field(0.95, ge=0.0, le=1.0)
    """GAE λ."""
    whiten_advantages: bool = True
    """Normalise advantages to zero mean and unit variance over the batch's policy tokens."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model."""
    critic_warmup_steps: int = Field(0, ge=0)
    """Iterations at the start that train only the critic (the policy is not updated). They
    count in `steps`: the policy's learning-rate schedule spans the `steps −
    critic_warmup_steps` iterations that update it, and an adaptive β stays put during them."""
