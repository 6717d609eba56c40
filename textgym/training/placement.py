"""Where an on-policy trainer's models live: the batch split over ranks, sharding, the reference.

The reference policy is the stage's start model, frozen; β = 0 never builds one. It is copied
before a checkpoint is loaded, so a resumed run has the same reference. With LoRA it is the
policy itself with its adapters disabled (`textgym.training.lora.reference_of`), no copy.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from transformers import PreTrainedModel

from textgym import distributed
from textgym.config import ConfigError, GRPOConfig, ParallelConfig, PPOConfig
from textgym.training.precision import set_precision


def check_world(cfg: GRPOConfig | PPOConfig, name: str, ranks: int) -> None:
    """Refuse a batch that does not split into whole prompts per rank (and vLLM) under torchrun.

    Raises:
        ConfigError: on several ranks, when `prompts_per_step` or the minibatch is not a
            multiple of the ranks, the rollout engine is vLLM, or `reference_device` is
            other than "cpu".
    """
    if ranks == 1:
        return
    mb = cfg.minibatch_size or cfg.batch_rows
    if cfg.prompts_per_step % ranks:
        raise ConfigError(
            f"{name}.prompts_per_step={cfg.prompts_per_step} must be a multiple of the number of "
            f"ranks ({ranks}): each rank rolls out whole groups of the same number of prompts"
        )
    if mb % ranks:
        raise ConfigError(f"{name}.minibatch_size={mb} must be a multiple of the number of ranks ({ranks})")
    if cfg.rollout.backend == "vllm":
        raise ConfigError(f"{name}.rollout.backend: vllm rollouts are not supported on several ranks yet")
    if cfg.reference_device not in (None, "cpu"):
        raise ConfigError(
            f"{name}.reference_device={cfg.reference_device!r}: on several ranks the reference is "
            'sharded with the policy, on each rank\'s device; only "cpu" (offload its shards) applies'
        )


def build_reference(
    cfg: GRPOConfig | PPOConfig, model: PreTrainedModel, parallel: ParallelConfig
) -> PreTrainedModel | None:
    """A frozen copy of the (unsharded) start policy, placed on `cfg.reference_device`; None without one.

    None when `kl_coef` is 0 or the policy has LoRA adapters (its reference is the policy with
    the adapters off). On several ranks `reference_device: cpu` is FSDP2's CPU offload of the
    reference's shards, applied when it is sharded (`shard(..., offload=True)`), not here.
    """
    if cfg.kl_coef <= 0 or cfg.lora is not None:
        return None
    reference = copy.deepcopy(model).eval().requires_grad_(False)
    if cfg.reference_device is not None and distributed.world().size == 1:
        reference.to(torch.device(cfg.reference_device))  # type: ignore[arg-type]
    if parallel.gradient_checkpointing:
        reference.gradient_checkpointing_disable()
    return reference


def shard(
    model: torch.nn.Module, parallel: ParallelConfig, device: torch.device, offload: bool = False
) -> Any:
    """Set `model`'s compute precision, and shard it over the ranks (FSDP2) under torchrun; return it.

    On one device the precision is `compute_autocast`'s record (`precision.set_precision`),
    resolved against the trainer's `device` for every model, the reference on the CPU
    included, so that the policy and its reference compute alike; under torchrun it is FSDP2's
    policy. `offload` keeps its shards in CPU memory (FSDP2's CPU offload; for the frozen
    reference).
    """
    set_precision(
        model, parallel.mixed_precision, device, tf32=parallel.tf32, cudnn_attention=parallel.cudnn_attention
    )
    bf16 = distributed.resolve_mixed_precision(parallel.mixed_precision, device)
    return distributed.shard(model, bf16=bf16, offload=offload)
