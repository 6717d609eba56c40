"""The process group: which rank this process is, joining and leaving the group torchrun set up.

Started without torchrun, nothing is initialised and `world()` is rank 0 of 1.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


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


def rank_seed(seed: int) -> int:
    """The seed of this rank's global RNGs: `seed` on rank 0, a distinct derived seed elsewhere."""
    return seed if _WORLD.rank == 0 else seed + 1_000_003 * _WORLD.rank
