"""Moving weights between processes outside the run's process group: the pieces both ends share.

A weight sync between a trainer and its rollout servers (`textgym.training.sources.servers` on
the trainer, `textgym.serve.weights` on a server) runs in a process group of its own, built
from a `TCPStore` and a `PrefixStore` named after the sync group (`new_group`): it never
touches `torch.distributed`'s default group, so a trainer launched by torchrun keeps its own,
and a server joins without any launcher.

Tensors travel as bytes: each is viewed as `uint8` (`pack`), laid end to end in buckets of at
most `bucket_bytes` (`plan_buckets`; a larger tensor is a bucket of its own), one broadcast per
bucket, and viewed back as its dtype on arrival (`unpack`). Bytes, not values, so every dtype
(bf16 included) arrives bitwise equal, on gloo and NCCL alike. Every broadcast waits with a
timeout (`broadcast`): a peer that dies closes its connection (gloo raises at once), a peer
that hangs makes the wait raise when the timeout expires; it never blocks for ever.

`checksum` is the SHA-256 of named tensors' bytes, which both ends compute to prove equality.
"""

from __future__ import annotations

import datetime
import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

ALIGN = 16
"""Byte alignment of each tensor inside a bucket (so a view back to any dtype is aligned)."""


@dataclass(frozen=True)
class TensorSpec:
    """What a receiver needs to rebuild one tensor from bytes.

    Attributes:
        name: the tensor's name (a `state_dict` key, or a LoRA factor's name).
        shape: its shape.
        dtype: torch dtype name without the "torch." prefix (e.g. "float32", "bfloat16").
    """

    name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        """Size in bytes (numel × element size)."""
        numel = 1
        for d in self.shape:
            numel *= d
        return numel * torch.empty((), dtype=self.torch_dtype).element_size()

    @property
    def torch_dtype(self) -> torch.dtype:
        """The `torch.dtype` named by `dtype`.

        Raises:
            ValueError: if `dtype` names no torch dtype.
        """
        dt = getattr(torch, self.dtype, None)
        if not isinstance(dt, torch.dtype):
            raise ValueError(f"{self.name}: unknown dtype {self.dtype!r}")
        return dt

    def to_json(self) -> dict[str, Any]:
        """`{"name", "shape", "dtype"}` (what goes over HTTP)."""
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> TensorSpec:
        """The inverse of `to_json`."""
        return cls(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]))

    @classmethod
    def of(cls, name: str, t: torch.Tensor) -> TensorSpec:
        """The spec of tensor `t` under `name`."""
        return cls(name, tuple(t.shape), str(t.dtype).removeprefix("torch."))


def _padded(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan_buckets(specs: list[TensorSpec], bucket_bytes: int) -> list[list[int]]:
    """Group tensors, in order, into buckets of at most `bucket_bytes` (each tensor padded to `ALIGN`).

    A tensor larger than `bucket_bytes` is a bucket of its own. Sender and receiver call this
    on the same specs and get the same plan.

    Returns:
        Indices into `specs`, one list per bucket.

    Raises:
        ValueError: if `bucket_bytes` < 1.
    """
    if bucket_bytes < 1:
        raise ValueError("bucket_bytes must be >= 1")
    out: list[list[int]] = []
    size = 0
    for i, s in enumerate(specs):
        n = _padded(s.nbytes)
        if out and size + n <= bucket_bytes:
            out[-1].append(i)
            size += n
        else:
            out.append([i])
            size = n
    return out


def bucket_nbytes(specs: list[TensorSpec]) -> int:
    """Bytes of one bucket holding `specs` (each padded to `ALIGN`)."""
    return sum(_padded(s.nbytes) for s in specs)


def pack(tensors: list[torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """The bytes of `tensors` end to end, each padded to `ALIGN`: `uint8` [sum of padded sizes]."""
    parts: list[torch.Tensor] = []
    for t in tensors:
        b = t.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
        parts.append(b)
        pad = _padded(b.numel()) - b.numel()
        if pad:
            parts.append(torch.zeros(pad, dtype=torch.uint8, device=device))
    if not parts:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.cat(parts)


def unpack(buf: torch.Tensor, specs: list[TensorSpec]) -> list[torch.Tensor]:
    """The tensors `pack` laid into `buf` (a `uint8` tensor), as views of `buf`, in order.

    Raises:
        ValueError: if `buf` is not exactly the size `specs` need.
    """
    if buf.numel() != bucket_nbytes(specs):
        raise ValueError(f"bucket of {buf.numel()} bytes, expected {bucket_nbytes(specs)}")
    out, off = [], 0
    for s in specs:
        n = s.nbytes
        out.append(buf[off : off + n].view(s.torch_dtype).reshape(s.shape))
        off += _padded(n)
    return out


def new_group(
    backend: str, host: str, port: int, rank: int, size: int, timeout_s: float, name: str, store: Any = None
) -> Any:
    """Join a process group of its own (not `torch.distributed`'s default group).

    Rank 0 passes the `TCPStore` it created as master (`store`); the other ranks connect to
    `host:port`. Blocks until all `size` ranks have joined, at most `timeout_s`.

    Args:
        backend: "gloo" (CPU tensors) or "nccl" (CUDA tensors of this process's current device).
        host: the master's address.
        port: the master store's TCP port.
        rank: this process's rank, 0 … size−1 (the trainer is 0).
        size: number of processes.
        timeout_s: seconds that joining, and later each collective, may take.
        name: the group's name (a prefix of its keys in the store; a fresh one per group).
        store: rank 0's master `TCPStore`; None on the other ranks.

    Returns:
        The backend's process group object (`ProcessGroupGloo` or `ProcessGroupNCCL`).

    Raises:
        RuntimeError / DistStoreError: when the store cannot be reached or not every rank joins
            within `timeout_s`.
        ValueError: on an unknown backend, or "nccl" where NCCL is not available.
    """
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = dist.TCPStore(host, port, size, False, timeout=timeout)
    prefixed = dist.PrefixStore(f"textgym-weights/{name}/", store)
    if backend == "gloo":
        return dist.ProcessGroupGloo(prefixed, rank, size, timeout)
    if backend == "nccl":
        if not dist.is_nccl_available():
            raise ValueError("backend 'nccl' is not available in this torch build")
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, size, opts)
    raise ValueError(f"unknown backend {backend!r}; available: 'gloo', 'nccl'")


def broadcast(group: Any, buf: torch.Tensor, timeout_s: float, root: int = 0) -> None:
    """Broadcast `buf` from rank `root` to every rank of `group`, in place; wait at most `timeout_s`.

    Args:
        group: a process group from `new_group`.
        buf: [n] `uint8` tensor (the sender's bytes; the receivers' buffer of the same size).
        timeout_s: seconds to wait for the broadcast to complete on this rank.
        root: the sending rank.

    Raises:
        RuntimeError: when a peer closed its connection (it died), or on timeout
            (gloo: "Operation timed out!"), or any other backend error.
    """
    opts = dist.BroadcastOptions()
    opts.rootRank = root
    opts.rootTensor = 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    work = group.broadcast([buf], opts)
    if not work.wait(datetime.timedelta(seconds=max(timeout_s, 0.001))):
        raise RuntimeError(f"broadcast did not complete within {timeout_s:.1f} s")


def checksum(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    """SHA-256 (hex) of named tensors: names sorted; each name, dtype, shape and bytes hashed.

    Equal checksums mean bitwise-equal tensors under equal names.
    """
    h = hashlib.sha256()
    for name, t in sorted(named, key=lambda kv: kv[0]):
        t = t.detach().contiguous().cpu()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()
