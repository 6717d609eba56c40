"""Checks of a config against this machine, run before any work (not while validating a schema).

A schema validates the same everywhere, so a config can be written and checked on a laptop for
a GPU machine. What depends on the machine is checked here: that a reward-model folder holds a
trained model, that vLLM is installed when an RL stage generates with it, and that a judge's
rubric file and API-key variable exist (`env.judge`). `textgym.pipeline`
calls `validate_runtime` before a run starts and `textgym.training.envs.make_env` before
it builds an env, so the errors are as clear (and as early) as when the schemas checked them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from pydantic import BaseModel

from textgym.config.base import ConfigError, EnvConfig
from textgym.config.judge import JudgeTermConfig
from textgym.config.rl import RolloutEngineConfig


def _problems(cfg: BaseModel, prefix: str) -> list[str]:
    """`dotted.path: message (got value)` for each machine-dependent problem in `cfg`'s tree."""
    out: list[str] = []
    # An env's reward model, or a stage's (online DPO's `scorer: reward_model`): a folder path.
    rm = getattr(cfg, "reward_model", None)
    if isinstance(rm, str) and not (Path(rm) / "config.json").is_file():
        out.append(
            f"{prefix}reward_model: Value error, reward model folder {rm!r} has no "
            f"config.json (train one with `textgym rm train`) (got {rm!r})"
        )
    prm = cfg.process_reward_model if isinstance(cfg, EnvConfig) else None
    if prm is not None and not (Path(prm) / "config.json").is_file():
        out.append(
            f"{prefix}process_reward_model: Value error, process reward model folder {prm!r} has no "
            f"config.json (train one with `textgym prm train`) (got {prm!r})"
        )
    vllm = isinstance(cfg, RolloutEngineConfig) and cfg.backend == "vllm"
    if vllm and importlib.util.find_spec("vllm") is None:
        out.append(
            f"{prefix.rstrip('.') or '<root>'}: Value error, backend 'vllm' needs vLLM installed: "
            "pip install 'textgym[vllm]'"
        )
    if isinstance(cfg, JudgeTermConfig):
        out.extend(_judge_problems(cfg, prefix))
    for name in type(cfg).model_fields:
        child = getattr(cfg, name)
        if isinstance(child, BaseModel):
            out.extend(_problems(child, f"{prefix}{name}."))
    return out


def _judge_problems(cfg: JudgeTermConfig, prefix: str) -> list[str]:
    """A judge's rubric file that is missing or lacks its mode's placeholders; an unset API-key variable."""
    from textgym.verifiers.judge_prompts import load_rubric

    out: list[str] = []
    if cfg.rubric is not None:
        try:
            load_rubric(cfg.rubric, cfg.mode)
        except OSError as e:
            out.append(f"{prefix}rubric: Value error, cannot read the rubric file: {e} (got {cfg.rubric!r})")
        except ValueError as e:
            out.append(f"{prefix}rubric: Value error, {e} (got {cfg.rubric!r})")
    if cfg.api_key_env is not None and not os.environ.get(cfg.api_key_env):
        out.append(
            f"{prefix}api_key_env: Value error, environment variable ${cfg.api_key_env} is not set "
            f"(got {cfg.api_key_env!r})"
        )
    return out


def validate_runtime(cfg: BaseModel) -> None:
    """Check what a config needs from this machine: reward-model folders, an installed vLLM, judge rubrics.

    Args:
        cfg: any config (a `RunConfig`, one stage, an `EnvConfig`); every nested config is checked.

    Raises:
        ConfigError: one line per problem, `dotted.path: message`, in the format of
            `format_validation_error`.
    """
    problems = _problems(cfg, "")
    if problems:
        raise ConfigError("invalid config:\n  " + "\n  ".join(problems))
