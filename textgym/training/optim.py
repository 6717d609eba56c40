"""The optimizer and learning-rate schedule, and their state in the single-process checkpoint format.

Under torchrun the state is gathered to rank 0 to save and broadcast and re-sharded to load
(`textgym.distributed`), so an `optimizer.pt` loads on any number of ranks.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch.optim.lr_scheduler import LambdaLR

from textgym import distributed
from textgym.config import OptimConfig


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW (Loshchilov & Hutter 2019) with linear warm-up then constant / cosine / linear decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return opt, LambdaLR(opt, factor)


def load_optimizer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load an `optimizer.pt` (single-process format) into `optimizer`; collective when `model` is sharded."""
    need = distributed.is_main() or not distributed.is_sharded(model)
    state = torch.load(path, weights_only=False) if need else {}
    distributed.load_optimizer_state(model, optimizer, state)


def save_optimizer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write `optimizer`'s state to `path` in the single-process format (collective when sharded)."""
    state = distributed.optimizer_state(model, optimizer)
    if distributed.is_main():
        torch.save(state, path)
