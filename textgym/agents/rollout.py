"""Run episodes of text environments with an `LLMAgent` and record them as `Trajectory`s.

All active episodes advance in lockstep: one batched generation per turn. The first
prompt is rendered by the chat template; each later observation is appended as the
template's incremental rendering (`observation_tokens`), so the token sequence is
exactly what the policy saw and sampled — no generated text is ever re-tokenized.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory
from textgym.types import Message
from textgym.verifiers.steps import step_token_indices

_PROBE = "\x00textgym-probe\x00"
_STEP_POOL = ThreadPoolExecutor(
    max_workers=int(os.environ.get("TEXTGYM_STEP_THREADS", "4")), thread_name_prefix="env-step"
)


def observation_tokens(
    tokenizer: PreTrainedTokenizerBase,
    observation: list[Message],
    ended_with_eos: bool,
    eos_ids: int | Iterable[int],
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids that follow an assistant turn when the environment answers with `observation`.

    Renders a probe conversation with and without the new messages and keeps the
    difference: the template's closing of the assistant turn (minus its end-of-turn
    token when the policy already sampled one), the observation, and the next
    generation prompt.

    Args:
        tokenizer: the policy's tokenizer, with its chat template.
        observation: the messages the environment answered with.
        ended_with_eos: whether the policy's turn ended with an end-of-turn token it sampled.
        eos_ids: every end-of-turn id the backend stops at (its `eos_ids`). When the policy
            ended its turn with any of them, the template's closing token (when it is one of
            them) is dropped, so the turn ends with exactly one end-of-turn token — the one
            sampled, e.g. Qwen's `<|endoftext|>` where the template writes `<|im_end|>`.
        tools: the env's tool schemas, passed to the template as in the first prompt.

    The earlier turns are never re-rendered: the trajectory is the one growing token sequence
    the policy actually saw, even under templates that rewrite history when a conversation
    is rendered whole (e.g. dropping earlier `<think>` blocks; see `textgym check-template`).

    Raises:
        ValueError: if the chat template rewrites the probe's plain turns (the rendering with
            the observation does not extend the rendering without it).
    """
    base: list[Message] = [{"role": "user", "content": _PROBE}, {"role": "assistant", "content": _PROBE}]
    before = tokenizer.apply_chat_template(base, tools=tools or None, tokenize=False)  # type: ignore[arg-type]
    after = tokenizer.apply_chat_template(
        base + observation,
        tools=tools or None,  # type: ignore[arg-type]
        tokenize=False,
        add_generation_prompt=True,
    )
    assert isinstance(before, str) and isinstance(after, str)
    if not after.startswith(before):
        raise ValueError(
            "the chat template rewrites history; multi-turn token bookkeeping needs a prefix-stable template"
        )
    closing = before[before.rindex(_PROBE) + len(_PROBE) :]
    ids = tokenizer(closing + after[len(before) :], add_special_tokens=False)["input_ids"]
    eos = {eos_ids} if isinstance(eos_ids, int) else set(eos_ids)
    if ended_with_eos and ids and ids[0] in eos:
        ids = ids[1:]
    return list(ids)


@dataclass
class _Episode:
    env: gym.Env
    task_index: int
    group: int
    messages: list[Message]
    token_ids: list[int]
    prompt_length: int
    tools: list[dict[str, Any]] | None = None
    loss_mask: list[float] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    token_rewards: list[float] = field(default_factory=list)
    step_rewards: list[float] = field(default_factory=list)
    step_mask: list[float] = field(default_factory=list)
    reward: float = 0.0
    terms: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    turns: int = 0
    done: bool = False
    terminated: bool = False
    truncated: bool = False
    info: dict = field(default_factory=dict)
    finish_reason: str = "stop"
    seed: int | None = None


def rollout(
    agent: LLMAgent,
    envs: Sequence[gym.Env],
    task_indices: list[int],
    params: SamplingParams,
    *,
    group_size: int = 1,
    max_turns: int = 16,
    env_id: str = "",
    seeds: list[int] | None = None,
) -> list[Trajectory]:
    """Run `group_size` episodes of each task in `task_indices` and return their trajectories.

    Args:
        agent: the policy.
        envs: at least `len(task_indices) * group_size` environment instances (reused; reset here).
        task_indices: tasks to pose, via `reset(options={"task_index": i})`.
        params: sampling parameters for every turn.
        group_size: samples per task (G); trajectory `group` is the task's position in `task_indices`.
        max_turns: safety cap on agent turns per episode (environments normally end
            themselves or through `TimeLimit`); an episode cut here is marked truncated.
        env_id: recorded in each trajectory.
        seeds: one seed per episode (in the order of the returned trajectories); turn k of
            episode e is sampled with `derive_seed(seeds[e], k)` (see `LLMAgent.generate`), so an
            episode's tokens depend only on its seed and the policy. None: the global RNG.

    Returns:
        `len(task_indices) * group_size` trajectories, grouped: rows g*G .. g*G+G-1 share task g.

    Raises:
        ValueError: if there are fewer envs than episodes, or `seeds` is not one per episode.
    """
    n = len(task_indices) * group_size
    if seeds is not None and len(seeds) != n:
        raise ValueError(f"got {len(seeds)} seeds for {n} episodes")
    if len(envs) < n:
        raise ValueError(
            f"need {n} environments for {len(task_indices)} tasks x {group_size} samples, got {len(envs)}"
        )
    tok = agent.tokenizer
    eos_ids = list(agent.backend.eos_ids)
    episodes: list[_Episode] = []
    for g, ti in enumerate(task_indices):
        prompt_ids: list[int] | None = None
        for _ in range(group_size):
            env = envs[len(episodes)]
            obs, reset_info = env.reset(options={"task_index": ti})
            tools = reset_info.get("tools")
            if prompt_ids is None:
                prompt_ids = agent.encode_prompt(obs, tools=tools)
            ep = _Episode(env, ti, g, list(obs), list(prompt_ids), len(prompt_ids), tools=tools)
            ep.seed = None if seeds is None else seeds[len(episodes)]
            ep.loss_mask = [0.0] * len(prompt_ids)
            ep.logprobs = [0.0] * len(prompt_ids)
            ep.token_rewards = [0.0] * len(prompt_ids)
            ep.step_rewards = [0.0] * len(prompt_ids)
            ep.step_mask = [0.0] * len(prompt_ids)
            episodes.append(ep)

    active = episodes
    while active:
        prompts = [ep.token_ids for ep in active]
        if seeds is None:
            gens = agent.generate(prompts, params)
        else:
            turn_seeds = [derive_seed(ep.seed or 0, ep.turns) for ep in active]
            gens = agent.generate(prompts, params, seeds=turn_seeds)
        texts = [agent.decode(gen.token_ids) for gen in gens]
        # Environments are independent objects: step them concurrently, so verifiers that wait on
        # worker processes (math-verify, later the sandbox) score in parallel.
        steps = list(_STEP_POOL.map(lambda pair: pair[0].env.step(pair[1]), zip(active, texts, strict=True)))
        for ep, gen, text, step in zip(active, gens, texts, steps, strict=True):
            ep.token_ids += gen.token_ids
            ep.loss_mask += [1.0] * len(gen.token_ids)
            ep.logprobs += gen.logprobs.tolist()
            ep.token_rewards += [0.0] * len(gen.token_ids)
            ep.step_rewards += [0.0] * len(gen.token_ids)
            ep.step_mask += [0.0] * len(gen.token_ids)
            ep.messages.append({"role": "assistant", "content": text})
            obs, reward, terminated, truncated, info = step
            if "step_rewards" in info:
                _place_step_rewards(ep, agent, list(gen.token_ids), info, env_id)
            ep.turns += 1
            ep.token_rewards[-1] += float(reward)
            ep.reward += float(reward)
            for k, v in info.items():
                if k.startswith("reward/"):
                    ep.terms[k] += float(v)
            ep.info = info
            ep.finish_reason = gen.finish_reason
            ep.terminated, ep.truncated = bool(terminated), bool(truncated)
            if terminated or truncated or ep.turns >= max_turns:
                ep.done = True
                ep.truncated = ep.truncated or (not terminated and ep.turns >= max_turns)
                continue
            env_ids = observation_tokens(tok, list(obs), gen.finish_reason == "stop", eos_ids, ep.tools)
            ep.messages += list(obs)
            ep.token_ids += env_ids
            ep.loss_mask += [0.0] * len(env_ids)
            ep.logprobs += [0.0] * len(env_ids)
            ep.token_rewards += [0.0] * len(env_ids)
            ep.step_rewards += [0.0] * len(env_ids)
            ep.step_mask += [0.0] * len(env_ids)
        active = [ep for ep in active if not ep.done]

    return [
        Trajectory(
            token_ids=torch.tensor(ep.token_ids, dtype=torch.long),
            loss_mask=torch.tensor(ep.loss_mask, dtype=torch.float32),
            logprobs=torch.tensor(ep.logprobs, dtype=torch.float32),
            token_rewards=torch.tensor(ep.token_rewards, dtype=torch.float32),
            step_rewards=torch.tensor(ep.step_rewards, dtype=torch.float32),
            step_mask=torch.tensor(ep.step_mask, dtype=torch.float32),
            prompt_length=ep.prompt_length,
            messages=ep.messages,
            reward=ep.reward,
            reward_terms=dict(ep.terms),
            task_index=ep.task_index,
            task_id=str(ep.info.get("task_id", "")),
            env_id=env_id,
            group=ep.group,
            terminated=ep.terminated,
            truncated=ep.truncated,
            info=ep.info,
            finish_reason=ep.finish_reason,
        )
        for ep in episodes
    ]


def _place_step_rewards(ep: _Episode, agent: LLMAgent, gen_ids: list[int], info: dict, env_id: str) -> None:
    """Add a turn's `info["step_rewards"]` onto the tokens that end its steps (`step_token_indices`).

    `gen_ids` are the turn's generated ids, already appended to the episode (its last
    `len(gen_ids)` positions); a trailing end-of-turn id is not part of the text.

    Raises:
        ValueError: if `info["step_ends"]` is missing or not one offset per step reward.
    """
    rewards, ends = info["step_rewards"], info.get("step_ends")
    if not isinstance(ends, list | tuple) or len(ends) != len(rewards):
        raise ValueError(
            f"{env_id or 'the env'}: info['step_rewards'] needs info['step_ends'], one offset per step "
            f"(got {len(rewards)} rewards and {ends!r})"
        )
    start = len(ep.token_ids) - len(gen_ids)
    ids = gen_ids[:-1] if gen_ids and gen_ids[-1] in agent.backend.eos_ids else gen_ids
    # a turn without text tokens (the end-of-turn id alone) has its steps on its last token
    where = step_token_indices(agent.decode, ids, list(ends)) if ids else [len(gen_ids) - 1] * len(ends)
    for r, j in zip(rewards, where, strict=True):
        ep.step_rewards[start + j] += float(r)
        ep.step_mask[start + j] = 1.0
