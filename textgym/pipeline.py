"""`textgym train`: start model → SFT → evaluate → GRPO → evaluate → summary, in one run directory.

    runs/<name>/config.yaml      the resolved config
    runs/<name>/model_init/      the preset model, when the run builds one
    runs/<name>/sft/, grpo/      stage directories (see textgym.trainers.common)
    runs/<name>/eval_before.json, eval_after.json
    runs/<name>/summary.json     accuracy_before, accuracy_after, n_eval, wall_time_s, ...

The evaluation brackets the last training stage: with GRPO, "before" is the model
that enters GRPO (after SFT when there is one). With `resume=True` finished stages
are skipped and an unfinished one continues from its newest checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch
import yaml

from textgym.agents.llm_agent import LLMAgent, SamplingParams
from textgym.config import ConfigError, EnvConfig, EvalConfig, RunConfig
from textgym.evaluation import EvalResult, evaluate
from textgym.models import init_model, load_model
from textgym.trainers.common import resolve_device, seed_everything


def preflight(cfg: RunConfig) -> None:
    """Check what pydantic cannot before any work: env kwargs construct, the model folder exists.

    Raises:
        ConfigError: naming the field that is wrong.
    """
    envs: list[tuple[str, EnvConfig]] = []
    if cfg.sft:
        envs.append(("sft.env", cfg.sft.env))
    if cfg.grpo:
        envs.append(("grpo.env", cfg.grpo.env))
    if cfg.eval:
        envs.append(("eval.env", cfg.eval.env))
    for field, env_cfg in envs:
        try:
            gym.make(env_cfg.id, **env_cfg.kwargs).close()
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{field}.kwargs: {env_cfg.id} rejects {env_cfg.kwargs}: {e}") from None
    if cfg.eval:
        n_tasks = len(gym.make(cfg.eval.env.id, **cfg.eval.env.kwargs).unwrapped.tasks)  # type: ignore[attr-defined]
        if cfg.eval.n > n_tasks:
            raise ConfigError(f"eval.n: {cfg.eval.env.id} has {n_tasks} tasks, got n={cfg.eval.n}")
    if cfg.model.path is not None and not (Path(cfg.model.path) / "config.json").is_file():
        raise ConfigError(
            f"model.path: {cfg.model.path!r} is not a Hugging Face model folder (no config.json); "
            "build one with `textgym model init --preset tiny --out DIR`"
        )
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {cfg.device!r} requested but CUDA is not available")


def run_eval(model_path: Path, cfg: EvalConfig, device: torch.device) -> EvalResult:
    """Evaluate the model saved at `model_path` with `cfg`."""
    model, tok = load_model(model_path, device=device)
    agent = LLMAgent(model, tok, batch_size=cfg.batch_size)
    return evaluate(
        agent,
        cfg.env.id,
        cfg.env.kwargs,
        n=cfg.n,
        samples=cfg.samples,
        params=SamplingParams(**cfg.sampling.model_dump()),
        batch_size=cfg.batch_size,
    )


def _cached_eval(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    if resume and path.is_file():
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("model") == str(model_path):
            return dict(cached)
    res = run_eval(model_path, cfg, device).summary()
    res["model"] = str(model_path)
    path.write_text(json.dumps(res, indent=2), encoding="utf-8")
    return res


def run(
    cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the configured stages and return the summary (also written to summary.json).

    Raises:
        ConfigError: on a bad config, or an existing run directory without `resume`/`overwrite`.
    """
    preflight(cfg)
    run_dir = cfg.run_dir
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        if not overwrite:
            raise ConfigError(
                f"run directory {run_dir} exists; pass --resume to continue it or --overwrite to replace it"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(
        yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8"
    )
    start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = resolve_device(cfg.device)
    seed_everything(cfg.seed)

    # 0. Start model.
    if cfg.model.path is not None:
        model_path = Path(cfg.model.path)
    else:
        assert cfg.model.init_preset is not None
        model_path = run_dir / "model_init"
        if not (model_path / "config.json").is_file():
            init_model(cfg.model.init_preset, model_path, seed=cfg.model.init_seed)
            echo(f"built {cfg.model.init_preset} model in {model_path}")
    stage_times: dict[str, float] = {}
    last_stage = "grpo" if cfg.grpo else "sft"
    before: dict[str, Any] | None = None

    # 1. SFT warm start.
    if cfg.sft is not None:
        if cfg.eval and last_stage == "sft":
            before = _cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
        sft_dir = run_dir / "sft"
        if resume and (sft_dir / "final" / "config.json").is_file():
            echo("sft: finished earlier, skipped")
        else:
            from textgym.trainers.sft import SFTTrainer

            t = time.perf_counter()
            seed_everything(cfg.seed)
            model, tok = load_model(model_path, device=device)
            (sft_dir).mkdir(parents=True, exist_ok=True)
            (sft_dir / "config.yaml").write_text(
                yaml.safe_dump(cfg.sft.model_dump(mode="json"), sort_keys=False)
            )
            SFTTrainer(cfg.sft, model, tok, sft_dir, seed=cfg.seed, resume=resume).train(echo)
            stage_times["sft"] = time.perf_counter() - t
        model_path = sft_dir / "final"

    # 2-3. GRPO, evaluated before and after.
    if cfg.grpo is not None:
        if cfg.eval:
            before = _cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
            echo(f"eval before grpo: accuracy {before['accuracy']:.3f} on {before['n']} tasks")
        grpo_dir = run_dir / "grpo"
        if resume and (grpo_dir / "final" / "config.json").is_file():
            echo("grpo: finished earlier, skipped")
        else:
            from textgym.trainers.grpo import GRPOTrainer

            t = time.perf_counter()
            seed_everything(cfg.seed + 1)
            model, tok = load_model(model_path, device=device)
            grpo_dir.mkdir(parents=True, exist_ok=True)
            (grpo_dir / "config.yaml").write_text(
                yaml.safe_dump(cfg.grpo.model_dump(mode="json"), sort_keys=False)
            )
            eval_fn = None
            if cfg.eval is not None and cfg.grpo.eval_every:
                eval_cfg = cfg.eval

                def eval_fn(m: Any) -> dict[str, float]:
                    agent = LLMAgent(m, tok, batch_size=eval_cfg.batch_size)
                    r = evaluate(
                        agent,
                        eval_cfg.env.id,
                        eval_cfg.env.kwargs,
                        n=eval_cfg.n,
                        samples=eval_cfg.samples,
                        params=SamplingParams(**eval_cfg.sampling.model_dump()),
                        batch_size=eval_cfg.batch_size,
                    )
                    return {"eval/accuracy": r.accuracy, "eval/mean_reward": r.mean_reward}

            GRPOTrainer(cfg.grpo, model, tok, grpo_dir, seed=cfg.seed, resume=resume, eval_fn=eval_fn).train(
                echo
            )
            stage_times["grpo"] = time.perf_counter() - t
        model_path = grpo_dir / "final"

    # 4. Evaluate the result and summarise.
    summary: dict[str, Any] = {"name": cfg.name, "final_model": str(model_path), "stage_times_s": stage_times}
    if cfg.eval is not None:
        after = _cached_eval(run_dir / "eval_after.json", model_path, cfg.eval, device, resume)
        assert before is not None
        summary.update(
            {
                "eval_env": cfg.eval.env.id,
                "eval_env_kwargs": cfg.eval.env.kwargs,
                "n_eval": cfg.eval.n,
                "samples": cfg.eval.samples,
                "decoding": cfg.eval.sampling.model_dump(),
                "accuracy_before": before["accuracy"],
                "accuracy_after": after["accuracy"],
                "mean_reward_before": before["mean_reward"],
                "mean_reward_after": after["mean_reward"],
                "pass_at_before": before["pass_at"],
                "pass_at_after": after["pass_at"],
            }
        )
    summary["wall_time_s"] = time.perf_counter() - start
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return summary
