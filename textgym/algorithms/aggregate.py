"""The reduction of a per-token loss [B, L] to a scalar, with the three normalisers of the field.

Shapes: B = sequences, L = response columns; `mask` is [B, L] with 1.0 on policy tokens. The
`num_seqs` / `num_tokens` arguments let a minibatch split into micro-batches (gradient
accumulation) produce exactly the gradient of the whole minibatch.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal

import torch

Aggregation = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"]


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


def aggregator(
    mask: torch.Tensor,
    mode: Aggregation = "seq_mean_token_mean",
    *,
    num_seqs: float | None = None,
    num_tokens: float | None = None,
    norm_len: int | None = None,
) -> Callable[[torch.Tensor], torch.Tensor]:
    """`aggregate` with everything but the values fixed: a loss reduces its terms the same way.

    Returns:
        `values [B, L] -> scalar`, `aggregate(values, mask, mode, num_seqs=..., ...)`.
    """
    return partial(
        aggregate, mask=mask, mode=mode, num_seqs=num_seqs, num_tokens=num_tokens, norm_len=norm_len
    )
