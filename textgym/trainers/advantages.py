"""Advantage estimators: pure tensor functions returning `(advantages, detached_stats)`.

Shapes: B = sequences in the batch, G = samples per group (B = num_groups × G),
L = response columns of a `RolloutBatch`.
"""

from __future__ import annotations

from typing import Literal

import torch

ScaleMode = Literal["group", "batch", "none"]


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: ScaleMode = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.2).

    With outcome supervision every token of sample i in group g gets
    `Â_i = (r_i − mean(r_g)) / (std(r_g) + eps)`; the std is the unbiased sample std over
    the G rewards of the group (as TRL and veRL compute it).

    Args:
        rewards: [B] episode rewards, grouped contiguously (rows g·G … g·G+G−1 share a task).
        group_size: G ≥ 1.
        scale: "group" divides by each group's std (GRPO); "batch" by the std of all B
            rewards; "none" only centres (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783, §3.1).
        eps: added to the std in the denominator.

    Returns:
        advantages [B] and stats: `adv/mean`, `adv/std`, `rollout/zero_std_frac` (fraction of
        groups whose rewards are all equal, hence zero advantage).

    Raises:
        ValueError: if B is not a multiple of G or `scale` is unknown.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [B] with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}"
        )
    r = rewards.float().view(-1, group_size)  # [num_groups, G]
    centred = r - r.mean(dim=1, keepdim=True)
    group_std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
    if scale == "group":
        # A group with equal rewards has centred == 0: its advantage is 0 even when eps == 0.
        adv = torch.where(group_std > 0, centred / (group_std + eps), torch.zeros_like(centred))
    elif scale == "batch":
        batch_std = rewards.float().std() if rewards.numel() > 1 else torch.tensor(0.0)
        adv = centred / (batch_std + eps) if batch_std > 0 else torch.zeros_like(centred)
    elif scale == "none":
        adv = centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    adv = adv.reshape(-1)
    stats = {
        "adv/mean": float(adv.mean()),
        "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "rollout/zero_std_frac": float((group_std.squeeze(1) == 0).float().mean()),
    }
    return adv, stats
