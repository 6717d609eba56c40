"""The on-policy loop every RL trainer shares (GRPO family and PPO).

One iteration (`train_step`): 1 rollout from the source, scored and shaped (the env's rubric, an
LLM judge's term (`env.judge`), DAPO's overlong penalty), chosen by the algorithm's selection
when it has one · 2 the trajectory store · 3 the padded batch, rows out of the loss masked ·
4 π_old recomputed where the sampler's log-probs are not the trainer's · 5 the reference's
log-probs · 6 advantages (the algorithm's estimator, a KL penalty in the reward when it goes
there) · 7 the update: μ epochs over shuffled minibatches of the clipped surrogate, plus the
critic's value loss when there is one; the KL controller moves β · 8 the rollout engine or
servers get the weights · 9 metrics (the loop logs and checkpoints).

With the transformers rollout engine (the policy generates), the importance ratio's
denominator is the sampling log-probability recorded during the rollout (no extra forward
pass); `kl/old_approx` at the first minibatch measures any sampler/trainer mismatch. With
the vLLM engine (`cfg.rollout.backend = "vllm"`), the trainer recomputes log π_old itself,
logs the rollout/trainer mismatch (`mismatch/*`), weights the policy gradient by truncated
importance weights (TIS, on by default there), and pushes the updated weights into the
engine after each iteration's optimizer steps. `rollout.tis: true` does the same on the
transformers backend (one extra no-grad forward): the KV-cached decoding that sampled and
the padded training forward compute slightly different probabilities under bf16 or FSDP,
and TIS corrects for it exactly as it does for vLLM; by default it is off there. With
`rollout.servers` the rollout servers generate (`training/sources/remote.py`), corrected as
vLLM is, and get the weights before the first rollout and after every update.
With `rollout.max_staleness: k > 0` (async RL) the batches come from a producer thread that
samples up to k policy versions ahead with a copy of the policy (`training/sources/async_producer.py`);
TIS is then on by default, and `k = 0` is this synchronous loop unchanged.

Under torchrun (`textgym.distributed`) every rank draws the same global task list, rolls
out its contiguous slice of whole prompts (a group never straddles ranks) with the full
policy weights (`distributed.full_params`), and trains on its rows with the policy (and the
reference, and PPO's critic) sharded by FSDP2. Each loss is divided by this rank's share of
the global denominator (tokens or sequences), so the averaged gradient is the one a single
process computes on the whole batch; batch statistics (GRPO's rewards, whitening, metrics)
are reduced over ranks. Rank 0 alone writes metrics, trajectories and checkpoints.

Where the pieces live: this module holds the one trainer class, its setup (`__init__`, numbered)
and the iteration (`train_step`, numbered, top to bottom). What makes it GRPO or PPO is an
`Algorithm` built by a function (`grpo.build_grpo`, `ppo.build_ppo`): the advantage estimator,
optionally a batch selection (GRPO's dynamic sampling and expert guidance), a critic (PPO's),
and the KL controller that owns β and its measurement. The rollouts come from a
`RolloutSource` (`textgym.training.sources`); the update and its no-grad log-prob passes are a
`PolicyUpdate` (`trainers/rl/update.py`); the rest is `textgym.training`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import RolloutStats
from textgym.agents.sampling import SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.kl import kl_estimate
from textgym.config import GRPOConfig, ParallelConfig, PPOConfig
from textgym.envs.registry import task_count
from textgym.trainers.rl.algorithm import Algorithm, Selection, Setup
from textgym.trainers.rl.update import PolicyUpdate
from textgym.trainers.sampled_stage import train_sampled_stage
from textgym.training.batch import RolloutBatch, no_token_budget_under_torchrun
from textgym.training.checkpoint import save_checkpoint
from textgym.training.envs import make_env
from textgym.training.judge_reward import JudgeTerm
from textgym.training.optim import build_optimizer
from textgym.training.placement import build_reference, check_world, shard
from textgym.training.precision import compute_autocast
from textgym.training.rollout_metrics import hack_warning, rollout_metrics
from textgym.training.sampler import TaskSampler
from textgym.training.shaping import apply_overlong_penalty
from textgym.training.sources.async_producer import AsyncRollouts, PolicyCopy
from textgym.training.sources.base import RolloutRequest, RolloutSettings
from textgym.training.sources.local import AgentSource
from textgym.training.sources.remote import build_remote
from textgym.training.sources.vllm_engine import build_engine, sync_weights
from textgym.training.trainer import prepare_policy, resume_checkpoint, stage_logger
from textgym.training.trajectory_log import log_trajectories, prune_trajectories

EvalFn = Callable[[PreTrainedModel, PreTrainedTokenizerBase], dict[str, float]]


class OnPolicyTrainer:
    """The on-policy trainer: rollouts, reference, the algorithm's parts, the clipped update, checkpoints.

    One class for every on-policy algorithm; `GRPOTrainer` and `PPOTrainer` only name it and
    the function that builds their `Algorithm` (`build`). Attributes a user may read:
    `policy`, `reference`, `critic` (PPO), `kl` (the KL controller: β), `source` (where
    rollouts come from), `updater` (the `PolicyUpdate`), `step`.

    Args:
        cfg: the stage config (GRPOConfig or PPOConfig).
        model: the policy (already on its device).
        tokenizer: its tokenizer (chat template, pad and EOS ids).
        stage_dir: where metrics, TensorBoard events and checkpoints go.
        seed: seed of task sampling.
        resume: continue from the newest checkpoint in `stage_dir` when there is one.
        eval_fn: called as `eval_fn(model, tokenizer) -> {metric: value}` every `cfg.eval_every` steps
            (on rank 0 only when distributed).
        parallel: sharding, mixed precision and gradient checkpointing (default `ParallelConfig()`).
        log_with: trackers beside `metrics.jsonl` ("tensorboard", "wandb", "mlflow", "trackio";
            `textgym.tracking`).

    Raises:
        ConfigError: under torchrun, when the batch does not split evenly over the ranks, the
            rollout engine is vLLM, or `reference_device` is other than "cpu"; with
            `rollout.max_staleness` > 0 where async rollouts do not run (`AsyncRollouts.check`).
        ValueError: from the algorithm's builder (GRPO's expert guidance on an env without an expert).
    """

    name = "rl"
    build: Callable[[Setup], Algorithm]

    # long: the set-up in the order its parts depend on each other, numbered as the docs read it
    def __init__(
        self,
        cfg: GRPOConfig | PPOConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stage_dir: Path,
        *,
        seed: int = 0,
        resume: bool = False,
        eval_fn: EvalFn | None = None,
        parallel: ParallelConfig | None = None,
        log_with: Sequence[str] = ("tensorboard",),
    ):
        self.cfg, self.world = cfg, distributed.world()
        check_world(cfg, self.name, self.world.size)
        # 1 the policy (with fresh LoRA adapters when asked) and the run directory
        # π_old (eval mode) and π (train mode) are the same function of the weights only
        # without dropout: off in the policy, hence in its reference copy (and PPO's critic).
        self.parallel = parallel or ParallelConfig()
        gc = self.parallel.gradient_checkpointing
        model = prepare_policy(model, cfg.lora, seed=seed, gradient_checkpointing=gc)
        self.policy, self.tokenizer, self.stage_dir = model, tokenizer, Path(stage_dir)
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        self.eval_fn, self.seed = eval_fn, seed
        # 2 the rollout side: one env per row of this rank's share of the batch, a task stream
        B, W = cfg.batch_rows, self.world.size  # the global batch; this rank holds B / W rows
        no_token_budget_under_torchrun(cfg.micro_batch_tokens, W)
        self.agent = LLMAgent(model, tokenizer, batch_size=B // W)
        self.params = SamplingParams(**cfg.sampling.model_dump())
        self.settings = RolloutSettings.of(cfg)
        self.envs = [make_env(cfg.env) for _ in range(B // W)]
        self.sampler = TaskSampler(task_count(self.envs[0]), seed)
        self.judge = None if cfg.env.judge is None else JudgeTerm(cfg.env.judge, cfg.group_size)
        # optimizer steps over the run (the schedules' lengths): the critic's warm-up iterations
        # (PPO's `critic_warmup_steps`) take none of the policy's
        minibatches = B // (cfg.minibatch_size or B)
        iterations = max(cfg.steps - getattr(cfg, "critic_warmup_steps", 0), 0)
        # 3 the reference (a frozen copy of the start policy, or LoRA's adapters-off policy)
        self.reference: PreTrainedModel | None = build_reference(cfg, model, self.parallel)
        self.step = 0
        # 4 the algorithm's parts (PPO's critic is built from the unsharded policy), then sharding
        every_update = cfg.steps * cfg.epochs * minibatches  # warm-up included
        micro = lambda *a, **k: self.updater.per_micro_batch(*a, **k)  # noqa: E731  (the update: step 5)
        rollout_side = (self.envs, self.params, self.settings, self.world)
        setup = Setup(cfg, model, tokenizer, *rollout_side, every_update, self._shard, gc, micro)
        algorithm = type(self).build(setup)
        self.advantages, self.selection = algorithm.advantages, algorithm.selection
        self.critic, self.kl, self._describe = algorithm.critic, algorithm.kl, algorithm.describe
        self.policy = self._shard(model)
        if self.reference is not None:
            self._shard(self.reference, offload=cfg.reference_device == "cpu")
        # 5 optimizer, update, memory report, resume (the critic's and the KL controller's state too)
        updates = iterations * cfg.epochs * minibatches
        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, updates)
        policy, opt, sched = self.policy, self.optimizer, self.scheduler
        self.updater: PolicyUpdate = PolicyUpdate(
            cfg, policy, opt, sched, self.device, reference=self.reference, critic=self.critic
        )
        self.memory = distributed.memory_report(self._models())
        state = resume_checkpoint(self.stage_dir, resume, self.policy, self.optimizer, self.scheduler)
        if state is not None:
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
            if self.critic is not None:
                self.critic.load(Path(state["checkpoint_dir"]) / "critic")
            self.kl.load_checkpoint_state(state)
        # 6 the rollout source: the policy, a vLLM engine, rollout servers; 7 async RL's producer
        self._start_sources(model, seed)
        # 8 logging: metrics and the trajectory store keep nothing past the step resumed from
        self.logger = stage_logger(self.stage_dir, state, log_with, cfg)
        self.trajectory_dir = self.stage_dir / "trajectories"
        if cfg.log_trajectories and distributed.is_main():
            prune_trajectories(self.trajectory_dir, self.step)

    def _start_sources(self, model: PreTrainedModel, seed: int) -> None:
        """Steps 6 and 7 of `__init__`: the rollout source and (`rollout.max_staleness` > 0) its producer.

        6: the policy's own agent, or a vLLM engine (`rollout.backend: vllm`) fed the policy's
        weights, or rollout servers (`rollout.servers`), checked, then sent the policy as of
        `self.step`; 7: a producer thread that samples ahead with a copy of the policy (async RL).
        """
        cfg, tokenizer = self.cfg, self.tokenizer
        self.engine: Any = build_engine(cfg, model, tokenizer, self.agent.backend.eos_ids, seed)
        if self.engine is not None:
            self.agent = LLMAgent(model, tokenizer, backend=self.engine)
        eos = self.agent.backend.eos_ids
        self.remote: Any = build_remote(cfg.rollout, self.policy, tokenizer, eos, self.step)
        if self.remote is not None:
            self.agent = LLMAgent(None, tokenizer, backend=self.remote.backend)
        self.source = AgentSource(self.settings, self.agent, self.envs, self.params, self._sampling_context)
        self.async_rollouts: AsyncRollouts | None = None
        if cfg.rollout.max_staleness > 0:
            AsyncRollouts.check(self.name, cfg, self.world.size, self.engine is not None)
            # the sampler: a copy of the policy, or on rollout servers their client; in the
            # producer's thread, at the policy's compute precision
            copy = None if self.remote is not None else PolicyCopy(self.policy)
            agent = self.agent if copy is None else LLMAgent(copy.model, tokenizer, batch_size=len(self.envs))
            precision = lambda: compute_autocast(self.policy)  # noqa: E731
            source = AgentSource(self.settings, agent, self.envs, self.params, precision)
            self.async_rollouts = AsyncRollouts(
                source,
                copy,
                self.sampler,
                prompts_per_step=cfg.prompts_per_step,
                group_size=cfg.group_size,
                max_staleness=cfg.rollout.max_staleness,
                steps=cfg.steps,
                seed=seed,
                start_step=self.step,
            )

    def _sampling_context(self) -> contextlib.ExitStack:
        """Entered around a rollout: the policy's full weights, its compute precision.

        The full weights under torchrun (not for rollout servers); the precision on the
        transformers backend, which samples as the trainer computes π_old and π
        (`precision.compute_autocast`; a vLLM engine has its own dtype).
        """
        stack = contextlib.ExitStack()
        if self.remote is None:
            stack.enter_context(distributed.full_params(self.policy))
        if self.engine is None:
            stack.enter_context(compute_autocast(self.policy))
        return stack

    def _shard(self, model: torch.nn.Module, offload: bool = False) -> Any:
        """Shard `model` over the ranks (FSDP2) when launched by torchrun (`placement.shard`); return it."""
        return shard(model, self.parallel, self.device, offload=offload)

    def _models(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]:
        """The models this trainer holds, for the memory report: name → (model, optimizer or None)."""
        models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] = {
            "policy": (self.policy, self.optimizer)
        }
        if self.reference is not None:
            models["reference"] = (self.reference, None)
        if self.critic is not None:
            models["critic"] = (self.critic.model, self.critic.optimizer)
        verifier = getattr(self.envs[0], "verifier", None)
        if verifier is not None and isinstance(getattr(verifier, "model", None), torch.nn.Module):
            models["reward_model"] = (verifier.model, None)
        return models

    # --- rollouts ------------------------------------------------------------------------
    def collect(self, n_prompts: int, round_index: int = 0) -> list[Trajectory]:
        """Roll out `group_size` samples of the next `n_prompts` tasks from the source, scored.

        Distributed: every rank draws the same `n_prompts` tasks and rolls out its contiguous
        slice of `n_prompts / ranks` of them, so the ranks' trajectories, concatenated in rank
        order, are the global batch. With `rollout.per_sequence_seeds` (always on rollout
        servers: a seed per request), sample j of the task in global slot g is seeded by
        `(seed, step, round_index, g, j)`.
        """
        cfg, w = self.cfg, self.world
        tasks = self.sampler.next(n_prompts)
        k = n_prompts // w.size
        first = w.rank * k
        seeds = None
        if cfg.rollout.per_sequence_seeds or self.remote is not None:
            seeds = [
                derive_seed(self.seed, self.step, round_index, first + g, j)
                for g in range(k)
                for j in range(cfg.group_size)
            ]
        # rollout servers report the version that sampled each turn: keep it
        version = None if self.remote is not None else self.step
        request = RolloutRequest(tasks[first : first + k], seeds, version, first_group=first)
        return self.score(self.source.rollout(request))

    def score(self, trajs: list[Trajectory]) -> list[Trajectory]:
        """The trainer's reward terms, in place: the LLM judge's (`env.judge`), DAPO's overlong penalty."""
        cfg = self.cfg
        if self.judge is not None:  # the whole batch at once
            self.judge.apply(trajs)
        if cfg.overlong_penalty is not None:
            op = cfg.overlong_penalty
            apply_overlong_penalty(trajs, op.max_len, op.cache_len, op.factor)
        return trajs

    def batch(self, metrics: dict[str, float]) -> list[Trajectory]:
        """The step's `prompts_per_step × group_size` trajectories: from the async producer or `collect`."""
        if self.async_rollouts is not None:  # `rollout.max_staleness` > 0: the producer's batch
            trajs = self.score(self.async_rollouts.next_batch(self.step, metrics))
        else:
            trajs = self.collect(self.cfg.prompts_per_step)
        metrics.update(rollout_metrics(trajs))
        return trajs

    def sample(self, metrics: dict[str, float]) -> Selection:
        """The step's batch: `batch`, or the algorithm's selection from rollouts (GRPO's `GroupSelection`)."""
        if self.selection is None:
            return Selection(self.batch(metrics))
        return self.selection.select(self.batch, self.collect, metrics)

    # --- the iteration -------------------------------------------------------------------
    # long: steps 1-9 of the on-policy loop, numbered in order as docs/design.md's Trainer reads
    def train_step(self) -> dict[str, float]:
        """One iteration (rollout, score, advantages, update); returns its metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        self.source.stats = RolloutStats()  # this step's generation and env-step seconds
        self.policy.zero_grad(set_to_none=True)  # the last update's: not kept through the rollout
        # 1 rollout: the step's trajectories, scored, chosen by the algorithm's selection
        selection = self.sample(metrics)
        trajs = selection.trajs
        stats = self.source.stats
        if stats.generated_rows:  # in-process rollouts: generating vs stepping envs
            metrics["time/generate_s"] = stats.generate_s
            metrics["time/env_s"] = stats.env_s
        if self.judge is not None:
            metrics.update(self.judge.pop_metrics())
        t_rollout = time.perf_counter() - t0
        # 2 the trajectory store (rank 0 writes the global batch)
        if cfg.log_trajectories:
            everyone = distributed.gather_list(trajs)  # the global batch on rank 0, [] elsewhere
            if distributed.is_main():
                log_trajectories(
                    self.trajectory_dir,
                    everyone,
                    step=self.step,
                    group_size=cfg.group_size,
                    env_kwargs=cfg.env.kwargs,
                    policy=str(self.stage_dir),
                    policy_versions=[t.policy_version for t in everyone],
                )

        # 3 the padded batch, with the rows that stay out of the loss masked: DAPO's filler groups
        # (`loss_rows`) and, with the overlong filter, the responses cut at max_new_tokens. One rule
        # for both: out of the loss and of its normalisers (`num_tokens` and `num_seqs`), so a kept
        # row's gradient does not depend on how many rows were left out.
        batch = RolloutBatch.from_trajectories(trajs, int(self.tokenizer.pad_token_id)).to(self.device)  # type: ignore[arg-type]
        loss_rows = None if selection.loss_rows is None else selection.loss_rows.to(self.device)
        if cfg.overlong_filter:
            cut = torch.tensor([t.finish_reason == "length" for t in trajs], device=self.device)
            metrics["rollout/overlong_masked"] = float(cut.float().mean())
            loss_rows = ~cut if loss_rows is None else loss_rows & ~cut
        if loss_rows is not None:
            batch.loss_mask = batch.loss_mask * loss_rows.float()[:, None]
        # the rewards the trainer sees: the outcome's, the steps' (process rewards), or both
        batch = batch.with_reward_source(cfg.reward_source, cfg.step_reward_weight)

        t1 = time.perf_counter()
        # Token means are combined over ranks weighted by each rank's policy tokens.
        tokens = float(batch.loss_mask.sum())
        token_means = ("kl/rollout_k3", "kl/ref", "value/mean_rollout", "returns/mean")
        token_weights = {k: tokens for k in token_means}
        # 4 π_old recomputed by the trainer where the sampler's log-probs are not its own: the
        # expert's rows (GRPO's guidance), or all rows when they differ (vLLM, servers, TIS) or are
        # of older weights (async: the ratio is centred on the current policy, the proximal π_old)
        recompute = self.engine is not None or self.remote is not None or cfg.rollout.max_staleness > 0
        is_weights = self.updater.recompute_old_logprobs(batch, metrics, selection.guided_rows, recompute)
        # 5 the reference's log-probs and the rollout's KL to it
        ref_logprobs = self.updater.reference_logprobs(batch)
        if ref_logprobs is not None:
            # One KL measure whatever the estimator and placement: k3 of π_old vs π_ref per token.
            # (expm1-based, clamped at 0: k3 ≥ 0 in exact arithmetic, a few ulps below in floats)
            k3 = kl_estimate(batch.old_logprobs, ref_logprobs, "k3").clamp(min=0.0) * batch.loss_mask
            metrics["kl/rollout_k3"] = float(k3.sum() / batch.loss_mask.sum().clamp(min=1.0))
        # 6 advantages (the algorithm's estimator), 7 the update and β's move (`update`)
        advantages = self.advantages(batch, trajs, ref_logprobs, metrics)
        stats_ = self.update(batch, advantages, ref_logprobs, loss_rows=loss_rows, is_weights=is_weights)
        metrics.update(stats_)
        t_update = time.perf_counter() - t1
        # 8 the rollout engine gets the new weights
        if self.engine is not None:
            t2 = time.perf_counter()
            sync_weights(self.engine, self.policy)
            metrics["time/weight_sync_s"] = time.perf_counter() - t2
        if self.remote is not None:  # the rollout servers get them as version `step + 1`
            metrics.update(self.remote.push(self.policy, self.step + 1))

        # 9 metrics, reduced over ranks
        self.step += 1
        step_s = time.perf_counter() - t0
        metrics.update(
            {
                "lr": float(self.scheduler.get_last_lr()[0]),
                "time/rollout_s": t_rollout,
                "time/update_s": t_update,
                "time/step_s": step_s,
                "throughput/tokens_per_s": tokens / step_s,
            }
        )
        return distributed.reduce_metrics(metrics, token_weights)

    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        *,
        step_policy: bool | None = None,
        **kw: Any,
    ) -> dict[str, float]:
        """Step 7: `PolicyUpdate.update` with this iteration's β and entropy cadence, then β's move.

        The KL controller then takes the KL the advantages measured (PPO: β moves for the
        next iteration; Ziegler et al. 2019, arXiv:1909.08593, §2.2), unless the policy took no
        step (the critic's warm-up). The arguments and metrics are `PolicyUpdate.update`'s;
        `step_policy` defaults to True, or with a critic to whether its warm-up has passed.
        """
        every = self.cfg.entropy_every
        if step_policy is None:
            step_policy = self.critic is None or self.step >= self.critic.warmup_steps
        kw["step_policy"] = step_policy
        entropy = every > 0 and self.step % every == 0
        kl_coef = self.kl.value
        stats = self.updater.update(
            batch, advantages, ref_logprobs, kl_coef=kl_coef, log_entropy=entropy, **kw
        )
        self.kl.commit(policy_moved=step_policy)
        return stats

    # --- checkpoints and the loop --------------------------------------------------------
    def save(self) -> Path:
        """Checkpoint the current step: the policy, the critic, β, the task cursor."""
        state: dict[str, Any] = {"cursor": self.sampler.cursor} | self.kl.checkpoint_state()
        if self.async_rollouts is not None:
            state |= self.async_rollouts.state()
        critic = self.critic
        extra = None if critic is None else lambda folder: critic.save(folder / "critic")
        held = (self.policy, self.tokenizer, self.optimizer, self.scheduler)
        return save_checkpoint(
            self.stage_dir, self.step, *held, state, keep=self.cfg.keep_checkpoints, extra=extra
        )

    def describe(self, m: dict[str, float]) -> str:
        """One progress line from a step's metrics (with the algorithm's own figures)."""
        entropy = f"  entropy {m['entropy']:.3f}" if "entropy" in m else ""  # see `entropy_every`
        return (
            f"reward {m['rollout/reward_mean']:.3f}  len {m['rollout/response_length_mean']:.1f}"
            f"  clip {m.get('clip/frac', 0.0):.3f}{entropy}"
            f"  {m['time/step_s']:.2f}s/step{hack_warning(m)}"
        ) + self._describe(m)

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps`, logging and checkpointing; return the saved final model folder."""
        final = train_sampled_stage(self, echo)
        self.close()
        if self.critic is not None:
            self.critic.save_final(self.stage_dir / "critic", {"kl_coef": self.kl.value})
        return final

    def close(self) -> None:
        """Release the async rollout producer, the rollout engine (vLLM), the judge and the environments."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        if self.judge is not None:
            self.judge.close()
        if self.remote is not None or self.engine is not None:
            for backend in (self.remote, self.engine):
                if backend is not None:
                    backend.close()
            self.remote = self.engine = None
            self.agent = LLMAgent(self.policy, self.tokenizer, batch_size=len(self.envs))
            self.source.agent = self.agent
        for e in self.envs:
            e.close()
