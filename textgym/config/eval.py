"""Evaluation schemas: the pipeline's held-out evaluation, and what `textgym eval` runs."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from textgym.config.base import EnvConfig, SamplingConfig, _Strict


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
    format_baseline: bool = True
    """Also evaluate the run's "before" model with the answer format given: the best of a
    prefilled answer stem, a one-shot example and an instruction, at a token budget that cuts at
    most 2% of answers (`textgym.evaluation.figures.format_baseline`). The summary records it as
    `accuracy_baseline`; the gain that counts is the one above it. Single-turn envs only (skipped
    for a multi-turn one)."""


class AgentConfig(_Strict):
    """Who acts in `textgym eval`: a model (local, or behind an OpenAI-compatible endpoint) or a script."""

    kind: Literal["model", "oracle", "random"] = "model"
    """"model" (needs `model`), "oracle" (reads the hidden solution) or "random" (`--agent`)."""
    model: str | None = None
    """Local Hugging Face model folder; with `endpoint`, the folder of the served model's tokenizer."""
    endpoint: str | None = None
    """Generate through this OpenAI-compatible server instead of a local model."""
    served_model: str | None = None
    """Model name on `endpoint`."""
    backend: Literal["transformers", "vllm"] = "transformers"
    """Local generation backend for `model`."""
    seed: int = 0
    """Seed of the random agent."""


class EvalJobConfig(_Strict):
    """What `textgym eval` runs: the first `n` tasks of one env, or a suite of envs, with one agent."""

    env: str | None = None
    """Environment id, e.g. `textgym/Arithmetic-v0` (exactly one of `env` and `suite`)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the env (`--env-kwargs key=value`)."""
    suite: str | None = None
    """A suite instead of one env: math, code, tools, core, or a suite YAML file."""
    n: int = Field(100, ge=1)
    """Number of tasks (task_index 0..n-1) of `env`."""
    samples: int = Field(1, ge=1)
    """Samples per task (pass@k for k=1 and k=samples)."""
    sampling: SamplingConfig = Field(default_factory=lambda: SamplingConfig(temperature=0.0))
    """Decoding of the model agent; greedy by default."""
    agent: AgentConfig = Field(default_factory=AgentConfig)
    """Who acts."""
    out: str | None = None
    """Keep finished episodes in `out/episodes.jsonl` (a rerun resumes); a suite also writes
    report.json, report.md and report.png there."""
    log_trajectories: bool = False
    """With `out`: also write full trajectories to `out/trajectories` (Parquet)."""
    prm: str | None = None
    """A process reward model folder (`textgym prm train`): score every sample and report
    best-of-n accuracy (the sample with the highest PRM score among the first n) beside majority
    vote and pass@n, for n = 1, 2, 4, … up to `samples` (`textgym.evaluation.best_of_n`). One env."""
    prm_aggregate: Literal["min", "product", "last"] | None = None
    """How the PRM's step scores make one score (default: the PRM folder's, else "min")."""
