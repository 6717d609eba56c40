"""What every rollout source takes and gives: a `RolloutRequest` in, trajectories out.

A source is where a trainer's rollouts come from: the policy in this process
(`local.AgentSource` over the transformers backend), an in-process vLLM engine (the same
source over the engine's backend, `vllm_engine`), rollout servers over HTTP (the same source
over the servers' client, `remote`), or a producer thread that samples ahead (`async_producer`).
A source sees only what a request carries (the tasks, their seeds, the policy version that
samples) and its own settings, never the trainer: scoring beyond the env's reward (an LLM
judge, DAPO's overlong penalty) and the step's bookkeeping stay with the trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from textgym.agents.trajectory import Trajectory


@dataclass(frozen=True)
class RolloutRequest:
    """One batch to roll out.

    Attributes:
        tasks: task indices, one group of `RolloutSettings.group_size` episodes each.
        seeds: one sampling seed per episode (`len(tasks) × group_size`, each group's
            consecutive), or None: the backend's own random stream.
        version: the policy version that samples them (`Trajectory.policy_version`); None
            keeps the version each trajectory reports (rollout servers tag their own).
        first_group: the global index of the first task's group (`Trajectory.group` is
            offset by it: under torchrun each rank rolls out its slice of the step's groups).
    """

    tasks: list[int]
    seeds: list[int] | None = None
    version: int | None = None
    first_group: int = 0


@dataclass(frozen=True)
class RolloutSettings:
    """The rollout fields of a stage config, read once.

    Attributes:
        group_size: episodes per task (G).
        max_turns: turns per episode at most (16 when the config leaves it unset).
        env_id: the env's id, recorded in each trajectory.
        max_context_tokens: the context budget of an episode (None: the model's).
        mode: "lockstep" or "continuous" (`textgym.agents.continuous.rollout_fn`).
        batch_window_s: the continuous scheduler's batching window in seconds.
    """

    group_size: int
    max_turns: int = 16
    env_id: str = ""
    max_context_tokens: int | None = None
    mode: str = "lockstep"
    batch_window_s: float = 0.0

    @classmethod
    def of(cls, cfg: Any, group_size: int | None = None) -> RolloutSettings:
        """The settings of a stage config (GRPO, PPO, online DPO): its `group_size` unless given."""
        return cls(
            group_size=cfg.group_size if group_size is None else group_size,
            max_turns=cfg.max_turns or 16,
            env_id=cfg.env.id,
            max_context_tokens=getattr(cfg, "max_context_tokens", None),
            mode=cfg.rollout.mode,
            batch_window_s=cfg.rollout.batch_window_s,
        )

    def episode_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `rollout` / `rollout_continuous` these settings fix."""
        return {
            "group_size": self.group_size,
            "max_turns": self.max_turns,
            "env_id": self.env_id,
            "max_context_tokens": self.max_context_tokens,
        }


class RolloutSource(Protocol):
    """Where rollouts come from (see the module docstring)."""

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        """`len(request.tasks) × group_size` trajectories, each group's consecutive, tagged."""
        ...

    def close(self) -> None:
        """Release what the source holds (threads, connections, engines)."""
        ...
