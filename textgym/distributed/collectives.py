"""Collectives that are the identity in a world of one: barriers, gathers, sums and metric reduction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Literal, TypeVar

import torch
import torch.distributed as dist

from textgym.distributed.process_group import _comm_device, world

T = TypeVar("T")


def barrier() -> None:
    """Wait until every rank gets here."""
    if world().active:
        dist.barrier()


def broadcast_object(obj: T, src: int = 0) -> T:
    """Return rank `src`'s `obj` on every rank (pickled; keep it small)."""
    if not world().active or world().size == 1:
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]  # type: ignore[return-value]


def all_gather_list(items: Sequence[T]) -> list[T]:
    """Concatenate every rank's `items` in rank order, on every rank (pickled objects).

    With contiguous per-rank slices of a global batch, the result is the global batch in its
    original order.
    """
    if not world().active or world().size == 1:
        return list(items)
    parts: list[Any] = [None] * world().size
    dist.all_gather_object(parts, list(items))
    return [x for part in parts for x in part]


def gather_list(items: Sequence[T], dst: int = 0) -> list[T]:
    """Concatenate every rank's `items` in rank order on rank `dst`; other ranks get `[]`."""
    if not world().active or world().size == 1:
        return list(items)
    parts: list[Any] | None = [None] * world().size if world().rank == dst else None
    dist.gather_object(list(items), parts, dst=dst)
    return [x for part in parts for x in part] if parts is not None else []


def all_gather_tensor(x: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's `x` along dim 0 in rank order (all ranks' shapes must be equal).

    Returns a tensor on `x`'s device; `x` itself in a world of one.
    """
    if not world().active or world().size == 1:
        return x
    src = x.detach().to(_comm_device()).contiguous()
    parts = [torch.empty_like(src) for _ in range(world().size)]
    dist.all_gather(parts, src)
    return torch.cat(parts).to(x.device)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Element-wise sum of `x` over ranks (a new tensor on `x`'s device; `x` itself in a world of one).

    This is the `reduce` hook of `textgym.algorithms.advantages` (whitening and explained
    variance over the global batch).
    """
    if not world().active or world().size == 1:
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
    if not world().active or world().size == 1:
        return float(count)
    return float(all_reduce_sum(torch.tensor([float(count)], dtype=torch.float64))[0]) / world().size


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
    if not world().active or world().size == 1:
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
    if not world().active or world().size == 1:
        return fn()
    result: Any = None
    error: tuple[type[BaseException], str] | None = None
    if world().is_main:
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
