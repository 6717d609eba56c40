"""Rollouts in this process, through an agent: the policy itself, a vLLM engine or rollout servers.

`AgentSource` is the one place a trainer's rollout reads its settings (`RolloutSettings`):
the on-policy loop, its async producer, GRPO's expert guidance and online DPO all roll out
through it. What generates is the agent's backend: the transformers policy, an in-process vLLM
engine (`vllm_engine`) or the rollout servers' client (`remote`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import gymnasium as gym
import torch

from textgym.agents.continuous import rollout_fn
from textgym.agents.rollout import RolloutStats
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import Trajectory
from textgym.training.sources.base import RolloutRequest, RolloutSettings


class AgentSource:
    """A `RolloutSource` that rolls out with `agent` on `envs`, in this process.

    Args:
        settings: group size, turns, env id, context budget, lockstep or continuous.
        agent: what acts: an `LLMAgent` (its backend generates) or an `OracleDemonstrator`.
        envs: one env per row: at least `len(request.tasks) × group_size`.
        params: the sampling parameters.
        context: entered around each rollout (with `torch.no_grad()`): the sampler's precision
            and, under torchrun, the policy's full weights. Called anew each time.
        stats: where generation and env-step seconds are added (None: not recorded); the
            trainer may swap it for a fresh `RolloutStats` each step.
    """

    def __init__(
        self,
        settings: RolloutSettings,
        agent: Any,
        envs: Sequence[gym.Env],
        params: SamplingParams,
        context: Callable[[], AbstractContextManager[Any]] = contextlib.nullcontext,
        stats: RolloutStats | None = None,
    ) -> None:
        self.settings, self.agent, self.envs, self.params = settings, agent, envs, params
        self.context, self.stats = context, stats

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        """`group_size` episodes of each of `request.tasks`, tagged with the request's version and groups.

        Raises:
            ValueError: if the settings' mode is neither "lockstep" nor "continuous".
        """
        s = self.settings
        run = rollout_fn(s.mode, s.batch_window_s)  # type: ignore[arg-type]
        with torch.no_grad(), self.context():
            per_request = {"seeds": request.seeds, "stats": self.stats}
            trajs = run(
                self.agent, self.envs, request.tasks, self.params, **s.episode_kwargs(), **per_request
            )
        for t in trajs:
            t.group += request.first_group  # the group's index in the step's global batch
            if request.version is not None:
                t.policy_version = request.version
        return trajs

    def close(self) -> None:
        """Nothing to release (the envs and the agent belong to the caller)."""
