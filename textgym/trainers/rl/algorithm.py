"""What makes the on-policy trainer one algorithm or another: the parts `build_grpo` and `build_ppo` return.

`OnPolicyTrainer` (`trainers/rl/on_policy.py`) is one class; its `train_step` calls these parts in
order and nothing else varies between GRPO and PPO:

- `advantages(batch, trajs, ref_logprobs, metrics)`: [B] per-sequence or [B, L] per-token
  advantages (GRPO's group-relative estimators, PPO's GAE over its critic's values);
- `selection` (optional): how the step's batch is chosen from rollouts (GRPO: DAPO's dynamic
  sampling, expert guidance), returning a `Selection`;
- `critic` (optional): PPO's value model, trained by the update beside the policy;
- `kl`: the KL controller, β of the KL term, which owns its measurement and checkpoint state.

A builder gets a `Setup`: what the trainer has built before the algorithm's parts (the
unsharded policy, its envs, the rollout settings), never the trainer itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import gymnasium as gym
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.kl_control import FixedKLController
from textgym.distributed.process_group import World
from textgym.trainers.rl.critic import Critic
from textgym.training.batch import RolloutBatch
from textgym.training.sources.base import RolloutSettings


@dataclass
class Selection:
    """The step's batch as a selection chose it.

    Attributes:
        trajs: this rank's trajectories, `group_size` consecutive rows per task.
        loss_rows: [B] bool, the rows that count in the loss (None: all); the others (DAPO's
            filler groups) are masked out of it and of its normalisers.
        guided_rows: [B] bool, the rows an expert played (GRPO's guidance), whose π_old the
            trainer recomputes; None: none.
    """

    trajs: list[Trajectory]
    loss_rows: torch.Tensor | None = None
    guided_rows: torch.Tensor | None = None


Plain = Callable[[dict[str, float]], list[Trajectory]]
"""`plain(metrics)`: the trainer's batch of the step without a selection (`OnPolicyTrainer.batch`)."""

Collect = Callable[[int, int], list[Trajectory]]
"""`collect(n_prompts, round_index)`: this rank's rollouts of the next `n_prompts` tasks, scored."""


class BatchSelection(Protocol):
    """How an algorithm chooses the step's batch from rollouts (GRPO's `GroupSelection`)."""

    def select(self, plain: Plain, collect: Collect, metrics: dict[str, float]) -> Selection:
        """The step's `Selection`; `plain(metrics)` is the trainer's batch without selection."""
        ...


Advantages = Callable[[RolloutBatch, list[Trajectory], torch.Tensor | None, dict[str, float]], torch.Tensor]
"""An algorithm's advantage estimator at one iteration: `(batch, trajs, ref_logprobs, metrics)` →
[B] per-sequence or [B, L] per-token advantages of this rank's rows, stats added to `metrics`
(`ref_logprobs`: [B, L] the reference's log-probs, or None without a reference)."""


@dataclass
class Setup:
    """What an algorithm's builder gets: the pieces the trainer built before it.

    Attributes:
        cfg: the stage config (GRPOConfig or PPOConfig).
        policy: the policy, not yet sharded (a critic is initialised from it).
        tokenizer: its tokenizer.
        envs: this rank's envs, one per row.
        params: the sampling parameters.
        settings: the rollout settings (`RolloutSettings.of(cfg)`).
        world: the data-parallel world.
        updates: optimizer steps an update of every iteration would take (`steps × epochs ×
            minibatches`, a critic's warm-up included).
        shard: shards a model as the policy is (`placement.shard` with the run's settings).
        gradient_checkpointing: the run's setting (a critic follows it).
        per_micro_batch: `PolicyUpdate.per_micro_batch` (no-grad passes in the update's
            micro-batches), bound once the update exists.
    """

    cfg: Any
    policy: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    envs: Sequence[gym.Env]
    params: SamplingParams
    settings: RolloutSettings
    world: World
    updates: int
    shard: Callable[..., Any]
    gradient_checkpointing: bool
    per_micro_batch: Callable[..., torch.Tensor]


@dataclass
class Algorithm:
    """The parts of one on-policy algorithm (see the module docstring)."""

    advantages: Advantages
    kl: FixedKLController
    selection: BatchSelection | None = None
    critic: Critic | None = None
    describe: Callable[[dict[str, float]], str] = field(default=lambda m: "")
    """Extra text for the progress line from a step's metrics (PPO: explained variance, β)."""
