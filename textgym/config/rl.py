"""On-policy RL schemas: the rollout engine, the options every policy-gradient stage shares, GRPO's family."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from textgym.config.base import EnvConfig, LoraSettings, OptimConfig, SamplingConfig, _Batching, _Strict


class OverlongPenaltyConfig(_Strict):
    """DAPO's soft overlong punishment (see `textgym.algorithms.advantages.overlong_penalty`)."""

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
    """Engine dtype; "auto" is "bfloat16" when the policy computes in bf16
    (`parallel.mixed_precision`), else the dtype of the policy's parameters."""
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
    `mismatch/*` metrics logged. null = on exactly when the engine is not the trainer (vLLM, or
    rollout `servers`) or the rollouts may be stale (`max_staleness > 0`).
    true on the transformers backend recomputes π_old too (one no-grad forward per step), for
    when the KV-cached sampling and the padded training forward differ (bf16, FSDP). false
    only drops the weighting: with vLLM, servers or `max_staleness > 0` the trainer still
    recomputes π_old, so the PPO ratio is centred on the current (proximal) policy."""
    tis_cap: float = Field(2.0, gt=0.0)
    """C, the truncation of the importance weight."""
    off_policy_correction: Literal["tis", "decoupled"] = "tis"
    """How TIS weights tokens whose π_old/π_rollout exceeds `tis_cap`: "tis" truncates the weight
    at the cap (Yao et al. 2025); "decoupled" is the decoupled PPO objective (AReaL, Fu et al.
    2025, arXiv:2505.24298, eq. 5): the clip is around π_prox = the trainer's π_old at the start
    of the update and the weight π_prox/π_behav is kept below the cap, those above it dropped
    (weight 0). Used when TIS is on (`tis`, or by default with vLLM or `max_staleness > 0`)."""
    max_staleness: int = Field(0, ge=0)
    """k of async RL: a rollout sampled by policy version v (the number of optimizer updates its
    weights had seen) trains versions up to v + k. 0 is the synchronous trainer exactly. k >= 1
    generates the next batches in a background thread with a copy of the policy while the
    trainer updates (`textgym.training.sources.async_producer`), TIS on unless `tis` says otherwise.
    Transformers backend, one process, no dynamic sampling (docs/training/async.md)."""
    vllm: VLLMEngineConfig = Field(default_factory=VLLMEngineConfig)
    """Engine settings for backend "vllm"."""
    mode: Literal["lockstep", "continuous"] = "lockstep"
    """How episodes are scheduled. "lockstep": each turn of every active episode is generated in
    one batch, then every env step runs, then the next turn. "continuous": an episode's next turn
    is submitted as soon as its env step returns, so slow env steps (sandbox, tools, web) overlap
    generation (`textgym.agents.continuous`); with `per_sequence_seeds` the trajectories equal
    lockstep's (log-probs up to float rounding). Gains only when env steps are slow: with
    instant steps it splits turns into smaller generate calls."""
    batch_window_s: float = Field(0.0, ge=0.0)
    """Continuous mode, in-process transformers backend: seconds a generate call may wait, once
    a turn is ready, for the env steps still running to return theirs (fewer, fuller calls;
    ends early once every unfinished episode is ready). 0: generate what is ready at once."""
    per_sequence_seeds: bool = False
    """Sample each sequence from its own generator, seeded by (run seed, step, the task's slot in
    the step's global batch, sample index, turn): the rollouts then depend neither on the number
    of ranks nor on how prompts are batched, so a run on N ranks samples what the same run on one
    samples (`textgym.agents.transformers_backend.TransformersBackend`). Transformers backend only (rollout
    `servers` are always sent one seed per request)."""
    servers: list[str] = Field(default_factory=list)
    """Base URLs of rollout servers (`textgym serve MODEL --weight-sync`, e.g.
    "http://10.0.0.5:8000") that generate the rollouts instead of the trainer; empty: generate
    in-process. Requests are spread over them (fewest in flight first), each with its own seed;
    the trainer pushes its weights to them before the first rollout and after every update
    (`textgym.training.sources.remote`, docs/training/rollout-servers.md). Under torchrun
    every rank generates its share through them and rank 0 alone pushes."""
    sync_timeout_s: float = Field(300.0, gt=0.0)
    """Seconds that joining the sync group, and then each whole weight push, may take before
    `WeightSyncError` (which stops the run; `--resume` continues from the last checkpoint)."""
    sync_http_timeout_s: float = Field(10.0, gt=0.0)
    """Seconds each HTTP call to a server may take (health checks, the sync's own calls)."""
    sync_bucket_mb: float = Field(256.0, gt=0.0)
    """MiB per broadcast of a weight push."""
    sync_backend: Literal["auto", "gloo", "nccl"] = "auto"
    """The sync group's backend: "auto" is NCCL where CUDA is available, else gloo."""
    sync_master_addr: str | None = None
    """The address the servers reach the trainer (rank 0) at; null: this machine's address on
    the route to the first server."""
    sync_lora: Literal["adapters", "merged"] = "adapters"
    """With `lora`: push the adapter factors only (each server merges them onto the base
    weights it started from) or the merged weights."""
    server_model: str | None = None
    """The model name the servers must serve (`--served-model-name`); null: whatever they
    serve, as long as every server serves the same name."""
    request_timeout_s: float = Field(120.0, gt=0.0)
    """Seconds one generation request to a server may take (then it is retried)."""
    server_concurrency: int = Field(16, ge=1)
    """Generation requests in flight at once, per server."""
    server_batch: int = Field(0, ge=0)
    """Prompts per generation request to the rollout servers in lockstep rollouts (one request
    with `prompt: [[ids], ...]` and a seed per prompt: the same tokens as one request each).
    0: each turn's prompts split evenly over the servers, one request per server; 1: one
    request per prompt (continuous rollouts always send one per episode turn). Per-request
    overhead (HTTP, JSON, a server round each) dominates small models' generation."""

    @property
    def use_tis(self) -> bool:
        """Whether TIS weights the loss (by default: when the sampler is not the trainer)."""
        if self.tis is not None:
            return self.tis
        return self.backend != "transformers" or bool(self.servers) or self.max_staleness > 0

    @model_validator(mode="after")
    def _server_urls(self) -> RolloutEngineConfig:
        for url in self.servers:
            if not url.startswith(("http://", "https://")):
                raise ValueError(f"servers: {url!r} is not an http:// or https:// URL")
        if len({u.rstrip("/") for u in self.servers}) != len(self.servers):
            raise ValueError("servers: a URL is listed twice")
        if self.servers and self.backend != "transformers":
            raise ValueError(
                "servers: with rollout servers the servers generate; leave backend at 'transformers' "
                "(start a server with `textgym serve MODEL --weight-sync --backend vllm` for vLLM)"
            )
        if self.max_staleness > 0 and self.backend != "transformers":
            raise ValueError(
                "max_staleness > 0 needs backend 'transformers' (the vLLM engine's weight push is "
                "not yet pipelined with generation)"
            )
        return self

    @model_validator(mode="after")
    def _seeds_need_transformers(self) -> RolloutEngineConfig:
        # Whether vLLM is installed is checked by `validate_runtime` (a fact of the machine).
        if self.backend == "vllm" and self.per_sequence_seeds:
            raise ValueError("per_sequence_seeds needs backend 'transformers'")
        return self


class _PolicyGradientConfig(_Batching):
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
    max_context_tokens: int | None = Field(None, ge=1)
    """Context window an episode must fit, in tokens (prompt, every turn and the next response):
    an episode that would outgrow it is truncated there and scored (`rollout`). Default: the
    model's `max_position_embeddings` (vLLM: its `max_model_len`)."""
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
    """How per-token losses are reduced (see `textgym.algorithms.aggregate.aggregate`)."""
    policy_loss: str = Field("ppo_clip", min_length=1)
    """A registered policy loss: PPO's clipped surrogate ("ppo_clip", with `clip_low`,
    `clip_high`, `dual_clip`); GSPO's sequence-level ratio ("gspo", Zheng et al. 2025, with
    `clip_low`, `clip_high` — the paper's are 3e-4 / 4e-4 — and `dual_clip`) or its token
    variant for per-token advantages ("gspo_token"); CISPO's clipped importance weight on
    REINFORCE ("cispo", MiniMax 2025, with `cispo_clip_low`, `cispo_clip_high`, and
    `loss_aggregation: token_mean` as in the paper); or one registered with
    `@textgym.algorithms.registry.register_policy_loss(name)`; the name is checked against the
    registry before work starts (`textgym.pipeline.preflight`). A built-in refuses the clip
    options it does not use (see `textgym.algorithms.policy_losses`)."""
    cispo_clip_low: float | None = Field(None, ge=0.0, lt=1.0)
    """ε_low^IS of `policy_loss: cispo`: its importance weight is clipped below at
    1 − cispo_clip_low; null: no lower bound (MiniMax-M1's setting)."""
    cispo_clip_high: float = Field(4.0, ge=0.0)
    """ε_high^IS of `policy_loss: cispo`: its importance weight is capped at 1 + cispo_clip_high.
    The default cap 5 is TRL's recommended `epsilon_high=5.0` (TRL's CISPO cap is
    `epsilon_high` itself, the paper's is 1 + ε_high^IS)."""
    kl_coef: float = Field(0.0, ge=0.0)
    """β of the KL-to-reference term; 0 skips loading the reference model."""
    kl_estimator: Literal["k1", "k2", "k3"] = "k3"
    """KL estimator (see `textgym.algorithms.kl.kl_estimate`)."""
    kl_placement: Literal["loss", "reward"] = "loss"
    """Where β·KL goes: differentiated in the loss (GRPO) or subtracted from the reward (RLHF PPO,
    REINFORCE++, no gradient through it). Gold standard: k1 in the reward; k1 in the loss has zero
    expected gradient; k3 in the reward is biased and refused (docs/maths.md, "KL estimators and where
    they go"). REINFORCE++ (`advantage_estimator: reinforce_pp`) needs it in the reward."""
    entropy_coef: float = Field(0.0, ge=0.0)
    """Entropy bonus: the loss gets −coef·H (token mean over policy tokens)."""
    entropy_every: int = Field(1, ge=0)
    """Log the policy's mean token entropy (`entropy`) every this many steps (0: never). It costs
    a softmax over the vocabulary for every token of the update, which at a real vocabulary
    (151,936 ids) is a few percent of the step; with `entropy_coef > 0` it is computed every
    step anyway, since the bonus needs it."""
    reward_source: Literal["outcome", "steps", "both"] = "outcome"
    """What the per-token rewards are: "outcome" (each turn's reward on its last policy token),
    "steps" (the process rewards of the env's `info["step_rewards"]` or a process reward model,
    each on the token that ends its step), or "both" (their sum, the steps weighted by
    `step_reward_weight`); see `RolloutBatch.with_reward_source`. PPO's GAE runs over whichever
    it is; of the group estimators, `grpo_process` normalises each reward event over its group."""
    step_reward_weight: float = Field(1.0, ge=0.0)
    """Weight of the process rewards with `reward_source` "steps" or "both"."""
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
    def _policy_loss_options(self) -> _PolicyGradientConfig:
        # The built-in losses refuse the options they would ignore (a user-registered loss may
        # read any field, so it is not checked).
        def changed(*names: str) -> list[str]:
            fields = type(self).model_fields
            return [n for n in names if getattr(self, n) != fields[n].default]

        if self.policy_loss == "cispo":
            unused = changed("clip_low", "clip_high", "dual_clip")
            if unused:
                raise ValueError(
                    f"{', '.join(unused)}: not used by policy_loss 'cispo', which has no clipped "
                    "surrogate; it clips its importance weight with cispo_clip_low / cispo_clip_high"
                )
        elif self.policy_loss in ("ppo_clip", "gspo", "gspo_token"):
            unused = changed("cispo_clip_low", "cispo_clip_high")
            if unused:
                raise ValueError(
                    f"{', '.join(unused)}: only policy_loss 'cispo' uses it, not {self.policy_loss!r} "
                    "(whose clip range is clip_low / clip_high)"
                )
        return self

    @model_validator(mode="after")
    def _kl_estimator_in_reward(self) -> _PolicyGradientConfig:
        # k3's score-function gradient is ∇KL(π‖π_ref) − ∇KL(π_ref‖π): biased, and reported to
        # collapse training (docs/maths.md, "KL estimators and where they go").
        if self.kl_coef > 0 and self.kl_placement == "reward" and self.kl_estimator == "k3":
            raise ValueError(
                "kl_estimator k3 with kl_placement reward: its gradient in the reward is biased "
                "(∇KL(π‖π_ref) − ∇KL(π_ref‖π)) and collapses training; use kl_estimator k1 in the "
                "reward, or kl_placement loss with k3 (docs/maths.md)"
            )
        return self

    @property
    def batch_rows(self) -> int:
        """The global batch of an iteration: `prompts_per_step × group_size` rollouts, over all ranks."""
        return self.prompts_per_step * self.group_size  # type: ignore[attr-defined,no-any-return]

    @model_validator(mode="after")
    def _batch_sizes(self) -> _PolicyGradientConfig:
        total = self.batch_rows
        mb = self.minibatch_size or total
        if total % mb:
            raise ValueError(f"minibatch_size={mb} must divide prompts_per_step*group_size={total}")
        if self.micro_batch_size is not None and mb % self.micro_batch_size:
            raise ValueError(f"micro_batch_size={self.micro_batch_size} must divide minibatch_size={mb}")
        return self


class GRPOConfig(_PolicyGradientConfig):
    """GRPO (Shao et al. 2024) and its family (DAPO, Dr. GRPO, RLOO, REINFORCE++, GSPO, CISPO): one trainer.

    Presets: `configs/grpo_arithmetic.yaml`, `dapo_arithmetic.yaml`, `drgrpo_arithmetic.yaml`,
    `rloo_arithmetic.yaml`, `gspo_arithmetic.yaml`, `cispo_arithmetic.yaml`.
    """

    group_size: int = Field(8, ge=2)
    """Samples per task (G)."""
    advantage_estimator: str = Field("grpo", min_length=1)
    """A registered advantage estimator: group-relative ("grpo"), leave-one-out ("rloo"), token
    returns normalised over the batch ("reinforce_pp", whose KL belongs in the reward), process
    supervision ("grpo_process": each reward event normalised over its group, with
    `reward_source` "steps" or "both"; its KL belongs in the loss), or one
    registered with `@textgym.algorithms.registry.register_advantage(name)`; the name is checked
    against the registry before work starts (`textgym.pipeline.preflight`)."""
    scale_rewards: Literal["group", "batch", "none"] = "group"
    """GRPO advantage scaling: per-group std (GRPO), batch std, or none (Dr. GRPO)."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: drop groups whose accuracy is all equal (all correct or all wrong:
    the env's `reward/correct` term, else the reward without the overlong penalty) and sample more
    tasks until the batch is full."""
    max_sampling_tries: int = Field(4, ge=1)
    """Rollout rounds per step with dynamic sampling; after the cap the batch is filled with
    dropped groups, which are masked out of the loss (no gradient, not counted in its normaliser)."""
    expert_guidance: bool = False
    """Off-policy guidance from the env's expert (after LUFFY, Yan et al. 2025, arXiv:2504.14945):
    in a group whose samples all fail (every `group_accuracy` ≤ 0, so the group has no gradient),
    the last sample is replaced by the env's `oracle_action` episode of the same task, written
    in the policy's tokens (`OracleDemonstrator`); its π_old is the trainer's log-probs of those
    tokens, so its ratio starts at 1 and its group-relative advantage is positive when the
    expert wins. Needs an env with `oracle_action`; not with `dynamic_sampling` (which drops
    such groups), async rollouts (`rollout.max_staleness` > 0), top-k/top-p cuts (an expert
    token outside the cut has no probability) or an LLM judge (`env.judge`). The step's
    `rollout/*` metrics are the policy's own samples; `guidance/groups_frac` is the share of
    groups guided."""

    @model_validator(mode="after")
    def _staleness_without_dynamic_sampling(self) -> GRPOConfig:
        if self.rollout.max_staleness > 0 and self.dynamic_sampling:
            raise ValueError(
                "rollout.max_staleness > 0 with dynamic_sampling is not supported yet: the extra "
                "rounds would be sampled by the trainer's current policy, out of the pipeline"
            )
        return self

    @model_validator(mode="after")
    def _guidance_alone(self) -> GRPOConfig:
        if not self.expert_guidance:
            return self
        clash = [
            name
            for name, on in (
                ("dynamic_sampling", self.dynamic_sampling),
                ("rollout.max_staleness > 0", self.rollout.max_staleness > 0),
                ("sampling.top_k", self.sampling.top_k > 0),
                ("sampling.top_p < 1", self.sampling.top_p < 1.0),
                ("env.judge", self.env.judge is not None),
            )
            if on
        ]
        if clash:
            raise ValueError(
                f"expert_guidance does not go with {', '.join(clash)}: dynamic sampling drops the "
                "groups it guides, async batches are sampled ahead of the trainer, and an expert "
                "token outside a top-k/top-p cut has log-probability -inf; an LLM judge scores whole "
                "groups of sampled rows"
            )
        return self

    @model_validator(mode="after")
    def _reinforce_pp_kl_in_reward(self) -> GRPOConfig:
        if self.advantage_estimator == "reinforce_pp" and self.kl_placement == "loss" and self.kl_coef > 0:
            raise ValueError(
                "advantage_estimator reinforce_pp folds the KL into the token rewards before its "
                "returns (Hu 2025): put it in the reward (kl_placement: reward, kl_estimator: k1)"
            )
        return self

    @model_validator(mode="after")
    def _process_kl_in_loss(self) -> GRPOConfig:
        if self.advantage_estimator == "grpo_process" and self.kl_placement == "reward" and self.kl_coef > 0:
            raise ValueError(
                "advantage_estimator grpo_process reads rewards at the reward events only: "
                "put the KL in the loss (kl_placement: loss)"
            )
        return self
