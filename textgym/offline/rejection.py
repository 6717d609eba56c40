"""Rejection sampling from a trajectory store: keep the verified samples, as supervised examples.

`select_responses` is the filter of rejection-sampling fine-tuning (RAFT, Dong et al. 2023,
arXiv:2304.06767; ReST-EM, Singh et al. 2023, arXiv:2312.06585): per prompt, the samples that
are correct (and reach a reward threshold), identical responses once, the best `max_per_prompt`
of them. `kept_records` turns the kept rows into the kept set's records (JSONL-ready, token ids
exact as sampled), optionally under another prompt (STaR's rationalisation, Zelikman et al. 2022,
arXiv:2203.14465: a sample drawn with a hint, trained on without it); `collect_hinted` draws those
hinted samples.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import episode_correct
from textgym.envs.hint import AnswerHintWrapper
from textgym.envs.registry import make as make_env
from textgym.offline.pairs import rollout_rows
from textgym.offline.store import SCHEMA, TrajectoryWriter, read_trajectories, shard_paths


@dataclass
class Selection:
    """What `select_responses` kept, and counts.

    Attributes:
        rows: indices of the kept rows of the table: prompts in order of first appearance, within
            a prompt the highest reward first (ties: table order).
        unsolved: for each prompt with no passing sample, the task index of its first row.
        trajectories: rows read. prompts: distinct prompts. passed: rows that passed the reward
            test. duplicates_dropped: passing rows dropped as repeats of a kept response.
        prompts_kept: prompts with at least one kept row.
    """

    rows: list[int] = field(default_factory=list)
    unsolved: list[int] = field(default_factory=list)
    trajectories: int = 0
    prompts: int = 0
    passed: int = 0
    duplicates_dropped: int = 0
    prompts_kept: int = 0


def select_responses(
    table: pa.Table,
    *,
    correct_only: bool = True,
    min_reward: float | None = None,
    dedup: bool = True,
    max_per_prompt: int | None = None,
) -> Selection:
    """Rejection sampling's filter over a trajectory table (`read_trajectories`).

    Rows are grouped by prompt: env id, task index and prompt token ids. The task index is part
    of the key because an env may pose different tasks under the same first message (a game
    whose hidden word or number is the task: every Wordle or GuessNumber task opens with the
    same rules), and those are different problems, each with its own best-of-K. A row passes
    when it is correct (`correct_only`: its `reward/correct` term reaches 1,
    `textgym.agents.trajectory.episode_correct`) and its reward is ≥ `min_reward` (when set).
    Within a group the passing rows are ranked by reward, highest first (a stable sort: ties
    keep table order); with `dedup` a response (its token ids after the prompt) already kept is
    dropped; the first `max_per_prompt` remain (RAFT's best-of-K is `max_per_prompt=1`).

    Raises:
        ValueError: if `max_per_prompt` < 1.
    """
    if max_per_prompt is not None and max_per_prompt < 1:
        raise ValueError(f"max_per_prompt must be >= 1, got {max_per_prompt}")
    cols = {c: table.column(c).to_pylist() for c in ("env_id", "token_ids", "prompt_length", "reward")}
    terms = [json.loads(t) for t in table.column("reward_terms").to_pylist()]
    tasks = table.column("task_index").to_pylist()
    groups: dict[tuple[str, int, tuple[int, ...]], list[int]] = {}
    prompts = zip(cols["env_id"], tasks, cols["token_ids"], cols["prompt_length"], strict=True)
    for i, (env, task, ids, p) in enumerate(prompts):
        groups.setdefault((env, int(task), tuple(ids[:p])), []).append(i)
    sel = Selection(trajectories=table.num_rows, prompts=len(groups))
    for members in groups.values():
        passing = [
            i
            for i in members
            if (not correct_only or episode_correct(terms[i], cols["reward"][i]))
            and (min_reward is None or cols["reward"][i] >= min_reward)
        ]
        sel.passed += len(passing)
        passing.sort(key=lambda i: -cols["reward"][i])
        kept: list[int] = []
        seen: set[tuple[int, ...]] = set()
        for i in passing:
            response = tuple(cols["token_ids"][i][cols["prompt_length"][i] :])
            if dedup and response in seen:
                sel.duplicates_dropped += 1
                continue
            seen.add(response)
            kept.append(i)
        if max_per_prompt is not None:
            kept = kept[:max_per_prompt]
        sel.rows += kept
        sel.prompts_kept += bool(kept)
        if not kept:
            sel.unsolved.append(int(tasks[members[0]]))
    return sel


def _split_messages(messages: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(the prompt's messages: those before the first assistant turn, the rest)."""
    k = next((j for j, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
    return messages[:k], messages[k:]


def kept_records(
    table: pa.Table,
    rows: list[int],
    prompts: Mapping[int, tuple[list[int], list[dict[str, Any]]]] | None = None,
) -> list[dict[str, Any]]:
    """The kept set's records of `rows` of a trajectory table, token ids exactly as sampled.

    Each record: `task_index`, `task_id`, `sample`, `reward`, `prompt` (the messages before the
    first assistant turn), `completion` (the messages from it on), `prompt_ids`, `completion_ids`
    and `completion_mask` (the row's loss mask after the prompt: 1 on the policy's tokens, 0 on an
    environment's turns), and `rationalized`.

    Args:
        table: trajectories (`read_trajectories`).
        rows: which rows.
        prompts: task index → (prompt token ids, prompt messages) put in place of each row's own
            prompt (STaR: the task's prompt without the hint its samples were drawn with);
            `rationalized` is then true. None: the rows' own prompts.

    Raises:
        KeyError: when `prompts` lacks a row's task index.
    """
    names = ["task_index", "task_id", "sample", "reward", "messages", "token_ids", "loss_mask"]
    names.append("prompt_length")
    cols = {c: table.column(c).to_pylist() for c in names}
    out = []
    for i in rows:
        p = cols["prompt_length"][i]
        prompt_msgs, completion = _split_messages(json.loads(cols["messages"][i]))
        prompt_ids = list(cols["token_ids"][i][:p])
        if prompts is not None:
            prompt_ids, prompt_msgs = prompts[int(cols["task_index"][i])]
        out.append(
            {
                "task_index": int(cols["task_index"][i]),
                "task_id": cols["task_id"][i],
                "sample": int(cols["sample"][i]),
                "reward": float(cols["reward"][i]),
                "rationalized": prompts is not None,
                "prompt": prompt_msgs,
                "completion": completion,
                "prompt_ids": list(prompt_ids),
                "completion_ids": list(cols["token_ids"][i][p:]),
                "completion_mask": [int(m) for m in cols["loss_mask"][i][p:]],
            }
        )
    return out


def task_prompts(table: pa.Table) -> dict[int, tuple[list[int], list[dict[str, Any]]]]:
    """Task index → (prompt token ids, prompt messages) of its first row in a trajectory table."""
    out: dict[int, tuple[list[int], list[dict[str, Any]]]] = {}
    cols = {c: table.column(c).to_pylist() for c in ("task_index", "token_ids", "prompt_length", "messages")}
    for t, ids, p, msgs in zip(*cols.values(), strict=True):
        if int(t) not in out:
            out[int(t)] = (list(ids[:p]), _split_messages(json.loads(msgs))[0])
    return out


def write_jsonl(records: list[dict[str, Any]], path: str | Path) -> Path:
    """Write records as JSON lines to `path` (a temporary name, then renamed into place)."""
    final = Path(path)
    tmp = final.with_name(f".{final.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    tmp.replace(final)
    return final


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """The records of a JSON-lines file (`write_jsonl`)."""
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line]


def collect_hinted(
    agent: LLMAgent,
    env_id: str,
    tasks: list[int],
    out: str | Path,
    *,
    hint: str,
    env_kwargs: dict[str, Any] | None = None,
    samples: int = 1,
    params: SamplingParams | None = None,
    batch_size: int = 256,
    policy: str = "",
    policy_version: int = 0,
    seed: int | None = None,
    run: str = "",
) -> pa.Table:
    """Sample `samples` episodes of each of `tasks` with the gold answer as a hint; store and return them.

    The envs are wrapped in `AnswerHintWrapper(env, hint)`, so the stored prompts (token ids and
    messages) are the hinted ones the policy saw; rewards are the env's own. The rows are written
    to the store `out` as one shard once every task is done; when `out` already holds shards
    (a resumed run), they are returned as they are and nothing is sampled.

    Raises:
        ValueError: from the wrapper, when the env gives no gold answer.
    """
    if Path(out).is_dir() and shard_paths(out):
        return read_trajectories(out)
    params = params or SamplingParams(temperature=1.0)
    env_kwargs = dict(env_kwargs or {})
    per_chunk = max(1, batch_size // samples)
    envs = [
        AnswerHintWrapper(make_env(env_id, **env_kwargs), hint)
        for _ in range(min(max(len(tasks), 1), per_chunk) * samples)
    ]
    try:
        with TrajectoryWriter(out, shard_rows=10**9) as writer:
            for c in range(0, len(tasks), per_chunk):
                meta: dict[str, Any] = {
                    "seed": seed,
                    "policy": policy,
                    "policy_version": policy_version,
                    "run": run,
                }
                chunk = tasks[c : c + per_chunk]
                writer.append(rollout_rows(agent, envs, chunk, params, samples, env_id, env_kwargs, **meta))
    finally:
        for e in envs:
            e.close()
    return read_trajectories(out) if shard_paths(out) else SCHEMA.empty_table()
