"""Weights for the rollout engine: what a live policy sends to an in-process vLLM engine.

A plain policy sends its own `state_dict()`. A LoRA policy (a `peft.PeftModel`, see
`textgym.training.lora`) is served merged: W + (α / r)·B A under the base model's parameter
names (Hu et al. 2021, arXiv:2106.09685, eq. 3), computed without touching the module. These
helpers live beside the engine so that the rollout side never imports the trainers;
`textgym.training.lora` re-exports them.
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


def merge_lora_weight(
    weight: torch.Tensor, factors: list[tuple[torch.Tensor, torch.Tensor, float]], fan_in_fan_out: bool
) -> torch.Tensor:
    """W + Σ_adapters (α / r)·B A for one layer (Hu et al. 2021, arXiv:2106.09685, eq. 3); a new tensor.

    The trainer (`merge_state`) and a rollout server (`textgym.serve.weights`) both merge with
    this function, so equal inputs give bitwise-equal weights on both.

    Args:
        weight: [out, in] the base weight ([in, out] when `fan_in_fan_out`, GPT-2's Conv1D).
        factors: per active adapter `(A [r, in], B [out, r], scale α / r)`.
        fan_in_fan_out: whether `weight` is stored transposed.

    Returns:
        The merged weight, `weight`'s shape and dtype (the product is taken in float32).
    """
    merged = weight.clone()
    for a, b, scale in factors:
        delta = b.float() @ a.float()  # [out, r] @ [r, in]
        if fan_in_fan_out:
            delta = delta.T
        merged += (delta * scale).to(merged.dtype)
    return merged


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
        factors = [
            (
                base_state[f"{name}.lora_A.{a}.weight"],
                base_state[f"{name}.lora_B.{a}.weight"],
                layer.scaling[a],
            )
            for a in layer.active_adapters
            if a in layer.lora_A
        ]
        out[f"{name}.weight"] = merge_lora_weight(
            base_state[f"{name}.base_layer.weight"], factors, bool(layer.fan_in_fan_out)
        )
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


@torch.no_grad()
def lora_adapters(model: Any) -> tuple[list[tuple[str, torch.Tensor]], list[dict[str, Any]]]:
    """The LoRA factors of `model`'s active adapters, and how each layer merges them.

    What a LoRA policy sends its rollout servers: the factors only (r·(in + out) numbers per
    layer instead of in·out); a server merges them onto its own base weights with
    `merge_lora_weight`. Collective for a sharded policy (see `merged_state_dict`): the
    tensors are gathered to rank 0, other ranks get `[]` tensors.

    Returns:
        `(tensors, layers)`: tensors `[(f"{module}.lora_A.{adapter}", A [r, in]),
        (f"{module}.lora_B.{adapter}", B [out, r]), ...]` under the base model's module names;
        layers `[{"module", "fan_in_fan_out", "adapters": [{"name", "scale"}]}]`, one per LoRA layer.

    Raises:
        TypeError: if `model` has no adapters.
        ValueError: if a trainable parameter lies outside the LoRA factors (e.g. peft's
            `modules_to_save`): adapters alone would not carry it; push merged weights instead.
    """
    from peft.tuners.lora import LoraLayer

    if not is_lora(model):
        raise TypeError("lora_adapters needs a LoRA policy (a peft.PeftModel)")
    extra = [n for n, p in model.named_parameters() if p.requires_grad and ".lora_" not in n]
    if extra:
        raise ValueError(
            f"trainable parameters outside the LoRA factors ({extra[0]}, ...): an adapter-only push "
            "would not carry them; push merged weights (lora='merged')"
        )
    state = distributed.model_state(model) if distributed.is_sharded(model) else model.state_dict()
    base_state = {k.removeprefix("base_model.model."): v for k, v in state.items()}
    tensors: list[tuple[str, torch.Tensor]] = []
    layers: list[dict[str, Any]] = []
    for name, module in model.get_base_model().named_modules():
        if not isinstance(module, LoraLayer):
            continue
        layer: Any = module
        adapters = [a for a in layer.active_adapters if a in layer.lora_A]
        layers.append(
            {
                "module": name,
                "fan_in_fan_out": bool(layer.fan_in_fan_out),
                "adapters": [{"name": a, "scale": float(layer.scaling[a])} for a in adapters],
            }
        )
        if base_state:
            for a in adapters:
                tensors.append((f"{name}.lora_A.{a}", base_state[f"{name}.lora_A.{a}.weight"]))
                tensors.append((f"{name}.lora_B.{a}", base_state[f"{name}.lora_B.{a}.weight"]))
    return tensors, layers
