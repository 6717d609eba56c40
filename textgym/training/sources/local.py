"""The in-process rollout of a stage's groups with its config's settings.

Both the on-policy loop (`OnPolicyTrainer.collect`) and the async producer
(`training/sources/async_producer.py`) roll out through `rollout_groups`, so the two read the
same config fields the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import gymnasium as gym

from textgym.agents.continuous import rollout_fn
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import RolloutStats
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import Trajectory


def rollout_groups(
    cfg: Any,
    agent: LLMAgent,
    envs: Sequence[gym.Env],
    tasks: list[int],
    params: SamplingParams,
    seeds: list[int] | None,
    stats: RolloutStats | None = None,
) -> list[Trajectory]:
    """`cfg.group_size` episodes of each task in `tasks`, rolled out by `agent` on `envs`.

    Args:
        cfg: the stage config (GRPOConfig or PPOConfig): `rollout.mode` and
            `rollout.batch_window_s` (`textgym.agents.continuous.rollout_fn`), `group_size`,
            `max_turns` (16 when unset), `env.id`, `max_context_tokens`.
        agent: the policy's agent (its backend generates).
        envs: one env per row: `len(tasks) × group_size` of them.
        tasks: task indices, one group each.
        params: the sampling parameters.
        seeds: one sampling seed per row, or None.
        stats: where generation and env-step seconds are added (None: not recorded).

    Returns:
        `len(tasks) × group_size` trajectories, each group's samples consecutive.
    """
    return rollout_fn(cfg.rollout.mode, cfg.rollout.batch_window_s)(
        agent,
        envs,
        tasks,
        params,
        group_size=cfg.group_size,
        max_turns=cfg.max_turns or 16,
        env_id=cfg.env.id,
        seeds=seeds,
        stats=stats,
        max_context_tokens=cfg.max_context_tokens,
    )
