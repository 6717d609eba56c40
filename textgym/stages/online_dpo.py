"""The `online_dpo:` stage: each step samples pairs from the current policy; evaluated before and after."""

from __future__ import annotations

from pathlib import Path

from textgym import distributed
from textgym.stages.evaluate import periodic_eval
from textgym.stages.registry import StageContext, StageResult, register_stage, train_stage
from textgym.training.seeding import seed_everything


@register_stage("online_dpo", order=40)
def online_dpo_stage(ctx: StageContext, model_path: Path) -> StageResult:
    """Train `OnlineDPOTrainer` in `<run_dir>/online_dpo/`, with periodic evals when `eval:` is set."""
    from textgym.trainers.preference.online import OnlineDPOTrainer, models_in_memory

    cfg, odpo = ctx.cfg, ctx.cfg.online_dpo
    assert odpo is not None
    seed_everything(distributed.rank_seed(cfg.seed + 1))
    result = train_stage(
        ctx, "online_dpo", odpo, model_path, OnlineDPOTrainer, eval_fn=periodic_eval(cfg.eval)
    )
    result.summary["models_in_memory"] = models_in_memory(odpo)
    return result
