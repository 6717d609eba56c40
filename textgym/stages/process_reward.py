"""The process reward model stage of a run config: `textgym prm label CONFIG`, `textgym prm train CONFIG`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from textgym.config import ConfigError, PRMConfig, RunConfig, validate_runtime
from textgym.training.seeding import seed_everything


def _stage(cfg: RunConfig) -> PRMConfig:
    if cfg.prm is None:
        raise ConfigError("prm: this config has no prm stage")
    return cfg.prm


def labels_path(cfg: RunConfig) -> Path:
    """Where the labels are: `prm.labels`, else `prm.label.out`, else `<run_dir>/prm/labels.jsonl`."""
    prm = _stage(cfg)
    if prm.labels is not None:
        return Path(prm.labels)
    if prm.label is not None and prm.label.out is not None:
        return Path(prm.label.out)
    return cfg.run_dir / "prm" / "labels.jsonl"


def run_prm_label(cfg: RunConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Label steps by Monte-Carlo continuations (`prm.label`) and write the labels file.

    The policy (`prm.label.policy`, else `model.path` or `model.name`) answers tasks
    `start … start + tasks − 1` of `prm.label.env` `samples` times each; every step gets
    K = `continuations` continuations (`textgym.offline.prm_labels.label_policy`). Seeded by
    `prm.label.seed`; `cfg.threads` applies.

    Returns:
        `label_policy`'s figures (answers, steps, label means, agreement with the env's checker).

    Raises:
        ConfigError: without a `prm.label` section, a policy folder, or an env with that many tasks.
    """
    from textgym.agents import LLMAgent, SamplingParams
    from textgym.envs.registry import make as make_env
    from textgym.envs.registry import task_count
    from textgym.models import load_model
    from textgym.offline.prm_labels import label_policy

    prm = _stage(cfg)
    if prm.label is None:
        raise ConfigError("prm.label: set how to label (env, tasks, continuations, ...)")
    lc = prm.label
    policy = lc.policy or cfg.model.source
    if policy is None:
        raise ConfigError(
            "prm.label.policy: set it, model.path or model.name, to the policy that answers and continues"
        )
    validate_runtime(lc)
    probe = make_env(lc.env.id, **lc.env.kwargs)
    n = task_count(probe)
    probe.close()
    if lc.start + lc.tasks > n:
        raise ConfigError(
            f"prm.label: tasks {lc.start}..{lc.start + lc.tasks - 1} exceed the {n} tasks of {lc.env.id}"
        )
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    seed_everything(lc.seed)
    model, tok = load_model(policy)
    agent = LLMAgent(model, tok, batch_size=lc.batch_size)
    params = SamplingParams(**lc.sampling.model_dump())
    with torch.no_grad():
        return label_policy(
            agent,
            lc.env,
            list(range(lc.start, lc.start + lc.tasks)),
            params,
            labels_path(cfg),
            samples=lc.samples,
            k=lc.continuations,
            batch_size=lc.batch_size,
            echo=echo,
        )


def run_prm_train(cfg: RunConfig, echo: Callable[[str], None] = print) -> dict[str, Any]:
    """Train the PRM on the labels file; save it to `prm.out` (default `<run_dir>/prm/model`).

    Returns:
        `train_prm`'s figures, plus `out`, the PRM's folder.

    Raises:
        ConfigError: without a model to start from.
        FileNotFoundError: when the labels file does not exist.
        ValueError: if no training answer has a step.
    """
    from textgym.models import resolve_model
    from textgym.trainers.reward.prm import read_labels, train_prm

    prm = _stage(cfg)
    model_dir = prm.model or (prm.label.policy if prm.label is not None else None) or cfg.model.source
    if model_dir is None:
        raise ConfigError(
            "prm.model: set it, prm.label.policy, model.path or model.name, to the causal LM to start from"
        )
    try:
        model_dir = resolve_model(model_dir, progress=True)
    except (OSError, ValueError) as e:
        raise ConfigError(f"prm.model: {e}") from None
    out = Path(prm.out) if prm.out is not None else cfg.run_dir / "prm" / "model"
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = "cuda" if cfg.device == "auto" and torch.cuda.is_available() else cfg.device
    device = "cpu" if device == "auto" else device
    res = train_prm(
        read_labels(labels_path(cfg)), model_dir, out, prm, echo, device=device, log_with=cfg.log_with
    )
    return {**res, "out": str(out)}
