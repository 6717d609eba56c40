"""FSDP2 sharding, full weights for generation, and full (single-process format) state dicts.

Each transformer block (the classes HF lists in `_no_split_modules`) is one FSDP2 unit, then
the root. `model_state` / `optimizer_state` gather full state dicts to rank 0;
`load_model_state` / `load_optimizer_state` broadcast rank 0's and shard them.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

from textgym.distributed.collectives import broadcast_object
from textgym.distributed.process_group import world

MixedPrecision = Literal["auto", "bf16", "fp32"]


def resolve_mixed_precision(setting: MixedPrecision, device: torch.device) -> bool:
    """Whether bf16 compute is on: "auto" → on CUDA only; "bf16" → on; "fp32" → off."""
    if setting == "auto":
        return device.type == "cuda"
    return setting == "bf16"


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether `model` is wrapped by FSDP2 (`fully_shard`)."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def shard(model: torch.nn.Module, *, bf16: bool = False, offload: bool = False) -> torch.nn.Module:
    """Shard `model` with FSDP2 over all ranks: each transformer block, then the root.

    Blocks are the submodules whose class is in the model's `_no_split_modules` (HF's list of
    layers that must not be split, e.g. `Qwen2DecoderLayer`). Every rank must hold the same
    weights when this is called (they load the same folder). The model is modified in place
    (its class becomes an FSDP subclass; parameters become `DTensor` shards) and returned.
    Build optimizers after this call. A no-op when no process group is initialised.

    Args:
        model: a Hugging Face model on this rank's device.
        bf16: compute in bf16 with fp32 master weights and fp32 gradient reduction.
        offload: keep the shards in CPU memory (pinned on CUDA) and copy each unit to the
            device for its forward (FSDP2's `CPUOffloadPolicy`); for a frozen model whose
            device memory is better spent elsewhere (the reference).

    Returns:
        `model`.
    """
    if not world().active:
        return model
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if bf16:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    block_names = set(getattr(model, "_no_split_modules", None) or [])
    for module in model.modules():
        if module is not model and type(module).__name__ in block_names:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    # A one-label head (PPO's critic) returns its logits as a reshaped view, which FSDP2 warns
    # about on every call because an in-place op on it would skip a hook; no trainer modifies a
    # model's output in place (the 2-rank PPO parity test checks the critic's gradients).
    warnings.filterwarnings("ignore", message=r"FSDP2-wrapped module .* returned a view tensor")
    return model


@contextmanager
def full_params(model: torch.nn.Module) -> Iterator[None]:
    """Keep `model`'s full (unsharded) weights on every rank inside the block.

    For generation and evaluation, whose forward calls differ in number between ranks:
    inside, a forward makes no collective call, so one rank may run alone. Entering costs one
    all-gather of every unit (collective: every rank must enter); leaving frees the full
    weights. Use it under `torch.no_grad()` only (no backward inside). A no-op for a model
    that is not sharded.
    """
    if not is_sharded(model):
        yield
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for u in units:
        u.unshard()
        u.set_reshard_after_forward(False, recurse=False)
    try:
        yield
    finally:
        for u in units:
            # FSDP2's defaults: blocks free their full weights after forward, the root keeps them
            # (it is needed again at once by backward).
            u.set_reshard_after_forward(u is not model, recurse=False)
            u.reshard()


def grad_norm(norm: torch.Tensor) -> float:
    """The float of a gradient norm returned by `clip_grad_norm_` (a replicated `DTensor` under FSDP2)."""
    full = getattr(norm, "full_tensor", None)
    return float(full() if full is not None else norm)


def set_requires_gradient_sync(model: torch.nn.Module, sync: bool) -> None:
    """Skip (False) or do (True) the gradient reduce-scatter of the next backward passes.

    Gradient accumulation calls it with False for all micro-batches but the last, which
    then reduces the accumulated gradient once. A no-op for a model that is not sharded.
    """
    if is_sharded(model):
        model.set_requires_gradient_sync(sync)  # type: ignore[operator]


def _full_options(**kw: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(full_state_dict=True, **kw)


def model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The full state dict of `model` on rank 0, on CPU (`{}` on other ranks).

    Collective for a sharded model (every rank must call it); `model.state_dict()` otherwise.
    """
    if not is_sharded(model):
        return model.state_dict()
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    state: dict[str, Any] = get_model_state_dict(model, options=_full_options(cpu_offload=True))
    return state if world().is_main else {}


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load a full state dict (needed on rank 0 only when sharded) into `model`.

    Returns:
        (missing keys, unexpected keys), as `load_state_dict(strict=False)` reports them.
    """
    if not is_sharded(model):
        missing, unexpected = model.load_state_dict(state, strict=False)
        return list(missing), list(unexpected)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    keys = broadcast_object(sorted(state) if world().is_main else [])
    expected = set(model.state_dict())  # names only: a sharded state dict needs no communication
    unexpected = sorted(set(keys) - expected)
    if unexpected:
        return [], unexpected
    full: dict[str, Any] = state if world().is_main else {}
    set_model_state_dict(model, full, options=_full_options(broadcast_from_rank0=True, strict=False))
    return sorted(expected - set(keys)), []


def _param_names(model: torch.nn.Module) -> list[str]:
    """Names of the trainable parameters in `model.parameters()` order (the optimizer's indices)."""
    return [n for n, p in model.named_parameters() if p.requires_grad]


def optimizer_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """The optimizer's full state on rank 0 in `optimizer.state_dict()`'s own format (`{}` elsewhere).

    torch.distributed.checkpoint keys a full optimizer state by parameter name; it is mapped
    back to the integer indices a single-process `optimizer.state_dict()` uses (the order of
    `model.parameters()` that `build_optimizer` passes), so the file is the same either way.
    Collective for a sharded model.
    """
    if not is_sharded(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    named: Any = get_optimizer_state_dict(model, optimizer, options=_full_options(cpu_offload=True))
    if not world().is_main:
        return {}
    index = {name: i for i, name in enumerate(_param_names(model))}
    return {
        "state": {index[name]: s for name, s in named["state"].items()},
        "param_groups": [
            {**g, "params": [index[name] for name in g["params"]]} for g in named["param_groups"]
        ],
    }


def load_optimizer_state(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]
) -> None:
    """Load an `optimizer.state_dict()`-format state (needed on rank 0 only when sharded).

    Raises:
        ValueError: if the state does not index the model's trainable parameters.
    """
    if not is_sharded(model):
        optimizer.load_state_dict(state)
        return
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    named: dict[str, Any] = {}
    if world().is_main:
        names = _param_names(model)
        n_state = sum(len(g["params"]) for g in state["param_groups"])
        if n_state != len(names):
            raise ValueError(f"optimizer state has {n_state} parameters, the model trains {len(names)}")
        named = {
            "state": {names[int(i)]: s for i, s in state["state"].items()},
            "param_groups": [
                {**g, "params": [names[int(i)] for i in g["params"]]} for g in state["param_groups"]
            ],
        }
    set_optimizer_state_dict(model, optimizer, named, options=_full_options(broadcast_from_rank0=True))
