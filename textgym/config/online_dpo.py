"""Online DPO's schema: each step samples pairs from the current policy, scores and trains on them."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from textgym.config.base import EnvConfig, LoraSettings, OptimConfig, SamplingConfig, _Batching
from textgym.config.preference import DPO_BETA, SIMPO_BETA
from textgym.config.rl import RolloutEngineConfig


class OnlineDPOConfig(_Batching):
    """Online DPO (Guo et al. 2024, "Direct Language Model Alignment from Online AI Feedback").

    Each of `steps` steps samples `samples_per_prompt` responses to each of `prompts_per_step`
    tasks from the current policy, scores them (`scorer`), pairs the best against the worst
    response of each task (prompts whose scores differ by less than `margin` are skipped) and
    takes one optimizer step of a DPO-family loss against the reference (the stage's start
    model). Preset: `configs/online_dpo_arithmetic.yaml`. Trainer:
    `textgym.trainers.preference.online.OnlineDPOTrainer`.
    """

    env: EnvConfig
    """Where the tasks come from, and (with `scorer: env`) what scores the responses: the env's
    reward (its verifier rubric, any LLM-judge term it has, or its own `reward_model`)."""
    scorer: Literal["env", "reward_model"] = "env"
    """"env": a response's score is the env's reward. "reward_model": the score of the
    Bradley–Terry reward model in `reward_model` (`textgym rm train`); the env's own terms
    (`reward/correct`, ...) are still logged as the true measure."""
    reward_model: str | None = None
    """The reward model folder of `scorer: reward_model` (a one-label sequence classifier)."""
    reward_model_device: str = "cpu"
    """Where the reward model runs."""
    loss: Literal["dpo", "ipo", "simpo", "orpo"] = "dpo"
    """The objective on each step's pairs (`textgym.algorithms.preference_losses`); DPO and IPO
    compare with the reference, SimPO and ORPO need none (no reference is kept)."""
    beta: float = Field(None, gt=0.0)  # type: ignore[assignment]  # null: set per loss (_beta_of_the_loss)
    """β (DPO, SimPO) or τ (IPO). Unset (null): 0.1 for DPO and IPO, 2.0 for SimPO, as the
    offline `dpo:` stage (`PreferenceConfig.beta`). ORPO does not use it (`orpo_lambda`)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """DPO/SimPO: probability a preference label is flipped."""
    simpo_gamma: float = Field(1.0, ge=0.0)
    """SimPO's target margin γ."""
    orpo_lambda: float = Field(0.1, ge=0.0)
    """ORPO's weight λ of the odds-ratio term."""
    steps: int = Field(100, ge=1)
    """Sample → score → pair → update iterations (one optimizer step each)."""
    prompts_per_step: int = Field(16, ge=1)
    """Tasks drawn per step."""
    samples_per_prompt: int = Field(4, ge=2)
    """Responses sampled per task (a pair needs two; more make a best-vs-worst pair likelier
    to have a margin and more informative)."""
    margin: float = Field(0.0, ge=0.0)
    """A task is paired when its best and worst scores differ by more than 0 and at least this."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Sampling of the responses."""
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig)
    """The engine that samples (transformers or vLLM). The loss does not use the sampler's
    log-probabilities (the policy's and the reference's are computed by the trainer), so no
    importance correction applies: `rollout.tis` must not be true."""
    max_turns: int | None = Field(None, ge=1)
    """Cap on turns per episode for multi-turn envs (the episode is then `truncated`)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Pairs per forward pass (gradient accumulation; default: all the step's pairs at once)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-5))
    """Optimizer of the policy."""
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of every weight; the reference is the base model with the
    adapters disabled (no second copy); `final/` is the merged model, `final_adapter/` the adapter."""
    log_every: int = Field(1, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""
    eval_every: int = Field(0, ge=0)
    """Run the pipeline's `eval` every this many steps during training (0 = never)."""
    log_trajectories: bool = False
    """Write every sampled response to the stage's trajectory store (`<stage>/trajectories/`,
    one Parquet shard per step; a resumed run drops the shards of steps after its checkpoint)."""

    @field_validator("beta", mode="before")
    @classmethod
    def _beta_of_the_loss(cls, v: Any, info: Any) -> Any:
        if v is None:  # `loss` is validated before `beta` (field order)
            return SIMPO_BETA if info.data.get("loss") == "simpo" else DPO_BETA
        return v

    @model_validator(mode="after")
    def _scorer_and_engine(self) -> OnlineDPOConfig:
        if self.scorer == "reward_model" and self.reward_model is None:
            raise ValueError("scorer 'reward_model' needs reward_model: the folder of a trained reward model")
        if self.scorer == "env" and self.reward_model is not None:
            raise ValueError(
                "reward_model is set but scorer is 'env': set scorer: reward_model to score with it"
            )
        if self.scorer == "reward_model" and self.env.reward_model is not None:
            raise ValueError(
                "scorer 'reward_model' with env.reward_model set too: give the reward model once"
            )
        if self.rollout.tis:
            raise ValueError("rollout.tis: the DPO loss does not use the sampler's log-probs; leave it unset")
        if self.rollout.servers:
            raise ValueError("rollout.servers: online DPO does not generate on rollout servers yet")
        return self

    @property
    def uses_reference(self) -> bool:
        """Whether the loss compares with the reference policy (DPO, IPO)."""
        return self.loss in ("dpo", "ipo")

    @property
    def scorer_env(self) -> EnvConfig:
        """The env every response is scored in: `env`, with the reward model when `scorer` names one."""
        if self.scorer == "env":
            return self.env
        return self.env.model_copy(
            update={"reward_model": self.reward_model, "reward_model_device": self.reward_model_device}
        )
