"""LoRA adapters for the trainers, through `peft`.

LoRA (Hu et al. 2021, arXiv:2106.09685, eq. 3) freezes each targeted weight W [out, in]
and learns a low-rank update: h = W x + (α / r) · B A x, with A [r, in] (random init)
and B [out, r] (zero init), so training starts exactly at the base model. Only A and B
get gradients and optimizer state.

What the trainers build on it:
- `apply_lora` wraps a policy in a `peft.PeftModel` (the base weights frozen).
- The reference policy is the same module with its adapters disabled
  (`PeftModel.disable_adapter()`), so a KL penalty costs no second copy of the model.
- `merged_state_dict` gives the weights W + (α / r)·BA under the base model's own names,
  without touching the module: what the vLLM engine is sent after each update, and what
  `save_merged` writes as a plain Hugging Face folder (any loader, vLLM included, reads it).
- Checkpoints hold the adapter only (`adapter_model.safetensors`, `adapter_config.json`);
  `textgym.trainers.common.load_weights` restores it into a wrapped policy.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from textgym.config import LoraSettings


def is_lora(model: Any) -> bool:
    """True when `model` is a `peft.PeftModel` (a policy with adapters)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def apply_lora(model: PreTrainedModel, settings: LoraSettings) -> Any:
    """Wrap `model` with fresh LoRA adapters; only the adapters stay trainable.

    Args:
        model: a causal LM (any `transformers` model `peft` supports).
        settings: rank r, scale α, dropout, target modules.

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


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Weights of the merged model, W + (α / r)·B A, keyed by the base model's parameter names.

    The module is not modified (no merge/unmerge round trip, so no rounding drift across
    steps). Tensors that LoRA does not touch are returned as they are (shared, not copied).

    Raises:
        TypeError: if `model` has no adapters.
    """
    if not is_lora(model):
        raise TypeError("merged_state_dict needs a LoRA policy (a peft.PeftModel)")
    from peft.tuners.lora import LoraLayer

    base = model.get_base_model()
    out: dict[str, torch.Tensor] = {}
    for key, value in base.state_dict().items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    for name, module in base.named_modules():
        if isinstance(module, LoraLayer):
            layer: Any = module  # a peft lora.Linear (get_delta_weight is on the concrete layers)
            weight: torch.Tensor = layer.get_base_layer().weight
            merged = weight.clone()
            for adapter in layer.active_adapters:
                if adapter in layer.lora_A:
                    merged += layer.get_delta_weight(adapter)
            out[f"{name}.weight"] = merged
    return out


def save_merged(model: Any, tokenizer: PreTrainedTokenizerBase, folder: Path) -> None:
    """Write the merged model as a plain Hugging Face folder (config, safetensors, tokenizer).

    Raises:
        TypeError: if `model` has no adapters.
    """
    weights = merged_state_dict(model)
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
