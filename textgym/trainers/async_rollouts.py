"""Async RL in one process: a rollout producer that runs ahead of the trainer, staleness bounded.

Version accounting. The policy's *version* is the number of optimizer updates its weights have
seen: the trainer is at version s during its step s (it trains batch s, and leaves version
s + 1). A trajectory records the version that sampled it (`Trajectory.policy_version`); the
trainer at version s trains on it with staleness s − policy_version. `rollout.max_staleness: k`
bounds it: a rollout of version v trains versions ≤ v + k.

The pipeline (k ≥ 1), k-step off-policy as in verl's one-step off-policy trainer and AReaL's
bounded-staleness producer (Fu et al. 2025, arXiv:2505.24298, §4): at the start of step s the
trainer snapshots its weights (version s) and submits batch s + k, to be generated with that
snapshot; then it waits for batch s, which was submitted k steps earlier (version s − k),
and trains on it while a background thread generates the batches ahead with a *separate
sampler model* (a copy of the policy that loads each job's snapshot before generating). The
first k + 1 batches of a run (or of a resumed run) are all generated from the start version,
so staleness is 0, 1, …, k, then k for every later batch. The trainer asserts
s − policy_version ≤ k before each update (`StalenessError`).

The trainer recomputes π_old with its own forward at update time and weights the policy
gradient by truncated importance weights min(π_old/π_behav, `tis_cap`) (Yao et al. 2025),
where π_behav is the stale sampler's recorded log-probability: TIS is on by default when
k > 0 (`RolloutEngineConfig.use_tis`).

Determinism: every job samples with per-sequence seeds derived from (run seed, batch index,
round 0, global slot, sample), the seeds `rollout.per_sequence_seeds` gives a synchronous
run, so a batch does not depend on thread timing. Tasks are drawn in the trainer's thread at
submission, in batch order.

Resume: pending batches (generated or in flight, not yet trained) are not checkpointed. The
checkpoint's task cursor is that of the next batch to train (`cursor`), so a resumed run
draws the same tasks again and regenerates them from the checkpoint's weights (staleness 0
for the first batch after resume): the bound holds across kill -9.

Limits: the transformers backend in one process (no FSDP, no vLLM engine), no dynamic
sampling; the config and `AsyncRollouts.check` refuse the rest.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from textgym.agents.continuous import rollout_fn
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import derive_seed
from textgym.agents.trajectory import Trajectory
from textgym.config.base import ConfigError
from textgym.trainers.precision import compute_autocast


class StalenessError(RuntimeError):
    """A batch would train a version more than `max_staleness` past the one that sampled it."""


@dataclass
class _Job:
    """One batch in the pipeline: what to generate, with which weights, and its result."""

    index: int
    """The batch's index = the trainer version that trains on it."""
    version: int
    """The policy version of the weights that generate it."""
    cursor: int
    """The task sampler's cursor before this batch's tasks were drawn."""
    future: Future[list[Trajectory]]


def staleness_metrics(trajs: list[Trajectory], trainer_version: int) -> dict[str, float]:
    """`rollout/staleness_mean` and `rollout/staleness_max`: trainer_version − policy_version over `trajs`."""
    gaps = [trainer_version - t.policy_version for t in trajs]
    return {
        "rollout/staleness_mean": sum(gaps) / max(1, len(gaps)),
        "rollout/staleness_max": float(max(gaps, default=0)),
    }


class AsyncRollouts:
    """The rollout producer of a trainer with `rollout.max_staleness: k ≥ 1` (see the module docstring).

    Args:
        trainer: the `OnPolicyTrainer` it feeds (its policy, envs, task sampler, config and
            step are read; its envs are used by the producer thread only). Typed `Any`:
            `on_policy` imports this module.

    Raises:
        ConfigError: see `check`.
    """

    def __init__(self, trainer: Any):
        self.check(trainer)
        self.trainer = trainer
        self.k = trainer.cfg.rollout.max_staleness
        # the sampler: a frozen copy of the policy, weights loaded from each job's snapshot
        self.model = copy.deepcopy(trainer.policy).requires_grad_(False)
        self.agent = LLMAgent(self.model, trainer.tokenizer, batch_size=len(trainer.envs))
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="textgym-rollouts")
        self.jobs: deque[_Job] = deque()
        self.next_index = trainer.step  # the next batch to submit
        self.cursor = trainer.sampler.cursor  # the cursor of the next batch to train

    @staticmethod
    def check(trainer: Any) -> None:
        """Refuse what the producer does not support.

        Raises:
            ConfigError: under torchrun (several ranks), with a vLLM engine, or with dynamic sampling.
        """
        name, cfg = trainer.name, trainer.cfg
        if trainer.world.size > 1:
            raise ConfigError(
                f"{name}.rollout.max_staleness={cfg.rollout.max_staleness}: async rollouts run in one "
                f"process; under torchrun ({trainer.world.size} ranks) use max_staleness: 0"
            )
        if trainer.engine is not None:
            raise ConfigError(f"{name}.rollout.max_staleness > 0 needs rollout.backend: transformers")
        if getattr(cfg, "dynamic_sampling", False):
            raise ConfigError(f"{name}.rollout.max_staleness > 0 with dynamic_sampling is not supported")

    def _submit(self, index: int, version: int, snapshot: dict[str, torch.Tensor]) -> None:
        """Draw batch `index`'s tasks and seeds now; generate it in the thread from `snapshot`."""
        tr, cfg = self.trainer, self.trainer.cfg
        cursor = tr.sampler.cursor
        tasks = tr.sampler.next(cfg.prompts_per_step)
        G = cfg.group_size
        seeds = [derive_seed(tr.seed, index, 0, g, j) for g in range(cfg.prompts_per_step) for j in range(G)]
        precision = compute_autocast(tr.policy)

        def work() -> list[Trajectory]:
            # grad mode and autocast are thread-local: set them in the producer's thread
            with torch.no_grad(), precision:
                self.model.load_state_dict(snapshot)
                return rollout_fn(cfg.rollout.mode)(
                    self.agent,
                    tr.envs,
                    tasks,
                    tr.params,
                    group_size=cfg.group_size,
                    max_turns=cfg.max_turns or 16,
                    env_id=cfg.env.id,
                    seeds=seeds,
                )

        self.jobs.append(_Job(index, version, cursor, self.pool.submit(work)))

    def next_batch(self, metrics: dict[str, float]) -> list[Trajectory]:
        """Batch `trainer.step`'s trajectories (shaped, tagged), after submitting the batches ahead.

        Submits batches up to `step + k` (below `cfg.steps`) generated from a snapshot of the
        current weights (version `step`), then waits for batch `step`. Adds
        `rollout/staleness_*` and `time/rollout_wait_s` to `metrics`.

        Raises:
            StalenessError: if the batch's version is more than k below the trainer's.
            Exception: whatever the rollout raised in the producer thread.
        """
        tr = self.trainer
        s = tr.step
        last = min(s + self.k, tr.cfg.steps - 1)
        if self.next_index <= last:
            snapshot = {n: p.detach().clone() for n, p in tr.policy.state_dict().items()}  # version s
            for index in range(self.next_index, last + 1):
                self._submit(index, s, snapshot)
            self.next_index = last + 1
        job = self.jobs.popleft()
        if job.index != s:
            raise RuntimeError(f"async rollouts out of order: batch {job.index} at trainer step {s}")
        t0 = time.perf_counter()
        trajs = job.future.result()
        metrics["time/rollout_wait_s"] = time.perf_counter() - t0
        if s - job.version > self.k:
            raise StalenessError(
                f"batch {s} was sampled by policy version {job.version}: staleness {s - job.version} "
                f"exceeds rollout.max_staleness={self.k}"
            )
        self.cursor = self.jobs[0].cursor if self.jobs else tr.sampler.cursor
        trajs = tr.finish_rollout(trajs, first=0, version=job.version)
        metrics.update(staleness_metrics(trajs, s))
        return trajs

    def close(self) -> None:
        """Drop the pending batches and stop the producer thread (waits for the batch in flight)."""
        for job in self.jobs:
            job.future.cancel()
        self.jobs.clear()
        self.pool.shutdown(wait=True)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the task cursor of the next batch to train (pending ones are dropped)."""
        return {"cursor": self.cursor}
