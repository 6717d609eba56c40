"""The RL stage, `grpo:` (the GRPO family) or `ppo:`: the on-policy loop, evaluated before and after."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textgym import distributed
from textgym.algorithms.registry import ADVANTAGES, POLICY_LOSSES, Registry, UnknownNameError
from textgym.config import ConfigError, RunConfig
from textgym.stages.evaluate import periodic_eval
from textgym.stages.registry import StageContext, StageResult, register_stage, train_stage
from textgym.training.seeding import seed_everything


def check_rl(cfg: RunConfig) -> None:
    """The names the registries must know (advantage estimator, policy loss), and the rollout servers.

    Raises:
        ConfigError: naming the field (`grpo.advantage_estimator`, `<stage>.policy_loss`,
            `<stage>.rollout.servers...`).
    """
    if cfg.grpo is not None:
        _check_name("grpo", ADVANTAGES, cfg.grpo.advantage_estimator)
    for stage_name, stage in (("grpo", cfg.grpo), ("ppo", cfg.ppo)):
        if stage is None:
            continue
        _check_name(stage_name, POLICY_LOSSES, stage.policy_loss)
        if stage.rollout.servers:  # reachable, with --weight-sync, one model (vocab: at the stage)
            from textgym.training.sources.remote import check_servers

            r = stage.rollout
            try:
                check_servers(r.servers, model=r.server_model, timeout_s=r.sync_http_timeout_s)
            except ConfigError as e:
                raise ConfigError(f"{stage_name}.{e}") from None


def _check_name(stage_name: str, registry: Registry[Any], name: str) -> None:
    """Look `name` up in `registry`.

    Raises:
        ConfigError: the registry's `UnknownNameError` text, prefixed with the stage's section
            (`grpo.advantage_estimator: unknown advantage estimator ...`).
    """
    try:
        registry.get(name)
    except UnknownNameError as e:
        raise ConfigError(f"{stage_name}.{e}") from None


def models_in_memory(cfg: RunConfig) -> list[str]:
    """Which models the RL stage holds: policy, reference (β > 0), critic (PPO)."""
    rl = cfg.rl
    models = ["policy"]
    if rl is not None and rl.kl_coef > 0:
        # With LoRA the reference is the policy with its adapters disabled: no second model.
        models.append("reference" if rl.lora is None else "reference (policy, adapters off)")
    if cfg.ppo is not None:
        models.append("critic")
    return models


def rl_stage(ctx: StageContext, model_path: Path) -> StageResult:
    """Train `GRPOTrainer` or `PPOTrainer` in `<run_dir>/grpo/` or `ppo/`, with periodic evals."""
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.trainers.rl.ppo import PPOTrainer

    cfg, rl_cfg = ctx.cfg, ctx.cfg.rl
    assert rl_cfg is not None
    stage = "grpo" if cfg.grpo is not None else "ppo"
    trainer_cls = GRPOTrainer if stage == "grpo" else PPOTrainer
    eval_fn = periodic_eval(cfg.eval) if rl_cfg.eval_every else None
    seed_everything(distributed.rank_seed(cfg.seed + 1))
    result = train_stage(ctx, stage, rl_cfg, model_path, trainer_cls, eval_fn=eval_fn)
    result.summary["models_in_memory"] = models_in_memory(cfg)
    return result


register_stage("grpo", order=10, check=check_rl)(rl_stage)
register_stage("ppo", order=11, check=check_rl)(rl_stage)
