"""Policy-gradient losses as pure tensor functions returning `(loss, detached_stats)`.

Shapes: B = sequences, L = response columns; `mask` is [B, L] with 1.0 on policy
tokens. Per-token quantities are reduced by `aggregate`, whose `num_seqs` /
`num_tokens` arguments let a minibatch split into micro-batches (gradient
accumulation) produce exactly the gradient of the whole minibatch.
"""

from __future__ import annotations

from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]
KLEstimator = Literal["k1", "k2", "k3"]


def aggregate(
    values: torch.Tensor,
    mask: torch.Tensor,
    mode: Aggregation = "seq_mean_token_mean",
    *,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    norm_len: int | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss [B, L] to a scalar.

    - `token_mean`: Σ_{i,t} m·x / N_tokens — every token weighs the same (DAPO, Yu et al. 2025,
      arXiv:2503.14476, eq. 12).
    - `seq_mean_token_mean`: (1/B) Σ_i (Σ_t m·x / |o_i|) — each sequence weighs the same
      (GRPO, Shao et al. 2024, eq. 3).
    - `seq_mean_token_sum_norm`: Σ_{i,t} m·x / (B · norm_len) — a constant normaliser, no
      length bias (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783, eq. 2).

    Args:
        values: [B, L] per-token loss.
        mask: [B, L] 1.0 on tokens that count.
        mode: one of the three above.
        num_seqs: B of the whole minibatch when `values` is one micro-batch of it (the rows
            that count: a trainer that masks rows out of the loss leaves them out of it too).
        num_tokens: Σ mask of the whole minibatch when `values` is one micro-batch of it.
        norm_len: the constant length of `seq_mean_token_sum_norm` (default: L).

    Raises:
        ValueError: on an unknown mode.
    """
    B, L = values.shape
    masked = values * mask
    if mode == "token_mean":
        denom = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
        return masked.sum() / denom
    if mode == "seq_mean_token_mean":
        per_seq = masked.sum(-1) / mask.sum(-1).clamp(min=1.0)
        return per_seq.sum() / (num_seqs if num_seqs is not None else B)
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / ((num_seqs if num_seqs is not None else B) * (norm_len or L))
    raise ValueError(f"unknown loss aggregation {mode!r}")


K3_CAP = 20.0
"""Above this log-ratio `k3` continues linearly (see `k3`): e^20 ≈ 4.9e8 is far from float32's
overflow at e^88.7, and a token that far from the reference is a diverged one."""

RATIO_LOG_CAP = 20.0
"""The PPO ratio's log is capped here before `exp` (see `clipped_policy_loss`)."""


def k3(log_ratio: torch.Tensor, cap: float = K3_CAP) -> torch.Tensor:
    """Schulman's k3 = e^x − 1 − x of a log-ratio x, accurate near 0, finite and differentiable everywhere.

    Computed as `expm1(x) − x` (no cancellation in `exp(x) − 1` for tiny x). Below `cap` it
    is exactly k3, with no clamp on the low side: e^x cannot overflow there, and the
    gradient e^x − 1 → −1 is what pulls a token with π_θ ≫ π_ref back (for x = log π_ref −
    log π_θ < −20 a clamp would make it 0). Above `cap` it continues with the first-order
    extension of e^x at the cap, `e^c·(1 + x − c) − 1 − x`: continuous with a continuous
    gradient e^c − 1 (> 0, no overflow), where a clamp would also zero the gradient.

    In floating point `expm1(x) − x` can still come out a few ulps below 0 for |x| ≲ 1e-7;
    metrics clamp it at 0 (`.clamp(min=0)`), losses use it as is.

    Args:
        log_ratio: [...] log-ratios x.
        cap: c, where the linear continuation starts.

    Returns:
        [...] k3 values (not masked).
    """
    capped = log_ratio.clamp(max=cap)
    over = torch.where(log_ratio > cap, log_ratio - cap, torch.zeros_like(log_ratio))
    return torch.expm1(capped) - log_ratio + torch.exp(capped) * over


def kl_estimate(
    logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: KLEstimator = "k3"
) -> torch.Tensor:
    """Per-token estimate of KL(π_θ ‖ π_ref) from samples of π_θ (Schulman 2020, "Approximating KL").

    With `log_ratio = log π_ref − log π_θ` at the sampled token:
    k1 = −log_ratio; k2 = ½·log_ratio²; k3 = exp(log_ratio) − 1 − log_ratio (≥ 0, unbiased),
    computed by `k3` (expm1, no clamp below, a linear continuation above log_ratio = 20, so
    its gradient never vanishes).

    Expected gradients for on-policy samples (see
    docs/maths.md#kl-estimators-and-where-they-go; checked exactly in tests/trainers/test_advantages.py):
    differentiated in the loss, k1 gives 0 (noise only), k2 gives
    ∇KL(π_θ‖π_ref), and k3 (GRPO, DeepSeekMath eq. 4) gives ∇KL(π_ref‖π_θ) — the forward KL,
    biased as a gradient of the reverse one. Subtracted from the reward (no gradient through
    it), k1 gives exactly ∇KL(π_θ‖π_ref); k3 there is biased.

    Args:
        logprobs: [B, L] log π_θ of the sampled tokens.
        ref_logprobs: [B, L] log π_ref of the same tokens.
        estimator: "k1", "k2" or "k3".

    Returns:
        [B, L] per-token estimates (not masked).

    Raises:
        ValueError: on an unknown estimator.
    """
    log_ratio = ref_logprobs - logprobs
    if estimator == "k1":
        return -log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    if estimator == "k3":
        return k3(log_ratio)
    raise ValueError(f"unknown KL estimator {estimator!r}")


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy H = −Σ_v p_v log p_v of each categorical distribution.

    Args:
        logits: [..., V] unnormalised log-probabilities; −inf (a token top-k / top-p dropped)
            counts as probability 0, with 0 · log 0 = 0.

    Returns:
        [...] entropies in nats.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp.clamp(min=torch.finfo(logp.dtype).min)).sum(-1)


def sft_loss(
    logprobs: torch.Tensor, mask: torch.Tensor, num_tokens: float | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """Negative log-likelihood of the target tokens, averaged over tokens.

    Args:
        logprobs: [B, L] log π_θ of the target tokens.
        mask: [B, L] 1.0 on target (completion) tokens.
        num_tokens: Σ mask of the whole minibatch when this is one micro-batch.

    Returns:
        The mean NLL in nats/token and stats `loss/sft`.
    """
    loss = aggregate(-logprobs, mask, "token_mean", num_tokens=num_tokens)
    return loss, {"loss/sft": float(loss.detach())}


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_range: float | None = 0.2,
    aggregation: Aggregation = "token_mean",
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    norm_len: int | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The critic's squared error, optionally clipped around the rollout's values.

    Per token: `ℓ_V = ½·max((V − R)², (V_old + clip(V − V_old, −ε_v, ε_v) − R)²)` with
    R the GAE return (PPO2's value clipping, Dhariwal et al. 2017 OpenAI Baselines;
    Ouyang et al. 2022 use it in InstructGPT's PPO). `clip_range=None` gives plain
    `½·(V − R)²`.

    Args:
        values: [B, L] the critic's current values (requires grad).
        old_values: [B, L] the values recorded at rollout time (no grad).
        returns: [B, L] targets R = Â + V_old.
        mask: [B, L] 1.0 on policy tokens.
        clip_range: ε_v in reward units, or None.
        aggregation: the reduction mode (see `aggregate`).
        num_seqs: minibatch size when this is a micro-batch (see `aggregate`).
        num_tokens: minibatch token count when this is a micro-batch (see `aggregate`).
        norm_len: the constant of `seq_mean_token_sum_norm` (see `aggregate`).

    Returns:
        The scalar loss and stats `loss/value`, `value/clip_frac` (fraction of tokens where
        the clipped term was the larger), `value/mean`.
    """
    err = (values - returns).pow(2)
    if clip_range is not None:
        clipped = old_values + (values - old_values).clamp(-clip_range, clip_range)
        err_clipped = (clipped - returns).pow(2)
        per_token = 0.5 * torch.maximum(err, err_clipped)
    else:
        err_clipped = err
        per_token = 0.5 * err
    loss = aggregate(
        per_token, mask, aggregation, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=norm_len
    )
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        stats = {
            "loss/value": float(loss),
            "value/clip_frac": float(((err_clipped > err).float() * mask).sum() / n),
            "value/mean": float((values * mask).sum() / n),
        }
    return loss, stats


def rollout_correction(
    trainer_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    *,
    cap: float | None = 2.0,
    drop_above_cap: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights for rollouts sampled by an engine other than the trainer.

    A fast inference engine (vLLM) and the trainer compute slightly different probabilities
    for the same weights (kernels, precision, batching), so the "on-policy" samples are
    really drawn from π_rollout ≠ π_old. Truncated importance sampling (TIS; Yao et al. 2025,
    "Your Efficient RL Framework Secretly Brings You Off-Policy RL Training", eq. 3; the
    truncation of IMPALA's V-trace, Espeholt et al. 2018, arXiv:1802.01561, eq. 1) weights
    each token's policy-gradient term by `w = min(π_old(a)/π_rollout(a), C)`.

    Args:
        trainer_logprobs: [B, L] log π_old of the sampled tokens, recomputed by the trainer.
        rollout_logprobs: [B, L] the sampling log-probabilities the engine reported.
        mask: [B, L] 1.0 on policy tokens.
        cap: C, the truncation; None returns weights of 1 (monitoring only).
        drop_above_cap: the decoupled PPO objective's behaviour weight instead (AReaL, Fu et
            al. 2025, arXiv:2505.24298, eq. 5, with its `behav_imp_weight_cap`): with
            π_old = π_prox, `w = π_prox(a)/π_behav(a)` where it is ≤ C and 0 (the token left
            out of the gradient, still counted in the loss's normaliser) where it is above.

    Returns:
        `w` [B, L] (0 off the mask), and stats over policy tokens: `mismatch/kl` (k1 estimate
        of KL(π_rollout‖π_old), i.e. the mean of `log π_rollout − log π_old`), `mismatch/k3`
        (the non-negative k3 estimate of the same KL), `mismatch/ratio_max` and
        `mismatch/ratio_min` (of π_old/π_rollout), `mismatch/abs_diff_max` (largest
        |log-prob difference|) and `mismatch/tis_clip_frac` (tokens whose weight was capped, or dropped).

    Raises:
        ValueError: if the shapes differ or `cap` is not > 0.
    """
    if not (trainer_logprobs.shape == rollout_logprobs.shape == mask.shape):
        raise ValueError(
            f"shapes differ: trainer {tuple(trainer_logprobs.shape)}, rollout "
            f"{tuple(rollout_logprobs.shape)}, mask {tuple(mask.shape)}"
        )
    if cap is not None and cap <= 0:
        raise ValueError(f"the TIS cap must be > 0, got {cap}")
    with torch.no_grad():
        log_ratio = ((trainer_logprobs - rollout_logprobs) * mask).clamp(-20.0, 20.0)
        ratio = log_ratio.exp()
        if cap is None:
            weights = torch.ones_like(ratio)
        elif drop_above_cap:
            weights = ratio * (ratio <= cap)
        else:
            weights = ratio.clamp(max=cap)
        weights = weights * mask
        on = mask > 0
        n = mask.sum().clamp(min=1.0)
        stats = {
            "mismatch/kl": float((-log_ratio * mask).sum() / n),
            "mismatch/k3": float((k3(log_ratio).clamp(min=0.0) * mask).sum() / n),
            "mismatch/ratio_max": float(ratio[on].max()) if on.any() else 1.0,
            "mismatch/ratio_min": float(ratio[on].min()) if on.any() else 1.0,
            "mismatch/abs_diff_max": float(log_ratio.abs()[on].max()) if on.any() else 0.0,
            "mismatch/tis_clip_frac": float(((ratio > cap) & on).float().sum() / n)
            if cap is not None
            else 0.0,
        }
    return weights, stats


# --- the policy losses moved to `textgym.trainers.clipped_loss` (one clipped core) -----------
_MOVED = {
    name: "textgym.trainers.clipped_loss"
    for name in ("clipped_policy_loss", "ppo_clip_loss", "clipped_surrogate", "add_kl_term")
}


def __getattr__(name: str) -> object:
    """A policy loss that moved to `textgym.trainers.clipped_loss` fails naming it.

    Raises:
        ImportError: for a moved name (so `from textgym.trainers.losses import clipped_policy_loss`
            says where it is now); AttributeError for any other missing name.
    """
    if name in _MOVED:
        raise ImportError(f"textgym.trainers.losses.{name} has moved to {_MOVED[name]}.{name}")
    raise AttributeError(f"module 'textgym.trainers.losses' has no attribute {name!r}")
