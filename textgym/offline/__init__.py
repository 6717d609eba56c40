"""Trajectory data: the store every run writes, and the offline datasets built from it.

- `store`: the trajectory store (Parquet shards published atomically; `TrajectoryWriter`,
  `read_trajectories`), written by training (`log_trajectories`) and by `textgym collect`
- `pairs`: offline data building: `collect_rollouts` of a policy into the store, `build_pairs`
  (preference pairs or unpaired rows) and the pair files the preference and reward-model
  trainers read
- `prm_labels`: step labels for process reward models (Math-Shepherd's rollout estimates,
  an LLM judge's verdicts), which `textgym.trainers.reward.prm` trains on
- `rejection`: the rejection-sampling filter over a store

Every public name of `store` and `pairs` is re-exported here (`from textgym.offline import build_pairs`
keeps working; the old `textgym.store` fails with an error naming `textgym.offline.store`).
"""

from textgym.offline.pairs import (
    PAIR_SCHEMA,
    UNPAIRED_SCHEMA,
    CollectResult,
    PairStats,
    build_pairs,
    collect_rollouts,
    read_pairs,
    write_pairs,
)
from textgym.offline.store import (
    SCHEMA,
    SCHEMA_VERSION,
    TrajectoryStoreError,
    TrajectoryWriter,
    env_version,
    read_trajectories,
    shard_paths,
    trajectory_row,
)

__all__ = [
    "PAIR_SCHEMA",
    "SCHEMA",
    "SCHEMA_VERSION",
    "UNPAIRED_SCHEMA",
    "CollectResult",
    "PairStats",
    "TrajectoryStoreError",
    "TrajectoryWriter",
    "build_pairs",
    "collect_rollouts",
    "env_version",
    "read_pairs",
    "read_trajectories",
    "shard_paths",
    "trajectory_row",
    "write_pairs",
]
