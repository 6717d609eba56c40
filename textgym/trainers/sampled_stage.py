"""`train()` of the trainers that sample their own data each step: the on-policy RL trainer, online DPO.

Both run the same stage shell (the memory report, `run_loop` to `cfg.steps` at the config's
logging, checkpoint and evaluation cadence, the final model) around their own `train_step`;
`train_sampled_stage` is that shell, over the few attributes it reads (`SampledStage`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from textgym.tracking import Logger
from textgym.training.loop import run_loop
from textgym.training.trainer import announce_memory, eval_every, save_final_model


class SampledStage(Protocol):
    """What `train_sampled_stage` reads of a trainer."""

    name: str
    cfg: Any
    """The stage config: `steps`, `log_every`, `checkpoint_every`, `eval_every`, `lora`."""
    step: int
    memory: dict[str, Any]
    stage_dir: Path
    policy: Any
    tokenizer: Any
    eval_fn: Callable[[Any, Any], dict[str, float]] | None

    @property
    def logger(self) -> Logger:
        """Where metrics go."""
        ...

    def train_step(self) -> dict[str, float]:
        """One iteration; its metrics."""
        ...

    def save(self) -> Path:
        """Checkpoint the current step."""
        ...

    def describe(self, m: dict[str, float]) -> str:
        """One progress line from a step's metrics."""
        ...


def train_sampled_stage(trainer: SampledStage, echo: Callable[[str], None] | None) -> Path:
    """Run `trainer` from its step to `cfg.steps`, logging, checkpointing, evaluating; save the final model.

    Returns the final model folder (`<stage_dir>/final`, and `final_adapter` with LoRA).
    """
    cfg, t = trainer.cfg, trainer
    announce_memory(t.name, t.memory, t.stage_dir, echo)
    evaluate = eval_every(t.policy, t.tokenizer, t.eval_fn, cfg.eval_every)
    loop = {"start": t.step, "name": t.name, "steps": cfg.steps, "log_every": cfg.log_every}
    loop |= {"checkpoint_every": cfg.checkpoint_every, "echo": echo, "describe": t.describe}
    run_loop(t.train_step, t.save, t.logger, after_step=evaluate, **loop)
    return save_final_model(trainer.stage_dir, trainer.policy, trainer.tokenizer, lora=cfg.lora is not None)
