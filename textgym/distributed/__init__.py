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

Checkpoints stay in the single-process format (`textgym.training.checkpoint`): `model_state`
and `optimizer_state` gather full, unsharded state dicts (torch.distributed.checkpoint's
`get_*_state_dict(..., full_state_dict=True, cpu_offload=True)`) on rank 0, which writes
them; `load_model_state` / `load_optimizer_state` take such a state on rank 0 and
broadcast-and-shard it. A checkpoint written by any number of ranks therefore resumes on
any number, including one.

The package: `process_group` (which rank this is; `init`, `shutdown`, `world`), `collectives`
(barriers, gathers, sums, metric reduction), `fsdp` (sharding, `full_params`, full state
dicts) and `memory` (the memory report). Every name is re-exported here, so callers write
`from textgym import distributed` and `distributed.shard(...)`.

Multi-node runs assume the run directory and the start model are on a filesystem every
node sees (every rank loads the start model from disk; rank 0 alone writes).
"""

from textgym.distributed.collectives import (
    MetricOp,
    all_gather_list,
    all_gather_tensor,
    all_reduce_sum,
    barrier,
    broadcast_object,
    gather_list,
    mean,
    metric_op,
    on_main,
    reduce_metrics,
    share,
)
from textgym.distributed.fsdp import (
    MixedPrecision,
    full_params,
    grad_norm,
    is_sharded,
    load_model_state,
    load_optimizer_state,
    model_state,
    optimizer_state,
    resolve_mixed_precision,
    set_requires_gradient_sync,
    shard,
)
from textgym.distributed.memory import format_memory_report, memory_report
from textgym.distributed.process_group import (
    World,
    device,
    init,
    is_main,
    launched,
    rank_seed,
    shutdown,
    world,
)

__all__ = [
    "MetricOp",
    "MixedPrecision",
    "World",
    "all_gather_list",
    "all_gather_tensor",
    "all_reduce_sum",
    "barrier",
    "broadcast_object",
    "device",
    "format_memory_report",
    "full_params",
    "gather_list",
    "grad_norm",
    "init",
    "is_main",
    "is_sharded",
    "launched",
    "load_model_state",
    "load_optimizer_state",
    "mean",
    "memory_report",
    "metric_op",
    "model_state",
    "on_main",
    "optimizer_state",
    "rank_seed",
    "reduce_metrics",
    "resolve_mixed_precision",
    "set_requires_gradient_sync",
    "shard",
    "share",
    "shutdown",
    "world",
]
