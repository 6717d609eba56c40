"""The trajectory store and `rollouts collect` (with SIGKILL mid-run)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import _traj

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams
from textgym.offline import collect_rollouts
from textgym.offline.store import (
    SCHEMA,
    TrajectoryStoreError,
    TrajectoryWriter,
    read_trajectories,
    shard_paths,
    trajectory_row,
)


def test_store_round_trip_and_datasets_reads_it(tmp_path):
    trajs = [_traj([1, 2, 3], [7, 8, 2], 1.0, 0), _traj([1, 2, 4], [9, 2], 0.0, 1)]
    with TrajectoryWriter(tmp_path / "store") as w:
        w.append(trajectory_row(t, env_kwargs={"digits": 2}, sample=0, policy="p", seed=3) for t in trajs)
        assert w.flush() is not None
        w.append([trajectory_row(trajs[0], sample=1, policy="p")])
    assert len(shard_paths(tmp_path / "store")) == 2
    (tmp_path / "store" / ".shard-x.parquet.tmp").write_bytes(b"half a shard")  # a killed writer's leftover
    t = read_trajectories(tmp_path / "store")
    assert t.schema == SCHEMA and t.num_rows == 3
    row = t.slice(0, 1).to_pylist()[0]
    assert row["token_ids"] == [1, 2, 3, 7, 8, 2] and row["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert row["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.5, -0.5] and row["prompt_length"] == 3
    assert json.loads(row["reward_terms"]) == {"reward/correct": 1.0} and row["env_version"] == 0
    assert json.loads(row["env_kwargs"]) == {"digits": 2} and row["seed"] == 3
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "store" / "*.parquet"), split="train")
    assert len(ds) == 3 and sorted(ds["reward"]) == [0.0, 1.0, 1.0]


def test_corrupt_and_foreign_files_are_named(tmp_path):
    store = tmp_path / "store"
    with TrajectoryWriter(store) as w:
        w.append([trajectory_row(_traj([1], [2], 1.0))])
    (store / "zz-corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(TrajectoryStoreError, match=r"zz-corrupt\.parquet: not a readable Parquet file"):
        read_trajectories(store)
    (store / "zz-corrupt.parquet").unlink()
    pq.write_table(pa.table({"question": ["2+2"], "answer": ["4"]}), store / "zz-foreign.parquet")
    with pytest.raises(
        TrajectoryStoreError, match=r"zz-foreign\.parquet: not a textgym trajectory shard \(missing"
    ):
        read_trajectories(store)


def test_collect_resumes_without_duplicates(tiny_model_dir, tmp_path):
    agent = LLMAgent.from_pretrained(tiny_model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    kw = {"operators": "+", "digits": 1, "instruction": ""}
    run = dict(env_kwargs=kw, samples=2, params=params, batch_size=4, policy="tiny")
    res = collect_rollouts(agent, "textgym/Arithmetic-v0", tmp_path, n=6, **run)
    assert (res.new_tasks, res.rows_written, res.shards_written) == (6, 12, 3)
    res = collect_rollouts(agent, "textgym/Arithmetic-v0", tmp_path, n=8, **run)
    assert (res.skipped_tasks, res.new_tasks, res.rows_written) == (6, 2, 4)
    t = read_trajectories(tmp_path)
    keys = list(zip(t.column("task_index").to_pylist(), t.column("sample").to_pylist(), strict=True))
    assert sorted(keys) == [(i, s) for i in range(8) for s in range(2)]


def test_sigkill_mid_collect_leaves_complete_shards_and_a_rerun_completes(tiny_model_dir, tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "textgym", "rollouts", "collect", "--model", str(tiny_model_dir),
           "--env", "textgym/Arithmetic-v0", "--env-kwargs", "digits=1", "--out", str(store),
           "--n", "40", "--samples", "2", "--batch-size", "8", "--max-new-tokens", "48"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(shard_paths(store) if store.exists() else []) < 2:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    shards = shard_paths(store)
    assert 2 <= len(shards) < 10, "the kill should land mid-run"
    first = read_trajectories(store)  # every published shard is complete and readable
    assert first.num_rows == 8 * len(shards)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    t = read_trajectories(store)
    keys = list(zip(t.column("task_index").to_pylist(), t.column("sample").to_pylist(), strict=True))
    assert len(keys) == 80 and len(set(keys)) == 80
