"""The supervised warm start: SFT on an environment's gold solutions, optionally stopped on a probe target."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from textgym.config.base import EnvConfig, LoraSettings, OptimConfig, _Batching, _Strict


class SFTTargetConfig(_Strict):
    """Stop SFT on a measured target: greedy accuracy on a probe set, checked every `every` steps.

    The probe is `n` tasks of the SFT env that the training stream does not reach: for an
    unbounded generated stream (Arithmetic's train split) the tasks at indices 2**40 … 2**40+n−1;
    for a finite task set a seeded random subset of n tasks (also trained on, so the probe then
    measures training accuracy). Accuracy is the share of episodes whose `reward/correct` is 1.
    """

    accuracy: float = Field(..., gt=0.0, le=1.0)
    """Stop as soon as the probe's greedy accuracy is at least this (checked after step `every`,
    2·`every`, …; `steps` stays the budget)."""
    every: int = Field(10, ge=1)
    """Steps between probes."""
    n: int = Field(128, ge=1)
    """Probe tasks."""
    max_new_tokens: int = Field(32, ge=1)
    """Response budget of the probe's greedy decoding, in tokens."""
    required: bool = False
    """Fail the stage (an error, after saving the last checkpoint) when the budget ends below the
    target; otherwise the run goes on and `target_reached: false` is recorded."""


class DemonstrationsConfig(_Strict):
    """Demonstrations collected in-line before SFT: the env's expert played in the model's tokens.

    `n` episodes of `sft.env` (tasks `start` … `start`+n−1) are played by
    `textgym.agents.demonstrator.OracleDemonstrator` and written to the stage's
    `demonstrations/` trajectory store (kept; a resumed run reuses them), then trained on as
    `sft.trajectories` would be.
    """

    agent: Literal["oracle"] = "oracle"
    """Who demonstrates: the env's `oracle_action` (the only kind so far)."""
    n: int = Field(..., ge=1)
    """Episodes to collect (one per task)."""
    start: int = Field(0, ge=0)
    """First task index."""
    noise: float = Field(0.0, ge=0.0, lt=1.0)
    """DART noise: the probability, per turn, that the env's `random_action` is played instead
    of the expert's, as a context turn outside the loss (Laskey et al. 2017), so SFT also sees
    the expert recover from states off its path. 0: the expert plays every turn."""
    tool_free: float = Field(0.0, ge=0.0, le=1.0)
    """The probability, per turn on which the expert would call a tool, that it answers at once
    with the env's own oracle answer instead (an expert who computes it in its head: imitable in
    form, not in skill; see `textgym.agents.demonstrator`). 0: the expert calls its tools."""
    seed: int = 0
    """Seeds the noise and `tool_free`'s draws."""


class SFTConfig(_Batching):
    """Supervised warm start: on an environment's gold solutions, a trajectory store, or demonstrations."""

    env: EnvConfig | None = None
    """Environment whose tasks' `solution` fields are the targets (single-turn), and whose tasks
    the `target` probe and the `demonstrations` play (multi-turn too). Required, except with
    `trajectories`: the store records each episode's env (id and keyword arguments), which is
    then the env (`textgym.offline.store.store_env`) when the store holds one env."""
    trajectories: str | None = None
    """Train on the episodes of this trajectory store instead of gold solutions: every policy
    token (loss mask 1: the assistant turns) of each episode, the prompt and the environment's
    turns as context only (e.g. from `textgym rollouts collect --agent oracle`)."""
    min_reward: float | None = None
    """With `trajectories` or `demonstrations`: keep only episodes whose return is at least this."""
    demonstrations: DemonstrationsConfig | None = None
    """Collect demonstrations in-line and train on them (see `DemonstrationsConfig`)."""
    steps: int = Field(100, ge=1)
    """Optimizer steps (the budget when `target` is set)."""
    target: SFTTargetConfig | None = None
    """Stop early once the model reaches a measured greedy accuracy, so the next stage starts from
    a measured state rather than from wherever a fixed step count happens to end (float rounding
    differs between CPUs and kernels); null trains exactly `steps` steps."""
    batch_size: int = Field(64, ge=1)
    """Sequences per optimizer step."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward pass (gradient accumulation when smaller than batch_size)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-3))
    """Optimizer."""
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of every weight; `final/` is the merged model (what the
    next stage starts from), `final_adapter/` the adapter."""
    log_every: int = Field(10, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""

    @model_validator(mode="after")
    def _one_source(self) -> SFTConfig:
        if self.env is None and self.trajectories is None:
            raise ValueError(
                "sft.env is required: the env whose gold solutions are the targets (or whose tasks "
                "`demonstrations` play); only with `trajectories` is it read from the store"
            )
        if self.trajectories is not None and self.demonstrations is not None:
            raise ValueError("sft: give either `trajectories` (a store) or `demonstrations`, not both")
        if self.min_reward is not None and self.trajectories is None and self.demonstrations is None:
            raise ValueError("sft.min_reward filters `trajectories` or `demonstrations`; neither is set")
        return self
