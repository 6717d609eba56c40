"""The process reward model stage: Monte-Carlo step labels (`textgym prm label`), training (`prm train`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from textgym.config.base import EnvConfig, OptimConfig, SamplingConfig, _Strict


class PRMLabelConfig(_Strict):
    """Monte-Carlo step labels (Math-Shepherd, Wang et al. 2023, arXiv:2312.08935, §3.3).

    The policy answers `samples` times each of the tasks `start … start + tasks − 1` of `env`;
    for every step (non-empty line) of every answer, it continues the answer from the end of that
    step `continuations` times (K), and the step's labels are the share of continuations that
    reach the correct answer (soft) and whether any does (hard).
    """

    env: EnvConfig
    """The environment whose tasks are answered and whose `reward/correct` judges the continuations."""
    policy: str | None = None
    """The policy folder that answers and continues (null: the run's `model.path` or `model.name`)."""
    tasks: int = Field(256, ge=1)
    """How many tasks to answer."""
    start: int = Field(0, ge=0)
    """Index of the first task (e.g. a train-stream index past what SFT saw, for held-out prefixes)."""
    samples: int = Field(1, ge=1)
    """Answers per task."""
    continuations: int = Field(8, ge=1)
    """K: continuations sampled from each step's prefix."""
    sampling: SamplingConfig = Field(
        default_factory=lambda: SamplingConfig(temperature=1.0, max_new_tokens=64)
    )
    """Sampling of the answers and of the continuations."""
    batch_size: int = Field(256, ge=1)
    """Sequences per generation call."""
    seed: int = 0
    """Seed of the sampling (each answer's and each continuation's tokens are a function of it)."""
    out: str | None = None
    """The labels file (JSON lines, one answer per line); null: `<out_dir>/<name>/prm/labels.jsonl`."""


class PRMConfig(_Strict):
    """A process reward model: the policy's body with a scalar head per token, trained on step labels.

    The head's logit at the token holding each step's last character is trained with binary
    cross-entropy towards the step's label (soft: the share of correct continuations; hard: 1 if
    any continuation is correct); every other token is out of the loss. `textgym prm label
    CONFIG` writes the labels (`label:`), `textgym prm train CONFIG` trains on them; `textgym
    train` runs neither. The trained folder scores steps in `PRMVerifier`, in RL through
    `env.process_reward_model`, and in `textgym eval --prm` (best-of-N).
    """

    label: PRMLabelConfig | None = None
    """How `textgym prm label` labels steps (needed to label; training needs only `labels`)."""
    labels: str | None = None
    """The labels file to train on; null: `label.out` (or its default)."""
    model: str | None = None
    """The causal LM folder the PRM starts from; null: `label.policy`, else the run's `model.path` or
    `model.name`."""
    out: str | None = None
    """The PRM's folder; null: `<out_dir>/<name>/prm/model`."""
    target: Literal["soft", "hard"] = "soft"
    """Which label the head is trained towards (soft: Math-Shepherd's soft estimation; hard: its
    hard estimation, 1 when any of the K continuations is correct)."""
    epochs: int = Field(3, ge=1)
    """Passes over the training answers."""
    batch_size: int = Field(32, ge=1)
    """Answers per optimizer step (each holds several steps)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Answers per forward pass (gradient accumulation); null: the whole batch."""
    eval_fraction: float = Field(0.2, ge=0.0, lt=1.0)
    """Share of the tasks held out (all answers of a task on one side) for step accuracy."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer."""
    seed: int = 0
    """Seed of the split, the head's initialisation and the shuffling."""
    aggregate: Literal["min", "product", "last"] = "min"
    """How the saved PRM turns step scores into one score by default (`PRMVerifier`)."""
