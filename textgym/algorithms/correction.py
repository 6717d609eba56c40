"""Rollout correction: truncated importance weights for rollouts sampled by another engine (TIS)."""

from __future__ import annotations

import torch

from textgym.algorithms.kl import k3


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
