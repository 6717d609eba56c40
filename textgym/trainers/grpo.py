"""GRPO: Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

Each iteration: 1 rollout G samples for each of `prompts_per_step` tasks · 2 score
(the environment's rubric) · 3 group-relative advantages · 4 update: μ epochs over
minibatches of the clipped surrogate (+ β·KL to a frozen reference, k3 in the loss),
with gradient accumulation over micro-batches · 5 log and checkpoint.

The importance ratio's denominator is the sampling log-probability recorded during
the rollout (no extra forward pass); `kl/old_approx` at the first minibatch measures
any sampler/trainer mismatch.
"""

from __future__ import annotations

import copy
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym.agents.llm_agent import LLMAgent, SamplingParams
from textgym.agents.rollout import rollout
from textgym.agents.trajectory import RolloutBatch, Trajectory
from textgym.config import GRPOConfig
from textgym.trainers.advantages import group_advantages
from textgym.trainers.common import (
    MetricsLogger,
    TaskSampler,
    build_optimizer,
    latest_checkpoint,
    load_checkpoint,
    run_loop,
    save_checkpoint,
    save_final,
    sequence_logprobs,
)
from textgym.trainers.losses import clipped_policy_loss


def _chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
    return [idx[i : i + size] for i in range(0, len(idx), size)]


def rollout_metrics(trajs: list[Trajectory]) -> dict[str, float]:
    """Reward, accuracy, reward terms and length statistics of a rollout batch."""
    rewards = torch.tensor([t.reward for t in trajs])
    lengths = torch.tensor([float(t.response_length) for t in trajs])
    m = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(trajs) > 1 else 0.0,
        "rollout/response_length_mean": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/overlong_frac": sum(t.finish_reason == "length" for t in trajs) / len(trajs),
    }
    terms: dict[str, list[float]] = defaultdict(list)
    for t in trajs:
        for k, v in t.reward_terms.items():
            terms[k].append(v)
    for k, vs in terms.items():
        m[f"rollout/{k.split('/', 1)[1]}_mean"] = sum(vs) / len(vs)
    if "reward/correct" in terms:
        m["rollout/accuracy"] = sum(v >= 1.0 for v in terms["reward/correct"]) / len(terms["reward/correct"])
    return m


class GRPOTrainer:
    """Trains `model` in place with GRPO on `cfg.env`.

    Args:
        cfg: the GRPO stage config.
        model: the policy (already on `device`).
        tokenizer: its tokenizer (chat template, pad and EOS ids).
        stage_dir: where metrics, TensorBoard events and checkpoints go.
        seed: seed of task sampling.
        resume: continue from the newest checkpoint in `stage_dir` when there is one.
        eval_fn: called as `eval_fn(model, tokenizer) -> {metric: value}` every `cfg.eval_every` steps.
    """

    def __init__(
        self,
        cfg: GRPOConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stage_dir: Path,
        *,
        seed: int = 0,
        resume: bool = False,
        eval_fn: Callable[[PreTrainedModel, PreTrainedTokenizerBase], dict[str, float]] | None = None,
    ):
        self.cfg, self.policy, self.tokenizer, self.stage_dir = cfg, model, tokenizer, Path(stage_dir)
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        self.eval_fn = eval_fn
        B = cfg.prompts_per_step * cfg.group_size
        self.agent = LLMAgent(model, tokenizer, batch_size=B)
        self.params = SamplingParams(**cfg.sampling.model_dump())
        self.envs = [gym.make(cfg.env.id, **cfg.env.kwargs) for _ in range(B)]
        self.sampler = TaskSampler(len(self.envs[0].unwrapped.tasks), seed)  # type: ignore[attr-defined]
        self.minibatch_size = cfg.minibatch_size or B
        self.micro_batch_size = cfg.micro_batch_size or self.minibatch_size
        updates = cfg.steps * cfg.epochs * (B // self.minibatch_size)
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim, updates)
        # The reference is the stage's start model (frozen); β = 0 never builds one. It is copied
        # before a checkpoint is loaded, so a resumed run has the same reference.
        self.reference: PreTrainedModel | None = None
        if cfg.kl_coef > 0:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        self.step = 0
        ckpt = latest_checkpoint(self.stage_dir) if resume else None
        if ckpt is not None:
            state = load_checkpoint(ckpt, model, self.optimizer, self.scheduler)
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
        self.logger = MetricsLogger(self.stage_dir, resume_step=self.step if ckpt is not None else None)

    # ------------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One GRPO iteration (rollout, score, advantages, update); returns its metrics."""
        cfg, G = self.cfg, self.cfg.group_size
        t0 = time.perf_counter()

        # 1. Rollout: G samples for each task of this step, with their sampling log-probs.
        tasks = self.sampler.next(cfg.prompts_per_step)
        trajs = rollout(self.agent, self.envs, tasks, self.params, group_size=G, env_id=cfg.env.id)
        t_rollout = time.perf_counter() - t0

        # 2. Score: the environment's rubric already scored every episode.
        batch = RolloutBatch.from_trajectories(trajs, int(self.tokenizer.pad_token_id)).to(self.device)  # type: ignore[arg-type]
        metrics = rollout_metrics(trajs)

        # 3. Advantages: group-relative, one per sequence.
        adv, adv_stats = group_advantages(batch.rewards, G, cfg.scale_rewards)
        metrics.update(adv_stats)

        # 4. Update: μ epochs × minibatches, gradient accumulation over micro-batches.
        t1 = time.perf_counter()
        metrics.update(self.update(batch, adv))
        t_update = time.perf_counter() - t1

        # 5. Log (the caller checkpoints).
        self.step += 1
        step_s = time.perf_counter() - t0
        tokens = float(batch.loss_mask.sum())
        metrics.update(
            {
                "lr": float(self.scheduler.get_last_lr()[0]),
                "time/rollout_s": t_rollout,
                "time/update_s": t_update,
                "time/step_s": step_s,
                "throughput/tokens_per_s": tokens / step_s,
            }
        )
        return metrics

    def update(self, batch: RolloutBatch, advantages: torch.Tensor) -> dict[str, float]:
        """Step 4: μ epochs over shuffled minibatches of `batch`, accumulating over micro-batches.

        Args:
            batch: the rollout batch (on the policy's device).
            advantages: [B] per-sequence advantages.

        Returns:
            Loss, KL, clip, entropy and gradient-norm metrics, averaged over optimizer steps
            (losses) or policy tokens (the rest).
        """
        cfg = self.cfg
        ref_logprobs = self._reference_logprobs(batch)
        advantages = advantages.to(self.device)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        updates = 0
        self.policy.train()
        for _ in range(cfg.epochs):
            for mb in _chunks(torch.randperm(len(batch)), self.minibatch_size):
                num_tokens = float(batch.loss_mask[mb].sum().clamp(min=1.0))
                self.optimizer.zero_grad(set_to_none=True)
                for micro in _chunks(mb, self.micro_batch_size):
                    sub = batch.select(micro)
                    logprobs, entropy = sequence_logprobs(
                        self.policy, sub, cfg.sampling.temperature, with_entropy=True
                    )
                    micro_d = micro.to(self.device)
                    loss, stats = clipped_policy_loss(
                        logprobs,
                        sub.old_logprobs,
                        advantages[micro_d],
                        sub.loss_mask,
                        clip_low=cfg.clip_low,
                        clip_high=cfg.clip_high,
                        aggregation=cfg.loss_aggregation,
                        ref_logprobs=None
                        if ref_logprobs is None
                        else ref_logprobs[micro_d, : sub.loss_mask.shape[1]],
                        kl_coef=cfg.kl_coef,
                        kl_estimator=cfg.kl_estimator,
                        num_seqs=len(mb),
                        num_tokens=num_tokens,
                        norm_len=cfg.sampling.max_new_tokens,
                    )
                    loss.backward()
                    w = float(sub.loss_mask.sum())
                    assert entropy is not None
                    stats["entropy"] = float((entropy * sub.loss_mask).sum() / max(w, 1.0))
                    stats["loss/total"] = float(loss.detach())
                    for k, v in stats.items():
                        if k.startswith("loss/"):
                            sums[k] += v  # micro-batch losses add up to the minibatch loss
                        else:
                            sums[k] += v * w
                            weights[k] += w
                if cfg.optim.max_grad_norm is not None:
                    gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.max_grad_norm)
                    sums["grad_norm"] += float(gn)
                    weights["grad_norm"] += 1.0
                self.optimizer.step()
                self.scheduler.step()
                updates += 1
        return {
            k: v / updates if k.startswith("loss/") else v / max(weights[k], 1e-12) for k, v in sums.items()
        }

    @torch.no_grad()
    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        if self.reference is None:
            return None
        parts = []
        for micro in _chunks(torch.arange(len(batch)), self.micro_batch_size):
            sub = batch.select(micro)
            lp, _ = sequence_logprobs(self.reference, sub, self.cfg.sampling.temperature)
            parts.append(torch.nn.functional.pad(lp, (0, batch.loss_mask.shape[1] - lp.shape[1])))
        return torch.cat(parts)

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.stage_dir,
            self.step,
            self.policy,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            {"cursor": self.sampler.cursor},
            keep=self.cfg.keep_checkpoints,
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps`, logging and checkpointing; return the saved final model folder."""
        cfg = self.cfg

        def periodic_eval(metrics: dict[str, float]) -> None:
            if self.eval_fn is not None and cfg.eval_every and self.step % cfg.eval_every == 0:
                metrics.update(self.eval_fn(self.policy, self.tokenizer))

        run_loop(
            self,
            name="grpo",
            steps=cfg.steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            echo=echo,
            after_step=periodic_eval,
            describe=lambda m: (
                f"reward {m['rollout/reward_mean']:.3f}  len {m['rollout/response_length_mean']:.1f}"
                f"  clip {m['clip/frac']:.3f}  entropy {m['entropy']:.3f}  {m['time/step_s']:.2f}s/step"
            ),
        )
        return save_final(self.stage_dir, self.policy, self.tokenizer)
