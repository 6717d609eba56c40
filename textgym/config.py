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
    reward_model: str | None = None
    """A reward model folder (`textgym rm train`): its score replaces the env's reward, whose own
    terms (`reward/correct`, ...) stay in `info` as the true measure (RLHF)."""
    reward_model_weight: float = 1.0
    """Scale of the reward model's score."""
    reward_model_device: str = "cpu"
    """Where the reward model runs ("cuda:1": another GPU; it scores in the env workers)."""

    def make(self) -> gym.Env:
        """Build the env (wrapped with `RewardModelWrapper` when `reward_model` is set)."""
        env = gym.make(self.id, **self.kwargs)
        if self.reward_model is not None:
            from textgym.envs.reward_model import RewardModelWrapper

            env = RewardModelWrapper(
                env, self.reward_model, self.reward_model_weight, self.reward_model_device
            )
        return env

    @field_validator("reward_model")
    @classmethod
    def _rm_folder(cls, v: str | None) -> str | None:
        if v is not None and not (Path(v) / "config.json").is_file():
            raise ValueError(
                f"reward model folder {v!r} has no config.json (train one with `textgym rm train`)"
            )
        return v

    @field_validator("id")
    @classmethod
    def _registered(cls, v: str) -> str:
        import textgym  # noqa: F401  (registers the ids)

        if v not in gym.registry:
            known = sorted(k for k in gym.registry if k.startswith("textgym/"))
            raise ValueError(f"unknown environment id {v!r}; registered textgym ids: {known}")
        return v

    @field_validator("kwargs")
    @classmethod
    def _known_sandbox(cls, v: dict[str, Any]) -> dict[str, Any]:
        from textgym.sandbox import BACKENDS

        if "sandbox" in v and v["sandbox"] not in BACKENDS:
            raise ValueError(f"unknown sandbox backend {v['sandbox']!r}; choose one of {list(BACKENDS)}")
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


class LoraSettings(_Strict):
    """LoRA adapters through `peft` (Hu et al. 2021, arXiv:2106.09685, eq. 3).

    Only A [r, in] and B [out, r] of each targeted weight train: h = W x + (alpha / r) · B A x.
    """

    r: int = Field(16, ge=1)
    """Rank r of the update."""
    alpha: int = Field(32, gt=0)
    """Scale α (the update is multiplied by α / r)."""
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    """Dropout on the adapter's input."""
    target_modules: str | list[str] = "all-linear"
    """Module names (or suffixes) that get adapters; "all-linear" = every linear layer but the LM head."""


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


class SFTConfig(_Strict):
    """Supervised warm start on an environment's gold solutions."""

    env: EnvConfig
    """Environment whose tasks' `solution` fields are the targets."""
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


class OverlongPenaltyConfig(_Strict):
    """DAPO's soft overlong punishment (see `textgym.trainers.advantages.overlong_penalty`)."""

    max_len: int = Field(..., ge=1)
    """L_max: responses this long (tokens) or longer get −1·factor."""
    cache_len: int = Field(..., ge=1)
    """L_cache: width of the linear ramp (tokens) before max_len."""
    factor: float = Field(1.0, ge=0.0)
    """Scale of the penalty added to the reward."""

    @model_validator(mode="after")
    def _window(self) -> OverlongPenaltyConfig:
        if self.cache_len > self.max_len:
            raise ValueError(f"cache_len={self.cache_len} must be <= max_len={self.max_len}")
        return self


class VLLMEngineConfig(_Strict):
    """The in-process vLLM engine that generates rollouts (`textgym.agents.vllm_backend`)."""

    dtype: str = "auto"
    """Engine dtype; "auto" follows the policy's parameters."""
    gpu_memory_utilization: float = Field(0.3, gt=0.0, le=1.0)
    """Share of GPU memory the engine may take (GPU only; the trainer shares the device)."""
    kv_cache_gib: float = Field(1.0, gt=0.0)
    """KV-cache size on CPU, GiB."""
    max_model_len: int | None = Field(None, ge=2)
    """Context window (prompt + response tokens); default: the model's."""
    enforce_eager: bool = True
    """Skip CUDA graphs and torch.compile (faster start-up)."""


class RolloutEngineConfig(_Strict):
    """Which engine samples the rollouts, and how the trainer corrects for it."""

    backend: Literal["transformers", "vllm"] = "transformers"
    """"transformers": the policy itself generates. "vllm": an in-process vLLM engine generates
    and gets the policy's weights after every optimizer step (in memory, no checkpoint)."""
    tis: bool | None = None
    """Truncated importance sampling (Yao et al. 2025): weight each token's policy gradient by
    min(π_old/π_rollout, tis_cap), with π_old recomputed by the trainer's forward and the
    `mismatch/*` metrics logged. null = on exactly when the engine is not the trainer (vLLM).
    true on the transformers backend recomputes π_old too (one no-grad forward per step), for
    when the KV-cached sampling and the padded training forward differ (bf16, FSDP)."""
    tis_cap: float = Field(2.0, gt=0.0)
    """C, the truncation of the importance weight."""
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)
    """Engine settings for backend "vllm"."""
    per_sequence_seeds: bool = False
    """Sample each sequence from its own generator, seeded by (run seed, step, the task's slot in
    the step's global batch, sample index, turn): the rollouts then depend neither on the number
    of ranks nor on how prompts are batched, so a run on N ranks samples what the same run on one
    samples (`textgym.agents.llm_agent.TransformersBackend`). Transformers backend only."""

    @property
    def use_tis(self) -> bool:
        """Whether TIS weights the loss."""
        return self.backend != "transformers" if self.tis is None else self.tis

    @model_validator(mode="after")
    def _installed(self) -> RolloutEngineConfig:
        if self.backend == "vllm":
            import importlib.util

            if importlib.util.find_spec("vllm") is None:
                raise ValueError("backend 'vllm' needs vLLM installed: pip install 'textgym[vllm]'")
            if self.per_sequence_seeds:
                raise ValueError("per_sequence_seeds needs backend 'transformers'")
        return self


class CollectConfig(_Strict):
    """How a preference stage collects rollouts of the current policy (`textgym.offline.collect_rollouts`)."""

    n: int = Field(512, ge=1)
    """Tasks per round (round r uses tasks `start + r·n ...`, fresh ones each round)."""
    start: int = Field(0, ge=0)
    """First task index."""
    samples: int = Field(4, ge=2)
    """Samples per task (pairs need at least two)."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""


class PairConfig(_Strict):
    """How pairs are built from the collected trajectories (`textgym.offline.build_pairs`)."""

    margin: float = Field(0.5, ge=0.0)
    """Minimum reward difference between chosen and rejected."""
    mode: Literal["best_vs_worst", "all"] = "best_vs_worst"
    """One best-vs-worst pair per prompt, or every pair that clears the margin."""
    max_per_prompt: int | None = Field(None, ge=1)
    """Cap on pairs per prompt (a seeded random subset)."""
    dedup: bool = True
    """Count identical responses to a prompt once."""
    desirable_threshold: float = 1.0
    """KTO: a response is desirable when its reward is at least this."""


DPO_BETA = 0.1
"""β of DPO, IPO (τ) and KTO when the config leaves it unset."""
SIMPO_BETA = 2.0
"""β of SimPO when the config leaves it unset (Meng et al. 2024 tune it in 2.0–2.5)."""


class PreferenceConfig(_Strict):
    """Offline preference optimisation from logged rollouts: DPO, IPO, KTO, SimPO or ORPO.

    Each of `rounds` rounds collects rollouts of the current policy on `env`, builds pairs
    (or KTO's unpaired examples) and trains on them; one round is offline DPO from the
    start model's rollouts, several are iterative DPO. Preset: `configs/dpo_arithmetic.yaml`,
    `configs/iterative_dpo_arithmetic.yaml`.
    """

    env: EnvConfig
    """Where rollouts are collected."""
    loss: Literal["dpo", "ipo", "kto", "simpo", "orpo"] = "dpo"
    """The objective (`textgym.trainers.preference_losses`)."""
    rounds: int = Field(1, ge=1)
    """collect → pair → train rounds."""
    collect: CollectConfig = Field(default_factory=CollectConfig)
    """Rollout collection per round."""
    pairs: PairConfig = Field(default_factory=PairConfig)
    """Pair building per round."""
    beta: float = Field(None, gt=0.0)  # type: ignore[assignment]  # null: set per loss (_beta_of_the_loss)
    """β (DPO, KTO, SimPO) or τ (IPO). Unset (null), it follows the loss's paper: 0.1 for DPO, IPO
    and KTO (Rafailov et al. 2023; Ethayarajh et al. 2024), 2.0 for SimPO (Meng et al. 2024,
    arXiv:2405.14734, whose tuned β is 2.0–2.5; at 0.1 its length-normalised margin barely moves
    the sigmoid). ORPO does not use it (`orpo_lambda`)."""
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5)
    """DPO/SimPO: probability a preference label is flipped."""
    simpo_gamma: float = Field(1.0, ge=0.0)
    """SimPO's target margin γ."""
    orpo_lambda: float = Field(0.1, ge=0.0)
    """ORPO's weight λ of the odds-ratio term."""
    desirable_weight: float = Field(1.0, ge=0.0)
    """KTO's λ_D."""
    undesirable_weight: float = Field(1.0, ge=0.0)
    """KTO's λ_U."""
    epochs: int = Field(1, ge=1)
    """Passes over each round's pairs."""
    batch_size: int = Field(32, ge=1)
    """Pairs (KTO: examples) per optimizer step."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Pairs per forward pass (gradient accumulation)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer of the policy (a fresh one each round)."""
    lora: LoraSettings | None = None
    """Train LoRA adapters (fresh each round) instead of every weight; the cached reference
    log-probs are the base model's; `final/` is the merged model, `final_adapter/` the adapter."""
    log_every: int = Field(10, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""

    @field_validator("beta", mode="before")
    @classmethod
    def _beta_of_the_loss(cls, v: Any, info: Any) -> Any:
        if v is None:  # `loss` is validated before `beta` (field order)
            return SIMPO_BETA if info.data.get("loss") == "simpo" else DPO_BETA
        return v

    @property
    def uses_reference(self) -> bool:
        """Whether the loss needs reference log-probabilities (DPO, IPO, KTO)."""
        return self.loss in ("dpo", "ipo", "kto")


class RewardModelConfig(_Strict):
    """Training a Bradley–Terry reward model on pairs (`textgym rm train`)."""

    epochs: int = Field(2, ge=1)
    """Passes over the training pairs."""
    batch_size: int = Field(32, ge=1)
    """Pairs per optimizer step (over all ranks under torchrun)."""
    micro_batch_size: int | None = Field(None, ge=1)
    """Pairs per forward pass on each rank (gradient accumulation); null = the rank's whole
    share of the batch."""
    eval_fraction: float = Field(0.1, ge=0.0, lt=1.0)
    """Share of prompts held out for pairwise accuracy (all pairs of a prompt go to one side)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer."""
    lm_coef: float = Field(0.0, ge=0.0)
    """α of the language-modelling regulariser: the loss adds α · NLL of the chosen responses
    under the backbone's LM head (GRM, Yang et al. 2024, arXiv:2406.10216); 0 turns it off."""
    seed: int = 0
    """Seed of the split, the score head's initialisation and the shuffling (epoch e's order is a
    permutation seeded by `seed + e`, so a resumed run draws the same batches)."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a resumable checkpoint to `<out>/checkpoints/step_<N>/` every this many steps (0 = none)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""


class _PolicyGradientConfig(_Strict):
    """What every on-policy trainer (GRPO family, PPO) shares: rollouts, the clipped update, KL, logging."""

    env: EnvConfig
    """Training environment."""
    steps: int = Field(100, ge=1)
    """Rollout/update iterations."""
    prompts_per_step: int = Field(16, ge=1)
    """Tasks drawn per iteration."""
    sampling: SamplingConfig = Field(default_factory=SamplingConfig)
    """Rollout sampling."""
    rollout: RolloutEngineConfig = Field(default_factory=RolloutEngineConfig)
    """The engine that generates rollouts (transformers or vLLM) and the TIS correction."""
    max_turns: int | None = Field(None, ge=1)
    """Cap on turns per episode for multi-turn envs (the episode is then `truncated`)."""
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
    dual_clip: float | None = Field(None, gt=1.0)
    """c of dual-clip PPO (Ye et al. 2020): caps the loss of negative-advantage tokens at −c·Â."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = (
        "seq_mean_token_mean"
    )
    """How per-token losses are reduced (see `textgym.trainers.losses.aggregate`)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """β of the KL-to-reference term; 0 skips loading the reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (see `textgym.trainers.losses.kl_estimate`)."""
    kl_placement: Literal["loss", "reward"] = "loss"
    """Where β·KL goes: differentiated in the loss (GRPO) or subtracted from the reward (RLHF PPO,
    REINFORCE++, no gradient through it). Gold standard: k1 in the reward; k1 in the loss has zero
    expected gradient; k3 in the reward is biased (../shared/reference/004)."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Entropy bonus: the loss gets −coef·H (token mean over policy tokens)."""
    overlong_filter: bool = False
    """Mask responses cut at max_new_tokens out of the loss (DAPO's overlong filtering)."""
    overlong_penalty: OverlongPenaltyConfig | None = None
    """DAPO's soft length penalty added to the reward; null disables."""
    optim: OptimConfig = Field(default_factory=OptimConfig)
    """Optimizer of the policy."""
    log_every: int = Field(1, ge=1)
    """Log metrics every this many steps."""
    checkpoint_every: int = Field(0, ge=0)
    """Save a checkpoint every this many steps (0 = only at the end)."""
    keep_checkpoints: int = Field(2, ge=1)
    """How many of the latest checkpoints to keep."""
    eval_every: int = Field(0, ge=0)
    """Run the pipeline's `eval` every this many steps during training (0 = never)."""
    log_trajectories: bool = False
    """Write every rollout to the stage's trajectory store (`<stage>/trajectories/`, one Parquet
    shard per step; a resumed run drops the shards of steps after its checkpoint)."""
    lora: LoraSettings | None = None
    """Train LoRA adapters instead of every weight; the reference is the base model with the
    adapters disabled (no second copy); `final/` is the merged model, `final_adapter/` the adapter."""
    reference_device: str | None = None
    """Where the frozen reference runs: "cpu" offloads it from the GPU, "cuda:1" puts it on
    another GPU; null = the policy's device. Each micro-batch is sent there and its log-probs
    come back. Not with LoRA (the reference is the policy). On several ranks the reference is
    sharded with the policy and only "cpu" applies: its shards stay in CPU memory and each block
    is copied to the rank's device for its forward (FSDP2's CPU offload)."""

    @model_validator(mode="after")
    def _reference_placement(self) -> _PolicyGradientConfig:
        if self.reference_device is not None:
            if self.lora is not None:
                raise ValueError(
                    "reference_device: with LoRA the reference is the policy itself (adapters off)"
                )
            import torch

            try:
                torch.device(self.reference_device)
            except RuntimeError as e:
                raise ValueError(
                    f"reference_device {self.reference_device!r} is not a torch device: {e}"
                ) from e
        return self

    @model_validator(mode="after")
    def _batch_sizes(self) -> _PolicyGradientConfig:
        total = self.prompts_per_step * self.group_size  # type: ignore[attr-defined]
        mb = self.minibatch_size or total
        if total % mb:
            raise ValueError(f"minibatch_size={mb} must divide prompts_per_step*group_size={total}")
        if self.micro_batch_size is not None and mb % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide minibatch_size={mb}")
        return self


class GRPOConfig(_PolicyGradientConfig):
    """GRPO (Shao et al. 2024) and its family: DAPO, Dr. GRPO, RLOO, REINFORCE++ — options of one trainer.

    Presets: `configs/grpo_arithmetic.yaml`, `dapo_arithmetic.yaml`, `drgrpo_arithmetic.yaml`,
    `rloo_arithmetic.yaml`.
    """

    group_size: int = Field(8, ge=2)
    """Samples per task (G)."""
    advantage_estimator: Literal["grpo", "rloo", "reinforce_pp"] = "grpo"
    """Group-relative (GRPO), leave-one-out (RLOO), or token returns normalised over the batch
    (REINFORCE++, whose KL belongs in the reward)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """GRPO advantage scaling: per-group std (GRPO), batch std, or none (Dr. GRPO)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose accuracy is all equal (all correct or all wrong:
    the env's `reward/correct` term, else the reward without the overlong penalty) and sample more
    tasks until the batch is full."""
    max_sampling_tries: int = Field(4, ge=1)
    """Rollout rounds per step with dynamic sampling; after the cap the batch is filled with
    dropped groups, which are masked out of the loss (no gradient, not counted in its normaliser)."""


class CriticConfig(_Strict):
    """PPO's value model: a transformer backbone with a scalar head per token."""

    path: str | None = None
    """HF folder to initialise the backbone from (default: the policy the PPO stage starts from)."""
    optim: OptimConfig = Field(default_factory=lambda: OptimConfig(lr=1e-4))
    """Optimizer of the critic (its own learning rate)."""
    value_clip: float | None = Field(0.2, gt=0.0)
    """ε_v of value clipping around the rollout's values; null disables."""
    epochs: int = Field(1, ge=1)
    """Passes of the critic over each rollout batch; those beyond the policy's `epochs` train
    the critic alone (a cheap way to let the value model keep up)."""


class PPOConfig(_PolicyGradientConfig):
    """PPO with a per-token critic and GAE, RLHF style (Ouyang et al. 2022; Schulman et al. 2017)."""

    group_size: int = Field(1, ge=1)
    """Samples per task (PPO needs no groups; more than 1 just samples each task several times)."""
    loss_aggregation: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"] = "token_mean"
    """How per-token policy and value losses are reduced."""
    kl_coef: float = Field(0.05, ge=0.0)
    """β_0 of the KL penalty to the reference."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k1"
    """KL estimator; k1 in the reward is unbiased."""
    kl_placement: Literal["loss", "reward"] = "reward"
    """KL in the per-token reward (RLHF) or in the loss."""
    kl_target: float | None = Field(None, gt=0.0)
    """Adaptive KL controller target (nats per sequence); null keeps β fixed."""
    kl_horizon: int = Field(10000, ge=1)
    """Adaptive controller horizon in sequences."""
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    """Discount per policy token."""
    lam: float = Field(0.95, ge=0.0, le=1.0)
    """GAE λ."""
    whiten_advantages: bool = True
    """Normalise advantages to zero mean and unit variance over the batch's policy tokens."""
    critic: CriticConfig = Field(default_factory=CriticConfig)
    """The value model."""
    critic_warmup_steps: int = Field(0, ge=0)
    """Iterations at the start that train only the critic (the policy is not updated)."""


class ParallelConfig(_Strict):
    """How the stages use the hardware: sharding under torchrun, mixed precision, activation memory.

    A run started by `torchrun --nproc-per-node N -m textgym train CONFIG` shards every
    trained model with FSDP2 over the N processes (`textgym.distributed`); started as
    `python -m textgym train`, it trains on one device as before and `mixed_precision`
    does not apply.
    """

    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Under torchrun: "bf16" computes in bf16 with fp32 master weights, optimizer state and
    gradient reduction (FSDP2's MixedPrecisionPolicy); "fp32" computes in fp32; "auto" is bf16
    on CUDA and fp32 on CPU."""
    gradient_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (HF's
    `gradient_checkpointing_enable`) for the trained models (policy, critic): less activation
    memory, about one more forward pass of compute. Groups then run their shared prompt once
    per row (the KV cache cannot be kept under checkpointing)."""


class RunConfig(_Strict):
    """A training run: a start model, optional SFT, optional RL (GRPO family or PPO), and an evaluation."""

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
    """GRPO-family stage (runs after SFT when set)."""
    ppo: PPOConfig | None = None
    """PPO stage (runs after SFT when set; a run has at most one RL stage)."""
    dpo: PreferenceConfig | None = None
    """Offline preference stage (DPO family, one or more collect → pair → train rounds) after SFT;
    instead of an RL stage."""
    eval: EvalConfig | None = None
    """Evaluation before and after the last training stage."""
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    """Sharding under torchrun, mixed precision and gradient checkpointing."""

    @model_validator(mode="after")
    def _has_stage(self) -> RunConfig:
        if self.sft is None and self.grpo is None and self.ppo is None and self.dpo is None:
            raise ValueError("a run needs at least one stage: sft, grpo, ppo or dpo")
        if sum(x is not None for x in (self.grpo, self.ppo, self.dpo)) > 1:
            raise ValueError("a run has at most one of the grpo, ppo and dpo stages")
        return self

    @property
    def rl(self) -> GRPOConfig | PPOConfig | None:
        """The RL stage's config (grpo or ppo), if any."""
        return self.grpo if self.grpo is not None else self.ppo

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
