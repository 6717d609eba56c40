"""What `textgym eval` runs, as a library call: `run_eval(EvalJobConfig(...))`.

One env (its first `n` tasks, `samples` each) or a suite of envs, evaluated with a model (local,
or behind an OpenAI-compatible endpoint) or a scripted agent (oracle, random). Every problem
that stops the evaluation before it starts is a `ConfigError` whose message names what to fix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym

from textgym.agents import LLMAgent, SamplingParams
from textgym.config import AgentConfig, ConfigError, EvalJobConfig
from textgym.envs.registry import UnknownEnvError, ensure_registered, task_count
from textgym.envs.registry import make as make_env
from textgym.evaluation.core import EvalResult, EvaluationInterruptedError, evaluate
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted
from textgym.evaluation.suites import load_suite, run_suite, write_report
from textgym.sandbox import SandboxUnavailableError


@dataclass
class EvalOutcome:
    """The result of `run_eval`.

    Attributes:
        result: the figures of a one-env evaluation (None for a suite).
        report: a suite's report (`suite`, `policy`, `samples`, `envs`: one row per env; None for one env).
        written: the report files written to the job's `out` folder ({kind: path}; suites only).
        best_of_n: with `prm`, one row per n: best-of-n accuracy by the PRM, majority vote,
            pass@n, mean single-sample accuracy (`textgym.evaluation.best_of_n.best_of_n`).
    """

    result: EvalResult | None = None
    report: dict[str, Any] | None = None
    written: dict[str, Path] = field(default_factory=dict)
    best_of_n: list[dict[str, Any]] | None = None


def open_env(env_id: str, kwargs: dict[str, Any]) -> gym.Env:
    """`gymnasium.make(env_id, **kwargs)` with errors that say what to fix.

    Raises:
        ConfigError: for an unregistered id, kwargs the env rejects, or a sandbox that does not run here.
    """
    try:
        ensure_registered(env_id)
    except (UnknownEnvError, ImportError) as e:
        raise ConfigError(str(e)) from None
    try:
        return make_env(env_id, **kwargs)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{env_id} rejects --env-kwargs {kwargs}: {e}") from None
    except SandboxUnavailableError as e:
        raise ConfigError(f"{env_id} needs a sandbox that does not run here: {e}") from None


def build_agent(agent: AgentConfig) -> Any:
    """The acting agent: an `LLMAgent` on the local model or the endpoint, or a scripted agent.

    Raises:
        ConfigError: a model agent without `model`, an endpoint without `served_model`, or a
            model that cannot be loaded (the loader's message).
    """
    if agent.kind == "oracle":
        return OracleAgent()
    if agent.kind == "random":
        return RandomAgent(agent.seed)
    if agent.model is None:
        raise ConfigError("--agent model needs --model DIR")
    try:
        if agent.endpoint is None:
            return LLMAgent.from_pretrained(agent.model, backend=agent.backend)
        if not agent.served_model:
            raise ConfigError("--endpoint needs --served-model NAME")
        return LLMAgent.from_endpoint(agent.endpoint, agent.served_model, agent.model)
    except (FileNotFoundError, OSError, ValueError, ImportError) as e:  # ConfigError: message kept
        raise ConfigError(str(e)) from None


def _policy_name(agent: AgentConfig) -> str:
    """What identifies the evaluated policy in saved episodes (the model folder, or the endpoint's model)."""
    assert agent.model is not None
    if agent.endpoint is None:
        return str(Path(agent.model).resolve())
    return f"{agent.endpoint} {agent.served_model}"


def _env_evaluator(job: EvalJobConfig) -> Callable[[str, dict[str, Any], int, int | None], EvalResult]:
    """`(env_id, kwargs, n, max_new_tokens) -> EvalResult` with the job's agent (built here, once).

    `max_new_tokens` None is the job's budget; a scripted agent generates nothing and ignores it.
    """
    agent = build_agent(job.agent)
    if job.agent.kind != "model":
        return lambda env_id, kwargs, n, max_new_tokens: evaluate_scripted(agent, env_id, kwargs, n=n)
    out = None if job.out is None else Path(job.out)

    def evaluate_env(env_id: str, kwargs: dict[str, Any], n: int, max_new_tokens: int | None) -> EvalResult:
        budget = max_new_tokens or job.sampling.max_new_tokens
        params = SamplingParams(temperature=job.sampling.temperature, max_new_tokens=budget)
        return evaluate(
            agent,
            env_id,
            kwargs,
            n=n,
            samples=job.samples,
            params=params,
            episodes_path=None if out is None else out / "episodes.jsonl",
            policy=_policy_name(job.agent),
            trajectory_store=out / "trajectories" if out is not None and job.log_trajectories else None,
        )

    return evaluate_env


def run_eval(job: EvalJobConfig) -> EvalOutcome:
    """Run `textgym eval`: one env or a suite, with the job's agent; a suite's report goes to `out`.

    Returns:
        `EvalOutcome`: the env's `EvalResult`, or the suite's report and the files written.

    Raises:
        ConfigError: without exactly one of `env` and `suite`, an unknown env or suite, kwargs
            the env rejects, `n` above the env's task count, a sandbox that does not run here,
            or an agent that cannot be built (see `build_agent`); also when an interrupted
            evaluation's saved episodes do not match (`EvaluationInterruptedError`'s message).
    """
    if (job.env is None) == (job.suite is None):
        raise ConfigError("give exactly one of --env or --suite")
    try:
        if job.env is not None:
            probe = open_env(job.env, job.env_kwargs)
            n_tasks = task_count(probe)
            probe.close()
            if job.n > n_tasks:
                raise ConfigError(f"--n {job.n} exceeds the {n_tasks} tasks of {job.env} {job.env_kwargs}")
            prm = _prm(job)
            result = _env_evaluator(job)(job.env, job.env_kwargs, job.n, None)
            if prm is None:
                return EvalOutcome(result=result)
            from textgym.evaluation.best_of_n import best_of_n, prm_scores

            return EvalOutcome(result=result, best_of_n=best_of_n(result, prm_scores(result, prm)))
        if job.prm is not None:
            raise ConfigError("--prm (best-of-N) needs --env, not --suite")
        try:
            suite = load_suite(job.suite)  # type: ignore[arg-type]
        except ValueError as e:
            raise ConfigError(str(e)) from None
        evaluate_env = _env_evaluator(job)
        try:
            rows = run_suite(suite, evaluate_env)
        except SandboxUnavailableError as e:
            raise ConfigError(f"suite {suite.name} needs a sandbox that does not run here: {e}") from None
    except EvaluationInterruptedError as e:
        raise ConfigError(str(e)) from None
    policy = str(Path(job.agent.model or "")) if job.agent.kind == "model" else f"{job.agent.kind} agent"
    report = {"suite": suite.name, "policy": policy, "samples": job.samples, "envs": rows}
    written = write_report(report, Path(job.out)) if job.out is not None else {}
    return EvalOutcome(report=report, written=written)


def _prm(job: EvalJobConfig) -> Any:
    """The job's `PRMVerifier` (None without `prm`).

    Raises:
        ConfigError: for a model agent with fewer than 2 samples, or a folder that is not a PRM.
    """
    if job.prm is None:
        return None
    if job.samples < 2:
        raise ConfigError("--prm ranks several samples: set --samples N (N >= 2) and a --temperature")
    if not (Path(job.prm) / "config.json").is_file():
        raise ConfigError(f"--prm {job.prm!r} has no config.json (train one with `textgym prm train`)")
    from textgym.verifiers.prm import PRMVerifier

    try:
        return PRMVerifier(job.prm, aggregate=job.prm_aggregate)
    except (OSError, ValueError) as e:
        raise ConfigError(f"--prm {job.prm!r}: {e}") from None
