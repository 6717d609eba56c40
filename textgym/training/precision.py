"""Compute precision of a model on one device: bf16 autocast over fp32 weights, and TF32 on CUDA.

`set_precision(model, parallel.mixed_precision, device)` resolves the setting ("auto" → bf16
on CUDA, fp32 on CPU) and records the compute dtype on the model object; every forward that
trains or scores a model then runs inside `with compute_autocast(model):`, which is
`torch.autocast(device_type, dtype=torch.bfloat16)` for a bf16 model and a null context
otherwise. Autocast runs the matmuls (linear layers, attention products) in bf16 and keeps
reductions such as softmax and norms where PyTorch's autocast op lists put them; the
parameters, their gradients and the AdamW state stay fp32 (Micikevicius et al. 2018, "Mixed
Precision Training", arXiv:1710.03740, §3.1: an fp32 master copy of the weights; bf16 has
fp32's exponent range, so no loss scaling is needed).

Under torchrun the models are sharded with FSDP2, whose `MixedPrecisionPolicy` casts the
parameters to bf16 itself (`textgym.distributed.shard`); `set_precision` then records nothing
and `compute_autocast` is a null context, so the two mechanisms never stack.

TF32 (`parallel.tf32`) lets CUDA matmuls and convolutions on fp32 tensors use TensorFloat-32
(10-bit mantissa inputs, fp32 accumulation) on Ampere and newer GPUs; it has no effect on CPU
and is not set there. It is process-wide (`torch.backends.cuda.matmul.allow_tf32`). So is
cuDNN's fused attention, off by default on CUDA (`parallel.cudnn_attention`,
`set_cudnn_attention`: its backward gives NaN gradients on masked, left-padded batches).
"""

from __future__ import annotations

import contextlib
from typing import Literal

import torch

from textgym import distributed

MixedPrecision = Literal["auto", "bf16", "fp32"]

_ATTR = "_textgym_compute_dtype"


def resolve_compute_dtype(mixed_precision: MixedPrecision | str, device: torch.device | str) -> torch.dtype:
    """The compute dtype a `parallel.mixed_precision` setting means on `device`.

    "bf16" → `torch.bfloat16`; "fp32" → `torch.float32`; "auto" → bf16 on CUDA, fp32 elsewhere
    (CPU bf16 autocast is exact enough but not faster than fp32 on every CPU).

    Raises:
        ValueError: on a setting other than "auto", "bf16" or "fp32".
    """
    if mixed_precision not in ("auto", "bf16", "fp32"):
        raise ValueError(f"mixed_precision must be 'auto', 'bf16' or 'fp32', got {mixed_precision!r}")
    bf16 = distributed.resolve_mixed_precision(mixed_precision, torch.device(device))  # type: ignore[arg-type]
    return torch.bfloat16 if bf16 else torch.float32


def set_tf32(enabled: bool, device: torch.device | str) -> None:
    """Allow (or forbid) TF32 for fp32 matmuls and cuDNN convolutions when `device` is CUDA.

    Sets `torch.backends.cuda.matmul.allow_tf32` and `torch.backends.cudnn.allow_tf32`, which are
    process-wide; a no-op on any other device (TF32 is an NVIDIA tensor-core format).
    """
    if torch.device(device).type != "cuda":
        return
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def set_cudnn_attention(enabled: bool, device: torch.device | str) -> None:
    """Allow (or forbid) cuDNN's fused attention in `scaled_dot_product_attention` on CUDA.

    Forbidden by default (`parallel.cudnn_attention`): since torch 2.11 its backward returns NaN
    query gradients on H100/H200 when an attention mask is passed, the sequence length is 64
    mod 128, and a query row's logsumexp is below ln(FLT_MAX) ≈ 88.7 (pytorch/pytorch#196678;
    huggingface/trl#7181). A left-padded prompt's pad positions are query rows with every key
    masked (logsumexp −inf), so RL batches meet it whenever their width is 64 mod 128. Sets the
    process-wide `torch.backends.cuda.enable_cudnn_sdp`; a no-op on any other device.
    """
    if torch.device(device).type != "cuda":
        return
    torch.backends.cuda.enable_cudnn_sdp(enabled)


def set_precision(
    model: torch.nn.Module,
    mixed_precision: MixedPrecision | str,
    device: torch.device | str,
    *,
    tf32: bool = True,
    cudnn_attention: bool = False,
) -> None:
    """Record the compute dtype of `model` for `compute_autocast`; set TF32 and cuDNN attention on CUDA.

    The model's parameters are not cast: bf16 compute is autocast over the weights' own dtype
    (fp32 master weights unless the model was loaded in bf16, `model.dtype`). Under torchrun (a
    process group initialised) nothing is recorded, since FSDP2's policy handles bf16 there;
    TF32 is still set. Calling it again replaces the record.

    Args:
        model: the model (policy, critic, reference, reward model) as placed on `device`.
        mixed_precision: `parallel.mixed_precision` ("auto", "bf16" or "fp32").
        device: the device the model computes on; "auto" resolves against it.
        tf32: `parallel.tf32`; only read on CUDA.
        cudnn_attention: `parallel.cudnn_attention`; only read on CUDA (`set_cudnn_attention`).

    Raises:
        ValueError: on an unknown `mixed_precision`.
    """
    dtype = resolve_compute_dtype(mixed_precision, device)
    set_tf32(tf32, device)
    set_cudnn_attention(cudnn_attention, device)
    if distributed.world().active:
        dtype = torch.float32
    setattr(model, _ATTR, dtype)


def compute_dtype(model: torch.nn.Module) -> torch.dtype:
    """The compute dtype `set_precision` recorded on `model` (fp32 when none was recorded).

    Found through wrappers that forward attribute lookups (PEFT's `PeftModel`).
    """
    dtype = getattr(model, _ATTR, None)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


def _device_type(model: torch.nn.Module) -> str:
    for p in model.parameters():
        return p.device.type
    return "cpu"


def compute_autocast(model: torch.nn.Module) -> contextlib.AbstractContextManager[object]:
    """`torch.autocast` at the compute dtype recorded on `model`, or a null context for fp32.

    The device type is that of the model's parameters at call time ("cuda" or "cpu"), so a model
    moved after `set_precision` still autocasts on the right device. A model sharded by FSDP2
    always gets the null context (its own policy casts). Use it around forward passes only;
    losses computed from the (bf16) outputs should upcast them with `.float()`.
    """
    dtype = compute_dtype(model)
    if dtype == torch.float32 or distributed.is_sharded(model):
        return contextlib.nullcontext()
    return torch.autocast(device_type=_device_type(model), dtype=dtype)
