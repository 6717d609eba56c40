"""The `textgym` command line (typer). Every command has `--help`.

Exit codes: 0 success; 1 some input lines failed (score/verify) or a run failed;
2 bad usage or configuration (nothing was written).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich.console import Console
from rich.table import Table

app = typer.Typer(
    help="textgym: text environments, verifiers and RL trainers for LLM agents.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
model_app = typer.Typer(help="Build models locally.", no_args_is_help=True)
verify_app = typer.Typer(help="Run a verifier on completions from a file.", no_args_is_help=True)
sandbox_app = typer.Typer(
    help="Isolated code execution: check backends, build the docker image.", no_args_is_help=True
)
app.add_typer(model_app, name="model")
app.add_typer(verify_app, name="verify")
report_app = typer.Typer(help="Compare evaluation reports.", no_args_is_help=True)
app.add_typer(sandbox_app, name="sandbox")
app.add_typer(report_app, name="report")
rollouts_app = typer.Typer(help="Fill a trajectory store with rollouts.", no_args_is_help=True)
pairs_app = typer.Typer(help="Build preference pairs from a trajectory store.", no_args_is_help=True)
app.add_typer(rollouts_app, name="rollouts")
app.add_typer(pairs_app, name="pairs")
rm_app = typer.Typer(help="Reward models (Bradley-Terry) trained on preference pairs.", no_args_is_help=True)
app.add_typer(rm_app, name="rm")
console = Console()


def _fail(message: str, code: int = 2) -> None:
    typer.echo(f"error: {message}", err=True)  # plain text: no wrapping inside paths or field names
    raise typer.Exit(code)


def _leave_world(error: BaseException | None = None) -> bool:
    """Leave the torchrun process group (a no-op outside torchrun); return whether this is rank 0.

    With `error`, the group is left without the final barrier (the other ranks may be failing
    too), rank 0 prints the error, and every rank exits with status 2 (`typer.Exit`).
    """
    from textgym import distributed

    main = distributed.is_main()
    distributed.shutdown(wait=error is None)
    if error is not None:
        if main:
            _fail(str(error))
        raise typer.Exit(2)
    return main


def _parse_kwargs(items: list[str] | None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            _fail(f"--env-kwargs expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
    return out


def _make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    import gymnasium as gym

    import textgym  # noqa: F401

    if env_id not in gym.registry:
        known = sorted(k for k in gym.registry if k.startswith("textgym/"))
        _fail(f"unknown environment {env_id!r}; registered: {', '.join(known)}")
    from textgym.sandbox import SandboxUnavailableError

    try:
        return gym.make(env_id, **kwargs)
    except (TypeError, ValueError) as e:
        _fail(f"{env_id} rejects --env-kwargs {kwargs}: {e}")
    except SandboxUnavailableError as e:
        _fail(f"{env_id} needs a sandbox that does not run here: {e}")


class _BadLineError(ValueError):
    """An input line that cannot be processed (reported on its own output line)."""


def _map_jsonl(path: Path, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Print `{"line": n, **handle(row)}` for each JSONL line, in order; bad lines get `"error"`.

    Exits with code 1 after the last line when any line was unusable.
    """
    if not path.is_file():
        _fail(f"input file {str(path)!r} not found")
    failed = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            out: dict[str, Any] = {"line": n}
            try:
                try:
                    row = json.loads(line)
                except json.JSONDecodeError as e:
                    raise _BadLineError(f"invalid JSON ({e.msg})") from None
                if not isinstance(row, dict):
                    raise _BadLineError("expected a JSON object")
                out.update(handle(row))
            except _BadLineError as e:
                out["error"] = f"line {n}: {e}"
                failed += 1
            print(json.dumps(out, ensure_ascii=False), flush=True)
    if failed:
        raise typer.Exit(1)


@app.command("envs")
def envs_cmd() -> None:
    """List the registered textgym environment ids with a one-line description."""
    import importlib

    import gymnasium as gym

    import textgym  # noqa: F401

    table = Table("id", "description")
    for env_id, spec in sorted(gym.registry.items()):
        if not env_id.startswith("textgym/"):
            continue
        mod, _, cls = str(spec.entry_point).partition(":")
        doc = (getattr(importlib.import_module(mod), cls).__doc__ or "").strip().splitlines()
        table.add_row(env_id, doc[0] if doc else "")
    console.print(table)


@model_app.command("init")
def model_init(
    preset: Annotated[str, typer.Option(help="Model size: tiny (~1.6M), small (~20M) or 0.5b.")] = "tiny",
    out: Annotated[Path, typer.Option(help="Output folder (a Hugging Face model folder).")] = Path(
        "models/tiny"
    ),
    seed: Annotated[int, typer.Option(help="Seed of the random initialisation.")] = 0,
    tokenizer: Annotated[
        str, typer.Option(help="bpe (trained byte-level BPE) or byte (one token per byte).")
    ] = "bpe",
) -> None:
    """Build a Qwen2-style causal LM with a locally built tokenizer and chat template, and save it."""
    from textgym.model_init import init_model
    from textgym.models import PRESETS, count_parameters, load_model

    if preset not in PRESETS:
        _fail(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if tokenizer not in ("bpe", "byte"):
        _fail(f"unknown tokenizer {tokenizer!r}; choose bpe or byte")
    path = init_model(preset, out, seed=seed, tokenizer=tokenizer)
    model, _ = load_model(path)
    console.print(f"saved {preset} model ({count_parameters(model):,} parameters) to {path}")


@app.command("train")
def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML run config (see configs/).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Overrides such as grpo.steps=10.")] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the run directory from its newest checkpoint.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Delete an existing run directory first.")] = False,
) -> None:
    """Train per the config: optional SFT, then GRPO-family or PPO, with a before/after evaluation.

    Under `torchrun --nproc-per-node N -m textgym train CONFIG` the stages train on N ranks.
    """
    from textgym.config import ConfigError, load_config
    from textgym.pipeline import run

    try:
        cfg = load_config(config, overrides or [])
        summary = run(cfg, resume=resume, overwrite=overwrite, echo=console.print)
    except ConfigError as e:
        _leave_world(error=e)
    if not _leave_world():
        return
    if "accuracy_before" in summary:
        kwargs = " ".join(f"{k}={v!r}" for k, v in summary["eval_env_kwargs"].items())
        table = Table(title=f"{cfg.name} · {summary['eval_env']} · n={summary['n_eval']}", caption=kwargs)
        table.add_column("")
        table.add_column("before", justify="right")
        table.add_column("after", justify="right")
        table.add_row("accuracy", f"{summary['accuracy_before']:.3f}", f"{summary['accuracy_after']:.3f}")
        table.add_row(
            "mean reward", f"{summary['mean_reward_before']:.3f}", f"{summary['mean_reward_after']:.3f}"
        )
        console.print(table)
    console.print(f"wall time {summary['wall_time_s']:.0f}s · summary in {cfg.run_dir / 'summary.json'}")


@app.command("eval")
def eval_cmd(
    env: Annotated[str | None, typer.Option(help="Environment id, e.g. textgym/Arithmetic-v0.")] = None,
    suite: Annotated[
        str | None,
        typer.Option(help="A suite instead of one env: math, code, tools, core, or a suite YAML file."),
    ] = None,
    out: Annotated[
        Path | None,
        typer.Option(
            help="Keep finished episodes in OUT/episodes.jsonl (rerunning resumes an interrupted eval); "
            "with --suite also write report.json, report.md and report.png there."
        ),
    ] = None,
    model: Annotated[
        Path | None, typer.Option(help="Local Hugging Face model folder (--agent model).")
    ] = None,
    agent_kind: Annotated[
        str,
        typer.Option("--agent", help="model (needs --model), oracle (reads the hidden solution) or random."),
    ] = "model",
    seed: Annotated[int, typer.Option(help="Seed of the random agent.")] = 0,
    endpoint: Annotated[
        str | None,
        typer.Option(
            help="Generate through an OpenAI-compatible server; --model is then its tokenizer folder."
        ),
    ] = None,
    served_model: Annotated[str | None, typer.Option(help="Model name on --endpoint.")] = None,
    backend: Annotated[
        str, typer.Option(help="Local generation backend for --model: transformers or vllm.")
    ] = "transformers",
    log_trajectories: Annotated[
        bool, typer.Option(help="With --out: also write full trajectories to OUT/trajectories (Parquet).")
    ] = False,
    env_kwargs: Annotated[
        list[str] | None, typer.Option("--env-kwargs", help="key=value, repeatable.")
    ] = None,
    n: Annotated[int, typer.Option(min=1, help="Number of tasks (task_index 0..n-1).")] = 100,
    samples: Annotated[int, typer.Option(min=1, help="Samples per task (pass@k for k=1 and k=samples).")] = 1,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 0.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response budget in tokens.")] = 256,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Evaluate a model, or the scripted oracle / random agent, on an env: accuracy, reward, pass@k."""
    from textgym.agents import SamplingParams
    from textgym.agents.scripted import OracleAgent, RandomAgent, evaluate_scripted
    from textgym.evaluation import EvalResult, EvaluationInterruptedError, evaluate

    if agent_kind not in ("model", "oracle", "random"):
        _fail(f"--agent must be model, oracle or random, got {agent_kind!r}")
    if (env is None) == (suite is None):
        _fail("give exactly one of --env or --suite")
    if suite is not None:
        _eval_suite(
            suite,
            out,
            model,
            agent_kind,
            seed,
            samples,
            temperature,
            max_new_tokens,
            endpoint,
            served_model,
            backend,
            log_trajectories,
        )
        return
    assert env is not None
    kwargs = _parse_kwargs(env_kwargs)
    probe = _make_env(env, kwargs)
    n_tasks = len(probe.unwrapped.tasks)
    probe.close()
    if n > n_tasks:
        _fail(f"--n {n} exceeds the {n_tasks} tasks of {env} {kwargs}")
    res: EvalResult
    if agent_kind == "model":
        if model is None:
            _fail("--agent model needs --model DIR")
            return
        agent = _load_agent(model, endpoint, served_model, backend)
        if samples > 1 and temperature == 0.0:
            typer.echo(
                "note: --samples > 1 with greedy decoding gives identical samples; set --temperature",
                err=True,
            )
        try:
            res = evaluate(
                agent,
                env,
                kwargs,
                n=n,
                samples=samples,
                params=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
                episodes_path=None if out is None else out / "episodes.jsonl",
                policy=_policy_name(model, endpoint, served_model),
                trajectory_store=out / "trajectories" if out is not None and log_trajectories else None,
            )
        except EvaluationInterruptedError as e:
            _fail(str(e))
            return
    else:
        scripted = OracleAgent() if agent_kind == "oracle" else RandomAgent(seed)
        res = evaluate_scripted(scripted, env, kwargs, n=n)
    if as_json:
        print(json.dumps(res.summary()))
        return
    table = Table(title=f"{env} {kwargs or ''} · {model if agent_kind == 'model' else agent_kind + ' agent'}")
    for col in (
        "n",
        "samples",
        "accuracy",
        "mean reward",
        *[f"pass@{k}" for k in res.pass_at],
        "resp. tokens",
        "tokens/s",
    ):
        table.add_column(col, justify="right")
    table.add_row(
        str(res.n),
        str(res.samples),
        f"{res.accuracy:.3f}",
        f"{res.mean_reward:.3f}",
        *[f"{v:.3f}" for v in res.pass_at.values()],
        f"{res.mean_response_tokens:.1f}",
        f"{res.tokens_per_s:.0f}",
    )
    console.print(table)


def _load_agent(
    model: Path, endpoint: str | None, served_model: str | None, backend: str = "transformers"
) -> Any:
    """An LLMAgent on the local model (transformers or vLLM backend), or on `endpoint`.

    With an endpoint, `model` is the folder of the served model's tokenizer.
    """
    from textgym.agents import LLMAgent

    if backend not in ("transformers", "vllm"):
        _fail(f"--backend must be transformers or vllm, got {backend!r}")
    try:
        if endpoint is None:
            return LLMAgent.from_pretrained(model, backend=backend)  # type: ignore[arg-type]
        if not served_model:
            _fail("--endpoint needs --served-model NAME")
        return LLMAgent.from_endpoint(endpoint, str(served_model), model)
    except (FileNotFoundError, OSError, ValueError, ImportError) as e:
        _fail(str(e))


def _policy_name(model: Path, endpoint: str | None, served_model: str | None) -> str:
    """What identifies the evaluated policy in saved episodes (the model folder, or the endpoint's model)."""
    return str(model.resolve()) if endpoint is None else f"{endpoint} {served_model}"


def _eval_suite(
    suite_name: str,
    out: Path | None,
    model: Path | None,
    agent_kind: str,
    seed: int,
    samples: int,
    temperature: float,
    max_new_tokens: int,
    endpoint: str | None = None,
    served_model: str | None = None,
    backend: str = "transformers",
    log_trajectories: bool = False,
) -> None:
    from textgym.agents import SamplingParams
    from textgym.agents.scripted import OracleAgent, RandomAgent, evaluate_scripted
    from textgym.evaluation import EvalResult, EvaluationInterruptedError, evaluate
    from textgym.suites import load_suite, markdown_table, run_suite, write_report

    try:
        suite = load_suite(suite_name)
    except ValueError as e:
        _fail(str(e))
        return
    evaluate_env: Callable[[str, dict[str, Any], int], EvalResult]
    if agent_kind == "model":
        if model is None:
            _fail("--agent model needs --model DIR")
            return
        agent = _load_agent(model, endpoint, served_model, backend)
        params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens)

        def evaluate_env(env_id: str, kwargs: dict[str, Any], n: int) -> EvalResult:
            return evaluate(
                agent,
                env_id,
                kwargs,
                n=n,
                samples=samples,
                params=params,
                episodes_path=None if out is None else out / "episodes.jsonl",
                policy=_policy_name(model, endpoint, served_model),
                trajectory_store=out / "trajectories" if out is not None and log_trajectories else None,
            )

        policy = str(model)
    else:
        scripted = OracleAgent() if agent_kind == "oracle" else RandomAgent(seed)

        def evaluate_env(env_id: str, kwargs: dict[str, Any], n: int) -> EvalResult:
            return evaluate_scripted(scripted, env_id, kwargs, n=n)

        policy = f"{agent_kind} agent"
    from textgym.sandbox import SandboxUnavailableError

    try:
        rows = run_suite(suite, evaluate_env)
    except SandboxUnavailableError as e:
        _fail(f"suite {suite.name} needs a sandbox that does not run here: {e}")
        return
    except EvaluationInterruptedError as e:
        _fail(str(e))
        return
    report = {"suite": suite.name, "policy": policy, "samples": samples, "envs": rows}
    print(markdown_table(report))
    if out is not None:
        for kind, path in write_report(report, out).items():
            console.print(f"wrote {kind}: {path}")


@app.command("score")
def score_cmd(
    env: Annotated[str, typer.Option(help="Environment id.")],
    input: Annotated[
        Path, typer.Option("--input", help='JSONL: {"task_index": i, "completion": "..."} per line.')
    ],
    env_kwargs: Annotated[
        list[str] | None, typer.Option("--env-kwargs", help="key=value, repeatable.")
    ] = None,
) -> None:
    """Score completions produced elsewhere: one JSON line out per line in, in order."""
    e = _make_env(env, _parse_kwargs(env_kwargs))

    def score(row: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(row.get("task_index"), int) or "completion" not in row:
            raise _BadLineError("needs an integer 'task_index' and a 'completion'")
        try:
            e.reset(options={"task_index": row["task_index"]})
        except ValueError as exc:
            raise _BadLineError(str(exc)) from None
        _, reward, _, _, info = e.step(row["completion"])
        out = {"task_index": row["task_index"], "reward": float(reward)}
        out.update({k: v for k, v in info.items() if k.startswith("reward/")})
        if "error" in info:
            out["reason"] = info["error"]
        return out

    _map_jsonl(input, score)


@verify_app.command("math")
def verify_math_cmd(
    input: Annotated[
        Path, typer.Option("--input", help='JSONL: {"completion": "...", "answer": "..."} per line.')
    ],
    timeout_s: Annotated[float, typer.Option(min=0.5, help="Seconds allowed per comparison.")] = 10.0,
) -> None:
    """Check math answers: reward 1.0/0.0 and the extracted answer, one JSON line per input line."""
    from textgym.types import Task
    from textgym.verifiers.math import MathVerifier

    v = MathVerifier(timeout_s=timeout_s)

    def check(row: dict[str, Any]) -> dict[str, Any]:
        completion, answer = row.get("completion"), row.get("answer")
        if not isinstance(completion, str) or not isinstance(answer, str | int | float):
            raise _BadLineError("needs a string 'completion' and an 'answer'")
        if not str(answer).strip():
            raise _BadLineError("empty 'answer'")
        s = v(completion, Task(task_id="line", prompt="", answer=str(answer)))
        out = {"reward": s.reward, "extracted": s.details.get("extracted"), "parsed": s.details.get("parsed")}
        if "error" in s.details:
            out["reason"] = s.details["error"]
        return out

    _map_jsonl(input, check)


@app.command("plot")
def plot_cmd(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory (runs/NAME) or one stage of it (runs/NAME/grpo).")
    ],
) -> None:
    """Write PNG training curves (reward, accuracy, KL, response length, loss) for each stage."""
    from textgym.plotting import plot_run

    if not run_dir.is_dir():
        _fail(f"run directory {str(run_dir)!r} not found")
    written = plot_run(run_dir)
    if not written:
        _fail(f"no metrics.jsonl under {run_dir}", code=1)
    for p in written:
        console.print(f"wrote {p}")


@app.command("serve")
def serve_cmd(
    model_dir: Annotated[Path, typer.Argument(help="A local Hugging Face model folder.")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind (default: this machine only).")] = "127.0.0.1",
    served_model_name: Annotated[str | None, typer.Option(help="Model name clients ask for.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, ... (transformers backend)")] = "cpu",
    backend: Annotated[str, typer.Option(help="Generation backend: transformers or vllm.")] = "transformers",
) -> None:
    """Serve a local model over an OpenAI-compatible API: /v1/models, /v1/completions, chat."""
    import uvicorn

    from textgym.serve import build_app

    if not model_dir.is_dir():
        _fail(f"model folder {str(model_dir)!r} not found")
    try:
        server_app = build_app(model_dir, served_model_name, device, backend_name=backend)
    except (OSError, ValueError, ImportError) as e:
        _fail(f"cannot load {model_dir}: {e}")
        return
    uvicorn.run(server_app, host=host, port=port, log_level="warning")


@rollouts_app.command("collect")
def rollouts_collect_cmd(
    model: Annotated[Path, typer.Option(help="Local Hugging Face model folder (the policy).")],
    env: Annotated[str, typer.Option(help="Environment id.")],
    out: Annotated[
        Path, typer.Option(help="Trajectory store folder (Parquet shards; created or appended to).")
    ],
    n: Annotated[int, typer.Option(min=1, help="Tasks (task_index start..start+n-1).")] = 100,
    samples: Annotated[int, typer.Option(min=1, help="Samples per task.")] = 1,
    start: Annotated[int, typer.Option(min=0, help="First task index.")] = 0,
    env_kwargs: Annotated[
        list[str] | None, typer.Option("--env-kwargs", help="key=value, repeatable.")
    ] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="0 = greedy.")] = 1.0,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Response budget in tokens.")] = 256,
    backend: Annotated[str, typer.Option(help="transformers or vllm.")] = "transformers",
    batch_size: Annotated[int, typer.Option(min=1, help="Episodes per shard (a chunk of tasks).")] = 256,
    seed: Annotated[int, typer.Option(help="Torch seed of the sampling.")] = 0,
) -> None:
    """Roll out a model on an env and append the episodes to a trajectory store.

    Tasks already in the store for this env, kwargs and model are skipped, so a killed run
    resumes by running the same command; shards appear only once complete.
    """
    from textgym.agents import SamplingParams
    from textgym.offline import collect_rollouts
    from textgym.store import TrajectoryStoreError
    from textgym.trainers.common import seed_everything

    kwargs = _parse_kwargs(env_kwargs)
    _make_env(env, kwargs).close()
    agent = _load_agent(model, None, None, backend)
    seed_everything(seed)
    try:
        res = collect_rollouts(
            agent,
            env,
            out,
            env_kwargs=kwargs,
            n=n,
            samples=samples,
            start=start,
            params=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
            batch_size=batch_size,
            policy=str(model.resolve()),
            seed=seed,
            progress=lambda done, total: console.print(f"collected {done}/{total} tasks"),
        )
    except (TrajectoryStoreError, ValueError) as e:
        _fail(str(e))
        return
    console.print(
        f"{res.new_tasks} tasks rolled out ({res.rows_written} episodes, {res.shards_written} shards), "
        f"{res.skipped_tasks} already in {out}"
    )


@pairs_app.command("build")
def pairs_build_cmd(
    source: Annotated[Path, typer.Option("--from", help="Trajectory store folder.")],
    out: Annotated[Path, typer.Option(help="Folder for pairs.parquet and unpaired.parquet.")],
    margin: Annotated[float, typer.Option(min=0.0, help="Minimum reward gap chosen − rejected.")] = 0.5,
    mode: Annotated[str, typer.Option(help="best_vs_worst or all.")] = "best_vs_worst",
    max_per_prompt: Annotated[int | None, typer.Option(min=1, help="Cap on pairs per prompt.")] = None,
    dedup: Annotated[bool, typer.Option(help="Count identical responses to a prompt once.")] = True,
    desirable_threshold: Annotated[float, typer.Option(help="KTO: desirable when reward >= this.")] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the per-prompt subsampling.")] = 0,
) -> None:
    """Build (prompt, chosen, rejected) pairs and KTO's unpaired examples from logged trajectories."""
    from textgym.offline import build_pairs, write_pairs
    from textgym.store import TrajectoryStoreError, read_trajectories

    if mode not in ("best_vs_worst", "all"):
        _fail(f"--mode must be best_vs_worst or all, got {mode!r}")
    try:
        table = read_trajectories(source)
    except (FileNotFoundError, TrajectoryStoreError) as e:
        _fail(str(e))
        return
    pairs, unpaired, stats = build_pairs(
        table,
        margin=margin,
        mode=mode,  # type: ignore[arg-type]
        max_per_prompt=max_per_prompt,
        dedup=dedup,
        desirable_threshold=desirable_threshold,
        seed=seed,
    )
    paths = write_pairs(pairs, unpaired, out)
    console.print(
        f"{stats.trajectories} trajectories, {stats.prompts} prompts ({stats.duplicates_dropped} duplicate "
        f"responses dropped) -> {stats.pairs} pairs from {stats.prompts_with_pairs} prompts "
        f"in {paths['pairs']}; "
        f"{stats.desirable} desirable / {stats.undesirable} undesirable in {paths['unpaired']}"
    )


@rm_app.command("train")
def rm_train_cmd(
    pairs: Annotated[Path, typer.Option(help="pairs.parquet (textgym pairs build), or its folder.")],
    model: Annotated[Path, typer.Option(help="Causal LM folder to initialise the reward model from.")],
    out: Annotated[Path, typer.Option(help="Output folder of the reward model.")],
    epochs: Annotated[int, typer.Option(min=1)] = 2,
    batch_size: Annotated[int, typer.Option(min=1, help="Pairs per step (over all ranks).")] = 32,
    micro_batch_size: Annotated[
        int | None,
        typer.Option(min=1, help="Pairs per forward pass on each rank (gradient accumulation)."),
    ] = None,
    lr: Annotated[float, typer.Option(min=0.0)] = 1e-4,
    schedule: Annotated[str, typer.Option(help="LR schedule: constant, cosine, linear.")] = "constant",
    eval_fraction: Annotated[float, typer.Option(min=0.0, max=0.9, help="Share of prompts held out.")] = 0.1,
    lm_coef: Annotated[
        float, typer.Option(min=0.0, help="Weight of the LM loss on chosen responses (GRM regulariser).")
    ] = 0.0,
    seed: Annotated[int, typer.Option()] = 0,
    device: Annotated[str, typer.Option(help="auto (cuda when available), cpu or cuda.")] = "auto",
    mixed_precision: Annotated[
        str, typer.Option(help="Under torchrun: auto (bf16 on CUDA), bf16 or fp32 compute.")
    ] = "auto",
    gradient_checkpointing: Annotated[
        bool, typer.Option(help="Recompute each block's activations in backward (less memory).")
    ] = False,
    checkpoint_every: Annotated[
        int, typer.Option(min=0, help="Save a checkpoint to OUT/checkpoints every this many steps (0: none).")
    ] = 0,
    keep_checkpoints: Annotated[int, typer.Option(min=1, help="How many checkpoints to keep.")] = 2,
    resume: Annotated[
        bool,
        typer.Option(
            help="Continue from the newest checkpoint in OUT (else OUT's old checkpoints are removed)."
        ),
    ] = False,
) -> None:
    """Train a Bradley-Terry reward model; print its held-out pairwise accuracy.

    Under `torchrun --nproc-per-node N -m textgym rm train ...` it trains sharded on N ranks.
    """
    from textgym import distributed
    from textgym.config import OptimConfig, ParallelConfig, RewardModelConfig
    from textgym.offline import read_pairs
    from textgym.trainers.reward_model import train_reward_model

    if mixed_precision not in ("auto", "bf16", "fp32"):
        _fail(f"--mixed-precision must be auto, bf16 or fp32, got {mixed_precision!r}")
    path = pairs / "pairs.parquet" if pairs.is_dir() else pairs
    try:
        distributed.init(device)
        table = read_pairs(path)
        cfg = RewardModelConfig(
            epochs=epochs,
            batch_size=batch_size,
            micro_batch_size=micro_batch_size,
            eval_fraction=eval_fraction,
            optim=OptimConfig(lr=lr, schedule=schedule),  # type: ignore[arg-type]
            lm_coef=lm_coef,
            seed=seed,
            checkpoint_every=checkpoint_every,
            keep_checkpoints=keep_checkpoints,
        )
        parallel = ParallelConfig(
            mixed_precision=mixed_precision,  # type: ignore[arg-type]
            gradient_checkpointing=gradient_checkpointing,
        )
        res = train_reward_model(
            table, model, out, cfg, echo=console.print, device=device, parallel=parallel, resume=resume
        )
    except (FileNotFoundError, ValueError, OSError) as e:
        _leave_world(error=e)
    if not _leave_world():
        return
    console.print(
        f"reward model in {out}: held-out pairwise accuracy {res['heldout_accuracy']:.3f} "
        f"(before training {res['heldout_accuracy_before']:.3f}) on {res['heldout_pairs']} pairs; "
        f"{res['train_pairs']} training pairs, {res['wall_time_s']:.0f}s"
    )


@report_app.command("compare")
def report_compare_cmd(
    a: Annotated[Path, typer.Argument(help="report.json of policy A (textgym eval --suite ... --out).")],
    b: Annotated[Path, typer.Argument(help="report.json of policy B.")],
    alpha: Annotated[float, typer.Option(min=0.0, max=1.0, help="Significance level.")] = 0.05,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")] = False,
) -> None:
    """Two policies side by side: accuracy per env, B − A, exact McNemar p-value on shared tasks."""
    from textgym.suites import compare_reports

    reports = []
    for path in (a, b):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(data, dict) or not isinstance(data.get("envs"), list):
                raise ValueError("not a textgym report (no 'envs' list)")
        except (OSError, ValueError) as e:
            _fail(f"cannot read report {str(path)!r}: {e}")
            return
        reports.append(data)
    rows = compare_reports(reports[0], reports[1], alpha)
    if as_json:
        print(json.dumps(rows))
        return
    print(f"A: {reports[0]['policy']} ({a})\nB: {reports[1]['policy']} ({b})\n")
    print("| env | paired tasks | accuracy A | accuracy B | B − A | McNemar p | significant |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "only_in" in r:
            print(f"| {r['env_id']} | | | | | | only in {r['only_in']} |")
            continue
        print(
            f"| {r['env_id']} | {r['paired_tasks']} | {r['accuracy_a']:.3f} | {r['accuracy_b']:.3f} | "
            f"{r['diff']:+.3f} | {r['p_value']:.3g} | {'yes' if r['significant'] else 'no'} |"
        )


@app.command("check-template")
def check_template_cmd(
    model_dir: Annotated[Path, typer.Argument(help="A local Hugging Face model (or tokenizer) folder.")],
) -> None:
    """Check that a chat template is append-only for multi-turn tool conversations (exit 1 if not)."""
    from transformers import AutoTokenizer

    from textgym.agents.template_check import check_template

    if not model_dir.is_dir():
        _fail(f"model folder {str(model_dir)!r} not found")
    try:
        tok = AutoTokenizer.from_pretrained(model_dir)
        report = check_template(tok)
    except (OSError, ValueError) as e:
        _fail(f"cannot check the template of {model_dir}: {e}")
        return
    if report.append_only:
        console.print(
            f"append-only: yes ({report.turns} assistant turns with tool calls and <think> blocks). "
            "Incremental rendering equals rendering the whole conversation."
        )
        return
    console.print(f"append-only: NO ({len(report.problems)} problem(s)):")
    for p in report.problems:
        typer.echo(f"  - {p}")
    console.print(
        "textgym's policy: a trajectory is the one growing token sequence the policy saw and sampled "
        "(earlier turns are never re-rendered), and training uses those stored token ids. Rendering "
        "the messages again with this template gives a different sequence; do not re-tokenize trajectories."
    )
    raise typer.Exit(1)


@sandbox_app.command("check")
def sandbox_check_cmd() -> None:
    """Say which sandbox backends work on this machine, and why not where not (exit 1 when none does)."""
    from textgym.sandbox import check_backends

    table = Table("backend", "works", "details")
    rows = check_backends()
    for name, ok, why in rows:
        table.add_row(name, "yes" if ok else "no", why)
    console.print(table)
    if not any(ok for _, ok, _ in rows):
        raise typer.Exit(1)


@sandbox_app.command("build-image")
def sandbox_build_image_cmd(
    tag: Annotated[str, typer.Option(help="Image name:tag to create.")] = "textgym-sandbox:latest",
    python: Annotated[
        str | None, typer.Option(help="Interpreter to ship (default: /usr/bin/python3 or the current one).")
    ] = None,
) -> None:
    """Build the docker backend's image locally (no registry): Python + stdlib + its shared libraries."""
    from textgym.sandbox import SandboxError
    from textgym.sandbox.image import build_image

    try:
        facts = build_image(tag, python)
    except SandboxError as e:
        _fail(str(e), code=1)
    console.print(
        f"built {facts['image']} ({facts['id'][:19]}): python {facts['version']} from {facts['python']}, "
        f"{facts['files']} files, {facts['bytes'] / 1e6:.1f} MB"
    )


def main() -> None:
    """Entry point of the `textgym` console script."""
    import os

    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    _refuse_ranks_outside_train(sys.argv[1:])
    app(prog_name="textgym")


def _refuse_ranks_outside_train(args: list[str]) -> None:
    """Under torchrun with several processes only `textgym train` and `textgym rm train` split the work.

    Every other command would run once per rank and write the same outputs; it exits with
    code 2 and a message instead.
    """
    import os

    words = [a for a in args if not a.startswith("-")][:2]
    command = " ".join(words[:1] if words[:1] != ["rm"] else words)
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and command not in ("", "train", "rm train"):
        if os.environ.get("RANK", "0") == "0":
            typer.echo(
                f"error: `textgym {command}` runs on one process; only `textgym train` and "
                "`textgym rm train` run under torchrun",
                err=True,
            )
        raise SystemExit(2)


if __name__ == "__main__":
    main()
