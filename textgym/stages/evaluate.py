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
from textgym.evaluation.figures import baseline_applies, format_baseline
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
    """The `eval_fn` a trainer calls every `eval_every` steps, or None without an `eval:` section.

    Its metrics: `eval/accuracy`, `eval/mean_reward`, and `eval/tool_calls_mean` (tool results per
    held-out episode: one per call, errors included).
    """
    if cfg is None:
        return None

    def eval_fn(model: Any, tokenizer: Any) -> dict[str, float]:
        r = evaluate_model(model, tokenizer, cfg)
        tools = [sum(m.get("role") == "tool" for m in e.get("messages", [])) for e in r.episodes]
        return {
            "eval/accuracy": r.accuracy,
            "eval/mean_reward": r.mean_reward,
            "eval/tool_calls_mean": sum(tools) / max(len(tools), 1),
        }

    return eval_fn


def cached_eval(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    """Evaluate the model saved at `model_path` and write the summary to `path`.

    The episodes, the transcripts a user reads, go beside it (`path` with `.jsonl`:
    `eval_before.jsonl`, `eval_after.jsonl`). When resuming, a summary already at `path` for
    the same `model_path` is reused. Distributed, rank 0 evaluates and every rank gets the result.
    """
    return distributed.on_main(lambda: _eval_saved(path, model_path, cfg, device, resume))


def _resumed(path: Path, model_path: Path, resume: bool) -> dict[str, Any] | None:
    """The figures saved at `path` for the same `model_path`, when resuming; else None."""
    if resume and path.is_file():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("model") == str(model_path):
            return dict(cached)
    return None


def _eval_saved(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    cached = _resumed(path, model_path, resume)
    if cached is not None:
        return cached
    model, tok = load_model(model_path, device=device)
    episodes = path.with_suffix(".jsonl")
    episodes.unlink(missing_ok=True)  # the transcripts of this model only
    agent = LLMAgent(model, tok, batch_size=cfg.batch_size)
    params = SamplingParams(**cfg.sampling.model_dump())
    res = evaluate(
        agent,
        cfg.env.id,
        cfg.env.kwargs,
        n=cfg.n,
        samples=cfg.samples,
        params=params,
        batch_size=cfg.batch_size,
        episodes_path=episodes,
        policy=str(model_path),
    ).summary()
    res["model"] = str(model_path)
    path.write_text(json.dumps(res, indent=2), encoding="utf-8")
    return res


def cached_baseline(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any] | None:
    """The format-controlled baseline of the model at `model_path` (`figures.format_baseline`).

    Written to `path` (`eval_baseline.json`), the chosen variant's episodes beside it
    (`eval_baseline.jsonl`); reused when resuming for the same model. None when `cfg` turns it off
    or the eval env is multi-turn or has no textgym task list (`baseline_applies`). Distributed,
    rank 0 evaluates and every rank gets the result.
    """
    if not cfg.format_baseline or not baseline_applies(cfg.env.id, cfg.env.kwargs, cfg.n):
        return None
    return distributed.on_main(lambda: _baseline_saved(path, model_path, cfg, device, resume))


def _baseline_saved(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    cached = _resumed(path, model_path, resume)
    if cached is not None:
        return cached
    model, tok = load_model(model_path, device=device)
    agent = LLMAgent(model, tok, batch_size=cfg.batch_size)
    params = SamplingParams(**cfg.sampling.model_dump())
    res = format_baseline(
        agent,
        cfg.env.id,
        cfg.env.kwargs,
        cfg.n,
        params,
        batch_size=cfg.batch_size,  # all tasks in one batch: finished rows leave it
        episodes_path=path.with_suffix(".jsonl"),
    )
    res["model"] = str(model_path)
    path.write_text(json.dumps(res, indent=2), encoding="utf-8")
    return res


def comparison(
    cfg: EvalConfig, before: dict[str, Any], after: dict[str, Any], baseline: dict[str, Any] | None = None
) -> dict[str, Any]:
    """The summary's before/after entries, with the eval settings and what tells skill from format.

    Accuracy, mean reward and pass@k before and after; the cut share and the stated-answer
    accuracy of each (`textgym.evaluation.figures`); the error split by the env's task category;
    and, with `baseline`, `accuracy_baseline` (the format-controlled baseline), the variant and
    budget it was measured with, and `gain_above_baseline` (after − baseline).
    """
    out = {
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
    for key in ("cut_share", "stated_accuracy", "error_split"):
        if key in before and key in after:
            out[f"{key}_before"], out[f"{key}_after"] = before[key], after[key]
    if baseline is not None:
        out["accuracy_baseline"] = baseline["accuracy"]
        out["baseline"] = {k: v for k, v in baseline.items() if k not in ("accuracy", "model")}
        out["gain_above_baseline"] = after["accuracy"] - baseline["accuracy"]
    return out
