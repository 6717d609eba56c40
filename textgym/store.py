"""Moved to `textgym.offline.store`; this module keeps the old import path working."""

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
    "SCHEMA",
    "SCHEMA_VERSION",
    "TrajectoryStoreError",
    "TrajectoryWriter",
    "env_version",
    "read_trajectories",
    "shard_paths",
    "trajectory_row",
]
