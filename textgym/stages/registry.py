"""The stages of `textgym train`, registered in run order, and what every stage shares.

A stage is a function `run(ctx, model_path) -> StageResult` registered under the name of its
`RunConfig` field with `@register_stage(name, order=...)`. `textgym.pipeline.run` takes the
stages whose field is set (`enabled_stages`), in `order`; it evaluates the model that enters
each stage that asks for it (`evaluate_before`; the last such evaluation is the run's "before")
and the model that leaves the last one, and writes the summary. A stage's `check` runs in
`textgym.pipeline.preflight`, before any work.

The built-in stages register when their modules are imported (`textgym.pipeline` imports them,
and `STAGES`, a `textgym.algorithms.registry.Registry`, does before its first lookup):
`sft` (order 0), `grpo` / `ppo` (10, 11), `dpo` (20), `rft` (30), `online_dpo` (40).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import yaml

from textgym import distributed
from textgym.algorithms.registry import Registry
from textgym.config import RunConfig
from textgym.models import load_model


@dataclass(frozen=True)
class StageContext:
    """What a stage gets from the run: its config, folder, device, resume flag and echo."""

    cfg: RunConfig
    run_dir: Path
    device: torch.device
    resume: bool
    echo: Callable[[str], None]


@dataclass
class StageResult:
    """What a stage gives back.

    Attributes:
        model_path: the folder of the model it leaves (the next stage's start).
        seconds: its wall time in seconds, or None when it was skipped (finished earlier).
        summary: entries for `summary.json` (e.g. `models_in_memory`, `dpo_rounds`).
    """

    model_path: Path
    seconds: float | None
    summary: dict[str, Any] = field(default_factory=dict)


StageFn = Callable[[StageContext, Path], StageResult]


def _always(cfg: RunConfig) -> bool:
    return True


@dataclass(frozen=True)
class Stage:
    """A registered stage: its `RunConfig` field name, run order, function and hooks."""

    name: str
    order: int
    run: StageFn
    evaluate_before: Callable[[RunConfig], bool] = _always
    check: Callable[[RunConfig], None] | None = None


STAGES: Registry[Stage] = Registry(
    "stage",
    "",
    "@register_stage(name, order=...) from textgym.stages.registry",
    modules=[f"textgym.stages.{m}" for m in ("sft", "rl", "preference", "rft", "online_dpo")],
)
"""Registered stages by name (the built-ins imported before the first lookup)."""


def register_stage(
    name: str,
    *,
    order: int,
    evaluate_before: Callable[[RunConfig], bool] = _always,
    check: Callable[[RunConfig], None] | None = None,
    replace: bool = False,
) -> Callable[[StageFn], StageFn]:
    """Register `fn(ctx, model_path) -> StageResult` as the stage of `RunConfig.<name>`.

    Args:
        name: the `RunConfig` field that enables the stage (the stage runs when it is set).
        order: where it runs among the enabled stages (ascending).
        evaluate_before: whether the model that enters it is evaluated (with `eval:` set).
        check: extra validation for `preflight` (raises `ConfigError` naming the field).
        replace: allow replacing a stage already registered under `name`.

    Raises:
        ValueError: `name` is not a `RunConfig` field, or is registered already (and `replace`
            is False).
    """

    def deco(fn: StageFn) -> StageFn:
        if name not in RunConfig.model_fields:
            raise ValueError(f"stage {name!r}: RunConfig has no field {name!r}")
        STAGES.register(name, replace=replace)(Stage(name, order, fn, evaluate_before, check))
        return fn

    return deco


def enabled_stages(cfg: RunConfig) -> list[Stage]:
    """The registered stages whose config field is set, in run order."""
    stages = (STAGES.get(name) for name in STAGES.names() if getattr(cfg, name) is not None)
    return sorted(stages, key=lambda s: s.order)


def write_yaml(path: Path, cfg: Any) -> None:
    """Write a pydantic config as YAML (its JSON-mode dump, fields in declaration order)."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")


def train_stage(
    ctx: StageContext, name: str, stage_cfg: Any, model_path: Path, trainer_cls: Any, **kwargs: Any
) -> StageResult:
    """Train one trainer stage from `model_path` in `<run_dir>/<name>/`, in the run's model dtype.

    Loads the model, writes the stage's `config.yaml` (rank 0), builds
    `trainer_cls(stage_cfg, model, tokenizer, stage_dir, seed=, resume=, parallel=, log_with=,
    **kwargs)` from the run's config and calls its `train(echo)`, which returns the final
    folder. With `resume`, a stage whose `final/` exists is skipped (`seconds` None).
    """
    stage_dir = ctx.run_dir / name
    if ctx.resume and (stage_dir / "final" / "config.json").is_file():
        ctx.echo(f"{name}: finished earlier, skipped")
        return StageResult(stage_dir / "final", None)
    t = time.perf_counter()
    model, tok = load_model(model_path, getattr(torch, ctx.cfg.model.dtype), ctx.device)
    if distributed.is_main():
        stage_dir.mkdir(parents=True, exist_ok=True)
        write_yaml(stage_dir / "config.yaml", stage_cfg)
    distributed.barrier()
    cfg = ctx.cfg
    trainer = trainer_cls(
        stage_cfg,
        model,
        tok,
        stage_dir,
        seed=cfg.seed,
        resume=ctx.resume,
        parallel=cfg.parallel,
        log_with=cfg.log_with,
        **kwargs,
    )
    final: Path = trainer.train(ctx.echo)
    return StageResult(final, time.perf_counter() - t)
