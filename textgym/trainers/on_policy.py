"""The on-policy loop every RL trainer shares (GRPO family and PPO).

One iteration: 1 rollout (`collect`) · 2 score and shape rewards (the env's rubric,
DAPO's overlong penalty, a KL penalty when it goes in the reward) · 3 advantages
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
and TIS corrects for it exactly as it does for vLLM; by default it is off there.

Under torchrun (`textgym.distributed`) every rank draws the same global task list, rolls
out its contiguous slice of whole prompts (a group never straddles ranks) with the full
policy weights (`distributed.full_params`), and trains on its rows with the policy (and the
reference, and PPO's critic) sharded by FSDP2. Each loss is divided by this rank's share of
the global denominator (tokens or sequences), so the averaged gradient is the one a single
process computes on the whole batch; batch statistics (GRPO's rewards, whitening, metrics)
are reduced over ranks. Rank 0 alone writes metrics, trajectories and checkpoints.
"""

from __future__ import annotations

import copy
import json
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent, SamplingParams, derive_seed
from textgym.agents.rollout import rollout
from textgym.agents.trajectory import Trajectory
from textgym.config import ConfigError, GRPOConfig, ParallelConfig, PPOConfig
from textgym.trainers.advantages import overlong_penalty
from textgym.trainers.batch import RolloutBatch
from textgym.trainers.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
    save_final,
    save_lora_final,
)
from textgym.trainers.logging import metrics_logger
from textgym.trainers.logprobs import sequence_logprobs
from textgym.trainers.loop import run_loop
from textgym.trainers.losses import aggregate, clipped_policy_loss, kl_estimate, rollout_correction
from textgym.trainers.optim import build_optimizer
from textgym.trainers.sampler import TaskSampler

EvalFn = Callable[[PreTrainedModel, PreTrainedTokenizerBase], dict[str, float]]


def chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Split a 1-D index tensor into consecutive pieces of `size` (the last may be shorter)."""
    return [idx[i : i + size] for i in range(0, len(idx), size)]


def rollout_metrics(trajs: list[Trajectory], gather: bool = True) -> dict[str, float]:
    """Reward, accuracy, reward terms and length statistics of a rollout batch.

    With `gather` (and several ranks), over every rank's trajectories: their rewards, lengths
    and terms are gathered first, so the statistics are those of the global batch.
    """
    rows = [(t.reward, t.response_length, t.finish_reason, t.reward_terms) for t in trajs]
    if gather:
        rows = distributed.all_gather_list(rows)
    rewards = torch.tensor([r[0] for r in rows])
    lengths = torch.tensor([float(r[1]) for r in rows])
    m = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(rows) > 1 else 0.0,
        "rollout/response_length_mean": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/overlong_frac": sum(r[2] == "length" for r in rows) / len(rows),
    }
    terms: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r[3].items():
            terms[k].append(v)
    for k, vs in terms.items():
        m[f"rollout/{k.split('/', 1)[1]}_mean"] = sum(vs) / len(vs)
    if "reward/correct" in terms:
        m["rollout/accuracy"] = sum(v >= 1.0 for v in terms["reward/correct"]) / len(terms["reward/correct"])
    return m


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


class OnPolicyTrainer:
    """Base of the on-policy trainers: rollouts, reference, the clipped policy update, checkpoints.

    Subclasses implement `compute_advantages(batch, trajs, metrics) -> [B] or [B, L]` and may
    add a critic through `_critic_loss` / `_critic_step` hooks.

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
    ):
        self.cfg, self.world = cfg, distributed.world()
        self._check_world()
        if cfg.lora is not None:
            from textgym.trainers.lora import apply_lora

            model = apply_lora(model, cfg.lora, seed=seed)
        self.policy, self.tokenizer, self.stage_dir = model, tokenizer, Path(stage_dir)
        self.parallel = parallel or ParallelConfig()
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        self.eval_fn = eval_fn
        self.seed = seed
        W = self.world.size
        B = cfg.prompts_per_step * cfg.group_size  # the global batch; this rank holds B / W rows
        self.agent = LLMAgent(model, tokenizer, batch_size=B // W)
        self.params = SamplingParams(**cfg.sampling.model_dump())
        self.envs = [cfg.env.make() for _ in range(B // W)]
        self.sampler = TaskSampler(len(self.envs[0].unwrapped.tasks), seed)  # type: ignore[attr-defined]
        self.minibatch_size = (cfg.minibatch_size or B) // W  # rows of a minibatch on this rank
        self.micro_batch_size = cfg.micro_batch_size or self.minibatch_size
        updates = cfg.steps * cfg.epochs * (B // (cfg.minibatch_size or B))
        if self.parallel.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        # The reference is the stage's start model (frozen); β = 0 never builds one. It is copied
        # before a checkpoint is loaded, so a resumed run has the same reference. With LoRA it is
        # the policy itself with its adapters disabled (no copy).
        self.reference: PreTrainedModel | None = None
        if cfg.kl_coef > 0 and cfg.lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
            if cfg.reference_device is not None and self.world.size == 1:
                # (on several ranks "cpu" is FSDP2's CPU offload of the reference's shards: `_shard`)
                self.reference.to(torch.device(cfg.reference_device))  # type: ignore[arg-type]
            if self.parallel.gradient_checkpointing:
                self.reference.gradient_checkpointing_disable()
        self.step = 0
        self._ref_logprobs: torch.Tensor | None = None
        self._is_weights: torch.Tensor | None = None
        self._loss_rows: torch.Tensor | None = None  # [B] bool set by `sample`: rows in the loss
        self._setup(updates)  # subclass models are built from the unsharded policy, then sharded
        self.policy = self._shard(model)
        if self.reference is not None:
            self._shard(self.reference, offload=cfg.reference_device == "cpu")
        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, updates)
        self.memory = distributed.memory_report(self._models())
        ckpt = latest_checkpoint(self.stage_dir) if resume else None
        if ckpt is not None:
            state = load_checkpoint(ckpt, self.policy, self.optimizer, self.scheduler)
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
            self._load_extra(ckpt, state)
        self.engine: Any = None
        if cfg.rollout.backend == "vllm":
            from textgym.agents.vllm_backend import VLLMBackend

            v = cfg.rollout.vllm
            self.engine = VLLMBackend.for_policy(
                model,
                tokenizer,
                self.agent.backend.eos_ids,
                gpu_memory_utilization=v.gpu_memory_utilization,
                kv_cache_gib=v.kv_cache_gib,
                max_model_len=v.max_model_len,
                enforce_eager=v.enforce_eager,
                seed=seed,
                **({} if v.dtype == "auto" else {"dtype": v.dtype}),
            )
            self.agent = LLMAgent(model, tokenizer, backend=self.engine)
        self.logger = metrics_logger(self.stage_dir, resume_step=self.step if ckpt is not None else None)
        self.trajectory_dir = self.stage_dir / "trajectories"
        if cfg.log_trajectories and self.trajectory_dir.is_dir() and distributed.is_main():
            # Like metrics.jsonl, the store keeps nothing past the step the run resumes from.
            for shard in self.trajectory_dir.glob("step-*.parquet"):
                if int(shard.name.split("-")[1]) > self.step:
                    shard.unlink()

    def _check_world(self) -> None:
        """Refuse a batch that does not split into whole prompts per rank (and vLLM) under torchrun."""
        cfg, W = self.cfg, self.world.size
        if W == 1:
            return
        B = cfg.prompts_per_step * cfg.group_size
        mb = cfg.minibatch_size or B
        if cfg.prompts_per_step % W:
            raise ConfigError(
                f"{self.name}.prompts_per_step={cfg.prompts_per_step} must be a multiple of the number of "
                f"ranks ({W}): each rank rolls out whole groups of the same number of prompts"
            )
        if mb % W:
            raise ConfigError(
                f"{self.name}.minibatch_size={mb} must be a multiple of the number of ranks ({W})"
            )
        if cfg.rollout.backend == "vllm":
            raise ConfigError(
                f"{self.name}.rollout.backend: vllm rollouts are not supported on several ranks yet"
            )
        if cfg.reference_device not in (None, "cpu"):
            raise ConfigError(
                f"{self.name}.reference_device={cfg.reference_device!r}: on several ranks the reference is "
                'sharded with the policy, on each rank\'s device; only "cpu" (offload its shards) applies'
            )

    def _shard(self, model: torch.nn.Module, offload: bool = False) -> Any:
        """Shard `model` over the ranks (FSDP2) when launched by torchrun; return it.

        `offload` keeps its shards in CPU memory (FSDP2's CPU offload; for the frozen reference).
        """
        bf16 = distributed.resolve_mixed_precision(self.parallel.mixed_precision, self.device)
        return distributed.shard(model, bf16=bf16, offload=offload)

    def _models(self) -> dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]]:
        """The models this trainer holds, for the memory report: name → (model, optimizer or None)."""
        models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] = {
            "policy": (self.policy, self.optimizer)
        }
        if self.reference is not None:
            models["reference"] = (self.reference, None)
        verifier = getattr(self.envs[0], "verifier", None)
        if verifier is not None and isinstance(getattr(verifier, "model", None), torch.nn.Module):
            models["reward_model"] = (verifier.model, None)
        return models

    # --- hooks ---------------------------------------------------------------------------
    def _setup(self, updates: int) -> None:
        """Build subclass state (critic, KL controller) before a checkpoint is loaded."""

    def _load_extra(self, ckpt: Path, state: dict[str, Any]) -> None:
        """Restore subclass state from a checkpoint."""

    def _extra_state(self) -> dict[str, Any]:
        """JSON-serialisable subclass state for checkpoints."""
        return {}

    def _save_extra(self, folder: Path) -> None:
        """Write subclass files (the critic) into a checkpoint folder."""

    def compute_advantages(
        self, batch: RolloutBatch, trajs: list[Trajectory], metrics: dict[str, float]
    ) -> torch.Tensor:
        """Return [B] per-sequence or [B, L] per-token advantages; add stats to `metrics`."""
        raise NotImplementedError

    def _critic_loss(
        self, sub: RolloutBatch, rows: torch.Tensor, minibatch: torch.Tensor, num_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]] | None:
        """The critic's loss on the micro-batch `rows` of `minibatch` (None: no critic).

        `num_tokens` is this rank's share of the minibatch's policy tokens (the policy loss's
        denominator); a critic that trains other positions too computes its own.
        """
        return None

    def _loss_kl_coef(self) -> float:
        """β of the KL term in the loss (`kl_placement: loss`): `cfg.kl_coef`; PPO's controller's β."""
        return self.cfg.kl_coef

    def _critic_step(self) -> dict[str, float]:
        """Step the critic's optimizer after a minibatch; return its stats."""
        return {}

    def _gradient_sync(self, sync: bool) -> None:
        """Whether the coming backward passes reduce gradients over ranks (the last micro-batch does)."""
        distributed.set_requires_gradient_sync(self.policy, sync)

    def _update_policy(self) -> bool:
        """Whether this iteration steps the policy (PPO's critic warm-up says no)."""
        return True

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
        if cfg.rollout.per_sequence_seeds:
            seeds = [
                derive_seed(self.seed, self.step, round_index, first + g, j)
                for g in range(k)
                for j in range(cfg.group_size)
            ]
        with torch.no_grad(), distributed.full_params(self.policy):
            trajs = rollout(
                self.agent,
                self.envs,
                tasks[first : first + k],
                self.params,
                group_size=cfg.group_size,
                max_turns=cfg.max_turns or 16,
                env_id=cfg.env.id,
                seeds=seeds,
            )
        for t in trajs:
            t.group += first  # the group's index in the step's global batch
        if cfg.overlong_penalty is not None:
            op = cfg.overlong_penalty
            apply_overlong_penalty(trajs, op.max_len, op.cache_len, op.factor)
        return trajs

    def sample(self, metrics: dict[str, float]) -> list[Trajectory]:
        """The step's trajectories (`prompts_per_step × group_size` in all); subclasses may resample.

        A subclass may set `self._loss_rows` ([B] bool, this rank's rows) to leave rows out of
        the loss: their tokens are masked and they count in neither `num_tokens` nor `num_seqs`.
        """
        trajs = self.collect(self.cfg.prompts_per_step)
        metrics.update(rollout_metrics(trajs))
        return trajs

    def train_step(self) -> dict[str, float]:
        """One iteration (rollout, score, advantages, update); returns its metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        metrics: dict[str, float] = {}
        self._loss_rows = None
        trajs = self.sample(metrics)
        t_rollout = time.perf_counter() - t0
        if cfg.log_trajectories:
            everyone = distributed.gather_list(trajs)  # the global batch on rank 0, [] elsewhere
            if distributed.is_main():
                self._log_trajectories(everyone)

        batch = RolloutBatch.from_trajectories(trajs, int(self.tokenizer.pad_token_id)).to(self.device)  # type: ignore[arg-type]
        if cfg.overlong_filter:
            cut = torch.tensor([t.finish_reason == "length" for t in trajs], device=self.device)
            batch.loss_mask = batch.loss_mask * (~cut).float()[:, None]
            metrics["rollout/overlong_masked"] = float(cut.float().mean())
        loss_rows = None if self._loss_rows is None else self._loss_rows.to(self.device)
        if loss_rows is not None:  # e.g. DAPO's filler groups: out of the loss and its normalisers
            batch.loss_mask = batch.loss_mask * loss_rows.float()[:, None]

        t1 = time.perf_counter()
        # Token means are combined over ranks weighted by each rank's policy tokens.
        tokens = float(batch.loss_mask.sum())
        token_means = ("kl/rollout_k3", "kl/ref", "value/mean_rollout", "returns/mean")
        token_weights = {k: tokens for k in token_means}
        self._is_weights = None
        if self.engine is not None or cfg.rollout.use_tis:
            # The engine's log-probs are π_rollout; the ratio's denominator is the trainer's π_old.
            # With the transformers backend and `rollout.tis: true`, π_rollout is the KV-cached
            # decoding's and π_old the padded training forward's (they differ under bf16/FSDP).
            rollout_logprobs = batch.old_logprobs
            batch.old_logprobs = self._trainer_logprobs(batch)
            weights, stats = rollout_correction(
                batch.old_logprobs,
                rollout_logprobs,
                batch.loss_mask,
                cap=cfg.rollout.tis_cap if cfg.rollout.use_tis else None,
            )
            self._is_weights = weights if cfg.rollout.use_tis else None
            metrics.update(stats)
        self._ref_logprobs = self._reference_logprobs(batch)
        if self._ref_logprobs is not None:
            # One KL measure whatever the estimator and placement: k3 of π_old vs π_ref per token.
            # (expm1-based, clamped at 0: k3 ≥ 0 in exact arithmetic, a few ulps below in floats)
            k3 = kl_estimate(batch.old_logprobs, self._ref_logprobs, "k3").clamp(min=0.0) * batch.loss_mask
            metrics["kl/rollout_k3"] = float(k3.sum() / batch.loss_mask.sum().clamp(min=1.0))
        advantages = self.compute_advantages(batch, trajs, metrics)
        metrics.update(self.update(batch, advantages, ref_logprobs=self._ref_logprobs, loss_rows=loss_rows))
        t_update = time.perf_counter() - t1
        if self.engine is not None:
            t2 = time.perf_counter()
            self.engine.load_weights(self._rollout_weights())
            metrics["time/weight_sync_s"] = time.perf_counter() - t2

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
        """μ epochs over shuffled minibatches of `batch`, accumulating over micro-batches.

        Args:
            batch: the rollout batch (on the policy's device).
            advantages: [B] per-sequence or [B, L] per-token advantages.
            ref_logprobs: [B, L] log π_ref of the batch (computed here when the KL is in the
                loss and it is not given).
            epochs: passes over the batch (default `cfg.epochs`).
            step_policy: False trains only the critic (default: `_update_policy()`).
            loss_rows: [B] bool, the rows that count in the policy loss (None: all). The
                others must have their `loss_mask` zeroed already (so they are out of
                `num_tokens`); here they are left out of `num_seqs` too.

        Returns:
            Loss, KL, clip, entropy and gradient-norm metrics, averaged over optimizer steps
            (losses) or policy tokens (the rest), over all ranks.

        Distributed: each rank takes `minibatch_size / ranks` of its rows per minibatch; the
        loss denominators (`num_tokens`, `num_seqs`) are this rank's share of the global
        minibatch's (`distributed.share`), so FSDP's average of the ranks' gradients is the
        gradient of the whole minibatch. The gradient reduce-scatter runs once per minibatch,
        after its last micro-batch.
        """
        cfg = self.cfg
        if cfg.kl_placement != "loss":
            ref_logprobs = None
        elif ref_logprobs is None:
            ref_logprobs = self._reference_logprobs(batch)
        kl_coef = self._loss_kl_coef() if cfg.kl_placement == "loss" else 0.0
        advantages = advantages.to(self.device)
        step_policy = self._update_policy() if step_policy is None else step_policy
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        updates = 0
        self.policy.train(step_policy)
        for _ in range(cfg.epochs if epochs is None else epochs):
            for mb in chunks(torch.randperm(len(batch)), self.minibatch_size):
                # The global Σ mask (at least 1) divided by the ranks: see the docstring.
                num_tokens = max(distributed.share(float(batch.loss_mask[mb].sum())), 1.0 / self.world.size)
                num_seqs: float = len(mb)
                if loss_rows is not None:
                    num_seqs = max(distributed.share(float(loss_rows[mb].sum())), 1.0 / self.world.size)
                self.optimizer.zero_grad(set_to_none=True)
                micros = chunks(mb, self.micro_batch_size)
                for i, micro in enumerate(micros):
                    self._gradient_sync(i == len(micros) - 1)
                    sub = batch.select(micro)
                    micro_d = micro.to(self.device)
                    Lm = sub.loss_mask.shape[1]
                    w = float(sub.loss_mask.sum())
                    critic = self._critic_loss(sub, micro_d, mb, num_tokens)
                    if critic is not None:
                        critic[0].backward()
                        for k, v in critic[1].items():
                            if k.startswith("loss/"):
                                sums[k] += v
                            else:
                                sums[k] += v * w
                                weights[k] += w
                    if not step_policy:
                        continue
                    logprobs, entropy, logits_entropy = self._policy_forward(sub)
                    adv = advantages[micro_d] if advantages.ndim == 1 else advantages[micro_d, :Lm]
                    is_w = None if self._is_weights is None else self._is_weights[micro_d, :Lm]
                    loss, stats = clipped_policy_loss(
                        logprobs,
                        sub.old_logprobs,
                        adv,
                        sub.loss_mask,
                        clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high,
                        dual_clip=cfg.dual_clip,
                        aggregation=cfg.loss_aggregation,
                        ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro_d, :Lm],
                        kl_coef=kl_coef,
                        kl_estimator=cfg.kl_estimator,
                        num_seqs=num_seqs,
                        num_tokens=num_tokens,
                        norm_len=cfg.sampling.max_new_tokens,
                        is_weights=is_w,
                    )
                    if logits_entropy is not None:
                        bonus = aggregate(logits_entropy, sub.loss_mask, "token_mean", num_tokens=num_tokens)
                        loss = loss - cfg.entropy_coef * bonus
                        stats["loss/entropy_bonus"] = float(-cfg.entropy_coef * bonus.detach())
                    loss.backward()
                    stats["entropy"] = float((entropy * sub.loss_mask).sum() / max(w, 1.0))
                    stats["loss/total"] = float(loss.detach())
                    for k, v in stats.items():
                        if k.startswith("loss/"):
                            sums[k] += v  # micro-batch losses add up to the minibatch loss
                        else:
                            sums[k] += v * w
                            weights[k] += w
                if step_policy:
                    if cfg.optim.max_grad_norm is not None:
                        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.max_grad_norm)
                        sums["grad_norm"] += distributed.grad_norm(gn)  # the global norm, on every rank
                        weights["grad_norm"] += 1.0
                    self.optimizer.step()
                    self.scheduler.step()
                for k, v in self._critic_step().items():
                    sums[k] += v
                    weights[k] += 1.0
                updates += 1
        # A rank's loss is its part of the global loss times the number of ranks (see the
        # docstring), so the mean over ranks is the global loss; the other statistics are
        # weighted sums, added up over ranks before dividing.
        out = {k: v / updates for k, v in sums.items() if k.startswith("loss/")}
        rest = [k for k in sums if not k.startswith("loss/")]
        ops: dict[str, distributed.MetricOp] = {k: "mean" for k in out}
        out.update({k: sums[k] for k in rest} | {f"{k}#weight": weights[k] for k in rest})
        ops.update({k: "sum" for k in out if k not in ops})
        out = distributed.reduce_metrics(out, ops=ops)
        for k in rest:
            out[k] /= max(out.pop(f"{k}#weight"), 1e-12)
        return out

    def _policy_forward(self, sub: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(logprobs [B, L], entropy [B, L] no grad, entropy with grad or None)."""
        grad = self.cfg.entropy_coef > 0
        logprobs, entropy = sequence_logprobs(
            self.policy,
            sub,
            self.cfg.sampling.temperature,
            with_entropy=True,
            entropy_grad=grad,
            split_prompt=distributed.is_sharded(self.policy),
        )
        assert entropy is not None
        return logprobs, entropy.detach(), entropy if grad else None

    def _rollout_weights(self) -> Any:
        """(name, tensor) pairs of the policy for the rollout engine; merged weights for LoRA."""
        if self.cfg.lora is not None:
            from textgym.trainers.lora import merged_state_dict

            return merged_state_dict(self.policy).items()
        return self.policy.state_dict().items()

    def _log_trajectories(self, trajs: list[Trajectory]) -> None:
        """Append this step's rollouts to the stage's store as one shard named by the step."""
        from textgym.store import TrajectoryWriter, trajectory_row

        G = self.cfg.group_size
        with TrajectoryWriter(self.trajectory_dir, prefix=f"step-{self.step + 1:06d}") as w:
            w.append(
                trajectory_row(
                    t,
                    env_kwargs=self.cfg.env.kwargs,
                    sample=j % G,
                    policy=str(self.stage_dir),
                    policy_version=self.step,
                    source="train",
                )
                for j, t in enumerate(trajs)
            )

    @torch.no_grad()
    def _trainer_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, L] log π_old of the batch's tokens under the current policy, in eval mode."""
        policy, T = self.policy, self.cfg.sampling.temperature
        split = distributed.is_sharded(policy)  # every rank makes the same forward calls
        was_training = policy.training
        policy.eval()
        try:
            return self.per_micro_batch(
                batch, lambda sub: sequence_logprobs(policy, sub, T, split_prompt=split)[0]
            )
        finally:
            policy.train(was_training)

    @torch.no_grad()
    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, L] log π_ref of the batch's tokens (None without a reference)."""
        if self.cfg.lora is not None and self.cfg.kl_coef > 0:
            from textgym.trainers.lora import reference_of

            policy, T = self.policy, self.cfg.sampling.temperature
            was_training = policy.training
            policy.eval()
            try:
                with reference_of(policy) as ref:
                    return self.per_micro_batch(batch, lambda sub: sequence_logprobs(ref, sub, T)[0])
            finally:
                policy.train(was_training)
        if self.reference is None:
            return None
        reference, T = self.reference, self.cfg.sampling.temperature
        split = distributed.is_sharded(reference)
        if self.cfg.reference_device is not None and not split:
            # Placed elsewhere (another GPU, or offloaded to CPU): the micro-batch goes there
            # and its log-probs come back.
            where = torch.device(self.cfg.reference_device)
            return self.per_micro_batch(
                batch, lambda sub: sequence_logprobs(reference, sub.to(where), T)[0].to(self.device)
            )
        return self.per_micro_batch(
            batch, lambda sub: sequence_logprobs(reference, sub, T, split_prompt=split)[0]
        )

    @torch.no_grad()
    def per_micro_batch(
        self, batch: RolloutBatch, fn: Callable[[RolloutBatch], torch.Tensor], extra_columns: int = 0
    ) -> torch.Tensor:
        """Apply `fn` to each micro-batch of `batch` without gradient and stitch the rows back.

        `fn(sub)` returns [b, L_sub + extra_columns] for a micro-batch trimmed to L_sub response
        columns; each piece is right-padded with 0 to `L + extra_columns` before concatenation.
        """
        width = batch.loss_mask.shape[1] + extra_columns
        parts = []
        for micro in chunks(torch.arange(len(batch)), self.micro_batch_size):
            out = fn(batch.select(micro))
            parts.append(torch.nn.functional.pad(out, (0, width - out.shape[1])))
        return torch.cat(parts)

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
            {"cursor": self.sampler.cursor, **self._extra_state()},
            keep=self.cfg.keep_checkpoints,
            extra=self._save_extra,
        )

    def describe(self, m: dict[str, float]) -> str:
        """One progress line from a step's metrics."""
        return (
            f"reward {m['rollout/reward_mean']:.3f}  len {m['rollout/response_length_mean']:.1f}"
            f"  clip {m.get('clip/frac', 0.0):.3f}  entropy {m.get('entropy', 0.0):.3f}"
            f"  {m['time/step_s']:.2f}s/step"
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps`, logging and checkpointing; return the saved final model folder."""
        cfg = self.cfg

        def periodic_eval(metrics: dict[str, float]) -> None:
            if self.eval_fn is not None and cfg.eval_every and self.step % cfg.eval_every == 0:
                eval_fn = self.eval_fn
                with torch.no_grad(), distributed.full_params(self.policy):  # rank 0 evaluates alone
                    metrics.update(distributed.on_main(lambda: eval_fn(self.policy, self.tokenizer)))

        if echo is not None and distributed.is_main():
            echo(f"{self.name} memory on each of {self.world.size} rank(s):")
            for line in distributed.format_memory_report(self.memory).splitlines():
                echo(f"  {line}")
        if distributed.is_main():
            (self.stage_dir / "memory.json").write_text(json.dumps(self.memory, indent=2), encoding="utf-8")
        run_loop(
            self,
            name=self.name,
            steps=cfg.steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            echo=echo,
            after_step=periodic_eval,
            describe=self.describe,
        )
        if self.cfg.lora is not None:
            final = save_lora_final(self.stage_dir, self.policy, self.tokenizer)
        else:
            final = save_final(self.stage_dir, self.policy, self.tokenizer)
        self.close()
        return final

    def close(self) -> None:
        """Release the rollout engine (vLLM) and the environments."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
            self.agent = LLMAgent(self.policy, self.tokenizer, batch_size=len(self.envs))
        for e in self.envs:
            e.close()
