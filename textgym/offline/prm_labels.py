"""Monte-Carlo step labels for a process reward model (Math-Shepherd, Wang et al. 2023, arXiv:2312.08935).

A step's quality is how often the policy, continuing the answer from the end of that step,
reaches the correct answer. For each step prefix s_{1..k} of an answer, K continuations are
sampled and judged; with a_j the final answer of continuation j and a* the gold one,

    soft:  y_k = (1/K) Σ_j 1[a_j = a*]            (Math-Shepherd §3.3, soft estimation)
    hard:  y_k = 1 if ∃ j: a_j = a*, else 0         (hard estimation)

so a step after which the policy can no longer get it right is labelled 0 without anyone
annotating it. `mc_step_labels` is the pure labelling (its sampler and judge are arguments, so
tests script them); `label_policy` rolls out a policy on an env and labels its answers.
Labelling covers single-turn envs (the answer is the episode's one assistant turn).

A labels file holds one JSON object per answer: `task_index`, `task_id`, `messages` (the
conversation before the answer), `response`, `step_ends` (each step's end offset in the
response), `soft`, `hard` (one label per step), `env_step_rewards` (the env's own step
rewards when it has a checker, e.g. worked Arithmetic; else null), `correct` (the answer's
outcome), `continuations` (K).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import episode_correct
from textgym.config import EnvConfig
from textgym.envs.registry import make as make_env
from textgym.types import Message
from textgym.verifiers.steps import split_steps

ContinuationSampler = Callable[[list[tuple[list[Message], str]], int], list[list[str]]]
"""`(requests, k) -> continuations`: for each (conversation, prefix of the answer), k texts that
continue the prefix (the prefix itself not repeated)."""

Judge = Callable[[list[tuple[int, str]]], list[bool]]
"""`[(task_index, whole answer)] -> [reaches the correct answer]`."""


@dataclass
class Answer:
    """One answer to label.

    Attributes:
        task_index, task_id: the task answered.
        messages: the conversation before the answer.
        response: the answer's text.
        step_ends: each step's end offset in `response` (`split_steps`' ends, or the env's).
        env_step_rewards: the env's own step rewards (a checker's verdicts), or None.
        correct: 1.0 when the answer itself is correct, else 0.0.
    """

    task_index: int
    task_id: str
    messages: list[Message]
    response: str
    step_ends: list[int]
    env_step_rewards: list[float] | None = None
    correct: float = 0.0


def mc_step_labels(
    answers: Sequence[Answer], sample: ContinuationSampler, judge: Judge, k: int
) -> list[dict]:
    """Label each step of each answer with the share (soft) and existence (hard) of correct continuations.

    Step k's prefix is `response[:step_ends[k]]`; each of its `k` continuations is judged as
    `prefix + continuation`. All prefixes go to `sample` in one call (it batches), all completed
    answers to `judge` in one call.

    Args:
        answers: what to label.
        sample: the continuation sampler (the policy, or a script in tests).
        judge: decides whether a whole answer reaches the task's correct answer.
        k: continuations per step (K ≥ 1).

    Returns:
        One row per answer (the labels file's format, see the module docstring).

    Raises:
        ValueError: if k < 1 or the sampler returns other than k continuations per prefix.
    """
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    requests = [(a.messages, a.response[:end]) for a in answers for end in a.step_ends]
    continuations = sample(requests, k) if requests else []
    if len(continuations) != len(requests) or any(len(c) != k for c in continuations):
        raise ValueError(f"the sampler must return {k} continuations for each of {len(requests)} prefixes")
    owners = [a.task_index for a in answers for _ in a.step_ends]
    verdicts = judge(
        [
            (ti, prefix + c)
            for ti, (_, prefix), conts in zip(owners, requests, continuations, strict=True)
            for c in conts
        ]
    )
    rows, j = [], 0
    for a in answers:
        soft, hard = [], []
        for _ in a.step_ends:
            hits = sum(bool(v) for v in verdicts[j * k : (j + 1) * k])
            soft.append(hits / k)
            hard.append(float(hits > 0))
            j += 1
        rows.append({**asdict(a), "soft": soft, "hard": hard, "continuations": k})
    return rows


def policy_sampler(agent: LLMAgent, params: SamplingParams, batch_size: int = 256) -> ContinuationSampler:
    """A `ContinuationSampler` that continues each prefix with `agent`'s policy.

    The prompt is the conversation rendered with the generation prompt followed by the prefix's
    tokens (`tokenizer(prefix)`); the continuation is the decoded generation. Sampling draws from
    the global RNG (seed it first for reproducible labels).
    """

    def sample(requests: list[tuple[list[Message], str]], k: int) -> list[list[str]]:
        tok = agent.tokenizer
        prompts: list[list[int]] = []
        for messages, prefix in requests:
            ids = agent.encode_prompt(messages) + list(tok(prefix, add_special_tokens=False)["input_ids"])
            prompts += [ids] * k
        texts: list[str] = []
        for i in range(0, len(prompts), batch_size):
            texts += [agent.decode(g.token_ids) for g in agent.generate(prompts[i : i + batch_size], params)]
        return [texts[r * k : (r + 1) * k] for r in range(len(requests))]

    return sample


def env_judge(env: EnvConfig, threads: int = 4) -> Judge:
    """A `Judge` stepping `env` (reset to the task, the answer as action); correct by `episode_correct`."""
    envs = [make_env(env.id, **env.kwargs) for _ in range(threads)]

    def one(slot: int, items: list[tuple[int, str]]) -> list[bool]:
        e, out = envs[slot], []
        for task_index, text in items:
            e.reset(options={"task_index": task_index})
            _, reward, _, _, info = e.step(text)
            terms = {k: float(v) for k, v in info.items() if k.startswith("reward/")}
            out.append(bool(episode_correct(terms, float(reward))))
        return out

    def judge(items: list[tuple[int, str]]) -> list[bool]:
        parts = [items[s::threads] for s in range(threads)]
        with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="prm-judge") as pool:
            results = list(pool.map(one, range(threads), parts))
        out: list[bool] = [False] * len(items)
        for s, res in enumerate(results):
            out[s::threads] = res
        return out

    return judge


def answers_of(agent: LLMAgent, env: EnvConfig, task_indices: list[int], params: SamplingParams,
               samples: int = 1, batch_size: int = 256) -> list[Answer]:  # fmt: skip
    """Roll out `samples` answers to each task of `task_indices` and keep what labelling needs.

    Raises:
        ValueError: if an episode has more than one assistant turn (a multi-turn env).
    """
    per = max(1, batch_size // samples)
    envs = [make_env(env.id, **env.kwargs) for _ in range(min(per, len(task_indices)) * samples)]
    out = []
    for c in range(0, len(task_indices), per):
        for t in rollout(agent, envs, task_indices[c : c + per], params, group_size=samples, env_id=env.id):
            if sum(m["role"] == "assistant" for m in t.messages) != 1:
                raise ValueError(f"{env.id}: step labels need single-turn episodes")
            response = str(t.messages[-1]["content"])
            ends = t.info.get("step_ends")
            gold = t.info.get("step_rewards")
            out.append(
                Answer(
                    task_index=t.task_index,
                    task_id=t.task_id,
                    messages=list(t.messages[:-1]),
                    response=response,
                    step_ends=[s.end for s in split_steps(response)] if ends is None else list(ends),
                    env_step_rewards=None if gold is None else [float(x) for x in gold],
                    correct=float(episode_correct(t.reward_terms, t.reward)),
                )
            )
    for e in envs:
        e.close()
    return out


def label_policy(
    agent: LLMAgent,
    env: EnvConfig,
    task_indices: list[int],
    params: SamplingParams,
    out: str | Path,
    *,
    samples: int = 1,
    k: int = 8,
    batch_size: int = 256,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Answer the tasks with `agent`, label every step by K continuations, write the labels file.

    Returns:
        Figures: answers, steps, the answers' accuracy, mean soft label, share of hard labels 1,
        and (when the env has a step checker) how often the labels agree with it
        (`agreement_soft`: soft ≥ 0.5 vs the checker, `agreement_hard`), wall seconds.
    """
    t0 = time.perf_counter()
    answers = answers_of(agent, env, task_indices, params, samples, batch_size)
    if echo is not None:
        n_steps = sum(len(a.step_ends) for a in answers)
        echo(f"prm label: {len(answers)} answers, {n_steps} steps; sampling {k} continuations per step")
    rows = mc_step_labels(answers, policy_sampler(agent, params, batch_size), env_judge(env), k)
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    tmp.replace(path)
    soft = [y for r in rows for y in r["soft"]]
    hard = [y for r in rows for y in r["hard"]]
    pairs = [(s, h, g) for r in rows if r["env_step_rewards"] is not None
             for s, h, g in zip(r["soft"], r["hard"], r["env_step_rewards"], strict=False)]  # fmt: skip
    res: dict[str, Any] = {
        "answers": len(rows),
        "steps": len(soft),
        "answer_accuracy": sum(r["correct"] for r in rows) / max(len(rows), 1),
        "soft_mean": sum(soft) / max(len(soft), 1),
        "hard_mean": sum(hard) / max(len(hard), 1),
        "continuations": k,
        "out": str(path),
    }
    if pairs:
        res["agreement_soft"] = sum((s >= 0.5) == (g >= 0.5) for s, _, g in pairs) / len(pairs)
        res["agreement_hard"] = sum((h >= 0.5) == (g >= 0.5) for _, h, g in pairs) / len(pairs)
    res["wall_time_s"] = time.perf_counter() - t0
    return res
