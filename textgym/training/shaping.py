"""Reward shaping the trainer adds to a rollout's rewards: DAPO's soft overlong penalty."""

from __future__ import annotations

import torch

from textgym.agents.trajectory import Trajectory
from textgym.algorithms.advantages import overlong_penalty


def apply_overlong_penalty(trajs: list[Trajectory], max_len: int, cache_len: int, factor: float) -> None:
    """Add DAPO's soft overlong penalty (`advantages.overlong_penalty`) to each trajectory in place.

    The penalty goes into `reward`, into the last policy token's `token_rewards` (so per-token
    returns see it) and into `reward_terms["reward/overlong"]`.
    """
    lengths = torch.tensor([t.response_length for t in trajs])
    pens = factor * overlong_penalty(lengths, max_len, cache_len)
    for t, p in zip(trajs, pens.tolist(), strict=True):
        t.reward += p
        t.reward_terms["reward/overlong"] = p
        pos = t.loss_mask.nonzero()
        if len(pos):
            t.token_rewards[int(pos[-1])] += p
