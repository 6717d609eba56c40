"""Data-parallel and sharded training on `torch.distributed`, launched by `torchrun`.

`torchrun --nproc-per-node N -m textgym train CONFIG` starts N processes; each reads its
place from the environment torchrun sets (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, plus
`MASTER_ADDR`/`MASTER_PORT`), and `init` joins the process group: NCCL when CUDA is
available (one GPU per process, `cuda:LOCAL_RANK`), gloo on CPU. Started any other way
(`python -m textgym train`), nothing is initialised and every function here is a no-op
that returns what a world of one would: the single-process trainers are unchanged.

Models are sharded with PyTorch's FSDP2 (`torch.distributed.fsdp.fully_shard`): each
transformer block (the classes HF lists in `_no_split_modules`) is one unit, then the
root (embeddings, final norm, head). Parameters, gradients and optimizer state live
sharded, 1/N per rank; a forward all-gathers one block at a time and frees it after
(ZeRO-3). FSDP2 runs on CPU with gloo in torch 2.13 (the tests use it), so there is no
DDP fallback. Gradients are *averaged* over ranks by the reduce-scatter, which is why the
trainers divide their per-rank loss by `share` of the global count (see `share`).

Mixed precision is FSDP2's `MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`:
fp32 master weights and optimizer state, bf16 compute, fp32 gradient reduction.
`resolve_mixed_precision("auto")` picks it on CUDA only.

Generation cannot run sharded: ranks stop at different lengths and multi-turn episodes
take different numbers of turns, so their forward calls (each an all-gather) would not
pair up. `full_params(model)` all-gathers every unit once and keeps the full weights on
each rank while the block runs (rollouts, evaluation), after which the shards are
restored; inside it a forward makes no collective call.

Checkpoints stay in the single-process format (`textgym.trainers.checkpoint`): `model_state`
and `optimizer_state` gather full, unsharded state dicts (torch.distributed.checkpoint's
`get_*_state_dict(..., full_state_dict=True, cpu_offload=True)`) on rank 0, which writes
them; `load_model_state` / `load_optimizer_state` take such a state on rank 0 and
broadcast-and-shard it. A checkpoint written by any number of ranks therefore resumes on
any number, including one.

Multi-node runs assume the run directory and the start model are on a filesystem every
node sees (every rank loads the start model from disk; rank 0 alone writes).
"""

from __future__ import annotations

import datetime
import os
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")

MixedPrecision = Literal["auto", "bf16", "fp32"]


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of a run.

    Attributes:
        rank: global rank, 0 … size−1 (rank 0 writes the run directory).
        size: number of processes (1 when not launched by torchrun).
        local_rank: rank on this node (the CUDA device index with NCCL).
        backend: "nccl", "gloo", or "" when no process group is initialised.
    """

    rank: int = 0
    size: int = 1
    local_rank: int = 0
    backend: str = ""

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0."""
        return self.rank == 0

    @property
    def active(self) -> bool:
        """Whether a process group is initialised (launched by torchrun, even with one process)."""
        return self.backend != ""


_WORLD = World()


def launched() -> bool:
    """Whether torchrun (or another launcher) set `RANK` and `WORLD_SIZE` for this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def init(device: str = "auto", timeout_min: float | None = None) -> World:
    """Join the process group torchrun set up; a no-op (world of one) when not launched by it.

    Idempotent: a second call returns the same `World`.

    Args:
        device: the run's device setting ("auto", "cpu", "cuda"): NCCL is used when it
            resolves to CUDA, gloo otherwise.
        timeout_min: collective timeout in minutes (default `TEXTGYM_DIST_TIMEOUT_MIN` or
            120: rank 0 evaluates alone while the others wait at a barrier).

    Returns:
        This process's `World`.

    Raises:
        RuntimeError: if CUDA is requested but there are fewer GPUs on the node than local ranks.
    """
    global _WORLD
    if _WORLD.active or not launched():
        return _WORLD
    rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    if use_cuda:
        if local_rank >= torch.cuda.device_count():
            raise RuntimeError(
                f"local rank {local_rank} has no GPU ({torch.cuda.device_count()} visible); "
                "start at most one process per GPU (torchrun --nproc-per-node)"
            )
        torch.cuda.set_device(local_rank)
    backend = "nccl" if use_cuda else "gloo"
    minutes = timeout_min or float(os.environ.get("TEXTGYM_DIST_TIMEOUT_MIN", "120"))
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(minutes=minutes))
    _WORLD = World(rank, size, local_rank, backend)
    return _WORLD


def shutdown(wait: bool = True) -> None:
    """Leave the process group (after a final barrier when `wait`); a no-op when none was joined."""
    global _WORLD
    if _WORLD.active and dist.is_initialized():
        if wait:
            dist.barrier()
        dist.destroy_process_group()
    _WORLD = World()


def world() -> World:
    """This process's `World` (rank 0 of 1 until `init` joins a process group)."""
    return _WORLD


def is_main() -> bool:
    """Whether this process is rank 0 (always true when not distributed)."""
    return _WORLD.rank == 0


def device(setting: str) -> torch.device:
    """This rank's device: `cuda:LOCAL_RANK` under NCCL, else `setting` ("auto": cuda if available)."""
    if _WORLD.backend == "nccl":
        return torch.device("cuda", _WORLD.local_rank)
    if setting == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(setting)


def _comm_device() -> torch.device:
    return torch.device("cuda", _WORLD.local_rank) if _WORLD.backend == "nccl" else torch.device("cpu")


# --- collectives (identity in a world of one) ---------------------------------------------
def barrier() -> None:
    """Wait until every rank gets here."""
    if _WORLD.active:
        dist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """Return rank `src`'s `obj` on every rank (pickled; keep it small)."""
    if not _WORLD.active or _WORLD.size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def all_gather_list(items: Sequence[T]) -> list[T]:
    """Concatenate every rank's `items` in rank order, on every rank (pickled objects).

    With contiguous per-rank slices of a global batch, the result is the global batch in its
    original order.
    """
    if not _WORLD.active or _WORLD.size == 1:
        return list(items)
    parts: list[Any] = [None] * _WORLD.size
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def gather_list(items: Sequence[T], dst: int = 0) -> list[T]:
    """Concatenate every rank's `items` in rank order on rank `dst`; other ranks get `[]`."""
    if not _WORLD.active or _WORLD.size == 1:
        return list(items)
    parts: list[Any] | None = [None] * _WORLD.size if _WORLD.rank == dst else None
    dist.gather_object(list(items), parts, dst=dst)
    return [x for part in parts for x in part] if parts is not None else []


def all_gather_tensor(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0 in rank order (all ranks' shapes must be equal).

    Returns a tensor on `x`'s device; `x` itself in a world of one.
    """
    if not _WORLD.active or _WORLD.size == 1:
        return x
    src = x.detach().to(_comm_device()).contiguous()
    parts = [torch.empty_like(src) for _ in range(_WORLD.size)]
    dist.all_gather(parts, src)
    return torch.cat(parts).to(x.device)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of `x` over ranks (a new tensor on `x`'s device; `x` itself in a world of one).

    This is the `reduce` hook of `textgym.trainers.advantages` (whitening and explained
    variance over the global batch).
    """
    if not _WORLD.active or _WORLD.size == 1:
        return x
    y = x.detach().to(_comm_device(), copy=True)
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y.to(x.device)


def share(count: float) -> float:
    """This rank's share of a count summed over ranks: `Σ_ranks count / world size`.

    Gradients are averaged over ranks by FSDP, so a rank whose loss is its local sum divided
    by `share(local count)` contributes `Σ_local / N_global · world`, and the average over
    ranks is exactly the gradient of `Σ_global / N_global`, the single-process loss on the
    whole batch. In a world of one this is `count`.
    """
    if not _WORLD.active or _WORLD.size == 1:
        return float(count)
    return float(all_reduce_sum(torch.tensor([float(count)], dtype=torch.float64))[0]) / _WORLD.size


def mean(value: float) -> float:
    """The mean of a scalar over ranks (`value` in a world of one)."""
    return share(value)


MetricOp = Literal["mean", "sum", "max", "min"]


def metric_op(key: str) -> MetricOp:
    """How a metric is combined over ranks, from its name.

    `time/*` and `*_max`: max (the slowest rank sets the pace); `*_min`: min;
    `throughput/*`: sum; everything else: a (weighted) mean.
    """
    if key.startswith("time/") or key.endswith("_max"):
        return "max"
    if key.endswith("_min"):
        return "min"
    if key.startswith("throughput/"):
        return "sum"
    return "mean"


def reduce_metrics(
    metrics: dict[str, float],
    weights: dict[str, float] | None = None,
    ops: dict[str, MetricOp] | None = None,
) -> dict[str, float]:
    """Combine every rank's metrics into the run's metrics (identical on every rank).

    Means are weighted: `Σ_r w_r·v_r / Σ_r w_r`, with `weights[key]` this rank's weight (e.g.
    its token count for a token mean; default 1, right for means over equal numbers of
    sequences). A key missing on some rank is combined over the ranks that have it.
    The op per key is `ops[key]`, else `metric_op(key)`.

    Args:
        metrics: this rank's values.
        weights: this rank's weight per key (only used for "mean" keys).
        ops: explicit ops for some keys.

    Returns:
        The combined metrics (`metrics` itself in a world of one).
    """
    if not _WORLD.active or _WORLD.size == 1:
        return metrics
    weights = weights or {}
    keys = sorted({k for part in all_gather_list([sorted(metrics)]) for k in part})
    op_of: dict[str, MetricOp] = {k: (ops or {}).get(k) or metric_op(k) for k in keys}
    n = len(keys)
    sums = torch.zeros(2 * n, dtype=torch.float64)
    extreme = torch.full((n,), -float("inf"), dtype=torch.float64)
    for i, k in enumerate(keys):
        if k not in metrics:
            continue
        v = float(metrics[k])
        if op_of[k] == "mean":
            w = float(weights.get(k, 1.0))
            sums[i], sums[n + i] = w * v, w
        elif op_of[k] == "sum":
            sums[i], sums[n + i] = v, 1.0
        else:
            extreme[i] = v if op_of[k] == "max" else -v
    sums = all_reduce_sum(sums)
    ext = extreme.to(_comm_device())
    dist.all_reduce(ext, op=dist.ReduceOp.MAX)
    ext = ext.cpu()
    out: dict[str, float] = {}
    for i, k in enumerate(keys):
        if op_of[k] == "mean":
            out[k] = float(sums[i] / sums[n + i]) if float(sums[n + i]) != 0 else float(sums[i])
        elif op_of[k] == "sum":
            out[k] = float(sums[i])
        else:
            out[k] = float(ext[i]) if op_of[k] == "max" else -float(ext[i])
    return out


def on_main(fn: Callable[[], T]) -> T:
    """Run `fn` on rank 0 only and return its result on every rank (others wait).

    An exception on rank 0 is re-raised on every rank (as the same exception type when it
    can be rebuilt from its message, else RuntimeError), so no rank is left waiting.
    """
    if not _WORLD.active or _WORLD.size == 1:
        return fn()
    result: Any = None
    error: tuple[type[BaseException], str] | None = None
    if _WORLD.is_main:
        try:
            result = fn()
        except Exception as e:
            error = (type(e), str(e))
    result, error = broadcast_object((result, error))
    if error is not None:
        cls, message = error
        try:
            raise cls(message)
        except TypeError:
            raise RuntimeError(f"{cls.__name__} on rank 0: {message}") from None
    return result  # type: ignore[no-any-return]


def rank_seed(seed: int) -> int:
    """The seed of this rank's global RNGs: `seed` on rank 0, a distinct derived seed elsewhere."""
    return seed if _WORLD.rank == 0 else seed + 1_000_003 * _WORLD.rank


# --- sharding -------------------------------------------------------------------------------
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
    if not _WORLD.active:
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


# --- full state dicts (checkpoints in the single-process format) ---------------------------
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
    return state if _WORLD.is_main else {}


def load_model_state(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> tuple[list[str], list[str]]:
    """Load a full state dict (needed on rank 0 only when sharded) into `model`.

    Returns:
        (missing keys, unexpected keys), as `load_state_dict(strict=False)` reports them.
    """
    if not is_sharded(model):
        missing, unexpected = model.load_state_dict(state, strict=False)
        return list(missing), list(unexpected)
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    keys = broadcast_object(sorted(state) if _WORLD.is_main else [])
    expected = set(model.state_dict())  # names only: a sharded state dict needs no communication
    unexpected = sorted(set(keys) - expected)
    if unexpected:
        return [], unexpected
    full: dict[str, Any] = state if _WORLD.is_main else {}
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
    if not _WORLD.is_main:
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
    if _WORLD.is_main:
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


# --- memory report --------------------------------------------------------------------------
def memory_report(
    models: dict[str, tuple[torch.nn.Module, torch.optim.Optimizer | None]],
) -> dict[str, dict[str, float]]:
    """Bytes each model holds on this rank, in MiB: parameters, gradients and optimizer state.

    Sharded parameters count their local shard. Optimizer state counts what the optimizer
    holds, or — before its first step, when it holds nothing yet — what AdamW will hold:
    two moments per trainable element in the parameter's dtype. Activations and the
    all-gathered blocks of a forward are not included.

    Args:
        models: name → (model, its optimizer or None for a frozen model).

    Returns:
        name → {"params_m": parameters in millions (whole model), "param_mib", "grad_mib",
        "optim_mib" (this rank's bytes / 2**20)}.
    """
    mib = 2.0**20
    out: dict[str, dict[str, float]] = {}
    for name, (model, optimizer) in models.items():
        total = local = trainable = 0
        for p in model.parameters():
            shard_p = p.to_local() if hasattr(p, "to_local") else p
            total += p.numel()
            local += shard_p.numel() * shard_p.element_size()
            if p.requires_grad:
                trainable += shard_p.numel() * shard_p.element_size()
        optim = 0.0
        if optimizer is not None:
            held = [
                v.to_local() if hasattr(v, "to_local") else v
                for s in optimizer.state.values()
                for v in s.values()
                if isinstance(v, torch.Tensor)
            ]
            optim = sum(t.numel() * t.element_size() for t in held) if held else 2.0 * trainable
        out[name] = {
            "params_m": total / 1e6,
            "param_mib": local / mib,
            "grad_mib": (trainable if optimizer is not None else 0) / mib,
            "optim_mib": optim / mib,
        }
    return out


def format_memory_report(report: dict[str, dict[str, float]]) -> str:
    """One line per model: `policy 1.8M params · 7.0 MiB params + 7.0 grads + 14.0 optimizer per rank`."""
    lines = []
    for name, r in report.items():
        lines.append(
            f"{name} {r['params_m']:.1f}M params · {r['param_mib']:.1f} MiB params"
            f" + {r['grad_mib']:.1f} grads + {r['optim_mib']:.1f} optimizer per rank"
        )
    return "\n".join(lines)
