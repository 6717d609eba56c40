"""The rollout engine of an on-policy trainer: an in-process vLLM engine fed the live policy's weights.

With `rollout.backend: vllm` the engine samples and the trainer pushes its weights into it
after each iteration's optimizer steps (`sync_weights`); with the transformers backend the
policy samples itself and there is no engine.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym.agents.weight_sync import rollout_weights
from textgym.config import GRPOConfig, OnlineDPOConfig, PPOConfig
from textgym.training.precision import compute_dtype


def build_engine(
    cfg: GRPOConfig | PPOConfig | OnlineDPOConfig,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    eos_ids: list[int],
    seed: int,
) -> Any:
    """A `VLLMBackend` for the live policy when `cfg.rollout.backend == "vllm"`, else None.

    With `rollout.vllm.dtype: auto` the engine computes in bfloat16 when the policy computes in
    bf16 (`precision.compute_dtype`, set from `parallel.mixed_precision`), else in the dtype of
    the policy's parameters; any other value is passed to vLLM as it is.

    Raises:
        ImportError: when vLLM is not installed.
    """
    if cfg.rollout.backend != "vllm":
        return None
    from textgym.agents.vllm_backend import VLLMBackend

    v = cfg.rollout.vllm
    dtype = v.dtype
    if dtype == "auto" and compute_dtype(model) == torch.bfloat16:
        dtype = "bfloat16"
    return VLLMBackend.for_policy(
        model,
        tokenizer,
        eos_ids,
        gpu_memory_utilization=v.gpu_memory_utilization,
        kv_cache_gib=v.kv_cache_gib,
        max_model_len=v.max_model_len,
        enforce_eager=v.enforce_eager,
        seed=seed,
        **({} if dtype == "auto" else {"dtype": dtype}),
    )


def sync_weights(engine: Any, policy: Any) -> None:
    """Load the policy's current weights into the engine (merged weights for a LoRA policy)."""
    engine.load_weights(rollout_weights(policy))
