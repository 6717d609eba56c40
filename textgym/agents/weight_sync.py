"""Weights for the rollout engine: what a live policy sends to an in-process vLLM engine.

A plain policy sends its own `state_dict()`. A LoRA policy (a `peft.PeftModel`, see
`textgym.trainers.lora`) is served merged: W + (α / r)·B A under the base model's parameter
names (Hu et al. 2021, arXiv:2106.09685, eq. 3), computed without touching the module. These
helpers live beside the engine so that the rollout side never imports the trainers;
`textgym.trainers.lora` re-exports them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from textgym import distributed


def is_lora(model: Any) -> bool:
    """True when `model` is a `peft.PeftModel` (a policy with adapters)."""
    try:
        from peft import PeftModel
    except ImportError:  # pragma: no cover - peft is a dependency
        return False
    return isinstance(model, PeftModel)


def merge_state(model: Any, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """W + (α / r)·B A for every LoRA layer of `model`, from `state` (a full `model.state_dict()`).

    Keys are the base model's own parameter names (peft's `base_model.model.` prefix and the
    `.base_layer.` / adapter entries removed). Tensors LoRA does not touch are passed through.
    """
    from peft.tuners.lora import LoraLayer

    prefix = "base_model.model."
    base_state = {k.removeprefix(prefix): v for k, v in state.items()}
    out: dict[str, torch.Tensor] = {}
    for key, value in base_state.items():
        if ".lora_" in key:
            continue
        out[key.replace(".base_layer.", ".")] = value
    for name, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module  # a peft lora.Linear
        weight = base_state[f"{name}.base_layer.weight"]
        merged = weight.clone()
        for adapter in layer.active_adapters:
            if adapter not in layer.lora_A:
                continue
            a = base_state[f"{name}.lora_A.{adapter}.weight"].float()
            b = base_state[f"{name}.lora_B.{adapter}.weight"].float()
            delta = b @ a  # [out, r] @ [r, in] (Hu et al. 2021, eq. 3)
            if layer.fan_in_fan_out:  # GPT-2's Conv1D keeps W as [in, out]
                delta = delta.T
            merged += (delta * layer.scaling[adapter]).to(merged.dtype)
        out[f"{name}.weight"] = merged
    return out


@torch.no_grad()
def merged_state_dict(model: Any) -> dict[str, torch.Tensor]:
    """Weights of the merged model, W + (α / r)·B A, keyed by the base model's parameter names.

    The module is not modified (no merge/unmerge round trip, so no rounding drift across
    steps). Tensors that LoRA does not touch are returned as they are (shared, not copied).
    For a model sharded over several ranks (FSDP2) this is collective: every rank calls it,
    the full weights are gathered to rank 0's CPU, and rank 0 gets the merged weights while
    the other ranks get `{}`.

    Raises:
        TypeError: if `model` has no adapters.
    """
    if not is_lora(model):
        raise TypeError("merged_state_dict needs a LoRA policy (a peft.PeftModel)")
    if distributed.is_sharded(model):
        state = distributed.model_state(model)
        return merge_state(model, state) if distributed.is_main() else {}
    return merge_state(model, model.state_dict())


def rollout_weights(model: Any) -> Iterable[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs to load into the rollout engine: merged weights for a LoRA policy.

    Collective for a sharded LoRA policy (see `merged_state_dict`).
    """
    return (merged_state_dict(model) if is_lora(model) else model.state_dict()).items()
