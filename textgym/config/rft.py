"""Rejection-sampling fine-tuning (RAFT, ReST-EM; STaR's rationalisation): sample, keep the verified, SFT."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from textgym.config.base import EnvConfig, LoraSettings, OptimConfig, SamplingConfig, _Batching, _Strict


class RFTCollectConfig(_Strict):
    """How a round samples the current policy (`textgym.offline.collect_rollouts`)."""

    n: int = Field(256, ge=1)
    """Tasks (prompts) per round."""
    start: int = Field(0, ge=0)
    """First task index."""
    fresh_tasks: bool = True
    """Round r samples tasks `start + r·n …` (fresh problems each round, as on an unbounded
    generated stream); false: every round samples the same tasks `start … start+n−1` (ReST-EM's
    fixed training set, for a finite dataset)."""
    samples: int = Field(8, ge=1)
    """K, samples per task (best-of-K)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling (temperature > 0, or every sample of a task is the same)."""


class RFTFilterConfig(_Strict):
    """Which samples a round keeps (`textgym.offline.rejection.select_responses`).

    A sample passes when it is correct (`correct_only`) and its reward is at least `min_reward`
    (when set); identical passing responses to a prompt count once (`dedup`); of the rest, the
    `max_per_prompt` highest-reward ones are kept (best-of-K; ties: the earlier sample).
    """

    correct_only: bool = True
    """Keep only samples the env's verifier marks correct (`reward/correct` reaches 1, the term
    that defines accuracy)."""
    min_reward: float | None = None
    """Keep only samples whose episode reward is at least this (e.g. a reward model's score);
    null: no threshold."""
    dedup: bool = True
    """Count identical responses (the same token ids) to a prompt once."""
    max_per_prompt: int | None = Field(None, ge=1)
    """At most this many samples per prompt, the highest rewards first (1: RAFT's best-of-K);
    null: every passing sample (ReST-EM keeps up to a cap, e.g. 10)."""

    @model_validator(mode="after")
    def _rejects_something(self) -> RFTFilterConfig:
        if not self.correct_only and self.min_reward is None and self.max_per_prompt is None:
            raise ValueError(
                "the filter keeps every sample: set correct_only, min_reward or max_per_prompt "
                "(rejection sampling needs a rule that rejects)"
            )
        return self


class RationalizeConfig(_Strict):
    """STaR's rationalisation (Zelikman et al. 2022, arXiv:2203.14465, section 3.2).

    For each prompt of a round with no kept sample, the policy is sampled again with the gold
    answer as a hint in the prompt; the samples that pass the round's filter are kept and trained
    on with the original prompt, without the hint, as if the policy had found them unaided.
    """

    hint: str = "{content}\nHint: the answer is {answer}."
    """The new content of the prompt's last user message: `{content}` is its text, `{answer}` the
    task's gold answer (the env's `info["answer"]`)."""
    samples: int | None = Field(None, ge=1)
    """Samples per hinted prompt; null: `collect.samples`."""
    sampling: SamplingConfig | None = None
    """Sampling of the hinted prompts; null: `collect.sampling`."""

    @field_validator("hint")
    @classmethod
    def _has_fields(cls, v: str) -> str:
        missing = [f for f in ("{content}", "{answer}") if f not in v]
        if missing:
            raise ValueError(f"the hint must contain {' and '.join(missing)}")
        try:
            v.format(content="", answer="")
        except (KeyError, IndexError, ValueError) as e:
            raise ValueError(f"the hint must format with {{content}} and {{answer}} only: {e!r}") from None
        return v


class RFTConfig(_Batching):
    """Rejection-sampling fine-tuning: `rounds` rounds of sample K → keep the verified → SFT on the kept.

    RAFT (Dong et al. 2023, arXiv:2304.06767, Algorithm 1) keeps the best of K samples per prompt
    and continues fine-tuning the current model (`from: previous`); ReST-EM (Singh et al. 2023,
    arXiv:2312.06585, section 3) keeps every correct sample (up to a cap per prompt) and
    fine-tunes the base model afresh each round (`from: start`), the data always coming from the
    latest model. With `rationalize`, STaR's rationalisation adds hinted solutions of the
    prompts no sample solved. Preset: `configs/rft_arithmetic.yaml`.
    """

    model_config = ConfigDict(
        extra="forbid",
        validate_default=True,
        validate_by_name=True,
        validate_by_alias=True,
        serialize_by_alias=True,
    )

    env: EnvConfig
    """Where the policy is sampled and verified (by the env's own reward; a `reward_model` is not
    supported here)."""

    @field_validator("env")
    @classmethod
    def _no_reward_model(cls, v: EnvConfig) -> EnvConfig:
        if v.reward_model is not None:
            raise ValueError("reward_model is not supported by rft: samples are scored by the env's verifier")
        return v

    rounds: int = Field(1, ge=1)
    """sample → filter → SFT rounds."""
    collect: RFTCollectConfig = Field(default_factory=RFTCollectConfig)
    """Sampling per round."""
    filter: RFTFilterConfig = Field(default_factory=RFTFilterConfig)
    """Which samples are kept."""
    rationalize: RationalizeConfig | None = None
    """STaR's rationalisation of the prompts with no kept sample; null: off."""
    from_: Literal["start", "previous"] = Field("previous", alias="from")
    """The model each round's SFT starts from (written `from:`): "previous", the latest
    model (RAFT: fine-tuning continues across rounds); "start", the model the stage started
    with (ReST-EM: each round fine-tunes the base model on the latest model's samples). Either
    way a round samples the latest model."""
    steps: int | None = Field(None, ge=1)
    """Optimizer steps of each round's SFT; null: `epochs` passes over the kept set."""
    epochs: int = Field(1, ge=1)
    """Passes over each round's kept set when `steps` is null: ⌈epochs · kept / batch_size⌉
    steps (the last batch may reach into the next pass)."""
    batch_size: int = Field(64, ge=1)
    """Sequences per optimizer step."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Sequences per forward pass (gradient accumulation when smaller than batch_size)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer of each round's SFT (a fresh one each round)."""
    lora: LoraSettings | None = None
    """Train LoRA adapters (fresh each round) instead of every weight; each round's `final/` is the
    merged model."""
    log_every: int = Field(10, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""
