"""Online DPO (Guo et al. 2024, arXiv:2402.04792): a DPO-family step on pairs sampled from the current policy.

Offline DPO trains on pairs sampled once, from the start model; as the policy moves, they stop
being its own. Online DPO samples them afresh every step and labels them with a scorer (the
paper's "online AI feedback" is an LLM annotator; here the env's reward — its verifier rubric,
an LLM-judge term — or a Bradley–Terry reward model), then takes one DPO step against the
reference (the stage's start model).

One step (`OnlineDPOTrainer.train_step`):
1 sample `samples_per_prompt` responses to each of the next `prompts_per_step` tasks from the
  current policy · 2 score each response (the env's reward, or the reward model's score) ·
3 pair the best against the worst response of each task (`best_vs_worst`; tasks whose scores do
  not differ by the margin are skipped and counted) · 4 the reference's log-probs of the pairs'
  responses, no grad (the frozen start model, or with LoRA the policy with its adapters off;
  none for SimPO and ORPO) · 5 the loss (`pair_losses`: DPO, IPO, SimPO or ORPO from
  `textgym.algorithms.preference_losses`), the mean over the step's pairs accumulated over
  micro-batches; clip, one optimizer step · 6 (vLLM) push the weights into the engine; log.

Sequence log-probabilities are sums over the response's policy tokens (`loss_mask`; environment
turns of a multi-turn episode are left out) of the model's own distribution, temperature 1,
whatever the sampling temperature: DPO's implicit reward β·log π/π_ref is of π itself (as TRL's
`OnlineDPOTrainer`). The sampler's log-probs are not used, so a vLLM engine needs no correction.

Distributed (torchrun), each rank samples its contiguous slice of the step's tasks; the
trajectories are gathered, so every rank pairs the whole batch alike, and each rank trains its
slice of the pairs (`rank_micro_batches`, with weight-0 filler micro-batches so that every rank
makes the same forward calls). A rank's loss is its sum over pairs divided by the global pair
count, times the ranks (FSDP averages gradients): the gradient of one process on the whole step.
"""

from __future__ import annotations

import contextlib
import copy
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory
from textgym.config import ConfigError, OnlineDPOConfig, ParallelConfig
from textgym.envs.registry import task_count
from textgym.trainers.preference.online_pairs import best_vs_worst, pair_losses
from textgym.trainers.sampled_stage import train_sampled_stage
from textgym.training.batch import RolloutBatch, rank_micro_batches, token_budget_micro_batches
from textgym.training.checkpoint import save_checkpoint
from textgym.training.envs import make_env
from textgym.training.logprobs import sequence_logprobs
from textgym.training.optim import build_optimizer
from textgym.training.placement import shard
from textgym.training.precision import compute_autocast
from textgym.training.rollout_metrics import hack_warning, rollout_metrics
from textgym.training.sampler import TaskSampler
from textgym.training.sources.base import RolloutRequest, RolloutSettings
from textgym.training.sources.local import AgentSource
from textgym.training.sources.vllm_engine import build_engine, sync_weights
from textgym.training.trainer import prepare_policy, resume_checkpoint, stage_logger
from textgym.training.trajectory_log import log_trajectories, prune_trajectories

EvalFn = Callable[[PreTrainedModel, PreTrainedTokenizerBase], dict[str, float]]


def models_in_memory(cfg: OnlineDPOConfig) -> list[str]:
    """Which models the stage holds: the policy, the reference (DPO, IPO), the reward model (its scorer)."""
    models = ["policy"]
    if cfg.uses_reference:
        models.append("reference" if cfg.lora is None else "reference (policy, adapters off)")
    if cfg.scorer_env.reward_model is not None:
        models.append("reward model")
    return models


class OnlineDPOTrainer:
    """Trains `model` in place with online DPO (or IPO, SimPO, ORPO) on pairs it samples itself.

    Args:
        cfg: the stage config.
        model: the policy (already on its device); the reference is a frozen copy of it as given.
        tokenizer: its tokenizer (chat template, pad and EOS ids).
        stage_dir: where metrics, TensorBoard events, checkpoints and `final/` go.
        seed: seed of task sampling (and of `rollout.per_sequence_seeds`).
        resume: continue from the newest checkpoint in `stage_dir` when there is one.
        eval_fn: called as `eval_fn(model, tokenizer) -> {metric: value}` every `cfg.eval_every` steps.
        parallel: sharding, mixed precision and gradient checkpointing (default `ParallelConfig()`).
        log_with: trackers beside `metrics.jsonl` (`textgym.tracking`).

    Attributes:
        trajectories: the last step's sampled trajectories (the global batch, `samples_per_prompt`
            consecutive rows per task), with their scores in `reward`.
        pairs: the last step's (chosen, rejected) rows of `trajectories`.

    Raises:
        ConfigError: under torchrun, when `prompts_per_step` is not a multiple of the ranks, the
            engine is vLLM, or `micro_batch_tokens` is set.
    """

    name = "online_dpo"

    def __init__(
        self,
        cfg: OnlineDPOConfig,
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
        self.cfg, self.world, self.seed, self.eval_fn = cfg, distributed.world(), seed, eval_fn
        W = self.world.size
        if W > 1 and (cfg.prompts_per_step % W or cfg.rollout.backend == "vllm" or cfg.micro_batch_tokens):
            raise ConfigError(
                f"online_dpo on {W} ranks: prompts_per_step ({cfg.prompts_per_step}) must be a multiple of "
                "the ranks, with the transformers rollout backend and micro_batch_size (no token budget)"
            )
        self.parallel = parallel or ParallelConfig()
        self.stage_dir = Path(stage_dir)
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        # 1 the reference: a frozen copy of the start policy (LoRA: the policy with adapters off)
        self.reference: Any = None
        if cfg.uses_reference and cfg.lora is None:
            self.reference = copy.deepcopy(model).eval().requires_grad_(False)
        # π and π_ref are compared across passes: dropout off
        model = prepare_policy(
            model, cfg.lora, seed=seed, gradient_checkpointing=self.parallel.gradient_checkpointing
        )
        self.tokenizer, self.pad_id = tokenizer, int(tokenizer.pad_token_id)  # type: ignore[arg-type]
        # 2 the sampling side: one env (with the scorer) per response of this rank's tasks
        k = cfg.prompts_per_step // W * cfg.samples_per_prompt
        self.agent = LLMAgent(model, tokenizer, batch_size=k)
        self.params = SamplingParams(**cfg.sampling.model_dump())
        self.envs = [make_env(cfg.scorer_env) for _ in range(k)]
        self.sampler = TaskSampler(task_count(self.envs[0]), seed)
        # 3 sharding (FSDP2 under torchrun), the optimizer, resume
        self.policy = shard(model, self.parallel, self.device)
        if self.reference is not None:
            shard(self.reference, self.parallel, self.device)
        self.split = distributed.is_sharded(self.policy)  # every rank makes the same forward calls
        self.optimizer, self.scheduler = build_optimizer(self.policy, cfg.optim, cfg.steps)
        models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]] = {
            "policy": (self.policy, self.optimizer)
        }
        if self.reference is not None:
            models["reference"] = (self.reference, None)
        scorer = getattr(getattr(self.envs[0], "verifier", None), "model", None)  # the reward model
        if isinstance(scorer, torch.nn.Module):
            models["reward_model"] = (scorer, None)
        self.memory = distributed.memory_report(models)
        self.step = 0
        state = resume_checkpoint(self.stage_dir, resume, self.policy, self.optimizer, self.scheduler)
        if state is not None:
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
        # 4 the vLLM engine (fed the policy's weights), logging
        self.engine: Any = build_engine(cfg, model, tokenizer, self.agent.backend.eos_ids, seed)
        if self.engine is not None:
            self.agent = LLMAgent(model, tokenizer, backend=self.engine)
        settings = RolloutSettings.of(cfg, group_size=cfg.samples_per_prompt)
        self.source = AgentSource(settings, self.agent, self.envs, self.params, self._sampling_context)
        self.logger = stage_logger(self.stage_dir, state, log_with, cfg)
        self.trajectory_dir = self.stage_dir / "trajectories"
        if cfg.log_trajectories and distributed.is_main():
            prune_trajectories(self.trajectory_dir, self.step)
        self.trajectories: list[Trajectory] = []
        self.pairs: list[tuple[int, int]] = []

    # --- 1 sample -----------------------------------------------------------------------
    def sample(self) -> list[Trajectory]:
        """`samples_per_prompt` scored responses to each of the step's tasks: the global batch.

        Every rank draws the same tasks and samples its contiguous slice of them; the slices are
        gathered in rank order. With `rollout.per_sequence_seeds`, response j to the task in slot g
        is seeded by `(seed, step, 0, g, j)`, so it depends on the policy and that seed only.
        """
        cfg, w, G = self.cfg, self.world, self.cfg.samples_per_prompt
        tasks = self.sampler.next(cfg.prompts_per_step)
        k = cfg.prompts_per_step // w.size
        first = w.rank * k
        seeds = None
        if cfg.rollout.per_sequence_seeds:
            seeds = [derive_seed(self.seed, self.step, 0, first + g, j) for g in range(k) for j in range(G)]
        trajs = self.source.rollout(RolloutRequest(tasks[first : first + k], seeds, first_group=first))
        return distributed.all_gather_list(trajs)

    def _sampling_context(self) -> contextlib.ExitStack:
        """Entered around a rollout: the policy's full weights, its compute precision.

        The full weights under torchrun; the precision on the transformers backend
        (`precision.compute_autocast`).
        """
        stack = contextlib.ExitStack()
        stack.enter_context(distributed.full_params(self.policy))
        if self.engine is None:
            stack.enter_context(compute_autocast(self.policy))
        return stack

    # --- 4, 5 log-probs and the loss ----------------------------------------------------
    def _rows(self, idx: list[int]) -> list[Trajectory]:
        """The chosen responses of the pairs `idx`, then their rejected ones."""
        return [self.trajectories[self.pairs[i][0]] for i in idx] + [
            self.trajectories[self.pairs[i][1]] for i in idx
        ]

    def _logps(self, model: Any, idx: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed response log-probs [2b], policy-token counts [2b]) of `_rows(idx)` under `model`."""
        batch = RolloutBatch.from_trajectories(self._rows(idx), self.pad_id).to(self.device)
        per_token, _ = sequence_logprobs(model, batch, 1.0, split_prompt=self.split, packed=self.cfg.packing)
        return (per_token * batch.loss_mask).sum(-1), batch.loss_mask.sum(-1)

    def _micro_batches(self, n_pairs: int) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of pair indices, with fillers (`rank_micro_batches`), or by tokens."""
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            return rank_micro_batches(list(range(n_pairs)), self.cfg.micro_batch_size or n_pairs)
        t = self.trajectories
        prompt = [t[c].prompt_length for c, _ in self.pairs]
        response = [max(len(t[i].token_ids) - t[i].prompt_length for i in p) for p in self.pairs]
        # two rows (chosen, rejected) per pair: half the budget per pair
        cut = token_budget_micro_batches(
            prompt, response, list(range(n_pairs)), max(budget // 2, 1), self.cfg.packing
        )
        return [(m, False) for m in cut]

    @torch.no_grad()
    def _reference_logps(self, micros: list[tuple[list[int], bool]]) -> list[torch.Tensor | None]:
        """The reference's summed log-probs [2b] of each micro-batch's rows (None: reference-free loss)."""
        if not self.cfg.uses_reference:
            return [None] * len(micros)
        if self.reference is not None:
            return [self._logps(self.reference, idx)[0] for idx, _ in micros]
        from textgym.training.lora import reference_of

        was = self.policy.training
        self.policy.eval()
        try:
            with reference_of(self.policy) as ref:
                return [self._logps(ref, idx)[0] for idx, _ in micros]
        finally:
            self.policy.train(was)

    def update(self) -> dict[str, float]:
        """One optimizer step of the loss over `self.pairs`; returns its metrics (global means)."""
        n = len(self.pairs)
        micros = self._micro_batches(n)
        refs = self._reference_logps(micros)
        W = self.world.size  # FSDP averages the ranks' gradients: each rank's loss is scaled by W
        self.policy.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        for j, ((idx, filler), ref) in enumerate(zip(micros, refs, strict=True)):
            distributed.set_requires_gradient_sync(self.policy, j == len(micros) - 1)
            lp, lengths = self._logps(self.policy, idx)
            b = len(idx)
            losses, stats = pair_losses(
                self.cfg,
                lp[:b],
                lp[b:],
                lengths[:b],
                lengths[b:],
                None if ref is None else ref[:b],
                None if ref is None else ref[b:],
            )
            loss = losses.sum() / n * (0.0 if filler else W)
            loss.backward()
            if filler:
                continue
            sums[f"loss/{self.cfg.loss}"] += float(losses.detach().sum()) / n
            for key, v in stats.items():
                sums[key] += v * b / n
            sums["logps/chosen"] += float(lp[:b].detach().sum()) / n
            sums["logps/rejected"] += float(lp[b:].detach().sum()) / n
            if ref is not None:  # Σ_t log π − log π_ref per response, mean over the 2n responses
                sums["kl/ref"] += float((lp.detach() - ref).sum()) / (2 * n)
        metrics = distributed.reduce_metrics(
            dict(sums), ops={k: "sum" for k in sums}
        )  # parts of global means
        if self.cfg.optim.max_grad_norm is not None:
            gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.optim.max_grad_norm)
            metrics["grad_norm"] = distributed.grad_norm(gn)
        self.optimizer.step()
        self.scheduler.step()
        return metrics

    # --- the step -------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One step: sample, score, pair, update (see the module docstring); returns its metrics."""
        cfg = self.cfg
        t0 = time.perf_counter()
        # 1 sample and 2 score (the env's reward, or the reward model's: in `reward`)
        self.trajectories = trajs = self.sample()
        t_rollout = time.perf_counter() - t0
        metrics = rollout_metrics(trajs, gather=False)
        if cfg.log_trajectories and distributed.is_main():
            log_trajectories(
                self.trajectory_dir,
                trajs,
                step=self.step,
                group_size=cfg.samples_per_prompt,
                env_kwargs=cfg.env.kwargs,
                policy=str(self.stage_dir),
            )
        # 3 best vs worst of each task
        self.pairs, skipped = best_vs_worst([t.reward for t in trajs], cfg.samples_per_prompt, cfg.margin)
        metrics["pairs/count"] = float(len(self.pairs))
        metrics["pairs/skipped_prompts"] = float(skipped)
        t1 = time.perf_counter()
        if self.pairs:  # 4 reference log-probs, 5 the loss and one optimizer step
            metrics["pairs/score_chosen"] = sum(trajs[c].reward for c, _ in self.pairs) / len(self.pairs)
            metrics["pairs/score_rejected"] = sum(trajs[r].reward for _, r in self.pairs) / len(self.pairs)
            metrics.update(self.update())
        # 6 the engine gets the new weights
        if self.engine is not None:
            sync_weights(self.engine, self.policy)
        self.step += 1
        step_s = time.perf_counter() - t0
        tokens = sum(float(t.loss_mask.sum()) for t in trajs)
        metrics.update(
            {
                "lr": float(self.scheduler.get_last_lr()[0]),
                "time/rollout_s": t_rollout,
                "time/update_s": time.perf_counter() - t1,
                "time/step_s": step_s,
                "throughput/tokens_per_s": tokens / step_s,
            }
        )
        return metrics

    # --- checkpoints and the loop --------------------------------------------------------
    def save(self) -> Path:
        """Checkpoint the current step (policy, optimizer, scheduler, RNG states, task cursor)."""
        held = (self.policy, self.tokenizer, self.optimizer, self.scheduler)
        state = {"cursor": self.sampler.cursor}
        return save_checkpoint(self.stage_dir, self.step, *held, state, keep=self.cfg.keep_checkpoints)

    def describe(self, m: dict[str, float]) -> str:
        """One progress line from a step's metrics."""
        acc = f"  acc {m['rollout/accuracy']:.3f}" if "rollout/accuracy" in m else ""
        loss = f"  loss {m[f'loss/{self.cfg.loss}']:.4f}" if f"loss/{self.cfg.loss}" in m else ""
        pref = f"  pref-acc {m['rewards/accuracy']:.2f}" if "rewards/accuracy" in m else ""
        return (
            f"reward {m['rollout/reward_mean']:.3f}{acc}  pairs {m['pairs/count']:.0f}{loss}{pref}"
            f"  {m['time/step_s']:.2f}s/step{hack_warning(m)}"
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps`, logging and checkpointing; return the saved final model folder."""
        final = train_sampled_stage(self, echo)
        self.close()
        return final

    def close(self) -> None:
        """Release the rollout engine (vLLM) and the environments."""
        if self.engine is not None:
            self.engine.close()
            self.engine = None
        for e in self.envs:
            e.close()
