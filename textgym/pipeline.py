"""`textgym train`: start model → SFT → evaluate → RL (GRPO family, PPO, DPO family) → evaluate → summary.

    runs/<name>/config.yaml      the resolved config
    runs/<name>/model_init/      the preset model, when the run builds one
    runs/<name>/sft/, grpo/, ppo/, dpo/, online_dpo/  stage directories (see textgym.training.checkpoint)
    runs/<name>/eval_before.json, eval_after.json
    runs/<name>/summary.json     accuracy_before, accuracy_after, n_eval, wall_time_s, peak_rss_mb,
                                 sft_target (steps, probe accuracy, reached) when SFT has a target, ...

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
import yaml

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.config import ConfigError, EnvConfig, EvalConfig, RunConfig, validate_runtime
from textgym.envs.registry import make as make_env
from textgym.envs.registry import task_count
from textgym.evaluation.core import EvalResult, evaluate
from textgym.evaluation.envcheck import preflight_envs
from textgym.model_init import init_model
from textgym.models import load_model
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
    if cfg.grpo is not None:
        from textgym.algorithms.advantages import available_advantages

        names = available_advantages()
        if cfg.grpo.advantage_estimator not in names:
            raise ConfigError(
                f"grpo.advantage_estimator: unknown estimator {cfg.grpo.advantage_estimator!r}; registered: "
                f"{', '.join(names)} (add one with @textgym.algorithms.registry.register_advantage)"
            )
    for stage_name, stage in (("grpo", cfg.grpo), ("ppo", cfg.ppo)):
        if stage is not None:
            from textgym.algorithms.policy_losses import available_policy_losses

            losses = available_policy_losses()
            if stage.policy_loss not in losses:
                raise ConfigError(
                    f"{stage_name}.policy_loss: unknown policy loss {stage.policy_loss!r}; registered: "
                    f"{', '.join(losses)} (add one with @textgym.algorithms.registry.register_policy_loss)"
                )
            if stage.rollout.servers:  # reachable, with --weight-sync, one model (vocab: at the stage)
                from textgym.training.sources.remote import check_servers

                r = stage.rollout
                try:
                    check_servers(r.servers, model=r.server_model, timeout_s=r.sync_http_timeout_s)
                except ConfigError as e:
                    raise ConfigError(f"{stage_name}.{e}") from None
    envs: list[tuple[str, EnvConfig]] = []
    if cfg.sft:
        envs.append(("sft.env", cfg.sft.env))
    if cfg.grpo:
        envs.append(("grpo.env", cfg.grpo.env))
    if cfg.ppo:
        envs.append(("ppo.env", cfg.ppo.env))
    if cfg.dpo:
        envs.append(("dpo.env", cfg.dpo.env))
    if cfg.rft:
        envs.append(("rft.env", cfg.rft.env))
    if cfg.online_dpo:
        envs.append(("online_dpo.env", cfg.online_dpo.env))
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
    if cfg.rft:
        from textgym.stages.rft import preflight_rft

        preflight_rft(cfg.rft)
    if cfg.eval:
        n_tasks = task_count(make_env(cfg.eval.env.id, **cfg.eval.env.kwargs))
        if cfg.eval.n > n_tasks:
            raise ConfigError(f"eval.n: {cfg.eval.env.id} has {n_tasks} tasks, got n={cfg.eval.n}")
    if cfg.model.path is not None and not (Path(cfg.model.path) / "config.json").is_file():
        raise ConfigError(
            f"model.path: {cfg.model.path!r} is not a Hugging Face model folder (no config.json); "
            "build one with `textgym model init --preset tiny --out DIR`"
        )
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device: {cfg.device!r} requested but CUDA is not available")


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


def _cached_eval(
    path: Path, model_path: Path, cfg: EvalConfig, device: torch.device, resume: bool
) -> dict[str, Any]:
    """Evaluate the model saved at `model_path`, reusing `path` when resuming the same model.

    Distributed, rank 0 evaluates and every rank gets the result.
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


def _prepare_run_dir(cfg: RunConfig, resume: bool, overwrite: bool) -> Path:
    run_dir = cfg.run_dir
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        if not overwrite:
            raise ConfigError(
                f"run directory {run_dir} exists; pass --resume to continue it or --overwrite to replace it"
            )
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_yaml(run_dir / "config.yaml", cfg)
    return run_dir


def _write_yaml(path: Path, cfg: Any) -> None:
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False), encoding="utf-8")


def _start_model(cfg: RunConfig, run_dir: Path, echo: Callable[[str], None]) -> Path:
    if cfg.model.path is not None:
        return Path(cfg.model.path)
    assert cfg.model.init_preset is not None
    model_path = run_dir / "model_init"
    if not (model_path / "config.json").is_file():
        init_model(cfg.model.init_preset, model_path, seed=cfg.model.init_seed)
        echo(f"built {cfg.model.init_preset} model in {model_path}")
    return model_path


def _run_stage(
    name: str,
    stage_cfg: Any,
    run_dir: Path,
    model_path: Path,
    device: torch.device,
    resume: bool,
    echo: Callable[[str], None],
    build: Callable[[Any, Any, Path], Any],
    dtype: str = "float32",
) -> tuple[Path, float | None]:
    """Train one stage from `model_path` in `dtype`; return its final folder and seconds (None if skipped)."""
    stage_dir = run_dir / name
    if resume and (stage_dir / "final" / "config.json").is_file():
        echo(f"{name}: finished earlier, skipped")
        return stage_dir / "final", None
    t = time.perf_counter()
    model, tok = load_model(model_path, getattr(torch, dtype), device)
    if distributed.is_main():
        stage_dir.mkdir(parents=True, exist_ok=True)
        _write_yaml(stage_dir / "config.yaml", stage_cfg)
    distributed.barrier()
    final: Path = build(model, tok, stage_dir).train(echo)
    return final, time.perf_counter() - t


def run(
    cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, echo: Callable[[str], None] = print
) -> dict[str, Any]:
    """Run the configured stages and return the summary (also written to summary.json).

    Under torchrun, every rank calls this and gets the summary; only rank 0 echoes.

    Raises:
        ConfigError: on a bad config, or an existing run directory without `resume`/`overwrite`.
    """
    from textgym.stages.preference import preference_rounds
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.trainers.rl.ppo import PPOTrainer
    from textgym.trainers.sft import SFTTrainer

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
    # 0. Start model.
    model_path = distributed.on_main(lambda: _start_model(cfg, run_dir, echo))
    stage_times: dict[str, float] = {}
    summary_extra: dict[str, Any] = {}
    before: dict[str, Any] | None = None

    # 1. SFT warm start (evaluated before it when it is the only stage).
    if cfg.sft is not None:
        sft_cfg = cfg.sft
        only_stage = cfg.rl is None and cfg.dpo is None and cfg.rft is None and cfg.online_dpo is None
        if cfg.eval is not None and only_stage:
            before = _cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
        seed_everything(distributed.rank_seed(cfg.seed))
        model_path, secs = _run_stage(
            "sft", sft_cfg, run_dir, model_path, device, resume, echo,
            lambda m, t, d: SFTTrainer(
                sft_cfg, m, t, d, seed=cfg.seed, resume=resume, parallel=cfg.parallel, log_with=cfg.log_with
            ), cfg.model.dtype,
        )  # fmt: skip
        if secs is not None:
            stage_times["sft"] = secs
        target = run_dir / "sft" / "target.json"
        if sft_cfg.target is not None and target.is_file():
            summary_extra["sft_target"] = json.loads(target.read_text(encoding="utf-8"))

    # 2. The RL stage (GRPO family or PPO), evaluated before and after.
    rl_cfg = cfg.rl
    if rl_cfg is not None:
        stage = "grpo" if cfg.grpo is not None else "ppo"
        eval_cfg = cfg.eval
        periodic: Callable[[Any, Any], dict[str, float]] | None = None
        if eval_cfg is not None:
            before = _cached_eval(run_dir / "eval_before.json", model_path, eval_cfg, device, resume)
            echo(f"eval before {stage}: accuracy {before['accuracy']:.3f} on {before['n']} tasks")
            if rl_cfg.eval_every:

                def periodic(m: Any, t: Any) -> dict[str, float]:
                    r = evaluate_model(m, t, eval_cfg)
                    return {"eval/accuracy": r.accuracy, "eval/mean_reward": r.mean_reward}

        trainer_cls = GRPOTrainer if stage == "grpo" else PPOTrainer

        def build(m: Any, t: Any, d: Path) -> Any:
            return trainer_cls(
                rl_cfg,
                m,
                t,
                d,
                seed=cfg.seed,
                resume=resume,
                eval_fn=periodic,
                parallel=cfg.parallel,
                log_with=cfg.log_with,
            )

        seed_everything(distributed.rank_seed(cfg.seed + 1))
        dtype = cfg.model.dtype
        model_path, secs = _run_stage(stage, rl_cfg, run_dir, model_path, device, resume, echo, build, dtype)
        if secs is not None:
            stage_times[stage] = secs
        summary_extra["models_in_memory"] = _models_in_memory(cfg)

    # 2b. The offline preference stage (DPO family): rounds of collect → pair → train.
    if cfg.dpo is not None:
        if cfg.eval is not None:
            before = _cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
            echo(f"eval before dpo: accuracy {before['accuracy']:.3f} on {before['n']} tasks")
        t = time.perf_counter()
        model_path, rounds = preference_rounds(cfg, run_dir, model_path, device, resume, echo)
        stage_times["dpo"] = time.perf_counter() - t
        summary_extra["dpo_rounds"] = rounds
        summary_extra["models_in_memory"] = ["policy"]

    # 2c. Rejection-sampling fine-tuning: rounds of sample → keep the verified → SFT.
    if cfg.rft is not None:
        from textgym.stages.rft import rft_rounds

        if cfg.eval is not None:
            before = _cached_eval(run_dir / "eval_before.json", model_path, cfg.eval, device, resume)
            echo(f"eval before rft: accuracy {before['accuracy']:.3f} on {before['n']} tasks")
        t = time.perf_counter()
        model_path, rounds = rft_rounds(cfg, run_dir, model_path, device, resume, echo)
        stage_times["rft"] = time.perf_counter() - t
        summary_extra["rft_rounds"] = rounds
        summary_extra["models_in_memory"] = ["policy"]

    # 2d. Online DPO: each step samples pairs from the current policy; evaluated before and after.
    odpo = cfg.online_dpo
    if odpo is not None:
        from textgym.trainers.preference.online import OnlineDPOTrainer, models_in_memory

        ecfg, eval_fn = cfg.eval, None
        if ecfg is not None:
            before = _cached_eval(run_dir / "eval_before.json", model_path, ecfg, device, resume)
            echo(f"eval before online_dpo: accuracy {before['accuracy']:.3f} on {before['n']} tasks")

            def eval_fn(m: Any, t: Any) -> dict[str, float]:
                r = evaluate_model(m, t, ecfg)
                return {"eval/accuracy": r.accuracy, "eval/mean_reward": r.mean_reward}

        seed_everything(distributed.rank_seed(cfg.seed + 1))
        model_path, secs = _run_stage(
            "online_dpo", odpo, run_dir, model_path, device, resume, echo,
            lambda m, t, d: OnlineDPOTrainer(
                odpo, m, t, d, seed=cfg.seed, resume=resume, eval_fn=eval_fn, parallel=cfg.parallel,
                log_with=cfg.log_with,
            ), cfg.model.dtype,
        )  # fmt: skip
        stage_times.update({} if secs is None else {"online_dpo": secs})
        summary_extra["models_in_memory"] = models_in_memory(odpo)

    # 3. Evaluate the result and summarise.
    summary: dict[str, Any] = {"name": cfg.name, "final_model": str(model_path), "stage_times_s": stage_times}
    if cfg.eval is not None:
        assert before is not None
        after = _cached_eval(run_dir / "eval_after.json", model_path, cfg.eval, device, resume)
        summary.update(_comparison(cfg.eval, before, after))
    summary["wall_time_s"] = time.perf_counter() - start
    summary.update(summary_extra)
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

    The reward model starts from `reward_model.model` (default `model.path`) and is saved to
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
    model_dir = rm.model or cfg.model.path
    if model_dir is None:
        raise ConfigError("reward_model.model: set it, or model.path, to the causal LM to start from")
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


def _silent(line: str) -> None:
    """The echo of ranks other than 0."""


def _models_in_memory(cfg: RunConfig) -> list[str]:
    """Which models the RL stage holds: policy, reference (β > 0), critic (PPO)."""
    rl = cfg.rl
    models = ["policy"]
    if rl is not None and rl.kl_coef > 0:
        # With LoRA the reference is the policy with its adapters disabled: no second model.
        models.append("reference" if rl.lora is None else "reference (policy, adapters off)")
    if cfg.ppo is not None:
        models.append("critic")
    return models


def _comparison(cfg: EvalConfig, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
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
