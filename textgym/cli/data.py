"""Offline data: `textgym rollouts collect` fills a trajectory store, `textgym pairs build` pairs it."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from textgym.cli._common import (
    EnvKwargs,
    MaxNewTokens,
    ModelHelp,
    Temperature,
    console,
    fail,
    load_agent,
    make_env,
    model_source,
    parse_kwargs,
)

rollouts_app = typer.Typer(help="Fill a trajectory store with rollouts.", no_args_is_help=True)
pairs_app = typer.Typer(help="Build preference pairs from a trajectory store.", no_args_is_help=True)

StoreOut = Annotated[
    Path, typer.Option(help="Trajectory store folder (Parquet shards; created or appended to).")
]
Backend = Annotated[str, typer.Option(help="transformers or vllm.")]
BatchSize = Annotated[int, typer.Option(min=1, help="Episodes per shard (a chunk of tasks).")]


@rollouts_app.command("collect")
def rollouts_collect_cmd(
    model: Annotated[str, typer.Option(help=ModelHelp + " (the policy)")],
    env: Annotated[str, typer.Option(help="Environment id.")],
    out: StoreOut,
    n: Annotated[int, typer.Option(min=1, help="Tasks (task_index start..start+n-1).")] = 100,
    samples: Annotated[int, typer.Option(min=1, help="Samples per task.")] = 1,
    start: Annotated[int, typer.Option(min=0, help="First task index.")] = 0,
    env_kwargs: EnvKwargs = None,
    temperature: Temperature = 1.0,
    max_new_tokens: MaxNewTokens = 256,
    backend: Backend = "transformers",
    batch_size: BatchSize = 256,
    seed: Annotated[int, typer.Option(help="Torch seed of the sampling.")] = 0,
    agent: Annotated[
        str,
        typer.Option(
            help="policy: the model samples; oracle: the env's oracle_action plays every turn, "
            "written in the model's tokens (demonstrations for SFT; the model's weights are not loaded)."
        ),
    ] = "policy",
    noise: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=0.99,
            help="With --agent oracle: the probability per turn of a random action (outside the loss) "
            "instead of the expert's, so the demonstrations show it recover (DART).",
        ),
    ] = 0.0,
    tool_free: Annotated[
        float,
        typer.Option(
            min=0.0,
            max=1.0,
            help="With --agent oracle: the probability, per turn where the expert would call a tool, "
            "that it answers at once with the env's own answer instead (an expert who computes it in "
            "its head).",
        ),
    ] = 0.0,
) -> None:
    """Roll out a model (or, with `--agent oracle`, the env's expert) and append the episodes to a store.

    Tasks already in the store for this env, kwargs and model are skipped, so a killed run
    resumes by running the same command; shards appear only once complete. Oracle episodes are
    recorded as `policy` "oracle:<model folder>" (their tokens are that tokenizer's).
    """
    from textgym.agents import SamplingParams
    from textgym.offline import collect_rollouts
    from textgym.offline.store import TrajectoryStoreError
    from textgym.training.seeding import seed_everything

    if agent not in ("policy", "oracle"):
        fail(f"--agent must be 'policy' or 'oracle', got {agent!r}")
    if (noise or tool_free) and agent != "oracle":
        fail("--noise and --tool-free change the oracle's demonstrations: they need --agent oracle")
    kwargs = parse_kwargs(env_kwargs)
    make_env(env, kwargs).close()
    model = model_source(model)
    if agent == "oracle":
        from textgym.agents.demonstrator import OracleDemonstrator
        from textgym.models import load_tokenizer

        try:
            actor = OracleDemonstrator(load_tokenizer(model), noise=noise, seed=seed, tool_free=tool_free)
        except (FileNotFoundError, ValueError) as e:
            fail(str(e))
        policy = f"oracle:{_policy_id(model)}"
    else:
        actor = load_agent(Path(model), None, None, backend)
        policy = _policy_id(model)
    seed_everything(seed)
    try:
        res = collect_rollouts(
            actor, env, out, env_kwargs=kwargs, n=n, samples=samples, start=start,
            params=SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens),
            batch_size=batch_size, policy=policy, seed=seed,
            source="demonstration" if agent == "oracle" else "collect",
            progress=lambda done, total: console.print(f"collected {done}/{total} tasks"),
        )  # fmt: skip
    except (TrajectoryStoreError, ValueError, AttributeError) as e:
        fail(str(e))
    console.print(
        f"{res.new_tasks} tasks rolled out ({res.rows_written} episodes, {res.shards_written} shards), "
        f"{res.skipped_tasks} already in {out}"
    )


def _policy_id(model: str) -> str:
    """How the store names the policy: a local folder by its absolute path, a Hub id as given."""
    return str(Path(model).resolve()) if Path(model).exists() else model


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
    from textgym.offline.store import TrajectoryStoreError, read_trajectories

    if mode not in ("best_vs_worst", "all"):
        fail(f"--mode must be best_vs_worst or all, got {mode!r}")
    try:
        table = read_trajectories(source)
    except (FileNotFoundError, TrajectoryStoreError) as e:
        fail(str(e))
    pairs, unpaired, stats = build_pairs(
        table, margin=margin, mode=mode, max_per_prompt=max_per_prompt,  # type: ignore[arg-type]
        dedup=dedup, desirable_threshold=desirable_threshold, seed=seed,
    )  # fmt: skip
    paths = write_pairs(pairs, unpaired, out)
    console.print(
        f"{stats.trajectories} trajectories, {stats.prompts} prompts ({stats.duplicates_dropped} duplicate "
        f"responses dropped) -> {stats.pairs} pairs from {stats.prompts_with_pairs} prompts "
        f"in {paths['pairs']}; "
        f"{stats.desirable} desirable / {stats.undesirable} undesirable in {paths['unpaired']}"
    )
