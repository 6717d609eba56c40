"""Offline data from rollouts: fill a trajectory store, and build preference pairs from it.

`collect_rollouts` runs a policy on an env and appends the episodes to a store
(`textgym.offline.store`), one atomically published shard per chunk of tasks; a rerun skips the
tasks whose samples are already there, so a killed collection resumes without duplicates.
`build_pairs` turns a store into (prompt, chosen, rejected) pairs for DPO and its family,
and into unpaired desirable/undesirable examples for KTO.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.envs.registry import make as make_env
from textgym.envs.registry import task_count
from textgym.offline.store import TrajectoryWriter, read_trajectories, shard_paths, trajectory_row


@dataclass
class CollectResult:
    """What `collect_rollouts` did: tasks skipped (already stored), tasks run, rows and shards written."""

    skipped_tasks: int
    new_tasks: int
    rows_written: int
    shards_written: int


def rollout_rows(
    agent: LLMAgent,
    envs: list[Any],
    tasks: list[int],
    params: SamplingParams,
    samples: int,
    env_id: str,
    env_kwargs: dict[str, Any],
    *,
    source: str = "collect",
    **meta: Any,
) -> list[dict[str, Any]]:
    """Roll out `samples` episodes of each of `tasks` on `envs`; their trajectory-store rows.

    `meta` (seed, policy, policy_version, run) goes into every row (`trajectory_row`), with
    `source` and `sample` = the episode's index within its task's group.
    """
    trajs = rollout(agent, envs, tasks, params, group_size=samples, env_id=env_id)
    return [
        trajectory_row(t, env_kwargs=env_kwargs, sample=j % samples, source=source, **meta)
        for j, t in enumerate(trajs)
    ]


def collect_rollouts(
    agent: LLMAgent,
    env_id: str,
    out: str | Path,
    *,
    env_kwargs: dict[str, Any] | None = None,
    n: int = 100,
    samples: int = 1,
    params: SamplingParams | None = None,
    start: int = 0,
    batch_size: int = 256,
    policy: str = "",
    policy_version: int = 0,
    seed: int | None = None,
    run: str = "",
    source: str = "collect",
    progress: Callable[[int, int], None] | None = None,
) -> CollectResult:
    """Roll out `samples` episodes of tasks `start..start+n−1` and append them to the store `out`.

    `agent` may be an `OracleDemonstrator` (the env's expert in a model's tokens; record it
    with `source="demonstration"` and a `policy` naming the tokenizer). Tasks whose `samples`
    episodes with the same env, kwargs and policy are already in the store are skipped. Each
    chunk of `batch_size // samples` tasks becomes one shard, written only after the chunk
    finishes.

    Raises:
        ValueError: if the env has fewer than `start + n` tasks.
        TrajectoryStoreError: if a file in `out` is not a readable trajectory shard.
    """
    params = params or SamplingParams(temperature=1.0)
    env_kwargs = dict(env_kwargs or {})
    probe = make_env(env_id, **env_kwargs)
    n_tasks = task_count(probe)
    probe.close()
    if start + n > n_tasks:
        raise ValueError(f"{env_id} has {n_tasks} tasks, cannot collect tasks {start}..{start + n - 1}")
    kwargs_json = json.dumps(env_kwargs, sort_keys=True)
    have: dict[int, int] = defaultdict(int)
    if Path(out).is_dir() and shard_paths(out):
        t = read_trajectories(out, ["env_id", "env_kwargs", "policy", "task_index"])
        for e, k, p, i in zip(*(t.column(c).to_pylist() for c in t.column_names), strict=True):
            if e == env_id and k == kwargs_json and p == policy:
                have[int(i)] += 1
    todo = [i for i in range(start, start + n) if have[i] < samples]
    per_chunk = max(1, batch_size // samples)
    envs = [make_env(env_id, **env_kwargs) for _ in range(min(max(len(todo), 1), per_chunk) * samples)]
    rows = shards = 0
    try:
        with TrajectoryWriter(out, shard_rows=10**9) as writer:
            for c in range(0, len(todo), per_chunk):
                idx = todo[c : c + per_chunk]
                meta = {"seed": seed, "policy": policy, "policy_version": policy_version, "run": run}
                chunk_rows = rollout_rows(
                    agent, envs, idx, params, samples, env_id, env_kwargs, source=source, **meta
                )
                writer.append(chunk_rows)
                writer.flush()
                rows += len(chunk_rows)
                shards += 1
                if progress is not None:
                    progress(min(c + per_chunk, len(todo)), len(todo))
    finally:
        for e in envs:
            e.close()
    return CollectResult(n - len(todo), len(todo), rows, shards)


PAIR_SCHEMA = pa.schema(
    [
        ("env_id", pa.string()),
        ("task_id", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("chosen_ids", pa.list_(pa.int32())),
        ("chosen_mask", pa.list_(pa.int8())),
        ("rejected_ids", pa.list_(pa.int32())),
        ("rejected_mask", pa.list_(pa.int8())),
        ("chosen_reward", pa.float64()),
        ("rejected_reward", pa.float64()),
    ]
)
"""A preference pair: response token ids after the shared prompt, with their loss masks
(1 on policy tokens; environment turns of multi-turn episodes are 0)."""

UNPAIRED_SCHEMA = pa.schema(
    [
        ("env_id", pa.string()),
        ("task_id", pa.string()),
        ("prompt_ids", pa.list_(pa.int32())),
        ("completion_ids", pa.list_(pa.int32())),
        ("completion_mask", pa.list_(pa.int8())),
        ("reward", pa.float64()),
        ("desirable", pa.bool_()),
    ]
)
"""An unpaired example for KTO: one response and whether it is desirable."""


@dataclass
class PairStats:
    """Counts from `build_pairs`."""

    trajectories: int
    prompts: int
    duplicates_dropped: int
    pairs: int
    prompts_with_pairs: int
    desirable: int
    undesirable: int


# long: one pass over the problems that pairs, dedups, subsamples and counts together
def build_pairs(
    table: pa.Table,
    *,
    margin: float = 0.5,
    mode: Literal["best_vs_worst", "all"] = "best_vs_worst",
    max_per_prompt: int | None = None,
    dedup: bool = True,
    desirable_threshold: float = 1.0,
    seed: int = 0,
) -> tuple[pa.Table, pa.Table, PairStats]:
    """Preference pairs and KTO examples from a trajectory table (`read_trajectories`).

    Trajectories are grouped by problem: env id, task id and prompt token ids (a game's tasks
    open with the same message but hide different words or numbers, and a pair compares two
    answers to one problem). Within a group, with `dedup` identical responses count
    once. `best_vs_worst` makes one pair of a highest- and a lowest-reward response; `all`
    makes every pair whose rewards differ; either way only pairs with
    `reward(chosen) − reward(rejected) ≥ margin` (and > 0) are kept, at most `max_per_prompt` per prompt
    (a seeded random subset). Every (deduplicated) response is also an unpaired example,
    desirable when its reward is ≥ `desirable_threshold`.

    Returns:
        (pairs as `PAIR_SCHEMA`, unpaired as `UNPAIRED_SCHEMA`, counts).

    Raises:
        ValueError: if `margin` < 0 or `max_per_prompt` < 1.
    """
    if margin < 0 or (max_per_prompt is not None and max_per_prompt < 1):
        raise ValueError("margin must be >= 0 and max_per_prompt >= 1")
    rng = random.Random(seed)
    cols = {c: table.column(c).to_pylist() for c in ("env_id", "task_id", "token_ids", "loss_mask")}
    cols["prompt_length"] = table.column("prompt_length").to_pylist()
    cols["reward"] = table.column("reward").to_pylist()
    groups: dict[tuple[str, str, tuple[int, ...]], list[int]] = defaultdict(list)
    for i, (env, task, ids, p) in enumerate(
        zip(cols["env_id"], cols["task_id"], cols["token_ids"], cols["prompt_length"], strict=True)
    ):
        groups[(env, str(task), tuple(ids[:p]))].append(i)
    pairs: list[dict[str, Any]] = []
    unpaired: list[dict[str, Any]] = []
    dropped = 0
    with_pairs = 0
    for (env, _task, prompt), members in groups.items():
        seen: dict[tuple[int, ...], int] = {}
        kept = []
        for i in members:
            resp = tuple(cols["token_ids"][i][len(prompt) :])
            if dedup and resp in seen:
                dropped += 1
                continue
            seen[resp] = i
            kept.append(i)

        def response(i: int, p: int = len(prompt)) -> tuple[list[int], list[int]]:
            return cols["token_ids"][i][p:], cols["loss_mask"][i][p:]

        for i in kept:
            ids, mask = response(i)
            unpaired.append(
                {
                    "env_id": env,
                    "task_id": cols["task_id"][i],
                    "prompt_ids": list(prompt),
                    "completion_ids": ids,
                    "completion_mask": mask,
                    "reward": cols["reward"][i],
                    "desirable": cols["reward"][i] >= desirable_threshold,
                }
            )
        ranked = sorted(kept, key=lambda i: -cols["reward"][i])
        if mode == "best_vs_worst":
            candidates = [(ranked[0], ranked[-1])] if len(ranked) > 1 else []
        else:
            candidates = [(a, b) for x, a in enumerate(ranked) for b in ranked[x + 1 :]]
        candidates = [
            (a, b)
            for a, b in candidates
            if cols["reward"][a] > cols["reward"][b] and cols["reward"][a] - cols["reward"][b] >= margin
        ]
        if max_per_prompt is not None and len(candidates) > max_per_prompt:
            candidates = rng.sample(candidates, max_per_prompt)
        with_pairs += bool(candidates)
        for a, b in candidates:
            (ca, ma), (cb, mb) = response(a), response(b)
            pairs.append(
                {
                    "env_id": env,
                    "task_id": cols["task_id"][a],
                    "prompt_ids": list(prompt),
                    "chosen_ids": ca,
                    "chosen_mask": ma,
                    "rejected_ids": cb,
                    "rejected_mask": mb,
                    "chosen_reward": cols["reward"][a],
                    "rejected_reward": cols["reward"][b],
                }
            )
    stats = PairStats(
        trajectories=table.num_rows,
        prompts=len(groups),
        duplicates_dropped=dropped,
        pairs=len(pairs),
        prompts_with_pairs=with_pairs,
        desirable=sum(u["desirable"] for u in unpaired),
        undesirable=sum(not u["desirable"] for u in unpaired),
    )
    return (
        pa.Table.from_pylist(pairs, schema=PAIR_SCHEMA),
        pa.Table.from_pylist(unpaired, schema=UNPAIRED_SCHEMA),
        stats,
    )


def write_pairs(pairs: pa.Table, unpaired: pa.Table, out: str | Path) -> dict[str, Path]:
    """Write `pairs.parquet` and `unpaired.parquet` into `out` (each via temp file and rename)."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, table in (("pairs", pairs), ("unpaired", unpaired)):
        final = folder / f"{name}.parquet"
        tmp = folder / f".{name}.parquet.tmp"
        pq.write_table(table, tmp)
        tmp.replace(final)
        paths[name] = final
    return paths


def read_pairs(path: str | Path, schema: pa.Schema = PAIR_SCHEMA) -> pa.Table:
    """Read a pairs (or, with `UNPAIRED_SCHEMA`, an unpaired) Parquet file.

    Raises:
        FileNotFoundError: if it does not exist.
        ValueError: naming the file, when it is not readable Parquet or lacks the columns.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"pairs file {str(p)!r} not found")
    try:
        t = pq.read_table(p)
    except (pa.ArrowInvalid, OSError) as e:
        raise ValueError(f"{p}: not a readable Parquet file ({e})") from e
    missing = [f.name for f in schema if f.name not in t.column_names]
    if missing:
        raise ValueError(f"{p}: not a textgym pairs file (missing columns: {', '.join(missing)})")
    return t.select([f.name for f in schema]).cast(schema)
