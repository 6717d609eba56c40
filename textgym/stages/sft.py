"""The `sft:` stage: a supervised warm start (on the env's gold solutions, demonstrations or a store)."""

from __future__ import annotations

import json
from pathlib import Path

from textgym import distributed
from textgym.config import RunConfig
from textgym.stages.registry import StageContext, StageResult, enabled_stages, register_stage, train_stage
from textgym.training.seeding import seed_everything


def _alone(cfg: RunConfig) -> bool:
    """SFT is evaluated before only when it is the run's only stage (else the next stage is)."""
    return len(enabled_stages(cfg)) == 1


@register_stage("sft", order=0, evaluate_before=_alone)
def sft_stage(ctx: StageContext, model_path: Path) -> StageResult:
    """Train `SFTTrainer` in `<run_dir>/sft/`; with `sft.target`, the summary gets `sft_target`."""
    from textgym.trainers.sft import SFTTrainer

    cfg, sft_cfg = ctx.cfg, ctx.cfg.sft
    assert sft_cfg is not None
    seed_everything(distributed.rank_seed(cfg.seed))
    result = train_stage(ctx, "sft", sft_cfg, model_path, SFTTrainer)
    target = ctx.run_dir / "sft" / "target.json"
    if sft_cfg.target is not None and target.is_file():
        result.summary["sft_target"] = json.loads(target.read_text(encoding="utf-8"))
    return result
