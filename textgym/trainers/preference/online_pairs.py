"""Online DPO's pairs and losses: best against worst response of each task, and the DPO-family loss of a pair.

Pure functions (`textgym.trainers.preference.online` is the trainer that calls them).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from textgym.algorithms.preference_losses import PairLossInputs, pair_loss
from textgym.config import OnlineDPOConfig


def best_vs_worst(
    rewards: Sequence[float], group_size: int, margin: float = 0.0
) -> tuple[list[tuple[int, int]], int]:
    """One (chosen, rejected) pair per group: its best response against its worst.

    Rows `g·G … g·G + G − 1` are the G responses to task g. The best is the first row with the
    highest reward, the worst the first with the lowest; the group is paired when they differ
    by more than 0 and at least `margin`, and skipped otherwise (all equal, or too close).

    Args:
        rewards: [N] scores, N a multiple of `group_size`.
        group_size: G, responses per task.
        margin: least score difference of a pair (≥ 0).

    Returns:
        (pairs as (chosen row, rejected row) in group order, number of groups skipped).

    Raises:
        ValueError: if N is not a multiple of G, or `margin` < 0.

    Examples:
        >>> best_vs_worst([0.0, 1.0, 1.0, 0.0, 0.5, 0.5], 3)
        ([(1, 0), (3, 4)], 0)
        >>> best_vs_worst([1.0, 1.0, 0.2, 0.0], 2, margin=0.5)
        ([], 2)
    """
    if len(rewards) % group_size or margin < 0:
        raise ValueError(
            f"{len(rewards)} rewards in groups of {group_size}, margin {margin}: need N % G == 0, margin >= 0"
        )
    pairs, skipped = [], 0
    for start in range(0, len(rewards), group_size):
        r = list(rewards[start : start + group_size])
        best, worst = r.index(max(r)), r.index(min(r))
        gap = r[best] - r[worst]
        if gap > 0 and gap >= margin:
            pairs.append((start + best, start + worst))
        else:
            skipped += 1
    return pairs, skipped


def pair_losses(
    cfg: OnlineDPOConfig,
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    ref_chosen_logps: torch.Tensor | None,
    ref_rejected_logps: torch.Tensor | None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-pair losses [B] of `cfg.loss` and its stats (the functions of `preference_losses`).

    DPO: Rafailov et al. 2023, eq. 7; IPO: Azar et al. 2023, eq. 17 (length-normalised
    log-ratios); SimPO: Meng et al. 2024, eq. 6; ORPO: Hong et al. 2024, eqs. 6–7 (the chosen
    response's mean token NLL plus λ times the odds-ratio term).

    Args:
        cfg: the stage config (loss, β, label smoothing, γ, λ).
        chosen_logps: [B] summed response log-probs of the chosen responses under the policy.
        rejected_logps: [B] the same for the rejected responses.
        chosen_lengths: [B] response tokens of each chosen response.
        rejected_lengths: [B] the same for the rejected.
        ref_chosen_logps: [B] the chosen responses under the reference (DPO, IPO; else None).
        ref_rejected_logps: [B] the rejected responses under the reference.

    Returns:
        Losses [B] and stats (`rewards/chosen`, `rewards/rejected`, `rewards/margin`,
        `rewards/accuracy`, ...).

    Raises:
        ValueError: when DPO or IPO gets no reference log-probs.
    """
    if cfg.uses_reference and (ref_chosen_logps is None or ref_rejected_logps is None):
        raise ValueError(f"{cfg.loss} needs the reference's log-probs")
    return pair_loss(
        cfg.loss,
        PairLossInputs(
            chosen_logps=chosen_logps,
            rejected_logps=rejected_logps,
            chosen_lengths=chosen_lengths,
            rejected_lengths=rejected_lengths,
            ref_chosen_logps=ref_chosen_logps,
            ref_rejected_logps=ref_rejected_logps,
            beta=cfg.beta,
            label_smoothing=cfg.label_smoothing,
            simpo_gamma=cfg.simpo_gamma,
            orpo_lambda=cfg.orpo_lambda,
        ),
    )
