"""One trainer shell, composed not inherited: the set-up, resume, train and save steps every trainer takes.

A trainer is a plain class (no base class) that calls these from its `__init__` and `train()`,
in this order:

    model = prepare_policy(model, cfg.lora, seed=seed, gradient_checkpointing=..., dropout_off=...)
    model = shard(model, parallel, device)                      # training.placement
    optimizer, scheduler = build_optimizer(model, cfg.optim, steps)   # training.optim
    state = resume_checkpoint(stage_dir, resume, model, optimizer, scheduler)
    logger = stage_logger(stage_dir, state, log_with, cfg)
    ...
    def train(self, echo) -> Path:
        announce_memory(name, self.memory, stage_dir, echo)
        run_loop(self.train_step, self.save, self.logger, start=self.step, ...,
                 after_step=eval_every(model, tokenizer, eval_fn, cfg.eval_every))  # training.loop
        return save_final_model(stage_dir, model, tokenizer, lora=cfg.lora is not None)

Every trainer's `train(echo)` returns the folder of the model it saved (the reward-model
trainers keep their figures in `.figures`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.models import disable_dropout
from textgym.tracking import CompositeLogger, metrics_logger
from textgym.training.checkpoint import latest_checkpoint, load_checkpoint, save_final, save_lora_final


def prepare_policy(
    model: Any, lora: Any, *, seed: int, gradient_checkpointing: bool, dropout_off: bool = True
) -> Any:
    """The policy as it trains, before sharding: LoRA adapters, dropout off, gradient checkpointing.

    Args:
        model: the start model (a Hugging Face causal LM, on its device).
        lora: the stage's `LoraSettings`, or None for full fine-tuning; fresh adapters are
            initialised from `seed` (B = 0, so the adapted model starts equal to `model`).
        seed: the seed of the adapters' initialisation.
        gradient_checkpointing: recompute activations in the backward pass (non-reentrant).
        dropout_off: switch dropout off, where a loss compares passes of the same weights
            (π with π_old or π_ref: they agree only without dropout; `models.disable_dropout`).

    Returns:
        The model to shard and train (a peft model with `lora`, else `model` itself).
    """
    if lora is not None:
        from textgym.training.lora import apply_lora

        model = apply_lora(model, lora, seed=seed)
    if dropout_off:
        disable_dropout(model)
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def resume_checkpoint(
    stage_dir: Path, resume: bool, model: torch.nn.Module, optimizer: Any, scheduler: Any
) -> dict[str, Any] | None:
    """Load the newest checkpoint under `stage_dir` when resuming; return its state, else None.

    The weights, optimizer, scheduler and RNG states are restored in place (see
    `training.checkpoint.load_checkpoint`); the state dict holds `step`, whatever the trainer
    saved beside it (`cursor`, ...), and `checkpoint_dir`, the folder it was read from (where a
    trainer's own files are). None when not resuming or when there is no checkpoint yet.
    """
    ckpt = latest_checkpoint(stage_dir) if resume else None
    if ckpt is None:
        return None
    return {**load_checkpoint(ckpt, model, optimizer, scheduler), "checkpoint_dir": str(ckpt)}


def stage_logger(
    stage_dir: Path, state: dict[str, Any] | None, log_with: Sequence[str], config: Any
) -> CompositeLogger:
    """The stage's metrics logger; resumed from a checkpoint, it keeps nothing past that step."""
    resume_step = None if state is None else int(state["step"])
    return metrics_logger(stage_dir, resume_step=resume_step, log_with=log_with, config=config)


def announce_memory(
    name: str, memory: dict[str, dict[str, float]], stage_dir: Path, echo: Callable[[str], None] | None
) -> None:
    """Echo the per-rank memory of each model and write it to `<stage_dir>/memory.json` (rank 0)."""
    if not distributed.is_main():
        return
    if echo is not None:
        echo(f"{name} memory on each of {distributed.world().size} rank(s):")
        for line in distributed.format_memory_report(memory).splitlines():
            echo(f"  {line}")
    (stage_dir / "memory.json").write_text(json.dumps(memory, indent=2), encoding="utf-8")


def eval_every(
    policy: Any, tokenizer: Any, eval_fn: Callable[[Any, Any], dict[str, float]] | None, every: int
) -> Callable[[int, dict[str, float]], None]:
    """`run_loop`'s `after_step`: every `every` steps, add `eval_fn(policy, tokenizer)`'s metrics.

    Rank 0 evaluates alone, on the full (gathered) weights under no_grad; every rank gets the
    figures. No evaluation when `eval_fn` is None or `every` is 0.
    """

    def after_step(step: int, metrics: dict[str, float]) -> None:
        if eval_fn is not None and every and step % every == 0:
            with torch.no_grad(), distributed.full_params(policy):
                metrics.update(distributed.on_main(lambda: eval_fn(policy, tokenizer)))

    return after_step


def save_final_model(stage_dir: Path, model: Any, tokenizer: Any, *, lora: bool) -> Path:
    """Save the trained policy to `<stage_dir>/final` (merged, plus `final_adapter` with LoRA); return it."""
    if lora:
        return save_lora_final(stage_dir, model, tokenizer)
    return save_final(stage_dir, model, tokenizer)
