"""The training rollouts in the trajectory store: one shard per step, pruned on resume."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from textgym.agents.trajectory import Trajectory


def log_trajectories(
    trajectory_dir: Path,
    trajs: list[Trajectory],
    *,
    step: int,
    group_size: int,
    env_kwargs: dict[str, Any],
    policy: str,
    policy_versions: list[int] | None = None,
) -> None:
    """Append a step's rollouts (the global batch) to the store as one shard named by the step.

    Args:
        trajectory_dir: the stage's `trajectories/` folder.
        trajs: the step's trajectories, `group_size` consecutive samples per task.
        step: the trainer's version that trains on them (the shard is `step-<step + 1>`).
        group_size: samples per task (a row's `sample` is its index in its group).
        env_kwargs: the env's constructor arguments, recorded with each row.
        policy: what produced them (the stage folder).
        policy_versions: each row's `policy_version`, the version that sampled it (its
            `Trajectory.policy_version`: up to `max_staleness` below `step` in an async run);
            None: `step` for every row (a synchronous trainer).
    """
    from textgym.offline.store import TrajectoryWriter, trajectory_row

    with TrajectoryWriter(trajectory_dir, prefix=f"step-{step + 1:06d}") as w:
        w.append(
            trajectory_row(
                t,
                env_kwargs=env_kwargs,
                sample=j % group_size,
                policy=policy,
                policy_version=step if policy_versions is None else policy_versions[j],
                source="train",
            )
            for j, t in enumerate(trajs)
        )


def prune_trajectories(trajectory_dir: Path, step: int) -> None:
    """Delete the store's shards past `step` (a resumed run), as `metrics.jsonl` drops its records."""
    if trajectory_dir.is_dir():
        for shard in trajectory_dir.glob("step-*.parquet"):
            if int(shard.name.split("-")[1]) > step:
                shard.unlink()
