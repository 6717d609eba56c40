"""Supervised fine-tuning on an environment's gold solutions (the warm start before RL).

Each example is the env's first observation rendered by the chat template (exactly the
prompt the policy sees in rollouts) followed by the task's `solution` and the
end-of-turn token; the loss is the token-mean NLL of the solution tokens only.
Loop: 1 draw tasks · 2 build the batch · 3 forward/backward over micro-batches ·
4 clip, step · 5 log and checkpoint.

Under torchrun every rank draws the same `batch_size` tasks and trains on its contiguous
`batch_size / ranks` of them with the model sharded (FSDP2); the token-mean's denominator is
this rank's share of the global token count, so the averaged gradient is the whole batch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.trajectory import RolloutBatch, Trajectory
from textgym.config import ConfigError, ParallelConfig, SFTConfig
from textgym.trainers.common import (
    TaskSampler,
    build_optimizer,
    latest_checkpoint,
    load_checkpoint,
    metrics_logger,
    run_loop,
    save_checkpoint,
    save_final,
    save_lora_final,
    sequence_logprobs,
)
from textgym.trainers.losses import sft_loss


class SFTTrainer:
    """Trains `model` in place on `(prompt, gold solution)` pairs of `cfg.env`.

    Args:
        cfg: the SFT stage config.
        model: the model (on its device); sharded in place under torchrun.
        tokenizer: its tokenizer.
        stage_dir: where metrics and checkpoints go.
        seed: seed of task sampling.
        resume: continue from the newest checkpoint in `stage_dir`.
        parallel: sharding, mixed precision and gradient checkpointing.

    Raises:
        ValueError: if the environment's tasks carry no gold `solution`.
        ConfigError: under torchrun, if `batch_size` is not a multiple of the number of ranks.
    """

    def __init__(
        self,
        cfg: SFTConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stage_dir: Path,
        *,
        seed: int = 0,
        resume: bool = False,
        parallel: ParallelConfig | None = None,
    ):
        self.cfg, self.model, self.tokenizer, self.stage_dir = cfg, model, tokenizer, Path(stage_dir)
        self.world = distributed.world()
        W, parallel = self.world.size, parallel or ParallelConfig()
        if cfg.batch_size % W:
            raise ConfigError(
                f"sft.batch_size={cfg.batch_size} must be a multiple of the number of ranks ({W})"
            )
        self.local_batch = cfg.batch_size // W
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        if cfg.lora is not None:
            from textgym.trainers.lora import apply_lora

            model = apply_lora(model, cfg.lora, seed=seed)
        if parallel.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        bf16 = distributed.resolve_mixed_precision(parallel.mixed_precision, self.device)
        self.model = model = distributed.shard(model, bf16=bf16)  # type: ignore[assignment]
        self.env = gym.make(cfg.env.id, **cfg.env.kwargs)
        tasks = self.env.unwrapped.tasks  # type: ignore[attr-defined]
        if tasks[0].solution is None:
            raise ValueError(f"{cfg.env.id} tasks have no gold solutions to fine-tune on")
        self.sampler = TaskSampler(len(tasks), seed)
        self.micro_batch_size = cfg.micro_batch_size or self.local_batch
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim, cfg.steps)
        self.memory = distributed.memory_report({"policy": (model, self.optimizer)})
        self.step = 0
        ckpt = latest_checkpoint(self.stage_dir) if resume else None
        if ckpt is not None:
            state = load_checkpoint(ckpt, model, self.optimizer, self.scheduler)
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
        self.logger = metrics_logger(self.stage_dir, resume_step=self.step if ckpt is not None else None)

    def example(self, task_index: int) -> Trajectory:
        """The supervised sequence of one task: prompt (mask 0) + solution + end-of-turn (mask 1)."""
        obs, _ = self.env.reset(options={"task_index": task_index})
        task = self.env.unwrapped.task  # type: ignore[attr-defined]
        prompt = self.tokenizer.apply_chat_template(
            obs, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        target = self.tokenizer(task.solution, add_special_tokens=False)["input_ids"] + [
            self.tokenizer.eos_token_id
        ]
        ids = list(prompt) + list(target)  # type: ignore[arg-type]
        mask = torch.tensor([0.0] * len(prompt) + [1.0] * len(target))
        return Trajectory(
            token_ids=torch.tensor(ids),
            loss_mask=mask,
            logprobs=torch.zeros(len(ids)),
            token_rewards=torch.zeros(len(ids)),
            prompt_length=len(prompt),
            messages=list(obs),
            reward=0.0,
        )

    def train_step(self) -> dict[str, float]:
        """One optimizer step on `batch_size` examples; returns its metrics."""
        t0 = time.perf_counter()
        # 1-2. Draw tasks (the same on every rank), keep this rank's slice, build the padded batch.
        tasks = self.sampler.next(self.cfg.batch_size)
        first = self.world.rank * self.local_batch
        batch = RolloutBatch.from_trajectories(
            [self.example(i) for i in tasks[first : first + self.local_batch]],
            int(self.tokenizer.pad_token_id),  # type: ignore[arg-type]
        ).to(self.device)
        local_tokens = float(batch.loss_mask.sum())
        num_tokens = distributed.share(local_tokens)  # the global count / ranks (FSDP averages)
        # 3. Forward/backward with gradient accumulation (token-mean over the whole batch).
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        starts = range(0, len(batch), self.micro_batch_size)
        for i in starts:
            distributed.set_requires_gradient_sync(self.model, i == starts[-1])
            sub = batch.select(list(range(i, min(len(batch), i + self.micro_batch_size))))
            logprobs, _ = sequence_logprobs(self.model, sub)
            loss, _ = sft_loss(logprobs, sub.loss_mask, num_tokens=num_tokens)
            loss.backward()
            total += float(loss.detach())
        # 4. Clip and step.
        metrics: dict[str, float] = {"loss/sft": total}
        if self.cfg.optim.max_grad_norm is not None:
            metrics["grad_norm"] = distributed.grad_norm(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
            )
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        dt = time.perf_counter() - t0
        metrics.update(
            {
                "lr": float(self.scheduler.get_last_lr()[0]),
                "time/step_s": dt,
                "throughput/tokens_per_s": local_tokens / dt,
            }
        )
        return distributed.reduce_metrics(metrics)

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.stage_dir,
            self.step,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            {"cursor": self.sampler.cursor},
            keep=self.cfg.keep_checkpoints,
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps` (5. log and checkpoint on the way); return the saved final model folder."""
        cfg = self.cfg
        if echo is not None and distributed.is_main():
            report = distributed.format_memory_report(self.memory)
            echo(f"sft memory on each of {self.world.size} rank(s): {report}")
        run_loop(
            self,
            name="sft",
            steps=cfg.steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            echo=echo,
            lines=10,
            describe=lambda m: f"loss {m['loss/sft']:.4f}  {m['time/step_s']:.2f}s/step",
        )
        if cfg.lora is not None:
            return save_lora_final(self.stage_dir, self.model, self.tokenizer)
        return save_final(self.stage_dir, self.model, self.tokenizer)
