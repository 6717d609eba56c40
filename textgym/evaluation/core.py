"""Evaluate a policy on an environment: accuracy, mean reward, pass@k, lengths and throughput."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from math import comb
from pathlib import Path
from typing import Any

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import EPISODE_COUNTS, TRUNCATION_CAUSES, episode_correct
from textgym.envs.registry import accuracy_term, task_count
from textgym.envs.registry import make as make_env


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one task from n samples with c correct (Chen et al. 2021, arXiv:2107.03374, eq. 1).

    `pass@k = 1 − C(n−c, k) / C(n, k)`.

    Raises:
        ValueError: unless 0 ≤ c ≤ n and 1 ≤ k ≤ n.
    """
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


@dataclass
class EvalResult:
    """Aggregate figures of an evaluation.

    Attributes:
        env_id: the environment.
        n: tasks evaluated; samples: samples per task.
        accuracy: share of samples that are correct (`episode_correct`, in `agents.trajectory`:
            the `reward/correct` term reaches 1).
        mean_reward: mean episode return.
        pass_at: {k: mean pass@k over tasks} for k in {1, samples}.
        mean_response_tokens: policy tokens per episode.
        wall_time_s: seconds for the whole evaluation; tokens_per_s: generated tokens per second.
        per_task: per-task lists of correctness (0/1) of each sample.
        episodes: one record per sample, in task order: `task_index`, `task_id`, `sample`,
            `reward`, `correct`, `terms` (the reward terms summed over turns), `messages` (the
            conversation as text) and more; the rows of `episodes.jsonl`.
        accuracy_term: the env's reward term that defines accuracy (`accuracy_term`, default "correct").
    """

    env_id: str
    n: int
    samples: int
    accuracy: float
    mean_reward: float
    pass_at: dict[int, float]
    mean_response_tokens: float
    wall_time_s: float
    tokens_per_s: float
    per_task: list[list[int]] = field(default_factory=list)
    episodes: list[dict[str, Any]] = field(default_factory=list)
    accuracy_term: str = "correct"

    def summary(self) -> dict[str, Any]:
        """The figures without the per-task lists and episodes (JSON-serialisable).

        Beside the attributes: `cut_share` (answers cut at the token budget), `stated_accuracy`
        (the answer each reply states, read leniently, against the gold; None without golds),
        `error_split` (episodes and correct ones by the env's task category, e.g. carry / no
        carry; `textgym.evaluation.figures`), `hacks` and `turns`.
        """
        from textgym.evaluation.figures import cut_share, error_split, stated_accuracy

        d = asdict(self)
        d.pop("per_task")
        d.pop("episodes")
        d["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        d["cut_share"] = cut_share(self.episodes)
        d["stated_accuracy"] = stated_accuracy(self.episodes)
        d["error_split"] = error_split(self.episodes)
        d["hacks"] = self.hacks()
        d["turns"] = self.turn_stats()
        return d

    def turn_stats(self) -> dict[str, float]:
        """Per-episode means of a multi-turn evaluation (the same names as training's `rollout/*`).

        `turns_mean` (agent turns per episode), `reward_per_turn_mean`, `tool_calls_mean`,
        `tool_errors_mean`, `invalid_actions_mean`, and `truncated_<cause>_frac` for each cause
        (`time_limit`, `max_turns`, `context`). Episodes recorded before these fields existed
        count as one turn with no calls.
        """
        eps = self.episodes
        if not eps:
            return {}
        n = len(eps)
        out = {
            "turns_mean": sum(int(e.get("turns", 1)) for e in eps) / n,
            "reward_per_turn_mean": sum(float(e["reward"]) / max(1, int(e.get("turns", 1))) for e in eps) / n,
        }
        for key in EPISODE_COUNTS:
            out[f"{key}_mean"] = sum(int(e.get(key, 0)) for e in eps) / n
        for cause in TRUNCATION_CAUSES:
            out[f"truncated_{cause}_frac"] = sum(e.get("truncation") == cause for e in eps) / n
        return out

    def hacks(self) -> dict[str, float]:
        """Reward-hacking shares among the rewarded episodes (`hack_telemetry.hack_shares`)."""
        from textgym.verifiers.hack_telemetry import hack_shares

        return hack_shares([(e["reward"], e.get("terms", {}), e.get("messages", [])) for e in self.episodes])


class EvaluationInterruptedError(RuntimeError):
    """An evaluation stopped part-way (e.g. its endpoint died); finished episodes are on disk.

    Attributes:
        episodes_path: the JSONL file holding the finished episodes.
        finished: tasks whose every sample finished.
    """

    def __init__(self, message: str, episodes_path: Path, finished: int):
        super().__init__(message)
        self.episodes_path = episodes_path
        self.finished = finished


def _load_episodes(path: Path, key: dict[str, Any]) -> dict[int, list[dict]]:
    """Finished episodes of this evaluation in `path`, by task index.

    A row belongs to this evaluation when its `key` fields (env, kwargs, samples, sampling,
    policy) are equal; other rows are kept in the file but ignored, and a half-written last
    line from a killed run is skipped.
    """
    done: dict[int, list[dict]] = {}
    if not path.is_file():
        return done
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(r, dict) and all(r.get(k) == v for k, v in key.items()):
            done.setdefault(int(r["task_index"]), []).append(r)
    return {i: rs for i, rs in done.items() if len(rs) == key["samples"]}


def _episode_rows(
    key: dict[str, Any], trajs: list[Any], samples: int, wall: float, about: TaskFacts | None = None
) -> list[dict[str, Any]]:
    """One episodes-file row per trajectory of a chunk.

    Each row is `key`, then the task (its gold answer and category when `about` knows them),
    sample, reward, correctness, reward terms, messages, token and turn counts, and the
    trajectory's share of the chunk's `wall` seconds.
    """
    about = about or TaskFacts(None, None)
    return [
        key
        | {
            "task_index": t.task_index,
            "task_id": t.task_id,
            **about.of(t.task_index),
            "sample": j % samples,
            "reward": t.reward,
            "correct": episode_correct(t.reward_terms, t.reward),
            "terms": t.reward_terms,
            "messages": t.messages,
            "response_tokens": t.response_length,
            "finish_reason": t.finish_reason,
            "turns": t.turns,
            **{k: int(t.counts.get(k, 0)) for k in EPISODE_COUNTS},
            "truncation": t.truncation,
            "wall_s": wall / len(trajs),
        }
        for j, t in enumerate(trajs)
    ]


class TaskFacts:
    """What an evaluation row records of its task beside the trajectory: its gold answer and category.

    `gold` is the task's `answer` (when the env has `tasks`), `category` what the env's
    `task_category(task)` says (e.g. Arithmetic's "carry" / "no carry"); either is left out when
    the env has none.
    """

    def __init__(self, tasks: Any, category: Any):
        self.tasks, self.category = tasks, category

    @classmethod
    def of_env(cls, env: Any) -> TaskFacts:
        """The facts `env` can give (its `tasks`, its `task_category`)."""
        found = []
        for name in ("tasks", "task_category"):
            try:
                found.append(env.get_wrapper_attr(name))
            except AttributeError:
                found.append(None)
        return cls(*found)

    def of(self, index: int) -> dict[str, Any]:
        """`{"gold": ..., "category": ...}` of task `index` (the keys it knows)."""
        if self.tasks is None or index < 0:
            return {}
        task = self.tasks[index]
        out: dict[str, Any] = {"gold": getattr(task, "answer", None)}
        if self.category is not None:
            out["category"] = self.category(task)
        return out


def _write_chunk(
    rows: list[dict[str, Any]],
    trajs: list[Any],
    path: Path | None,
    trajectory_store: str | Path | None,
    env_kwargs: dict[str, Any],
    samples: int,
    policy: str,
) -> None:
    """Append a finished chunk: its trajectories to the store (one shard), its rows to the episodes file."""
    if trajectory_store is not None:
        from textgym.offline.store import TrajectoryWriter, trajectory_row

        with TrajectoryWriter(trajectory_store) as w:
            w.append(
                trajectory_row(t, env_kwargs=env_kwargs, sample=j % samples, policy=policy, source="eval")
                for j, t in enumerate(trajs)
            )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(r) + "\n" for r in rows))


def evaluate(
    agent: LLMAgent,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    n: int = 200,
    samples: int = 1,
    params: SamplingParams | None = None,
    batch_size: int = 256,
    episodes_path: str | Path | None = None,
    policy: str = "",
    trajectory_store: str | Path | None = None,
) -> EvalResult:
    """Run `samples` episodes on each of the tasks 0..n−1 of `env_id` and aggregate.

    Episodes run in chunks of `batch_size // samples` tasks. With `episodes_path`, each
    chunk's episodes are appended to that JSONL file as soon as the chunk finishes (one row
    per episode: task, sample, reward, correctness, tokens, wall-time share), and tasks whose
    episodes are already there are not run again: a call that died part-way (an endpoint
    that went away, a killed process) is resumed by repeating it, and its figures are those
    of one uninterrupted run (wall time summed over the calls). Rows are reused only when
    env, kwargs, samples, sampling parameters and `policy` (a name of the policy) all match.
    With `trajectory_store`, each chunk's full trajectories are also appended to that store
    (`textgym.offline.store`, one shard per chunk, `source="eval"`).

    Raises:
        ValueError: if the environment has fewer than `n` tasks.
        EvaluationInterruptedError: when generation fails part-way with `episodes_path` set (the
            cause is chained; the finished chunks are in the file).
    """
    params = params or SamplingParams(temperature=0.0)
    env_kwargs = dict(env_kwargs or {})
    probe = make_env(env_id, **env_kwargs)
    n_tasks, term, about = task_count(probe), accuracy_term(probe), TaskFacts.of_env(probe)
    probe.close()
    if n > n_tasks:
        raise ValueError(f"{env_id} has {n_tasks} tasks, cannot evaluate n={n}")
    path = Path(episodes_path) if episodes_path is not None else None
    key = {
        "env_id": env_id,
        "env_kwargs": env_kwargs,
        "samples": samples,
        "sampling": asdict(params),
        "policy": policy,
    }
    records = _load_episodes(path, key) if path is not None else {}
    todo = [i for i in range(n) if i not in records]
    per_ep = max(1, batch_size // samples)
    envs = [make_env(env_id, **env_kwargs) for _ in range(min(max(len(todo), 1), per_ep) * samples)]
    new_tokens, new_wall = 0, 0.0
    try:
        for c in range(0, len(todo), per_ep):
            idx = todo[c : c + per_ep]
            start = time.perf_counter()
            try:
                trajs = rollout(agent, envs, idx, params, group_size=samples, env_id=env_id)
            except Exception as e:
                if path is None:
                    raise
                finished = sum(1 for i in range(n) if i in records)
                raise EvaluationInterruptedError(
                    f"{env_id}: generation failed after {finished} of {n} tasks ({type(e).__name__}: {e}); "
                    f"the finished episodes are in {path}; run the same evaluation again to resume",
                    path,
                    finished,
                ) from e
            wall = time.perf_counter() - start
            new_wall += wall
            new_tokens += sum(t.response_length for t in trajs)
            rows = _episode_rows(key, trajs, samples, wall, about)
            for r in rows:
                records.setdefault(int(r["task_index"]), []).append(r)
            _write_chunk(rows, trajs, path, trajectory_store, env_kwargs, samples, policy)
    finally:
        for env in envs:
            env.close()
    ordered = [sorted(records[i], key=lambda r: int(r["sample"])) for i in range(n)]
    flat = [r for rs in ordered for r in rs]
    per_task = [[int(r["correct"]) for r in rs] for rs in ordered]
    ks, tokens = sorted({1, samples}), sum(int(r["response_tokens"]) for r in flat)
    wall_total = sum(float(r["wall_s"]) for r in flat)
    return EvalResult(
        env_id=env_id,
        n=n,
        samples=samples,
        accuracy=sum(sum(c) for c in per_task) / len(flat),
        mean_reward=sum(float(r["reward"]) for r in flat) / len(flat),
        pass_at={k: sum(pass_at_k(samples, sum(c), k) for c in per_task) / n for k in ks},
        mean_response_tokens=tokens / len(flat),
        wall_time_s=wall_total,
        tokens_per_s=new_tokens / new_wall
        if new_wall > 0
        else (tokens / wall_total if wall_total > 0 else 0.0),
        per_task=per_task,
        episodes=flat,
        accuracy_term=term,
    )
