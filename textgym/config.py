"""Run configuration: pydantic models loaded from YAML, overridable as `key.sub=value`.

Every model forbids unknown keys and checks ranges, so a wrong key or value fails
before any work starts, with the dotted path of the bad field in the message
(`ConfigError`). `textgym train` exits with code 2 on it and writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the offending field(s)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=True)


class ModelConfig(_Strict):
    """Which policy to start from: a local HF folder, or a preset built from scratch."""

    path: str | None = None
    """Local Hugging Face causal-LM folder (config.json, weights, tokenizer with chat template)."""
    init_preset: Literal["tiny", "small", "0.5b"] | None = None
    """Build a randomly initialised Qwen2-style model of this size when `path` is not set."""
    init_seed: int = 0
    """Seed of the random initialisation."""

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.init_preset is None):
            raise ValueError("set exactly one of model.path or model.init_preset")
        return self


class EnvConfig(_Strict):
    """A registered environment and its constructor kwargs."""

    id: str
    """Gymnasium id, e.g. `textgym/Arithmetic-v0` (see `textgym envs`)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments for `gymnasium.make(id, **kwargs)`."""

    @field_validator("id")
    @classmethod
    def _registered(cls, v: str) -> str:
        import textgym  # noqa: F401  (registers the ids)

        if v not in gym.registry:
            known = sorted(k for k in gym.registry if k.startswith("textgym/"))
            raise ValueError(f"unknown environment id {v!r}; registered textgym ids: {known}")
        return v


class SamplingConfig(_Strict):
    """Sampling parameters of rollouts (see `textgym.agents.SamplingParams`)."""

    temperature: float = Field(1.0, ge=0.0, le=10.0)
    """Softmax temperature; 0 = greedy."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus mass; 1 disables."""
    top_k: int = Field(0, ge=0)
    """Top-k cut; 0 disables."""
    max_new_tokens: int = Field(256, ge=1, le=32768)
    """Response budget per turn, in tokens."""


class OptimConfig(_Strict):
    """AdamW and its learning-rate schedule."""

    lr: float = Field(1e-5, gt=0.0, le=1.0)
    """Peak learning rate."""
    weight_decay: float = Field(0.0, ge=0.0)
    """Decoupled weight decay (AdamW)."""
    betas: tuple[float, float] = (0.9, 0.999)
    """Adam β1, β2."""
    warmup_steps: int = Field(0, ge=0)
    """Linear warm-up from 0 to `lr` over this many optimizer steps."""
    schedule: Literal["constant", "cosine", "linear"] = "constant"
    """Shape after warm-up: constant, cosine decay to `min_lr_ratio·lr`, or linear decay to it."""
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0)
    """Final learning rate as a fraction of `lr` for the decaying schedules."""
    max_grad_norm: float | None = Field(1.0, gt=0.0)
    """Clip the global gradient norm to this value; null disables clipping."""


class SFTConfig(_Strict):
    """Supervised warm start on an environment's gold solutions."""

    env: EnvConfig
    """Environment whose tasks' `solution` fields are the targets."""
    steps: int = Field(100, ge=1)
    """Optimizer steps."""
    batch_size: int = Field(64, ge=1)
    """Sequences per optimizer step."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward pass (gradient accumulation when smaller than batch_size)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-3))
    """Optimizer."""
    log_every: int = Field(10, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""


class EvalConfig(_Strict):
    """Held-out evaluation: the first `n` tasks of an environment, `samples` each."""

    env: EnvConfig
    """Environment (usually a test split)."""
    n: int = Field(200, ge=1)
    """Number of tasks (task_index 0..n-1)."""
    samples: int = Field(1, ge=1)
    """Samples per task (pass@k is reported for k = 1 and k = samples)."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.0))
    """Decoding; greedy by default."""
    batch_size: int = Field(256, ge=1)
    """Episodes per generation call."""


class GRPOConfig(_Strict):
    """Group Relative Policy Optimization (Shao et al. 2024) with the options of its descendants."""

    env: EnvConfig
    """Training environment."""
    steps: int = Field(100, ge=1)
    """Rollout/update iterations."""
    prompts_per_step: int = Field(16, ge=1)
    """Tasks drawn per iteration."""
    group_size: int = Field(8, ge=2)
    """Samples per task (G)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""
    epochs: int = Field(1, ge=1)
    """Update epochs μ over each rollout batch."""
    minibatch_size: int | None = Field(None, ge=1)
    """Sequences per optimizer step (default: the whole rollout batch)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward pass (gradient accumulation)."""
    clip_low: float = Field(0.2, ge=0.0, lt=1.0)
    """ε_low: the ratio is clipped below at 1 − clip_low."""
    clip_high: float = Field(0.2, ge=0.0)
    """ε_high: the ratio is clipped above at 1 + clip_high (DAPO's clip-higher uses 0.28)."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = (
        "seq_mean_token_mean"
    )
    """How per-token losses are reduced (see `textgym.trainers.losses.aggregate`)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """Advantage scaling: per-group std (GRPO), batch std, or none (Dr. GRPO)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """β of the KL-to-reference term in the loss; 0 skips loading the reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator in the loss (GRPO uses k3)."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer."""
    log_every: int = Field(1, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""
    eval_every: int = Field(0, ge=0)
    """Run the pipeline's `eval` every this many steps during training (0 = never)."""

    @model_validator(mode="after")
    def _batch_sizes(self) -> GRPOConfig:
        total = self.prompts_per_step * self.group_size
        mb = self.minibatch_size or total
        if total % mb:
            raise ValueError(f"minibatch_size={mb} must divide prompts_per_step*group_size={total}")
        if self.micro_batch_size is not None and mb % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide minibatch_size={mb}")
        return self


class RunConfig(_Strict):
    """A training run: a start model, optional SFT, optional GRPO, and a before/after evaluation."""

    name: str = Field(..., pattern=r"^[A-Za-z0-9_.-]+$")
    """Run name; outputs go to `<out_dir>/<name>/`."""
    out_dir: str = "runs"
    """Parent folder of run directories."""
    seed: int = 0
    """Seed of torch, numpy and Python RNGs and of task sampling."""
    threads: int | None = Field(None, ge=1)
    """torch intra-op threads on CPU (default: torch's choice)."""
    device: str = "auto"
    """"auto" (cuda when available, else cpu), "cpu", or "cuda[:N]"."""
    model: ModelConfig
    """Start model."""
    sft: SFTConfig | None = None
    """Supervised warm start (runs first when set)."""
    grpo: GRPOConfig | None = None
    """GRPO stage (runs after SFT when set)."""
    eval: EvalConfig | None = None
    """Evaluation before and after the last training stage."""

    @model_validator(mode="after")
    def _has_stage(self) -> RunConfig:
        if self.sft is None and self.grpo is None:
            raise ValueError("a run needs at least one stage: sft or grpo")
        return self

    @property
    def run_dir(self) -> Path:
        """`<out_dir>/<name>`."""
        return Path(self.out_dir) / self.name


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Set `key.sub=value` overrides on a nested dict (values parsed as YAML scalars/lists).

    Raises:
        ConfigError: on an override without `=` or one that descends into a non-mapping.
    """
    for item in overrides:
        if "=" not in item:
            raise ConfigError(f"override {item!r} must look like key.sub=value")
        key, raw = item.split("=", 1)
        parts = key.strip().split(".")
        node = data
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError(f"override {item!r}: {'.'.join(parts[: i + 1])} is not a mapping")
            node = child
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
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


def load_config(path: str | Path | None = None, overrides: list[str] | None = None, **base: Any) -> RunConfig:
    """Load a YAML run config, apply overrides and validate it.

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
    try:
        return RunConfig.model_validate(data)
    except ValidationError as e:
        raise ConfigError(format_validation_error(e)) from None
