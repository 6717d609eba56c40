"""Scripted agents that need no model: an oracle that reads the hidden solution, and a random agent.

They bound what an environment can give: the oracle should solve (almost) every task, the
random agent almost none. `textgym eval --agent oracle|random` runs them; the tests use them
to check every env end to end.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym
import numpy as np

from textgym.agents.trajectory import EPISODE_COUNTS, episode_correct, turn_counts
from textgym.envs.registry import accuracy_term, task_count
from textgym.envs.registry import make as make_env
from textgym.evaluation.core import EvalResult
from textgym.tools.base import format_tool_call
from textgym.types import Message

_RANDOM_WORDS = ("hello", "42", "open", "search", "7 * 6", "print(1)", "shirt", "blue", "1", "the")


class OracleAgent:
    """Replies with the env's `oracle_action(messages)` (the outermost wrapper that defines it)."""

    name = "oracle"

    def act(self, env: gym.Env, messages: list[Message], info: dict[str, Any]) -> str:
        """The expert's next reply.

        Raises:
            AttributeError: when the env defines no oracle.
        """
        return str(env.get_wrapper_attr("oracle_action")(messages))


class RandomAgent:
    """Replies at random in the env's action format.

    With tools on offer (`info["tools"]`), half the replies call a random tool with random
    arguments drawn from its schema. Otherwise the reply is the env's `random_action(rng)` when
    it has one, else a random integer in `\\boxed{}`.

    Args:
        seed: seeds the agent's generator.
    """

    name = "random"

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def _random_value(self, schema: dict[str, Any]) -> Any:
        kind = schema.get("type")
        if "enum" in schema:
            return schema["enum"][int(self.rng.integers(len(schema["enum"])))]
        if kind == "integer":
            return int(self.rng.integers(0, 20))
        if kind == "number":
            return float(self.rng.uniform(0, 100))
        if kind == "boolean":
            return bool(self.rng.integers(2))
        return str(_RANDOM_WORDS[int(self.rng.integers(len(_RANDOM_WORDS)))])

    def act(self, env: gym.Env, messages: list[Message], info: dict[str, Any]) -> str:
        """A random reply (see the class docstring)."""
        tools = info.get("tools") or []
        if tools and self.rng.random() < 0.5:
            fn = tools[int(self.rng.integers(len(tools)))]["function"]
            props = fn.get("parameters", {}).get("properties", {})
            args = {k: self._random_value(v) for k, v in props.items() if self.rng.random() < 0.9}
            return format_tool_call(fn["name"], args)
        try:
            random_action = env.get_wrapper_attr("random_action")
        except AttributeError:
            return f"The final answer is \\boxed{{{int(self.rng.integers(0, 1000))}}}."
        return str(random_action(self.rng))


def play_episode(
    agent: OracleAgent | RandomAgent, env: gym.Env, task_index: int, max_turns: int = 64
) -> dict[str, Any]:
    """Play one episode of task `task_index`; return its return, turns, end flags and reward terms.

    Also the episode's `EPISODE_COUNTS` (tool calls, tool errors, invalid actions) and its
    `truncation` cause ("time_limit", "max_turns", or None when it terminated), as a rollout
    records them.
    """
    obs, info = env.reset(options={"task_index": task_index})
    tools = info.get("tools")
    messages = list(obs)
    total, turns = 0.0, 0
    terms: dict[str, float] = {}
    counts = dict.fromkeys(EPISODE_COUNTS, 0)
    terminated = truncated = False
    while not (terminated or truncated) and turns < max_turns:
        action = agent.act(env, messages, {**info, "tools": tools})
        messages.append({"role": "assistant", "content": action})
        obs, reward, terminated, truncated, info = env.step(action)
        messages += list(obs)
        total += float(reward)
        turns += 1
        for k, v in info.items():
            if k.startswith("reward/"):
                terms[k] = terms.get(k, 0.0) + float(v)
        for k, c in turn_counts(info).items():
            counts[k] += c
    return {
        "reward": total,
        "turns": turns,
        "terminated": terminated,
        "truncated": truncated or not terminated,
        "truncation": None if terminated else ("time_limit" if truncated else "max_turns"),
        **counts,
        "terms": terms,
        "messages": messages,
    }


def evaluate_scripted(
    agent: OracleAgent | RandomAgent,
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    n: int = 100,
) -> EvalResult:
    """Run `agent` on tasks 0..n−1 of `env_id`; accuracy counts episodes whose `reward/correct` sums to ≥ 1.

    Raises:
        ValueError: if the environment has fewer than `n` tasks.
    """
    env = make_env(env_id, **(env_kwargs or {}))
    n_tasks, term = task_count(env), accuracy_term(env)
    if n > n_tasks:
        raise ValueError(f"{env_id} has {n_tasks} tasks, cannot evaluate n={n}")
    start = time.perf_counter()
    episodes = [play_episode(agent, env, i) for i in range(n)]
    wall = time.perf_counter() - start
    env.close()
    correct = [episode_correct(e["terms"], e["reward"]) for e in episodes]
    return EvalResult(
        env_id=env_id,
        n=n,
        samples=1,
        accuracy=sum(correct) / n,
        mean_reward=sum(e["reward"] for e in episodes) / n,
        pass_at={1: sum(correct) / n},
        mean_response_tokens=0.0,
        wall_time_s=wall,
        tokens_per_s=0.0,
        per_task=[[c] for c in correct],
        episodes=[
            {"task_index": i, "sample": 0, "reward": e["reward"], "correct": c, "terms": e["terms"],
             "turns": e["turns"], "truncation": e["truncation"], "messages": e["messages"],
             **{k: e[k] for k in EPISODE_COUNTS}}
            for i, (e, c) in enumerate(zip(episodes, correct, strict=True))
        ],
        accuracy_term=term,
    )  # fmt: skip
