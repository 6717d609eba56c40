"""The Bradley–Terry reward-model stage (`textgym rm train`, or `reward_model:` in a run config)."""

from __future__ import annotations

from pydantic import Field

from textgym.config.base import OptimConfig, _Batching


class RewardModelConfig(_Batching):
    """Training a Bradley–Terry reward model on pairs (`textgym rm train`).

    As the `reward_model:` stage of a run config, `textgym rm train CONFIG [key=value ...]`
    trains it from `pairs` into `out`; the same fields are `textgym rm train`'s flags, whose
    defaults are the ones below. `textgym train` does not run this stage: train the reward
    model first, then point an RL stage's `env.reward_model` at its folder.

    `micro_batch_tokens` and `packing` (from `_Batching`) apply to pairs: each pair is two
    sequences (chosen and rejected), so a pair counts as its prompt and its longer response
    against half the token budget; the held-out evaluation uses the same micro-batches.
    """

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
    pairs: str | None = None
    """`pairs.parquet` (`textgym pairs build`) or the folder holding it (`--pairs`); needed to train."""
    model: str | None = None
    """Causal LM folder the reward model starts from (`--model`); null = the run's `model.path` or
    `model.name`."""
    out: str | None = None
    """Output folder of the reward model (`--out`); null = `<out_dir>/<name>/reward_model`."""
