"""LoRA adapters for the trainers, through `peft`.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) freezes each targeted weight W [out, in]
and learns a low-rank update: h = W x + (α / r) · B A x, with A [r, in] (random init)
and B [out, r] (zero init), so training starts exactly at the base model. Only A and B
get gradients and optimizer state.

What the trainers build on it:
- `apply_lora` wraps a policy in a `peft.PeftModel` (the base weights frozen).
- The reference policy is the same module with its adapters disabled
  (`PeftModel.disable_adapter()`), so a KL penalty costs no second copy of the model.
- `merged_state_dict` (`textgym.agents.weight_sync`) gives the weights
  W + (α / r)·BA under the base model's own names, without touching the module: what the
  vLLM engine is sent after each update, and what `save_merged` writes as a plain Hugging Face
  folder (any loader, vLLM included, reads it).
- Checkpoints hold the adapter only (`adapter_model.safetensors`, `adapter_config.json`);
  `textgym.training.checkpoint.load_weights` restores it into a wrapped policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from textgym import distributed
from textgym.agents.weight_sync import is_lora, merged_state_dict

__all__ = [
    "adapter_state_for_model",
    "apply_lora",
    "reference_of",
    "save_merged",
    "write_merged",
]

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from textgym.config import LoraSettings


def apply_lora(model: PreTrainedModel, settings: LoraSettings, seed: int = 0) -> Any:
    """Wrap `model` with fresh LoRA adapters; only the adapters stay trainable.

    Args:
        model: a causal LM (any `transformers` model `peft` supports).
        settings: rank r, scale α, dropout, target modules.
        seed: seed of the random A matrices. Drawn from their own generator (the global RNG
            is left as it was), so every rank of a distributed run starts from the same
            adapters, which FSDP2 requires (it shards each rank's own copy).

    Returns:
        The `peft.PeftModel` (its forward at step 0 equals `model`'s exactly: B = 0).

    Raises:
        ValueError: from peft, when `target_modules` matches no module of `model`.
    """
    from peft import LoraConfig, get_peft_model

    config = LoraConfig(
        r=settings.r,
        lora_alpha=settings.alpha,
        lora_dropout=settings.dropout,
        target_modules=settings.target_modules,
        bias="none",
        task_type="CAUSAL_LM",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


@contextlib.contextmanager
def reference_of(model: Any) -> Iterator[Any]:
    """Context in which `model` computes the reference policy: the base model, adapters off.

    Yields the module to call. For a model without adapters this is an error (its reference
    is a separate frozen copy).

    Raises:
        TypeError: if `model` has no adapters.
    """
    if not is_lora(model):
        raise TypeError("reference_of needs a LoRA policy (a peft.PeftModel)")
    with model.disable_adapter():
        yield model


def adapter_state_for_model(model: Any, saved: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Adapter weights as peft saves them (`...lora_A.weight`) renamed to `model.state_dict()`'s keys.

    peft's files leave out the adapter's name (`...lora_A.default.weight` in the module);
    this puts the active adapter's name back, so the tensors can be loaded with a plain
    (or FSDP2's full) `load_state_dict`.

    Raises:
        TypeError: if `model` has no adapters.
    """
    if not is_lora(model):
        raise TypeError("adapter_state_for_model needs a LoRA policy (a peft.PeftModel)")
    adapter = model.active_adapter
    out = {}
    for key, value in saved.items():
        for part in ("lora_A", "lora_B"):
            key = key.replace(f".{part}.weight", f".{part}.{adapter}.weight")
        out[key] = value
    return out


def save_merged(model: Any, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write the merged model as a plain Hugging Face folder (config, safetensors, tokenizer).

    Collective for a sharded model (rank 0 writes).

    Raises:
        TypeError: if `model` has no adapters.
        RuntimeError: if the merged weights do not fit the base model's architecture.
    """
    weights = merged_state_dict(model)
    if distributed.is_main():
        write_merged(model, weights, tokenizer, folder)


def write_merged(
    model: Any, weights: dict[str, torch.Tensor], tokenizer: PreTrainedTokenizerBase, folder: Path
) -> None:
    """Write `weights` (from `merged_state_dict`) as a plain HF folder of `model`'s base class.

    Raises:
        RuntimeError: if the weights do not fit the base model's architecture.
    """
    base = model.get_base_model()
    # A fresh module of the base class with the merged weights: save_pretrained of the wrapped
    # base model would write peft's module names.
    from transformers import AutoModelForCausalLM

    plain = AutoModelForCausalLM.from_config(base.config, dtype=next(iter(weights.values())).dtype)
    missing, unexpected = plain.load_state_dict(weights, strict=False)
    if [k for k in missing if "lm_head" not in k] or unexpected:
        raise RuntimeError(
            f"merged weights do not match the base model: missing {missing}, unexpected {unexpected}"
        )
    plain.tie_weights()
    plain.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
