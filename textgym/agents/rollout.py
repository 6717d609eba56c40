"""Run episodes of text environments with an `LLMAgent` and record them as `Trajectory`s.

`rollout` advances all active episodes in lockstep: one batched generation per turn, then
every env step, then the next turn. `textgym.agents.continuous.rollout_continuous` lets each
episode advance on its own (same arguments, same trajectories); both share this module's
per-episode bookkeeping (`_start_episodes`, `_record_turn`, `_to_trajectory`). The first
prompt is rendered by the chat template; each later observation is appended as the
template's incremental rendering (`observation_tokens`), so the token sequence is
exactly what the policy saw and sampled — no generated text is ever re-tokenized.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import torch
from transformers import PreTrainedTokenizerBase

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import Generation, SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory, turn_counts
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
class RolloutStats:
    """How a rollout used its generation backend (filled in when passed as `stats=`).

    Attributes:
        wall_s: the rollout's wall-clock time, seconds (envs' resets included).
        generate_s: seconds during which generation ran: at least one `generate` call (or, for an
            endpoint, one request) in flight.
        env_s: seconds spent stepping environments (verifiers, tools, sandboxes): in lockstep,
            the wall time of each turn's concurrent env steps; in a continuous rollout, the sum
            of the env steps' own times (they overlap generation there).
        generate_calls: `generate` calls made (for an endpoint: requests sent).
        generated_rows: prompts generated in all (one per episode turn).
        episodes: episodes rolled out.
    """

    wall_s: float = 0.0
    generate_s: float = 0.0
    env_s: float = 0.0
    generate_calls: int = 0
    generated_rows: int = 0
    episodes: int = 0

    @property
    def idle_fraction(self) -> float:
        """Fraction of the wall time with no generation running, in [0, 1] (0 for an empty rollout)."""
        return max(0.0, 1.0 - self.generate_s / self.wall_s) if self.wall_s > 0 else 0.0

    @property
    def episodes_per_s(self) -> float:
        """Episodes finished per second of wall time."""
        return self.episodes / self.wall_s if self.wall_s > 0 else 0.0

    def add_generate(self, seconds: float, rows: int) -> None:
        """Count one generation call of `rows` prompts that ran `seconds`."""
        self.generate_s += seconds
        self.generate_calls += 1
        self.generated_rows += rows

    def finish(self, episodes: int, wall_s: float) -> None:
        """Record the rollout's end: `episodes` episodes in `wall_s` seconds."""
        self.wall_s = wall_s
        self.episodes = episodes


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
    token_versions: list[int] = field(default_factory=list)  # per token: its turn's server version, else -1
    truncation: str = ""  # why a truncated episode was cut (`Trajectory.truncation`)
    counts: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    reply_prefix: str = ""  # the env's prefill of the first reply (`info["reply_prefix"]`), until used


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
    stats: RolloutStats | None = None,
    max_context_tokens: int | None = None,
) -> list[Trajectory]:
    """Run `group_size` episodes of each task in `task_indices` in lockstep; return their trajectories.

    Args:
        agent: the policy; an `OracleDemonstrator` plays each env's `oracle_action` instead of
            sampling (demonstrations, recorded in the same layout).
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
        stats: filled in with the rollout's timing (`RolloutStats`), or None.
        max_context_tokens: the context window an episode must stay within, in tokens: an
            episode whose next observation plus a full response (`params.max_new_tokens`) would
            outgrow it ends there, truncated (`Trajectory.truncation == "context"`), scored with
            the rewards of the turns it played, and the observation is not appended. None: the
            agent's `context_length` (the model's `max_position_embeddings`, vLLM's
            `max_model_len`; no limit when it reports none).

    Returns:
        `len(task_indices) * group_size` trajectories, grouped: rows g*G .. g*G+G-1 share task g.

    Raises:
        ValueError: if there are fewer envs than episodes, `seeds` is not one per episode, or a
            first prompt leaves no room for a response of `params.max_new_tokens` in the context.
        Exception: whatever an env's step raised (`textgym.envs.EnvError` for envs built by
            `textgym.envs.make`), unchanged.
    """
    start = time.perf_counter()
    limit = context_limit(agent, max_context_tokens)
    episodes = _start_episodes(agent, envs, task_indices, group_size, seeds)
    check_first_prompts(episodes, limit, params.max_new_tokens, env_id)
    eos_ids = list(agent.backend.eos_ids)
    active = episodes
    demonstrate = getattr(agent, "demonstrate", None)  # `OracleDemonstrator`: the env's expert
    room = None if limit is None else limit - params.max_new_tokens  # the longest next prompt
    while active:
        prompts = [ep.token_ids for ep in active]
        t0 = time.perf_counter()
        if demonstrate is not None:
            gens = demonstrate([ep.env for ep in active], [ep.messages for ep in active])
        elif seeds is None:
            gens = agent.generate(prompts, params)
        else:
            turn_seeds = [derive_seed(ep.seed or 0, ep.turns) for ep in active]
            gens = agent.generate(prompts, params, seeds=turn_seeds)
        if stats is not None:
            stats.add_generate(time.perf_counter() - t0, len(prompts))
        texts = [reply_text(ep, agent.decode(gen.token_ids)) for ep, gen in zip(active, gens, strict=True)]
        # Environments are independent objects: step them concurrently, so verifiers that wait on
        # worker processes (math-verify, later the sandbox) score in parallel.
        t1 = time.perf_counter()
        steps = list(_STEP_POOL.map(lambda pair: pair[0].env.step(pair[1]), zip(active, texts, strict=True)))
        if stats is not None:
            stats.env_s += time.perf_counter() - t1
        for ep, gen, text, step in zip(active, gens, texts, steps, strict=True):
            _record_turn(
                ep, agent, gen, text, step, env_id=env_id, max_turns=max_turns, eos_ids=eos_ids, room=room
            )
        active = [ep for ep in active if not ep.done]
    if stats is not None:
        stats.finish(len(episodes), time.perf_counter() - start)
    return [_to_trajectory(ep, env_id) for ep in episodes]


def context_limit(agent: LLMAgent, max_context_tokens: int | None) -> int | None:
    """The context window episodes must fit, in tokens.

    `max_context_tokens` when given, else the agent's `context_length` (None: no limit).

    Raises:
        ValueError: if `max_context_tokens` is not positive.
    """
    if max_context_tokens is not None:
        if max_context_tokens <= 0:
            raise ValueError(f"max_context_tokens must be positive, got {max_context_tokens}")
        return int(max_context_tokens)
    n = getattr(agent, "context_length", None)
    return int(n) if n else None


def check_first_prompts(
    episodes: Sequence[_Episode], limit: int | None, max_new_tokens: int, env_id: str
) -> None:
    """Refuse to start episodes whose first prompt leaves no room for a whole response.

    Raises:
        ValueError: naming the task, the prompt's length, `max_new_tokens` and the limit.
    """
    if limit is None:
        return
    for ep in episodes:
        if ep.prompt_length + max_new_tokens > limit:
            raise ValueError(
                f"{env_id or 'the env'} task {ep.task_index}: the first prompt has "
                f"{ep.prompt_length} tokens, and with max_new_tokens {max_new_tokens} it outgrows "
                f"the context of {limit} tokens "
                "(lower max_new_tokens, or raise max_context_tokens up to the model's window)"
            )


def _start_episodes(
    agent: LLMAgent,
    envs: Sequence[gym.Env],
    task_indices: list[int],
    group_size: int,
    seeds: list[int] | None,
) -> list[_Episode]:
    """Reset one env per episode and render each first prompt (once per task: the group shares it).

    Episode e (in the order of the returned trajectories) takes `envs[e]` and `seeds[e]`.

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
    episodes: list[_Episode] = []
    for g, ti in enumerate(task_indices):
        prompt_ids: list[int] | None = None
        for _ in range(group_size):
            env = envs[len(episodes)]
            obs, reset_info = env.reset(options={"task_index": ti})
            tools = reset_info.get("tools")
            prefix = str(reset_info.get("reply_prefix") or "")
            if prompt_ids is None:
                prompt_ids = agent.encode_prompt(obs, tools=tools)
                if prefix:  # the prefilled start of the reply: context, not the policy's tokens
                    prompt_ids += agent.tokenizer(prefix, add_special_tokens=False)["input_ids"]
            ep = _Episode(env, ti, g, list(obs), list(prompt_ids), len(prompt_ids), tools=tools)
            ep.reply_prefix = prefix
            ep.seed = None if seeds is None else seeds[len(episodes)]
            _pad_non_policy(ep, len(prompt_ids))
            episodes.append(ep)
    return episodes


def reply_text(ep: _Episode, generated: str) -> str:
    """The text the env is stepped with: `generated`, after the env's reply prefix on the first turn.

    An env that announced `info["reply_prefix"]` at reset (`SingleTurnEnv(prefill=True)`) had
    the prefix's tokens appended to the first prompt (`_start_episodes`), so the policy wrote
    only the continuation; the env scores the whole reply, and the transcript shows it.
    """
    prefix, ep.reply_prefix = ep.reply_prefix, ""
    return prefix + generated


def _pad_non_policy(ep: _Episode, n: int) -> None:
    """Extend the per-token arrays by `n` non-policy positions (mask 0, log-prob 0, no reward)."""
    ep.loss_mask += [0.0] * n
    ep.logprobs += [0.0] * n
    ep.token_rewards += [0.0] * n
    ep.step_rewards += [0.0] * n
    ep.step_mask += [0.0] * n
    ep.token_versions += [-1] * n


def _record_turn(
    ep: _Episode,
    agent: LLMAgent,
    gen: Generation,
    text: str,
    step: tuple[Any, Any, Any, Any, dict],
    *,
    env_id: str,
    max_turns: int,
    eos_ids: list[int],
    room: int | None = None,
) -> None:
    """Append one turn to `ep`: its generated tokens, its reward, then the observation's tokens.

    The generated tokens get mask 1 and their log-probs (mask 0 for ids the backend marks
    not sampled, `Generation.sampled`); the turn's reward sits on its last policy token;
    unless the episode ends here, the observation follows (`observation_tokens`, mask 0).

    Args:
        ep: the episode (mutated; `ep.done` set when it ends).
        agent: the policy (its tokenizer renders the observation).
        gen: the turn's generation ([N] ids and log-probs).
        text: `gen` decoded (what the env received).
        step: what `env.step(text)` returned: (observation, reward, terminated, truncated, info).
        env_id: for messages and the trajectory.
        max_turns: the rollout's cap on turns (an episode cut there is marked truncated).
        eos_ids: the backend's end-of-turn ids.
        room: the longest sequence a next prompt may be, in tokens (the context window minus
            `max_new_tokens`): when the observation would make it longer, the episode ends here
            truncated by "context" instead. None: no limit.

    Raises:
        ValueError: from `_place_step_rewards` or `observation_tokens`.
    """
    n = len(gen.token_ids)
    ep.token_ids += gen.token_ids
    ep.loss_mask += [1.0] * n if gen.sampled is None else [float(x) for x in gen.sampled]
    ep.logprobs += gen.logprobs.tolist()
    ep.token_rewards += [0.0] * n
    ep.step_rewards += [0.0] * n
    ep.step_mask += [0.0] * n
    ep.token_versions += [-1 if gen.policy_version is None else int(gen.policy_version)] * n
    ep.messages.append({"role": "assistant", "content": text})
    obs, reward, terminated, truncated, info = step
    if "step_rewards" in info:
        _place_step_rewards(ep, agent, list(gen.token_ids), info, env_id)
    ep.turns += 1
    # the turn's reward on its last policy token (an appended end-of-turn id has mask 0)
    last = max((i for i in range(n) if ep.loss_mask[len(ep.loss_mask) - n + i] > 0), default=n - 1)
    ep.token_rewards[len(ep.token_rewards) - n + last] += float(reward)
    ep.reward += float(reward)
    for k, v in info.items():
        if k.startswith("reward/"):
            ep.terms[k] += float(v)
    for key, count in turn_counts(info).items():  # counted per episode: only what happened is a key
        if count:
            ep.counts[key] += count
    ep.info = info
    ep.finish_reason = gen.finish_reason
    # An episode that terminated is not truncated, even when a `TimeLimit` also reported its
    # step limit on that step (gymnasium sets both): its return ends there, with nothing to
    # bootstrap. Truncated means cut short of a terminal state (time limit or `max_turns`).
    ep.terminated = bool(terminated)
    ep.truncated = not ep.terminated and (bool(truncated) or ep.turns >= max_turns)
    if ep.truncated:
        ep.truncation = "time_limit" if truncated else "max_turns"
    if terminated or truncated or ep.turns >= max_turns:
        ep.done = True
        return
    env_ids = observation_tokens(agent.tokenizer, list(obs), gen.finish_reason == "stop", eos_ids, ep.tools)
    if room is not None and len(ep.token_ids) + len(env_ids) > room:
        # the next turn would not fit the context: the episode ends here, cut short of a
        # terminal state (PPO bootstraps it), scored with what its turns earned
        ep.truncated, ep.truncation, ep.done = True, "context", True
        return
    ep.messages += list(obs)
    ep.token_ids += env_ids
    _pad_non_policy(ep, len(env_ids))


def _to_trajectory(ep: _Episode, env_id: str) -> Trajectory:
    """The finished episode as a `Trajectory` (its lists become [T] tensors)."""
    reported = [v for v in ep.token_versions if v >= 0]  # versions a rollout server reported
    return Trajectory(
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
        policy_version=min(reported, default=0),  # the oldest version over the turns
        token_versions=torch.tensor(ep.token_versions, dtype=torch.long) if reported else None,
        truncation=ep.truncation,
        counts=dict(ep.counts),
    )


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
