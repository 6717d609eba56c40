"""The trajectory store: rollouts as append-only Parquet shards, for online logging and offline learning.

A store is a folder of `shard-*.parquet` files with one schema (`SCHEMA`, version
`SCHEMA_VERSION`), one row per episode:

| column | type | meaning |
|---|---|---|
| schema_version | int16 | `SCHEMA_VERSION` |
| env_id, env_version | string, int32 | e.g. "textgym/Arithmetic-v0", 0 (the id's `-vN`) |
| env_kwargs | string | JSON of the env's keyword arguments |
| task_id, task_index | string, int64 | the task, and its index in the env |
| group, sample | int64, int32 | the rollout group (task position in its batch) and sample index |
| seed | int64 (nullable) | the seed the producer ran with |
| messages | string | JSON list of the conversation's messages |
| token_ids | list<int32> | the whole token sequence (prompt, responses, env turns) |
| loss_mask | list<int8> | 1 on tokens the policy generated |
| logprobs | list<float32> | sampling log-probs of policy tokens, 0 elsewhere |
| token_rewards | list<float32> | per-token rewards (turn rewards on each turn's last token) |
| prompt_length | int32 | tokens of the first prompt |
| reward | float64 | episode return |
| reward_terms | string | JSON of the summed reward terms (`reward/correct`, ...) |
| finish_reason, terminated, truncated | string, bool, bool | how the last response and the episode ended |
| policy, policy_version | string, int64 | what generated it (model folder / run) and its step |
| source, run | string, string | "collect", "demonstration", "eval" or "train"; a free-form run name |
| created_at | timestamp[us, UTC] | when the row was written |

Each shard is complete on disk before it is visible: it is written under a hidden temporary
name, fsynced, renamed into place (atomic on POSIX) and the folder fsynced, so a reader (or
`datasets.load_dataset("parquet", data_files=".../*.parquet")`) never sees a partial shard,
and a process killed mid-write leaves at most a hidden `.tmp` file that readers ignore.
"""

from __future__ import annotations

import json
import os
import re
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch

from textgym.agents.trajectory import Trajectory
from textgym.config import EnvConfig

SCHEMA_VERSION = 1
SCHEMA = pa.schema(
    [
        ("schema_version", pa.int16()),
        ("env_id", pa.string()),
        ("env_version", pa.int32()),
        ("env_kwargs", pa.string()),
        ("task_id", pa.string()),
        ("task_index", pa.int64()),
        ("group", pa.int64()),
        ("sample", pa.int32()),
        ("seed", pa.int64()),
        ("messages", pa.string()),
        ("token_ids", pa.list_(pa.int32())),
        ("loss_mask", pa.list_(pa.int8())),
        ("logprobs", pa.list_(pa.float32())),
        ("token_rewards", pa.list_(pa.float32())),
        ("prompt_length", pa.int32()),
        ("reward", pa.float64()),
        ("reward_terms", pa.string()),
        ("finish_reason", pa.string()),
        ("terminated", pa.bool_()),
        ("truncated", pa.bool_()),
        ("policy", pa.string()),
        ("policy_version", pa.int64()),
        ("source", pa.string()),
        ("run", pa.string()),
        ("created_at", pa.timestamp("us", tz="UTC")),
    ]
)


class TrajectoryStoreError(ValueError):
    """A store file that cannot be read, or is not a textgym trajectory shard (the message names it)."""


def store_env(store: str | Path) -> EnvConfig:
    """The env a trajectory store's episodes were played in: its id and keyword arguments.

    What `sft.trajectories` trains with when `sft.env` is not given (its `target` probe plays
    this env).

    Raises:
        FileNotFoundError: if `store` holds no trajectory shard.
        ValueError: if the store holds episodes of several envs (or several keyword-argument
            sets of one), naming them: the config must then say which env is meant.
    """
    if not shard_paths(store):
        raise FileNotFoundError(f"no trajectory shard (shard-*.parquet) in {str(store)!r}")
    table = read_trajectories(store, ["env_id", "env_kwargs"])
    envs = sorted(
        set(zip(table.column("env_id").to_pylist(), table.column("env_kwargs").to_pylist(), strict=True))
    )
    if len(envs) != 1:
        named = "; ".join(f"{i} {k}" for i, k in envs[:5])
        raise ValueError(
            f"{str(store)!r} holds episodes of {len(envs)} envs ({named}): name the env to train "
            "and probe with in `sft.env`"
        )
    env_id, kwargs = envs[0]
    return EnvConfig(id=env_id, kwargs=json.loads(kwargs))


def env_version(env_id: str) -> int:
    """The version number of a Gymnasium id ("textgym/Arithmetic-v0" → 0; -1 when it has none)."""
    m = re.search(r"-v(\d+)$", env_id)
    return int(m.group(1)) if m else -1


def trajectory_row(
    traj: Trajectory,
    *,
    env_kwargs: dict[str, Any] | None = None,
    sample: int = 0,
    seed: int | None = None,
    policy: str = "",
    policy_version: int = 0,
    source: str = "collect",
    run: str = "",
) -> dict[str, Any]:
    """One store row (a dict matching `SCHEMA`) for a finished trajectory."""
    return {
        "schema_version": SCHEMA_VERSION,
        "env_id": traj.env_id,
        "env_version": env_version(traj.env_id),
        "env_kwargs": json.dumps(env_kwargs or {}, sort_keys=True),
        "task_id": traj.task_id,
        "task_index": traj.task_index,
        "group": traj.group,
        "sample": sample,
        "seed": seed,
        "messages": json.dumps(traj.messages),
        "token_ids": traj.token_ids.tolist(),
        "loss_mask": traj.loss_mask.round().to(torch.int8).tolist(),
        "logprobs": traj.logprobs.float().tolist(),
        "token_rewards": traj.token_rewards.float().tolist(),
        "prompt_length": traj.prompt_length,
        "reward": float(traj.reward),
        "reward_terms": json.dumps(traj.reward_terms, sort_keys=True),
        "finish_reason": traj.finish_reason,
        "terminated": bool(traj.terminated),
        "truncated": bool(traj.truncated),
        "policy": policy,
        "policy_version": policy_version,
        "source": source,
        "run": run,
        "created_at": datetime.now(UTC),
    }


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class TrajectoryWriter:
    """Appends rows to a store folder, one atomically published shard per `flush()`.

    Args:
        root: the store folder (created if missing).
        shard_rows: `append` flushes by itself once this many rows are buffered.
        prefix: shard file names start with it (a trainer puts its step there).

    Use as a context manager (flushes on exit), or call `flush()` / `close()`.
    """

    def __init__(self, root: str | Path, shard_rows: int = 1024, prefix: str = "shard"):
        self.root = Path(root)
        self.prefix = prefix
        self.root.mkdir(parents=True, exist_ok=True)
        self.shard_rows = int(shard_rows)
        self._rows: list[dict[str, Any]] = []
        self._seq = 0
        self._tag = f"{time.strftime('%Y%m%dT%H%M%S', time.gmtime())}-{os.getpid()}-{uuid.uuid4().hex[:8]}"

    def append(self, rows: Iterable[dict[str, Any]]) -> None:
        """Buffer `rows` (see `trajectory_row`); flushes whenever `shard_rows` are buffered."""
        self._rows.extend(rows)
        if len(self._rows) >= self.shard_rows:
            self.flush()

    def flush(self) -> Path | None:
        """Write the buffered rows as one shard (temp file, fsync, rename, fsync folder); its path or None.

        Raises:
            pyarrow.ArrowInvalid / ArrowTypeError: if a row does not fit `SCHEMA` (nothing is written).
        """
        if not self._rows:
            return None
        table = pa.Table.from_pylist(self._rows, schema=SCHEMA)
        name = f"{self.prefix}-{self._tag}-{self._seq:05d}.parquet"
        tmp = self.root / f".{name}.tmp"
        with tmp.open("wb") as f:
            pq.write_table(table, f)
            f.flush()
            os.fsync(f.fileno())
        final = self.root / name
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self._seq += 1
        self._rows = []
        return final

    def close(self) -> None:
        """Flush what is buffered."""
        self.flush()

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def shard_paths(root: str | Path) -> list[Path]:
    """The published shards of a store, sorted by name (hidden temp files excluded)."""
    return sorted(p for p in Path(root).glob("*.parquet") if not p.name.startswith("."))


def read_trajectories(root: str | Path, columns: list[str] | None = None) -> pa.Table:
    """All rows of a store as one Arrow table (`SCHEMA`, or its `columns`).

    Raises:
        FileNotFoundError: if `root` is not a folder.
        TrajectoryStoreError: naming the file, when a shard is not readable Parquet or lacks
            the store's columns (a foreign file).
    """
    folder = Path(root)
    if not folder.is_dir():
        raise FileNotFoundError(f"trajectory store {str(folder)!r} not found")
    tables = []
    for path in shard_paths(folder):
        try:
            schema = pq.read_schema(path)
        except (pa.ArrowInvalid, OSError) as e:
            raise TrajectoryStoreError(f"{path}: not a readable Parquet file ({e})") from e
        missing = [f.name for f in SCHEMA if f.name not in schema.names]
        if missing:
            raise TrajectoryStoreError(
                f"{path}: not a textgym trajectory shard (missing columns: {', '.join(missing)})"
            )
        try:
            t = pq.read_table(path, columns=[f.name for f in SCHEMA]).cast(SCHEMA)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OSError) as e:
            raise TrajectoryStoreError(f"{path}: unreadable trajectory shard ({e})") from e
        tables.append(t)
    table = pa.concat_tables(tables) if tables else SCHEMA.empty_table()
    return table.select(columns) if columns else table
