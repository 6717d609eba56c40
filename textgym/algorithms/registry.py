"""Named advantage estimators and policy losses, selectable from the config by name.

`@register_advantage("name")` makes an advantage estimator selectable by the GRPO trainer
(`grpo.advantage_estimator`); `@register_policy_loss("name")` makes a policy loss selectable
by every on-policy trainer (`grpo.policy_loss`, `ppo.policy_loss`).

## Advantage estimators

A registered estimator is a function `fn(inputs: AdvantageInputs) -> (advantages, stats)`:

- a per-sequence estimator returns advantages [N] for `inputs.rewards` (the rewards of the
  whole batch, every rank's rows in rank order); the trainer keeps this rank's rows;
- a per-token estimator returns advantages [B, L] for this rank's rows (`inputs.token_rewards`,
  `inputs.mask`), using `inputs.reduce` for any statistic over the whole batch.

`stats` are detached floats, logged with the step's metrics (keys like `adv/std`). The
built-in estimators (`grpo`, `rloo`, `reinforce_pp`) are registered in
`textgym.algorithms.advantages`; `available_advantages()` there lists every name after they are.
Adding one:

    from textgym.algorithms.registry import AdvantageInputs, register_advantage

    @register_advantage("mean_baseline")
    def mean_baseline(x: AdvantageInputs):
        adv = x.rewards - x.rewards.mean()
        return adv, {"adv/std": float(adv.std())}

then `grpo.advantage_estimator: mean_baseline` selects it.

## Policy losses
A registered policy loss is a function `fn(inputs: PolicyLossInputs) -> (loss, stats)`: the
scalar loss of one micro-batch (reduced with `textgym.algorithms.aggregate.aggregate` so that
micro-batch losses add up to the minibatch's) and detached float stats (`loss/policy`,
`clip/frac`, ...). The built-in `ppo_clip` (PPO's clipped surrogate with the config's clip
range, dual-clip, KL in the loss and importance weights) is registered in
`textgym.algorithms.clipped_loss`; `gspo`, `gspo_token` (Zheng et al. 2025) and `cispo` (MiniMax 2025)
in `textgym.algorithms.policy_losses`, whose `available_policy_losses()` lists every name.

This module imports nothing heavy, so the config can validate names against it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator gets from the GRPO trainer at one step.

    Attributes:
        rewards: [N] float, each sequence's reward over the whole batch (all ranks' rows,
            grouped contiguously by task, N = num_groups × G); with `kl_placement: reward`,
            already minus β·Σ_t KL_t.
        token_rewards: [B, L] this rank's per-token rewards (the reward on each turn's last
            policy token; −β·KL_t on every token with `kl_placement: reward`).
        mask: [B, L] 1 on this rank's policy tokens that count in the loss, else 0.
        group_size: G, samples per task.
        scale_rewards: the config's `scale_rewards` ("group", "batch" or "none").
        reduce: sums a tensor over data-parallel ranks (identity on one process), for
            statistics of the whole batch from per-rank tensors; None: the local batch alone.
        step_mask: [B, L] 1 on this rank's tokens that carry a reward event the trainer sees
            (step ends and/or turn ends, per the config's `reward_source`;
            `RolloutBatch.with_reward_source`); None when not given.
    """

    rewards: torch.Tensor
    token_rewards: torch.Tensor
    mask: torch.Tensor
    group_size: int
    scale_rewards: str = "group"
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    step_mask: torch.Tensor | None = None


AdvantageFn = Callable[[AdvantageInputs], "tuple[torch.Tensor, dict[str, float]]"]
"""An advantage estimator: `AdvantageInputs` in, `(advantages [N] or [B, L], stats)` out."""

_ADVANTAGES: dict[str, AdvantageFn] = {}


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss gets from the on-policy update for one micro-batch.

    Attributes:
        logprobs: [B, L] log π_θ of the taken tokens (requires grad).
        old_logprobs: [B, L] log π_old, the sampling log-probs (no grad).
        advantages: [B, L] per-token or [B] per-sequence advantages.
        mask: [B, L] 1.0 on the policy tokens that count in the loss.
        config: the stage's config (`GRPOConfig` or `PPOConfig`): `clip_low`, `clip_high`,
            `dual_clip`, `loss_aggregation`, `kl_estimator`, `sampling.max_new_tokens`, ...
        ref_logprobs: [B, L] log π_ref when the KL is in the loss, else None.
        kl_coef: β of the KL in the loss (0.0: none; the controller's current value for PPO).
        is_weights: [B, L] truncated importance weights of the rollout correction, or None.
        num_seqs: sequences in the minibatch this micro-batch belongs to (see `aggregate`).
        num_tokens: policy tokens in that minibatch (see `aggregate`).
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    config: Any
    ref_logprobs: torch.Tensor | None = None
    kl_coef: float = 0.0
    is_weights: torch.Tensor | None = None
    num_seqs: float | None = None
    num_tokens: float | None = None


PolicyLossFn = Callable[[PolicyLossInputs], "tuple[torch.Tensor, dict[str, float]]"]
"""A policy loss: `PolicyLossInputs` in, `(scalar loss, stats)` out."""

_POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def _register(table: dict[str, Any], kind: str, name: str, replace: bool) -> Callable[[Any], Any]:
    """The decorator of `register_advantage` / `register_policy_loss` for `table`."""
    if not name:
        raise ValueError(f"a {kind} needs a name")

    def decorate(fn: Any) -> Any:
        taken = table.get(name)
        if taken is not None and taken is not fn and not replace:
            raise ValueError(f"{kind} {name!r} is already registered ({_qualname(taken)})")
        table[name] = fn
        return fn

    return decorate


def _lookup(table: dict[str, Any], kind: str, name: str) -> Any:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}; registered: {', '.join(sorted(table))}") from None


def register_advantage(name: str, *, replace: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under `name` (returns the function unchanged).

    Args:
        name: the value of `advantage_estimator` that selects it.
        replace: allow replacing an estimator already registered under `name`.

    Raises:
        ValueError: if `name` is empty or taken (and `replace` is False).
    """
    return _register(_ADVANTAGES, "advantage estimator", name, replace)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under `name`.

    Raises:
        ValueError: if none is, listing the registered names.
    """
    return _lookup(_ADVANTAGES, "advantage estimator", name)  # type: ignore[no-any-return]


def registered_advantages() -> list[str]:
    """The names registered so far, sorted (the built-ins once `algorithms.advantages` is imported)."""
    return sorted(_ADVANTAGES)


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under `name` (returns the function unchanged).

    Args:
        name: the value of `policy_loss` that selects it.
        replace: allow replacing a loss already registered under `name`.

    Raises:
        ValueError: if `name` is empty or taken (and `replace` is False).
    """
    return _register(_POLICY_LOSSES, "policy loss", name, replace)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered under `name`.

    Raises:
        ValueError: if none is, listing the registered names.
    """
    return _lookup(_POLICY_LOSSES, "policy loss", name)  # type: ignore[no-any-return]


def registered_policy_losses() -> list[str]:
    """The names registered so far, sorted (all built-ins once `trainers.policy_losses` is imported)."""
    return sorted(_POLICY_LOSSES)


def _qualname(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
