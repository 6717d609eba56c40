"""PPO's clipped surrogate: the one clipped core every policy loss is built on, and `ppo_clip`.

`clipped_surrogate` is the clipped policy-gradient term on any ratio (a token's ρ_t, GSPO's
sequence ratio s_i, GSPO-token's s_{i,t}), with dual-clip and the rollout correction's
importance weights; `add_kl_term` adds β·KL_est in the loss; `clip_fractions` and `kl_stats`
are the statistics every loss reports. `clipped_policy_loss` is PPO's loss on them, registered
as `ppo_clip` (the default of GRPO, its family and PPO); `textgym.algorithms.policy_losses`
builds GSPO, GSPO-token and CISPO on the same pieces.

Shapes: B = sequences, L = response columns, `mask` [B, L] with 1.0 on policy tokens.
"""

from __future__ import annotations

from typing import Any

import torch

from textgym.algorithms.aggregate import Aggregation, aggregator
from textgym.algorithms.kl import KLEstimator, k3, kl_estimate
from textgym.algorithms.registry import PolicyLossInputs, register_policy_loss

RATIO_LOG_CAP = 20.0
"""The ratio's log is capped here before `exp` (see `clipped_surrogate`)."""


def clipped_policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    aggregation: Aggregation = "seq_mean_token_mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    norm_len: int | None = None,
    dual_clip: float | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate with asymmetric clipping, dual-clip and an optional KL term in the loss.

    Per token, with ρ = exp(log π_θ − log π_old):
    `ℓ = −min(ρ·Â, clip(ρ, 1−clip_low, 1+clip_high)·Â) + β·KL_est(π_θ‖π_ref)`
    (Schulman et al. 2017, arXiv:1707.06347, eq. 7; GRPO's KL in the loss, Shao et al. 2024
    eq. 3; clip-higher `clip_high > clip_low`, DAPO, Yu et al. 2025, eq. 10), reduced by
    `aggregate`. With `dual_clip = c > 1`, tokens with Â < 0 have their surrogate loss capped
    at −c·Â, so a huge ratio on a bad token cannot make an unbounded step (Ye et al. 2020,
    arXiv:1912.09729, eq. 5).

    The ratio's exponent is capped at `RATIO_LOG_CAP` = 20 before `exp` (as verl does): in
    the normal range nothing changes; beyond, ρ stays at e^20 with no gradient instead of
    overflowing to inf (whose product with a zero advantage, or in the backward pass, is nan).
    An Â > 0 token there is clipped anyway; an Â < 0 one is what `dual_clip` bounds.

    KL in the loss: what the gradient of `β·KL_est` does depends on the estimator (Shah et
    al. 2026, table in docs/maths.md#kl-estimators-and-where-they-go): k3 (GRPO) is stable
    but its expected gradient is that of the forward KL(π_ref‖π_θ); k2's is that of the
    reverse KL(π_θ‖π_ref) for
    on-policy samples; k1 has zero expected gradient (noise only) — put k1 in the reward
    instead (`textgym.algorithms.advantages.token_level_rewards`).

    Args:
        logprobs: [B, L] log π_θ of the taken tokens (requires grad).
        old_logprobs: [B, L] log π_old (sampling log-probs), no grad.
        advantages: [B, L] per-token or [B] per-sequence advantages.
        mask: [B, L] 1.0 on policy tokens.
        clip_low: ε_low: the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high: the ratio is clipped above at 1 + ε_high.
        aggregation: the reduction mode (see `aggregate`).
        num_seqs: minibatch size when this is a micro-batch (see `aggregate`).
        num_tokens: minibatch token count when this is a micro-batch (see `aggregate`).
        norm_len: the constant of `seq_mean_token_sum_norm` (see `aggregate`).
        ref_logprobs: [B, L] log π_ref, required when `kl_coef > 0`.
        kl_coef: β.
        kl_estimator: "k1" | "k2" | "k3" (see `kl_estimate`).
        dual_clip: c > 1 of dual-clip PPO, or None.
        is_weights: [B, L] per-token weights (no grad) multiplying the policy-gradient term,
            e.g. the truncated importance weights that correct for a rollout engine whose
            probabilities differ from the trainer's (`rollout_correction`); None for 1.

    Returns:
        The scalar loss, and detached stats: `loss/policy`, `kl/ref` (masked token mean of the
        estimate), `clip/frac_low`, `clip/frac_high`, `clip/frac`, `clip/frac_dual`,
        `ratio/mean`, `ratio/max`, `kl/old_approx` (k3 estimate of KL(π_old‖π_θ)).

    Raises:
        ValueError: if `kl_coef > 0` and `ref_logprobs` is None, or `dual_clip <= 1`.
    """
    log_ratio = logprobs - old_logprobs
    # Guard against overflow (e^89 = inf in float32, and inf·0 = nan for a zero advantage or in
    # the gradient): identical below log ρ = 20; above, ρ stays at e^20 with no gradient.
    ratio = torch.exp(log_ratio.clamp(max=RATIO_LOG_CAP))
    adv = advantages[:, None] if advantages.ndim == 1 else advantages
    pg, adv, dual = clipped_surrogate(ratio, adv, logprobs, clip_low, clip_high, dual_clip, is_weights)
    per_token, kl = add_kl_term(pg, logprobs, ref_logprobs, kl_coef, kl_estimator)

    agg = aggregator(mask, aggregation, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=norm_len)

    loss = agg(per_token)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        stats = {
            "loss/policy": float(agg(pg)),
            **clip_fractions(ratio, adv, mask, clip_low, clip_high, dual),
            "ratio/mean": float((ratio * mask).sum() / n),
            "ratio/max": float(ratio.masked_fill(mask == 0, 0.0).max()) if mask.any() else 1.0,
            **kl_stats(log_ratio, mask, kl, kl_estimator),
        }
    return loss, stats


# --- the clipped core every policy loss shares (ppo_clip, gspo, gspo_token; cispo's KL) -----
def clipped_surrogate(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    logprobs: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    is_weights: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The clipped policy-gradient term per token: PPO's, on any ratio (a token's or a sequence's).

    `pg = −min(w·Â, clip(w, 1−ε_low, 1+ε_high)·Â)` (Schulman et al. 2017, eq. 7; asymmetric
    clip-higher, Yu et al. 2025, eq. 10), then dual-clip for Â < 0 (the term capped at −c·Â,
    Ye et al. 2020, eq. 5), then the rollout correction's importance weights. `clipped_policy_loss`
    passes the token ratio ρ_t, GSPO the sequence ratio s_i ([B, 1], broadcast) or
    GSPO-token's s_{i,t}.

    Args:
        ratio: [B, L] or [B, 1] the importance ratio w (its exponent already capped).
        advantages: [B, L] or [B, 1] Â.
        logprobs: [B, L] log π_θ (gives the output shape).
        clip_low: ε_low: the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high: the ratio is clipped above at 1 + ε_high.
        dual_clip: c > 1, or None.
        is_weights: [B, L] weights (no grad) on the term, or None.

    Returns:
        `pg` [B, L], `advantages` broadcast to [B, L], and the [B, L] bool mask of the terms
        dual-clip capped (None without dual-clip).

    Raises:
        ValueError: if `dual_clip <= 1`.
    """
    pg = -torch.minimum(ratio * advantages, ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages)
    pg = pg.expand_as(logprobs)
    adv = advantages.expand_as(logprobs)
    dual = None
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        capped = torch.minimum(pg, -dual_clip * adv)
        dual = (adv < 0) & (capped < pg)
        pg = torch.where(adv < 0, capped, pg)
    if is_weights is not None:
        pg = pg * is_weights.detach()
    return pg, adv, dual


def add_kl_term(
    pg: torch.Tensor,
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    kl_coef: float,
    estimator: KLEstimator,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`(pg + β·KL_est, KL_est)` per token ([B, L] each), or `(pg, None)` when β = 0.

    GRPO's KL in the loss (Shao et al. 2024, eq. 3), with the estimators of `kl_estimate`.

    Raises:
        ValueError: if `kl_coef > 0` and `ref_logprobs` is None.
    """
    if kl_coef <= 0:
        return pg, None
    if ref_logprobs is None:
        raise ValueError("kl_coef > 0 needs ref_logprobs")
    kl = kl_estimate(logprobs, ref_logprobs, estimator)
    return pg + kl_coef * kl, kl


def clip_fractions(
    ratio: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual: torch.Tensor | None,
) -> dict[str, float]:
    """Shares of policy tokens whose clipped term is active: `clip/frac_low`, `_high`, `_dual`, `clip/frac`.

    Below (Â < 0), above (Â > 0), either, and dual-clipped. `ratio` and `advantages` broadcast
    to `mask`'s [B, L]; `dual` is `clipped_surrogate`'s mask.
    """
    n = mask.sum().clamp(min=1.0)
    r = ratio.expand_as(mask)
    low = ((r < 1.0 - clip_low) & (advantages < 0)).float()
    high = ((r > 1.0 + clip_high) & (advantages > 0)).float()
    return {
        "clip/frac_low": float((low * mask).sum() / n),
        "clip/frac_high": float((high * mask).sum() / n),
        "clip/frac": float(((low + high) * mask).sum() / n),
        "clip/frac_dual": 0.0 if dual is None else float((dual.float() * mask).sum() / n),
    }


def kl_stats(
    log_ratio: torch.Tensor, mask: torch.Tensor, kl: torch.Tensor | None, estimator: KLEstimator
) -> dict[str, float]:
    """`kl/old_approx` (k3 of KL(π_old‖π_θ)) and, with a KL term, `kl/ref`: masked token means."""
    n = mask.sum().clamp(min=1.0)
    stats = {"kl/old_approx": float((k3(log_ratio).clamp(min=0.0) * mask).sum() / n)}
    if kl is not None:
        kl_metric = kl.clamp(min=0.0) if estimator == "k3" else kl  # k3 may round a few ulps below 0
        stats["kl/ref"] = float((kl_metric * mask).sum() / n)
    return stats


def config_kwargs(x: PolicyLossInputs) -> dict[str, Any]:
    """The keyword arguments every registered policy loss takes from its inputs and stage config.

    `aggregation` (`loss_aggregation`), `ref_logprobs`, `kl_coef`, `kl_estimator`, `num_seqs`,
    `num_tokens`, `norm_len` (the sampling's `max_new_tokens`) and `is_weights`; the clip
    settings differ per loss and are passed by each.
    """
    c = x.config
    return {
        "aggregation": c.loss_aggregation,
        "ref_logprobs": x.ref_logprobs,
        "kl_coef": x.kl_coef,
        "kl_estimator": c.kl_estimator,
        "num_seqs": x.num_seqs,
        "num_tokens": x.num_tokens,
        "norm_len": c.sampling.max_new_tokens,
        "is_weights": x.is_weights,
    }


@register_policy_loss("ppo_clip")
def ppo_clip_loss(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO's clipped surrogate (`clipped_policy_loss`) with the stage config's settings.

    The clip range, dual-clip, aggregation and KL estimator come from `x.config`; the default
    loss of GRPO, its family and PPO (Schulman et al. 2017, arXiv:1707.06347, eq. 7).
    """
    c = x.config
    return clipped_policy_loss(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.mask,
        clip_low=c.clip_low,
        clip_high=c.clip_high,
        dual_clip=c.dual_clip,
        **config_kwargs(x),
    )
