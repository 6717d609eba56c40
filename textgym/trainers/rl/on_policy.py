"""The on-policy loop every RL trainer shares (GRPO family and PPO).

One iteration: 1 rollout (`collect`) · 2 score and shape rewards (the env's rubric, an LLM
judge's term (`env.judge`), DAPO's overlong penalty, a KL penalty when it goes in the reward) · 3 advantages
(`compute_advantages`, the subclass's estimator) · 4 update: μ epochs over shuffled
minibatches of the clipped surrogate, accumulating over micro-batches, plus the
critic's value loss when there is one · 5 log (the loop checkpoints).

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

Where the pieces live: this module holds the setup (`__init__`, numbered) and the iteration
(`train_step`, numbered); the update and its no-grad log-prob passes are a `PolicyUpdate`
object (`trainers/rl/update.py`) the trainer holds as `updater`; PPO's critic is a `Critic`
(`trainers/rl/critic.py`) the update trains beside the policy; the rest is `textgym.training`.
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
from textgym.algorithms.kl_control import FixedKLController
from textgym.config import GRPOConfig, ParallelConfig, PPOConfig
from textgym.envs.registry import task_count
from textgym.trainers.rl.critic import Critic
from textgym.trainers.rl.update import PolicyUpdate
from textgym.training.batch import RolloutBatch, no_token_budget_under_torchrun
from textgym.training.checkpoint import save_checkpoint
from textgym.training.envs import make_env
from textgym.training.judge_reward import JudgeTerm
from textgym.training.loop import run_loop
from textgym.training.optim import build_optimizer
from textgym.training.placement import build_reference, check_world, shard
from textgym.training.precision import compute_autocast
from textgym.training.rollout_metrics import (
    apply_overlong_penalty,
    hack_warning,
    log_trajectories,
    prune_trajectories,
    rollout_metrics,
)
from textgym.training.sampler import TaskSampler
from textgym.training.sources.async_producer import AsyncRollouts
from textgym.training.sources.local import rollout_groups
from textgym.training.sources.remote import build_remote
from textgym.training.sources.vllm_engine import build_engine, sync_weights
from textgym.training.trainer import (
    announce_memory,
    eval_every,
    prepare_policy,
    resume_checkpoint,
    save_final_model,
    stage_logger,
)

EvalFn = Callable[[PreTrainedModel, PreTrainedTokenizerBase], dict[str, float]]


class OnPolicyTrainer:
    """Base of the on-policy trainers: rollouts, reference, the clipped policy update, checkpoints.

    Subclasses implement `compute_advantages(batch, trajs, metrics) -> [B] or [B, L]`; they
    may resample (`sample`), build a critic and a KL controller in `_setup` (PPO: `critic`,
    `kl_ctl`) and extend the progress line (`describe`). The update is a `PolicyUpdate`
    object (`updater`) that trains the critic, when there is one, beside the policy.

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
            rollout engine is vLLM, or `reference_device` is other than "cpu".
    """

    name = "rl"

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
        W = self.world.size
        B = cfg.prompts_per_step * cfg.group_size  # the global batch; this rank holds B / W rows
        no_token_budget_under_torchrun(cfg.micro_batch_tokens, W)
        self.agent = LLMAgent(model, tokenizer, batch_size=B // W)
        self.rollout_stats = RolloutStats()  # this step's generation and env-step time (`collect`)
        self.params = SamplingParams(**cfg.sampling.model_dump())
        self.envs = [make_env(cfg.env) for _ in range(B // W)]
        self.sampler = TaskSampler(task_count(self.envs[0]), seed)
        self.judge = None if cfg.env.judge is None else JudgeTerm(cfg.env.judge, cfg.group_size)
        # optimizer steps over the run (the schedules' lengths): the critic's warm-up iterations
        # (PPO's `critic_warmup_steps`) take none of the policy's
        iterations = max(cfg.steps - getattr(cfg, "critic_warmup_steps", 0), 0)
        updates = iterations * cfg.epochs * (B // (cfg.minibatch_size or B))
        # 3 the reference (a frozen copy of the start policy, or LoRA's adapters-off policy)
        self.reference: PreTrainedModel | None = build_reference(cfg, model, self.parallel)
        self.step = 0
        self._ref_logprobs: torch.Tensor | None = None
        self._is_weights: torch.Tensor | None = None
        self._loss_rows: torch.Tensor | None = None  # [B] bool set by `sample`: rows in the loss
        self._guided_rows: torch.Tensor | None = None  # [B] bool set by `sample`: expert rows (GRPO)
        self.critic: Critic | None = None  # PPO's value model (`_setup`)
        self.kl_ctl: FixedKLController = FixedKLController(cfg.kl_coef)  # β; PPO's may adapt it
        self._kl_measured: tuple[float, int] | None = None  # (KL per sequence, sequences) for kl_ctl
        # 4 subclass models (PPO's critic) are built from the unsharded policy, then all are sharded
        self._setup(cfg.steps * cfg.epochs * (B // (cfg.minibatch_size or B)))
        self.policy = self._shard(model)
        if self.reference is not None:
            self._shard(self.reference, offload=cfg.reference_device == "cpu")
        # 5 optimizer, memory report, resume
        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, updates)
        policy, opt, sched = self.policy, self.optimizer, self.scheduler
        self.updater = PolicyUpdate(
            cfg, policy, opt, sched, self.device, reference=self.reference, critic=self.critic
        )
        self.memory = distributed.memory_report(self._models())
        state = resume_checkpoint(self.stage_dir, resume, self.policy, self.optimizer, self.scheduler)
        if state is not None:
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
            if self.critic is not None:
                self.critic.load(Path(state["checkpoint_dir"]) / "critic")
            if "kl_coef" in state:  # PPO's checkpoints carry its β (`save`)
                self.kl_ctl.value = float(state["kl_coef"])
        # 6 the rollout engine (vLLM), 6b rollout servers, 7 async RL's producer (`_start_sources`)
        self._start_sources(model, seed)
        # 8 logging: metrics and the trajectory store keep nothing past the step resumed from
        self.logger = stage_logger(self.stage_dir, state, log_with, cfg)
        self.trajectory_dir = self.stage_dir / "trajectories"
        if cfg.log_trajectories and distributed.is_main():
            prune_trajectories(self.trajectory_dir, self.step)

    def _start_sources(self, model: PreTrainedModel, seed: int) -> None:
        """Start the rollout sources the config asks for (steps 6 and 7 of `__init__`).

        6: a vLLM engine (`rollout.backend: vllm`), fed the policy's weights; 6b: rollout
        servers (`rollout.servers`), checked, then sent the policy as of `self.step`; 7: with
        `rollout.max_staleness` > 0, a producer thread that samples ahead with a copy (async RL).
        """
        cfg, tokenizer = self.cfg, self.tokenizer
        self.engine: Any = build_engine(cfg, model, tokenizer, self.agent.backend.eos_ids, seed)
        if self.engine is not None:
            self.agent = LLMAgent(model, tokenizer, backend=self.engine)
        eos = self.agent.backend.eos_ids
        self.remote: Any = build_remote(cfg.rollout, self.policy, tokenizer, eos, self.step)
        if self.remote is not None:
            self.agent = LLMAgent(None, tokenizer, backend=self.remote.backend)
        self.async_rollouts = AsyncRollouts(self) if cfg.rollout.max_staleness > 0 else None

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

    # --- hooks ---------------------------------------------------------------------------
    def _setup(self, updates: int) -> None:
        """Build subclass state (PPO: `critic`, `kl_ctl`) from the unsharded policy.

        It runs before a checkpoint is loaded; `updates` is the optimizer steps an update of every
        iteration of the run would take (`steps × epochs × minibatches`, warm-up included).
        """

    def compute_advantages(
        self, batch: RolloutBatch, trajs: list[Trajectory], metrics: dict[str, float]
    ) -> torch.Tensor:
        """Return [B] per-sequence or [B, L] per-token advantages; add stats to `metrics`."""
        raise NotImplementedError

    # --- the iteration -------------------------------------------------------------------
    def collect(self, n_prompts: int, round_index: int = 0) -> list[Trajectory]:
        """Roll out `group_size` samples of the next `n_prompts` tasks (shaping applied).

        Distributed: every rank draws the same `n_prompts` tasks and rolls out its contiguous
        slice of `n_prompts / ranks` of them, so the ranks' trajectories, concatenated in rank
        order, are the global batch. With `rollout.per_sequence_seeds`, sample j of the task in
        global slot g is seeded by `(seed, step, round_index, g, j)`.
        """
        cfg, w = self.cfg, self.world
        tasks = self.sampler.next(n_prompts)
        k = n_prompts // w.size
        first = w.rank * k
        seeds = None
        if cfg.rollout.per_sequence_seeds or self.remote is not None:  # servers: a seed per request
            seeds = [
                derive_seed(self.seed, self.step, round_index, first + g, j)
                for g in range(k)
                for j in range(cfg.group_size)
            ]
        # The transformers backend samples under the policy's compute precision, as the trainer
        # computes π_old and π (`precision.compute_autocast`); a vLLM engine has its own dtype.
        sampler_precision = compute_autocast(self.policy) if self.engine is None else contextlib.nullcontext()
        # rollout servers generate: no full weights needed here
        weights = distributed.full_params(self.policy) if self.remote is None else contextlib.nullcontext()
        with torch.no_grad(), weights, sampler_precision:
            mine = tasks[first : first + k]
            trajs = rollout_groups(cfg, self.agent, self.envs, mine, self.params, seeds, self.rollout_stats)
        # rollout servers report the version that sampled each turn: keep it
        return self.finish_rollout(trajs, first, version=None if self.remote is not None else self.step)

    def finish_rollout(self, trajs: list[Trajectory], first: int, version: int | None) -> list[Trajectory]:
        """Score and tag a rollout in place: judge term, global group indices, version, DAPO's penalty.

        Args:
            trajs: this rank's trajectories, `group_size` consecutive samples per task.
            first: the global index of this rank's first group.
            version: the policy version that sampled them (`Trajectory.policy_version`); None
                keeps the version the trajectories carry (a rollout server's report).
        """
        cfg = self.cfg
        if self.judge is not None:  # the LLM judge's reward term (`env.judge`), the whole batch at once
            self.judge.apply(trajs)
        for t in trajs:
            t.group += first  # the group's index in the step's global batch
            if version is not None:
                t.policy_version = version
        if cfg.overlong_penalty is not None:
            op = cfg.overlong_penalty
            apply_overlong_penalty(trajs, op.max_len, op.cache_len, op.factor)
        return trajs

    def sample(self, metrics: dict[str, float]) -> list[Trajectory]:
        """The step's trajectories (`prompts_per_step × group_size` in all); subclasses may resample.

        A subclass may set `self._loss_rows` ([B] bool, this rank's rows) to leave rows out of
        the loss: their tokens are masked and they count in neither `num_tokens` nor `num_seqs`.
        """
        if self.async_rollouts is not None:  # `rollout.max_staleness` > 0: the producer's batch
            trajs = self.async_rollouts.next_batch(metrics)
        else:
            trajs = self.collect(self.cfg.prompts_per_step)
        metrics.update(rollout_metrics(trajs))
        return trajs

    # long: steps 1-8 of the on-policy loop, numbered in order as docs/design.md's Trainer reads
    def train_step(self) -> dict[str, float]:
        """One iteration (rollout, score, advantages, update); returns its metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        self._loss_rows = self._guided_rows = None
        self.rollout_stats = RolloutStats()
        self.policy.zero_grad(set_to_none=True)  # the last update's: not kept through the rollout
        # 1 rollout: the step's trajectories, rewards shaped (`collect`, `sample`)
        trajs = self.sample(metrics)
        if self.rollout_stats.generated_rows:  # in-process rollouts: generating vs stepping envs
            metrics["time/generate_s"] = self.rollout_stats.generate_s
            metrics["time/env_s"] = self.rollout_stats.env_s
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
        # (`_loss_rows`) and, with the overlong filter, the responses cut at max_new_tokens. One rule
        # for both: out of the loss and of its normalisers (`num_tokens` and `num_seqs`), so a kept
        # row's gradient does not depend on how many rows were left out.
        batch = RolloutBatch.from_trajectories(trajs, int(self.tokenizer.pad_token_id)).to(self.device)  # type: ignore[arg-type]
        loss_rows = None if self._loss_rows is None else self._loss_rows.to(self.device)
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
        self._is_weights = self.updater.recompute_old_logprobs(batch, metrics, self._guided_rows, recompute)
        # 5 the reference's log-probs and the rollout's KL to it
        self._ref_logprobs = self.updater.reference_logprobs(batch)
        if self._ref_logprobs is not None:
            # One KL measure whatever the estimator and placement: k3 of π_old vs π_ref per token.
            # (expm1-based, clamped at 0: k3 ≥ 0 in exact arithmetic, a few ulps below in floats)
            k3 = kl_estimate(batch.old_logprobs, self._ref_logprobs, "k3").clamp(min=0.0) * batch.loss_mask
            metrics["kl/rollout_k3"] = float(k3.sum() / batch.loss_mask.sum().clamp(min=1.0))
        # 6 advantages (the subclass's estimator), 7 the update (`update`: `PolicyUpdate.update`)
        advantages = self.compute_advantages(batch, trajs, metrics)
        metrics.update(self.update(batch, advantages, ref_logprobs=self._ref_logprobs, loss_rows=loss_rows))
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
        epochs: int | None = None,
        step_policy: bool | None = None,
        loss_rows: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """Step 7: `PolicyUpdate.update` with this iteration's β, TIS weights and entropy cadence.

        Then the KL controller takes the KL `compute_advantages` measured (PPO: β moves for the
        next iteration; Ziegler et al. 2019, arXiv:1909.08593, §2.2), unless the policy took no
        step (the critic's warm-up: β stays as it is). The arguments and metrics
        are `PolicyUpdate.update`'s; `step_policy` defaults to True, or for PPO to whether
        `critic_warmup_steps` have passed.
        """
        every = self.cfg.entropy_every
        if step_policy is None:
            step_policy = self.critic is None or self.step >= self.critic.warmup_steps
        stats = self.updater.update(
            batch,
            advantages,
            ref_logprobs,
            kl_coef=self.kl_ctl.value,
            epochs=epochs,
            step_policy=step_policy,
            loss_rows=loss_rows,
            is_weights=self._is_weights,
            log_entropy=every > 0 and self.step % every == 0,
        )
        # β is frozen while the policy does not move (the critic's warm-up): its KL to the
        # reference is 0 there and would drive an adaptive β down for nothing
        if self._kl_measured is not None and step_policy:
            self.kl_ctl.update(*self._kl_measured)
        self._kl_measured = None
        return stats

    # --- checkpoints and the loop --------------------------------------------------------
    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.stage_dir,
            self.step,
            self.policy,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            {"cursor": self.sampler.cursor}
            | ({"kl_coef": self.kl_ctl.value} if self.critic is not None else {})  # PPO's β
            | ({} if self.async_rollouts is None else self.async_rollouts.state()),
            keep=self.cfg.keep_checkpoints,
            extra=None if self.critic is None else lambda folder: self.critic.save(folder / "critic"),  # type: ignore[union-attr]
        )

    def describe(self, m: dict[str, float]) -> str:
        """One progress line from a step's metrics."""
        entropy = f"  entropy {m['entropy']:.3f}" if "entropy" in m else ""  # see `entropy_every`
        return (
            f"reward {m['rollout/reward_mean']:.3f}  len {m['rollout/response_length_mean']:.1f}"
            f"  clip {m.get('clip/frac', 0.0):.3f}{entropy}"
            f"  {m['time/step_s']:.2f}s/step{hack_warning(m)}"
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps`, logging and checkpointing; return the saved final model folder."""
        cfg = self.cfg
        announce_memory(self.name, self.memory, self.stage_dir, echo)
        run_loop(
            self,
            name=self.name,
            steps=cfg.steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            echo=echo,
            after_step=eval_every(self, self.eval_fn, cfg.eval_every),
            describe=self.describe,
        )
        final = save_final_model(self.stage_dir, self.policy, self.tokenizer, lora=cfg.lora is not None)
        self.close()
        if self.critic is not None:
            self.critic.save_final(self.stage_dir / "critic", {"kl_coef": self.kl_ctl.value})
        return final

    def close(self) -> None:
        """Release the async rollout producer, the rollout engine (vLLM), the judge and the environments."""
        if self.async_rollouts is not None:
            self.async_rollouts.close()
        if self.judge is not None:
            self.judge.close()
        if self.remote is not None:
            self.remote.close()
            self.remote = None
            self.agent = LLMAgent(self.policy, self.tokenizer, batch_size=len(self.envs))
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            self.agent = LLMAgent(self.policy, self.tokenizer, batch_size=len(self.envs))
        for e in self.envs:
            e.close()
