"""`textgym env new | check | hacks | show | serve-openenv`: write, check, probe, inspect, serve an env."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import EnvKwargs, console, fail, parse_kwargs
from textgym.cli.openenv import serve_openenv_cmd

env_app = typer.Typer(
    help="Write a new environment, check one, show its tasks, or serve it over OpenEnv's protocol.",
    no_args_is_help=True,
)

EnvIdArg = Annotated[
    str, typer.Argument(help="Environment id: textgym/Wordle-v0, my/Env-v0, or module:my/Env-v0.")
]


@env_app.command("new")
def env_new_cmd(
    name: Annotated[
        str, typer.Argument(help="Module name of the new env (lowercase identifier, e.g. reverse).")
    ],
    multi_turn: Annotated[
        bool,
        typer.Option("--multi-turn", help="The multi-turn template (guess a number) instead of single-turn."),
    ] = False,
    out: Annotated[Path, typer.Option(help="Folder to write into (default: the current folder).")] = Path(),
    force: Annotated[bool, typer.Option(help="Overwrite existing files.")] = False,
) -> None:
    """Write NAME.py (a working env, registered as NAME/Name-v0), test_NAME.py and train_NAME.yaml."""
    from textgym.envs.scaffold import env_id_of, write_env_project

    try:
        written = write_env_project(name, out, multi_turn=multi_turn, force=force)
    except ValueError as e:
        fail(str(e))
    for path in written:
        console.print(f"wrote {path}")
    where = "" if out == Path() else f"cd {out} && "
    console.print(
        f"next: {where}textgym env check {name}:{env_id_of(name)} && pytest test_{name}.py "
        f"&& textgym train train_{name}.yaml",
        soft_wrap=True,
    )


@env_app.command("check")
def env_check_cmd(
    env_id: EnvIdArg,
    env_kwargs: EnvKwargs = None,
    n: Annotated[int, typer.Option(min=1, help="Tasks the oracle and the random agent play.")] = 5,
    sft: Annotated[
        bool, typer.Option("--sft", help="Fail when tasks have no gold solution (SFT needs them).")
    ] = False,
    hacks: Annotated[bool, typer.Option(help="Run the reward-hack probes (`textgym env hacks`).")] = True,
) -> None:
    """Check an env: gymnasium's checker, determinism, oracle and random bounds, bad actions, limits, hacks.

    Prints one line per check (ok / fail / warn / skip); exit code 0 when none failed, else 1.
    """
    from textgym.evaluation.envcheck import check_env

    results = check_env(env_id, parse_kwargs(env_kwargs), n=n, sft=sft, hacks=hacks)
    colour = {"ok": "green", "fail": "red", "warn": "yellow", "skip": "yellow"}
    for r in results:
        console.print(
            f"[{colour[r.status]}]{r.status:<5}[/] [bold]{r.name}[/]: {r.detail}",
            highlight=False,
            soft_wrap=True,
        )
    failed = [r.name for r in results if r.status == "fail"]
    if failed:
        typer.echo(f"{len(failed)} check(s) failed: {', '.join(failed)}", err=True)
        raise typer.Exit(1)


@env_app.command("hacks")
def env_hacks_cmd(
    env_id: EnvIdArg,
    env_kwargs: EnvKwargs = None,
    n: Annotated[int, typer.Option(min=1, help="Tasks each probe plays.")] = 5,
) -> None:
    """Play reward-hack probes (echo, hedges, expressions, format only, harness tampering, ...) on an env.

    Prints each probe's mean return next to the random agent's; exit code 1 when a probe earns
    more than random (by more than 0.2), a verifier that pays for what the task did not ask.
    """
    from textgym.evaluation.hack_probes import probe_env

    try:
        results = probe_env(env_id, parse_kwargs(env_kwargs), n=n)
    except Exception as e:
        fail(f"{env_id}: the probes could not play: {type(e).__name__}: {e}")
    for r in results:
        console.print(r.line(), highlight=False, soft_wrap=True)
    paid = [r.name for r in results if not r.ok]
    if paid:
        typer.echo(f"{len(paid)} probe(s) paid more than a random agent: {', '.join(paid)}", err=True)
        raise typer.Exit(1)


@env_app.command("show")
def env_show_cmd(
    env_id: EnvIdArg,
    env_kwargs: EnvKwargs = None,
    task: Annotated[int, typer.Option("--task", min=0, help="Task index.")] = 0,
) -> None:
    """Show one task: its prompt as the policy sees it, the gold answer and solution, an oracle transcript."""
    from rich.markup import escape

    from textgym.agents.trajectory import episode_correct
    from textgym.cli._common import make_env
    from textgym.cli.eval import print_episodes
    from textgym.envs.registry import accuracy_term, task_count
    from textgym.evaluation.scripted import OracleAgent, play_episode

    env = make_env(env_id, parse_kwargs(env_kwargs))
    n = task_count(env)
    if task >= n:
        fail(f"--task {task} is out of range: {env_id} has {n} tasks")
    obs, _ = env.reset(options={"task_index": task})
    gold: Any = getattr(env.unwrapped, "task", None)

    def say(label: str, text: object) -> None:
        console.print(f"[bold]{escape(label)}[/]: {escape(str(text))}", highlight=False, soft_wrap=True)

    say(env_id, f"task {task} of {n if n < 2**62 else 'unbounded'}")
    for m in obs:
        say(str(m["role"]), m["content"])
    if gold is not None:
        say("gold answer", getattr(gold, "answer", ""))
        say("gold solution", getattr(gold, "solution", None))
    say("accuracy term", f"reward/{accuracy_term(env)}")
    try:
        ep = play_episode(OracleAgent(), env, task)
    except (AttributeError, NotImplementedError, LookupError) as e:
        console.print(f"no oracle transcript: {escape(str(e))}", highlight=False)
        return
    correct = episode_correct(ep["terms"], ep["reward"])
    print_episodes([{"task_index": task, "sample": 0, "correct": correct, **ep}])


# `textgym env serve-openenv ID`: OpenEnv's protocol (imports openenv only when run)
env_app.command(
    "serve-openenv",
    help="Serve any textgym env over OpenEnv's protocol until Ctrl-C (wrap it back with textgym/OpenEnv-v0).",
)(serve_openenv_cmd)
