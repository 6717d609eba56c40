"""Losses beside the policy gradient: entropy, the SFT negative log-likelihood, the clipped value loss.

Pure tensor functions returning `(loss, detached_stats)`; shapes as in `textgym.algorithms.aggregate`
(B sequences, L response columns, `mask` [B, L] 1.0 on policy tokens).
"""

from __future__ import annotations

import torch

from textgym.algorithms.aggregate import Aggregation, aggregate


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
