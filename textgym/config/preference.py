"""Offline preference optimisation (DPO, IPO, KTO, SimPO, ORPO): collection, pairing, the loss."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

from textgym.config.base import EnvConfig, LoraSettings, OptimConfig, SamplingConfig, _Batching, _Strict


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


class PreferenceConfig(_Batching):
    """Offline preference optimisation from logged rollouts: DPO, IPO, KTO, SimPO or ORPO.

    Each of `rounds` rounds collects rollouts of the current policy on `env`, builds pairs
    (or KTO's unpaired examples) and trains on them; one round is offline DPO from the
    start model's rollouts, several are iterative DPO. Preset: `configs/dpo_arithmetic.yaml`,
    `configs/iterative_dpo_arithmetic.yaml`.
    """

    env: EnvConfig
    """Where rollouts are collected."""
    loss: Literal["dpo", "ipo", "kto", "simpo", "orpo"] = "dpo"
    """The objective (`textgym.trainers.preference.offline`)."""
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
