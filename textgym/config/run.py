"""A run: the start model and its stages, loaded from YAML with `key.sub=value` overrides.

Every model forbids unknown keys and checks ranges, so a wrong key or value fails
before any work starts, with the dotted path of the bad field in the message
(`ConfigError`). `textgym train` exits with code 2 on it and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator

from textgym.config.base import ConfigError, ModelConfig, ParallelConfig, _Strict, import_before_validation
from textgym.config.eval import EvalConfig
from textgym.config.online_dpo import OnlineDPOConfig
from textgym.config.ppo import PPOConfig
from textgym.config.preference import PreferenceConfig
from textgym.config.prm import PRMConfig
from textgym.config.reward_model import RewardModelConfig
from textgym.config.rft import RFTConfig
from textgym.config.rl import GRPOConfig
from textgym.config.sft import SFTConfig
from textgym.tracking import check_log_with


class RunConfig(_Strict):
    """A training run: a start model, optional SFT, optional RL (GRPO family or PPO), and an evaluation.

    The optional `reward_model` stage is trained by `textgym rm train CONFIG`, not by `textgym train`.
    """

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name; outputs go to `<out_dir>/<name>/`."""
    imports: list[str] = Field(default_factory=list)
    """Python modules imported before anything else (each registers its environments with
    `gymnasium.register`), e.g. `[myenvs]`; the current directory is on the import path."""

    @model_validator(mode="before")
    @classmethod
    def _imports_first(cls, data: Any) -> Any:
        return import_before_validation(data)

    out_dir: str = "runs"
    """Parent folder of run directories."""
    seed: int = 0
    """Seed of torch, numpy and Python RNGs and of task sampling."""
    threads: int | None = Field(None, ge=1)
    """torch intra-op threads on CPU (default: torch's choice)."""
    log_with: list[str] = Field(default_factory=lambda: ["tensorboard"])
    """Experiment trackers every stage logs to beside `metrics.jsonl`: any of "tensorboard",
    "wandb" (offline unless WANDB_MODE says otherwise), "mlflow" (a file store under the stage
    unless MLFLOW_TRACKING_URI is set), "trackio" (`pip install 'textgym[trackers]'`)."""

    @field_validator("log_with")
    @classmethod
    def _known_trackers(cls, v: list[str]) -> list[str]:
        check_log_with(v)
        return v

    device: str = "auto"
    """"auto" (cuda when available, else cpu), "cpu", or "cuda[:N]"."""
    model: ModelConfig
    """Start model."""
    sft: SFTConfig | None = None
    """Supervised warm start (runs first when set)."""
    grpo: GRPOConfig | None = None
    """GRPO-family stage (runs after SFT when set)."""
    ppo: PPOConfig | None = None
    """PPO stage (runs after SFT when set; a run has at most one RL stage)."""
    dpo: PreferenceConfig | None = None
    """Offline preference stage (DPO family, one or more collect → pair → train rounds) after SFT;
    instead of an RL stage."""
    rft: RFTConfig | None = None
    """Rejection-sampling fine-tuning (RAFT / ReST-EM rounds of sample → keep the verified → SFT)
    after SFT; instead of an RL stage."""
    online_dpo: OnlineDPOConfig | None = None
    """Online DPO (pairs sampled from the current policy each step) after SFT; instead of an RL stage."""
    eval: EvalConfig | None = None
    """Evaluation before and after the last training stage."""
    reward_model: RewardModelConfig | None = None
    """A Bradley–Terry reward model trained on preference pairs by `textgym rm train CONFIG`
    (`textgym train` leaves it to that command)."""
    prm: PRMConfig | None = None
    """A process reward model: Monte-Carlo step labels by `textgym prm label CONFIG`, training by
    `textgym prm train CONFIG` (`textgym train` leaves it to those commands)."""
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    """Sharding under torchrun, mixed precision and gradient checkpointing."""

    @model_validator(mode="after")
    def _has_stage(self) -> RunConfig:
        stages = (
            self.sft,
            self.grpo,
            self.ppo,
            self.dpo,
            self.rft,
            self.online_dpo,
            self.reward_model,
            self.prm,
        )
        if all(x is None for x in stages):
            raise ValueError(
                "a run needs at least one stage: sft, grpo, ppo, dpo, rft, online_dpo, reward_model or prm"
            )
        if sum(x is not None for x in (self.grpo, self.ppo, self.dpo, self.rft, self.online_dpo)) > 1:
            raise ValueError("a run has at most one of the grpo, ppo, dpo, rft and online_dpo stages")
        return self

    @property
    def rl(self) -> GRPOConfig | PPOConfig | None:
        """The RL stage's config (grpo or ppo), if any."""
        return self.grpo if self.grpo is not None else self.ppo

    @property
    def run_dir(self) -> Path:
        """`<out_dir>/<name>`."""
        return Path(self.out_dir) / self.name

    @property
    def trains_in_pipeline(self) -> bool:
        """Whether `textgym train` has a stage to run (every stage but `reward_model` is its)."""
        return any(
            x is not None for x in (self.sft, self.grpo, self.ppo, self.dpo, self.rft, self.online_dpo)
        )


def _set(data: dict[str, Any], key: str, value: Any, item: str) -> None:
    """Set the dotted `key` of a nested dict to `value`, creating mappings on the way.

    Raises:
        ConfigError: naming `item` (the override it came from) when a key descends into a non-mapping.
    """
    parts = key.strip().split(".")
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a mapping")
        node = child
    node[parts[-1]] = value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set `key.sub=value` overrides on a nested dict (values parsed as YAML scalars/lists).

    Raises:
        ConfigError: on an override without `=` or one that descends into a non-mapping.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        _set(data, key, yaml.safe_load(raw) if raw.strip() else None, item)
    return data


def format_validation_error(err: ValidationError) -> str:
    """Render a pydantic error as one line per bad field: `dotted.path: message (got value)`."""
    lines = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"] if not str(p).startswith("function-")) or "<root>"
        got = e.get("input")
        shown = "" if isinstance(got, dict) else f" (got {got!r})"
        lines.append(f"{path}: {e['msg']}{shown}")
    return "invalid config:\n  " + "\n  ".join(lines)


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | None = None,
    *,
    values: dict[str, Any] | None = None,
    **base: Any,
) -> RunConfig:
    """Load a YAML run config, apply overrides and validate it.

    Precedence, lowest first: `base` (top-level keys), the file, `overrides` (`key.sub=value`
    strings), `values` ({"key.sub": python value}: command-line flags, set as they are).

    Raises:
        ConfigError: if the file is missing or not a mapping, or any field is unknown or out of range.
    """
    data: dict[str, Any] = dict(base)
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} not found")
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
        except yaml.YAMLError as e:
            raise ConfigError(f"config file {p} is not valid YAML: {e}") from e
        if not isinstance(loaded, dict):
            raise ConfigError(f"config file {p} must hold a mapping at the top level")
        data.update(loaded)
    apply_overrides(data, overrides or [])
    for key, value in (values or {}).items():
        _set(data, key, value, f"{key}={value!r}")
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None
