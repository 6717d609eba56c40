"""Evaluate a policy on an environment: accuracy, mean reward, pass@k, lengths and throughput."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from math import comb
from typing import Any

import gymnasium as gym

from textgym.agents.llm_agent import LLMAgent, SamplingParams
from textgym.agents.rollout import rollout


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


def episode_correct(terms: dict[str, float], reward: float) -> int:
    """Whether an episode counts as correct (1) or not (0).

    Correct when its `reward/correct` term, summed over its turns, reaches 1 (up to 1e-9 of
    float rounding); an env without that term counts a positive return as correct.
    """
    return int(terms.get("reward/correct", 1.0 if reward > 0 else 0.0) >= 1.0 - 1e-9)


@dataclass
class EvalResult:
    """Aggregate figures of an evaluation.

    Attributes:
        env_id: the environment.
        n: tasks evaluated; samples: samples per task.
        accuracy: mean of `reward/correct` over all samples (reward > 0 when the env has no such term).
        mean_reward: mean episode return.
        pass_at: {k: mean pass@k over tasks} for k in {1, samples}.
        mean_response_tokens: policy tokens per episode.
        wall_time_s: seconds for the whole evaluation; tokens_per_s: generated tokens per second.
        per_task: per-task lists of correctness (0/1) of each sample.
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

    def summary(self) -> dict[str, Any]:
        """The figures without the per-task lists (JSON-serialisable)."""
        d = asdict(self)
        d.pop("per_task")
        d["pass_at"] = {str(k): v for k, v in self.pass_at.items()}
        return d


def evaluate(
    agent: LLMAgent,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    n: int = 200,
    samples: int = 1,
    params: SamplingParams | None = None,
    batch_size: int = 256,
) -> EvalResult:
    """Run `samples` episodes on each of the tasks 0..n−1 of `env_id` and aggregate.

    Raises:
        ValueError: if the environment has fewer than `n` tasks.
    """
    params = params or SamplingParams(temperature=0.0)
    probe = gym.make(env_id, **(env_kwargs or {}))
    n_tasks = len(probe.unwrapped.tasks)  # type: ignore[attr-defined]
    probe.close()
    if n > n_tasks:
        raise ValueError(f"{env_id} has {n_tasks} tasks, cannot evaluate n={n}")
    per_ep = max(1, batch_size // samples)
    envs = [gym.make(env_id, **(env_kwargs or {})) for _ in range(min(n, per_ep) * samples)]
    start = time.perf_counter()
    trajs = []
    for i in range(0, n, per_ep):
        idx = list(range(i, min(n, i + per_ep)))
        trajs += rollout(agent, envs, idx, params, group_size=samples, env_id=env_id)
    wall = time.perf_counter() - start
    for e in envs:
        e.close()
    correct = [episode_correct(t.reward_terms, t.reward) for t in trajs]
    per_task = [correct[j * samples : (j + 1) * samples] for j in range(n)]
    ks = sorted({1, samples})
    tokens = sum(t.response_length for t in trajs)
    return EvalResult(
        env_id=env_id,
        n=n,
        samples=samples,
        accuracy=sum(correct) / len(correct),
        mean_reward=sum(t.reward for t in trajs) / len(trajs),
        pass_at={k: sum(pass_at_k(samples, sum(c), k) for c in per_task) / n for k in ks},
        mean_response_tokens=tokens / len(trajs),
        wall_time_s=wall,
        tokens_per_s=tokens / wall if wall > 0 else 0.0,
        per_task=per_task,
    )
