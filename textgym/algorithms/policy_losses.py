"""The GRPO family's policy losses beyond PPO's clip: GSPO, GSPO-token and CISPO, on its core.

Importing this module registers `gspo`, `gspo_token` and `cispo`, and (through
`textgym.algorithms.clipped_loss`) `ppo_clip`; `textgym.algorithms.registry.POLICY_LOSSES`
imports it before its first lookup, so `POLICY_LOSSES.names()` lists every built-in. They are
pure tensor functions of one micro-batch returning `(loss, detached_stats)`, reduced by
`aggregate` (so micro-batch losses add up to the minibatch's), built on one clipped core
(`textgym.algorithms.clipped_loss`): `clipped_surrogate` (the clipped term on a token's or a
sequence's ratio, dual-clip, the importance weights), `add_kl_term`, `clip_fractions` and
`kl_stats`; GSPO is PPO's clip on the sequence ratio, and CISPO, which does not clip the
surrogate, shares the KL term and its statistics. The loss per token:

    ℓ_{i,t} = w_{i,t} · pg_{i,t} + β · KL_est(π_θ‖π_ref)_{i,t}

where `pg` is the loss's policy-gradient term and `w` the truncated importance weights
(`textgym.algorithms.correction.rollout_correction`, 1 without them).

Shapes: B = sequences, L = response columns, `mask` [B, L] with 1.0 on policy tokens.
"""

from __future__ import annotations

import torch

from textgym.algorithms.aggregate import Aggregation, aggregator
from textgym.algorithms.clipped_loss import (
    RATIO_LOG_CAP,
    add_kl_term,
    clip_fractions,
    clipped_surrogate,
    config_kwargs,
    kl_stats,
)
from textgym.algorithms.kl import KLEstimator
from textgym.algorithms.registry import PolicyLossInputs, register_policy_loss


def sequence_log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """GSPO's length-normalised sequence log-ratio log s_i = (1/|y_i|) Σ_t log(π_θ(y_{i,t}) / π_old(y_{i,t})).

    Zheng et al. 2025, "Group Sequence Policy Optimization", arXiv:2507.18071, eq. 5-7 (the
    |y_i|-th root of the sequence likelihood ratio). A row with no policy token gets 0 (s = 1).

    Args:
        logprobs: [B, L] log π_θ of the taken tokens.
        old_logprobs: [B, L] log π_old of the same tokens.
        mask: [B, L] 1.0 on policy tokens.

    Returns:
        [B] log s_i (differentiable through `logprobs`).
    """
    return ((logprobs - old_logprobs) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)


def gspo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    token_level: bool = False,
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
    """GSPO: PPO's clipped surrogate on the length-normalised sequence ratio s_i (or GSPO-token's s_{i,t}).

    GSPO (Zheng et al. 2025, arXiv:2507.18071, eq. 5-7), with s_i = exp(log s_i) of
    `sequence_log_ratio`:
    `J = (1/G) Σ_i min(s_i·Â_i, clip(s_i, 1−ε_low, 1+ε_high)·Â_i)`: one ratio, one clip
    decision and one advantage per sequence. Its recommended clip range is tiny (ε_low = 3e-4,
    ε_high = 4e-4, §5.1), as s_i is a geometric mean of token ratios.

    GSPO-token (`token_level=True`, eq. 13-14): s_{i,t} = sg[s_i] · π_θ(y_{i,t}) / sg[π_θ(y_{i,t})]
    replaces s_i in every token's term: its value is s_i (same clip decisions) and its
    gradient is s_i·∇log π_θ(y_{i,t}), so each token can carry its own advantage Â_{i,t}. With
    one advantage per sequence (and one TIS weight) the two are the same objective, clip and
    gradient (the paper's §4.3): textgym's tests check it, in every aggregation.

    Per token the loss is `−min(w·Â, clip(w)·Â)` (w = s_i broadcast over the sequence, or
    s_{i,t}), then dual-clip, the importance weights and the KL term as in
    `textgym.algorithms.clipped_loss.clipped_policy_loss`, reduced by `aggregate`. The paper's
    objective is `seq_mean_token_mean` (each sequence weighs 1/B); `token_mean` and
    `seq_mean_token_sum_norm` weigh sequence i by its length |y_i| instead (TRL does the same
    for its `dapo`/`bnpo`/`dr_grpo` loss types, with a warning). The sequence log-ratio is
    capped at `RATIO_LOG_CAP` = 20 before `exp` (as `ppo_clip` caps its; TRL does not): s_i then
    stays at e^20, clipped for Â > 0 and bounded by `dual_clip` for Â < 0.

    TRL 1.16 (`importance_sampling_level="sequence"`) computes the same s_i and loss (the tests
    check loss and gradient to 1e-5); it has no GSPO-token in that release (it was added to
    `trl.experimental` later), so `gspo_token` is checked against TRL's sequence level with
    per-sequence advantages and against hand values with per-token ones.

    Args:
        logprobs: [B, L] log π_θ of the taken tokens (requires grad).
        old_logprobs: [B, L] log π_old (sampling log-probs), no grad.
        advantages: [B] per-sequence (GSPO's) or [B, L] per-token advantages.
        mask: [B, L] 1.0 on policy tokens.
        clip_low: ε_low: the ratio is clipped below at 1 − ε_low.
        clip_high: ε_high: the ratio is clipped above at 1 + ε_high.
        token_level: GSPO-token's s_{i,t} instead of s_i.
        aggregation: the reduction mode (see `aggregate`).
        ref_logprobs: [B, L] log π_ref, required when `kl_coef > 0`.
        kl_coef: β of the KL term in the loss.
        kl_estimator: "k1" | "k2" | "k3" (see `kl_estimate`).
        num_seqs: minibatch size when this is a micro-batch (see `aggregate`).
        num_tokens: minibatch token count when this is a micro-batch (see `aggregate`).
        norm_len: the constant of `seq_mean_token_sum_norm` (see `aggregate`).
        dual_clip: c > 1: the loss of Â < 0 terms is capped at −c·Â (Ye et al. 2020), or None.
        is_weights: [B, L] per-token weights (no grad) on the policy-gradient term, or None.

    Returns:
        The scalar loss and detached stats: `loss/policy`; `clip/frac_low`, `clip/frac_high`,
        `clip/frac`, `clip/frac_dual` (share of policy tokens whose term is clipped: with
        per-sequence advantages, the clipped sequences weighted by length; TRL counts
        sequences); `ratio/seq_mean` (token-weighted mean of s_i), `ratio/seq_max`,
        `ratio/seq_min`; `kl/old_approx`, and `kl/ref` with a KL term.

    Raises:
        ValueError: if `kl_coef > 0` and `ref_logprobs` is None, or `dual_clip <= 1`.
    """
    adv = advantages[:, None] if advantages.ndim == 1 else advantages  # [B, 1] or [B, L]
    log_s = sequence_log_ratio(logprobs, old_logprobs, mask).clamp(max=RATIO_LOG_CAP)  # [B]
    # GSPO: s_i [B, 1]. GSPO-token, eq. 14's sg[s_i]·π_θ(y_t)/sg[π_θ(y_t)] [B, L]: value s_i,
    # gradient s_i·∇log π_θ(y_t).
    token = logprobs - logprobs.detach()
    log_w = log_s.detach()[:, None] + token if token_level else log_s[:, None]
    w = torch.exp(log_w)
    pg, adv, dual = clipped_surrogate(w, adv, logprobs, clip_low, clip_high, dual_clip, is_weights)
    per_token, kl = add_kl_term(pg, logprobs, ref_logprobs, kl_coef, kl_estimator)

    agg = aggregator(mask, aggregation, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=norm_len)

    loss = agg(per_token)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        s = log_s.exp()[:, None].expand_as(logprobs)
        rows = mask.sum(-1) > 0
        stats = {
            "loss/policy": float(agg(pg)),
            **clip_fractions(s, adv, mask, clip_low, clip_high, dual),
            "ratio/seq_mean": float((s * mask).sum() / n),
            "ratio/seq_max": float(log_s[rows].exp().max()) if rows.any() else 1.0,
            "ratio/seq_min": float(log_s[rows].exp().min()) if rows.any() else 1.0,
            **kl_stats(logprobs - old_logprobs, mask, kl, kl_estimator),
        }
    return loss, stats


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float | None = None,
    clip_high: float = 4.0,
    aggregation: Aggregation = "token_mean",
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: KLEstimator = "k3",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    norm_len: int | None = None,
    is_weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO: REINFORCE weighted by a clipped, stop-gradient importance ratio; every token keeps its gradient.

    MiniMax-M1 (MiniMax 2025, arXiv:2506.13585, eq. 4-5), per token with r_t = π_θ(y_t)/π_old(y_t):
    `ℓ_t = −sg(r̂_t)·Â_t·log π_θ(y_t)`, r̂_t = clip(r_t, 1 − ε_low^IS, 1 + ε_high^IS),
    so its gradient is −r̂_t·Â_t·∇log π_θ(y_t). Unlike PPO's clip, which drops the gradient of
    the tokens whose ratio left the trust region (often the rare "fork" tokens of a
    reasoning chain), CISPO only bounds their weight. The paper sets no lower bound
    (`clip_low=None`) and tunes ε_high^IS; its objective is normalised by the batch's token
    count (`token_mean`, eq. 4), which TRL's `loss_type="cispo"` uses too; the other
    aggregations are allowed.

    TRL 1.16 (`loss_type="cispo"`) computes `−sg(min(r_t, epsilon_high))·Â·log π_θ`: its
    `epsilon_high` is the cap itself (ε_max of ScaleRL, Khatri et al. 2025, arXiv:2510.13786,
    recommended 5.0), where the paper's bound is 1 + ε_high^IS; textgym follows the paper, so
    TRL's `epsilon_high=5.0` is `clip_high=4.0` here (the default). TRL has no lower bound and
    its `cispo_clip_ratio` metric counts only Â > 0 tokens; `clip/frac_high` here counts every
    capped token, as the cap applies whatever the advantage's sign. The loss's value is
    −Σ r̂·Â·log π (not a surrogate of the return); only its gradient is meaningful.

    The ratio is computed without gradient, its exponent capped at `RATIO_LOG_CAP` = 20.

    Args:
        logprobs: [B, L] log π_θ of the taken tokens (requires grad).
        old_logprobs: [B, L] log π_old (sampling log-probs), no grad.
        advantages: [B] per-sequence or [B, L] per-token advantages.
        mask: [B, L] 1.0 on policy tokens.
        clip_low: ε_low^IS: the weight is clipped below at 1 − ε_low^IS; None: no lower bound.
        clip_high: ε_high^IS: the weight is capped at 1 + ε_high^IS.
        aggregation: the reduction mode (see `aggregate`; the paper's is `token_mean`).
        ref_logprobs: [B, L] log π_ref, required when `kl_coef > 0`.
        kl_coef: β of the KL term in the loss.
        kl_estimator: "k1" | "k2" | "k3" (see `kl_estimate`).
        num_seqs: minibatch size when this is a micro-batch (see `aggregate`).
        num_tokens: minibatch token count when this is a micro-batch (see `aggregate`).
        norm_len: the constant of `seq_mean_token_sum_norm` (see `aggregate`).
        is_weights: [B, L] per-token weights (no grad) on the policy-gradient term, or None.

    Returns:
        The scalar loss and detached stats: `loss/policy`; `clip/frac_low`, `clip/frac_high`,
        `clip/frac` (share of policy tokens whose weight was clipped below / above / either);
        `ratio/mean`, `ratio/max` (of r_t); `cispo/weight_mean` (of r̂_t); `kl/old_approx`, and
        `kl/ref` with a KL term.

    Raises:
        ValueError: if `kl_coef > 0` and `ref_logprobs` is None, or a bound is negative.
    """
    if clip_high < 0 or (clip_low is not None and not 0 <= clip_low < 1):
        raise ValueError(f"need clip_high >= 0 and 0 <= clip_low < 1, got {clip_low}, {clip_high}")
    adv = advantages[:, None].expand_as(logprobs) if advantages.ndim == 1 else advantages
    log_ratio = logprobs.detach() - old_logprobs
    ratio = torch.exp(log_ratio.clamp(max=RATIO_LOG_CAP))
    weight = ratio.clamp(min=None if clip_low is None else 1.0 - clip_low, max=1.0 + clip_high)
    pg = -weight * adv * logprobs  # [B, L]
    if is_weights is not None:
        pg = pg * is_weights.detach()
    per_token, kl = add_kl_term(pg, logprobs, ref_logprobs, kl_coef, kl_estimator)

    agg = aggregator(mask, aggregation, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=norm_len)

    loss = agg(per_token)
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = (ratio < 1.0 - clip_low).float() if clip_low is not None else torch.zeros_like(ratio)
        high = (ratio > 1.0 + clip_high).float()
        stats = {
            "loss/policy": float(agg(pg)),
            "clip/frac_low": float((low * mask).sum() / n),
            "clip/frac_high": float((high * mask).sum() / n),
            "clip/frac": float(((low + high) * mask).sum() / n),
            "ratio/mean": float((ratio * mask).sum() / n),
            "ratio/max": float(ratio.masked_fill(mask == 0, 0.0).max()) if mask.any() else 1.0,
            "cispo/weight_mean": float((weight * mask).sum() / n),
            **kl_stats(log_ratio, mask, kl, kl_estimator),
        }
    return loss, stats


# --- registered under the names `policy_loss` selects ----------------------------------------
def _gspo_from_config(x: PolicyLossInputs, token_level: bool) -> tuple[torch.Tensor, dict[str, float]]:
    c = x.config
    return gspo_loss(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.mask,
        clip_low=c.clip_low,
        clip_high=c.clip_high,
        token_level=token_level,
        dual_clip=c.dual_clip,
        **config_kwargs(x),
    )


@register_policy_loss("gspo")
def gspo_policy_loss(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO (`gspo_loss`, Zheng et al. 2025 eq. 5-7) with the stage config's settings.

    Uses `clip_low`, `clip_high` (GSPO's recommended 3e-4 / 4e-4, not PPO's 0.2),
    `dual_clip`, `loss_aggregation` (`seq_mean_token_mean` is the paper's), `kl_estimator`.
    """
    return _gspo_from_config(x, token_level=False)


@register_policy_loss("gspo_token")
def gspo_token_policy_loss(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO-token (`gspo_loss(token_level=True)`, Zheng et al. 2025 eq. 13-14) with the config's settings.

    The same options as `gspo`; it differs from it only with per-token advantages.
    """
    return _gspo_from_config(x, token_level=True)


@register_policy_loss("cispo")
def cispo_policy_loss(x: PolicyLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """CISPO (`cispo_loss`, MiniMax 2025 eq. 4-5) with the stage config's settings.

    Uses `cispo_clip_low`, `cispo_clip_high`, `loss_aggregation` (`token_mean` is the paper's)
    and `kl_estimator`; `clip_low`, `clip_high` and `dual_clip` do not apply (the config
    refuses them with `policy_loss: cispo`).
    """
    c = x.config
    return cispo_loss(
        x.logprobs,
        x.old_logprobs,
        x.advantages,
        x.mask,
        clip_low=c.cispo_clip_low,
        clip_high=c.cispo_clip_high,
        **config_kwargs(x),
    )
