"""The run's evaluations: the model entering a stage, the model leaving the last, and periodic ones."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.config import EvalConfig
from textgym.evaluation.core import EvalResult, evaluate
from textgym.models import load_model


def evaluate_model(model: Any, tokenizer: Any, cfg: EvalConfig) -> EvalResult:
    """Evaluate an in-memory model with `cfg` (the first `cfg.n` tasks, `cfg.samples` each)."""
    agent = LLMAgent(model, tokenizer, batch_size=cfg.batch_size)
    params = SamplingParams(**cfg.sampling.model_dump())
    return evaluate(
        agent,
        cfg.env.id,
        cfg.env.kwargs,
        n=cfg.n,
        samples=cfg.samples,
        params=params,
        batch_size=cfg.batch_size,
    )


def periodic_eval(cfg: EvalConfig | None) -> Callable[[Any, Any], dict[str, float]] | None:
    """The `eval_fn` a trainer calls every `eval_every` steps: `eval/accuracy`, `eval/mean_reward`.

    None without an `eval:` section.
    """
    if cfg is None:
        return None

    def eval_fn(model: Any, tokenizer: Any) -> dict[str, float]:
        r = evaluate_model(model, tokenizer, cfg)
        return {"eval/accuracy": r.accuracy, "eval/mean_reward": r.mean_reward}

    return eval_fn


def cached_eval(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    """Evaluate the model saved at `model_path` and write the summary to `path`.

    When resuming, a summary already at `path` for the same `model_path` is reused. Distributed,
    rank 0 evaluates and every rank gets the result.
    """
    return distributed.on_main(lambda: _eval_saved(path, model_path, cfg, device, resume))


def _eval_saved(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    if resume and path.is_file():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("model") == str(model_path):
            return dict(cached)
    model, tok = load_model(model_path, device=device)
    res = evaluate_model(model, tok, cfg).summary()
    res["model"] = str(model_path)
    path.write_text(json.dumps(res, indent=2), encoding="utf-8")
    return res


def comparison(cfg: EvalConfig, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The summary's before/after entries: accuracy, mean reward and pass@k, with the eval settings."""
    return {
        "eval_env": cfg.env.id,
        "eval_env_kwargs": cfg.env.kwargs,
        "n_eval": cfg.n,
        "samples": cfg.samples,
        "decoding": cfg.sampling.model_dump(),
        "accuracy_before": before["accuracy"],
        "accuracy_after": after["accuracy"],
        "mean_reward_before": before["mean_reward"],
        "mean_reward_after": after["mean_reward"],
        "pass_at_before": before["pass_at"],
        "pass_at_after": after["pass_at"],
    }
