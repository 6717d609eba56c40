"""Per-token KL estimators between the policy and a reference (Schulman's k1, k2, k3)."""

from __future__ import annotations

from typing import Literal

import torch

KLEstimator = Literal["k1", "k2", "k3"]


K3_CAP = 20.0
"""Above this log-ratio `k3` continues linearly (see `k3`): e^20 ≈ 4.9e8 is far from float32's
overflow at e^88.7, and a token that far from the reference is a diverged one."""


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
