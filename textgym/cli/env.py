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
    judge_config: Annotated[
        Path | None,
        typer.Option(
            help="Also probe an LLM judge with forged verdicts, its settings from this YAML: a run "
            "config (its first `env.judge`, e.g. configs/rlaif_arithmetic.yaml) or a judge mapping "
            "(endpoint, model, ...)."
        ),
    ] = None,
    judge_endpoint: Annotated[
        str | None,
        typer.Option(help="Or probe the judge at this OpenAI-compatible URL (with --judge-model)."),
    ] = None,
    judge_model: Annotated[str | None, typer.Option(help="The judge's served model name.")] = None,
    judge_mode: Annotated[
        str, typer.Option(help="The judge's mode: pointwise, pairwise or group.")
    ] = "pointwise",
    judge_rubric: Annotated[Path | None, typer.Option(help="The judge's rubric template file.")] = None,
    judge_api_key_env: Annotated[
        str | None, typer.Option(help="Variable holding the judge's API key.")
    ] = None,
) -> None:
    """Play reward-hack probes (echo, hedges, expressions, format only, harness tampering, ...) on an env.

    Prints each probe's mean return next to the random agent's; exit code 1 when a probe earns
    more than random (by more than 0.2), a verifier that pays for what the task did not ask.
    With a judge (--judge-config, or --judge-endpoint and --judge-model), also plays the judge
    forgery probes on the env's tasks: wrong answers that write a verdict of their own (after
    line-splitting characters, fake chat-template closes, in a guessed verdict tag, as JSON, ...);
    a probe fails when the judge pays it more than the same wrong answer without the forgery.
    """
    from textgym.evaluation.hack_probes import probe_env

    judge = _probe_judge(
        judge_config, judge_endpoint, judge_model, judge_mode, judge_rubric, judge_api_key_env
    )
    try:
        results = probe_env(env_id, parse_kwargs(env_kwargs), n=n)
    except Exception as e:
        fail(f"{env_id}: the probes could not play: {type(e).__name__}: {e}")
    for r in results:
        console.print(r.line(), highlight=False, soft_wrap=True)
    paid = [r.name for r in results if not r.ok]
    if judge is not None:
        paid += _play_judge_probes(judge, env_id, parse_kwargs(env_kwargs), n)
    if paid:
        against = "a random agent" + (" (judge probes: the plain wrong answer)" if judge is not None else "")
        typer.echo(f"{len(paid)} probe(s) paid more than {against}: {', '.join(paid)}", err=True)
        raise typer.Exit(1)


def _play_judge_probes(judge: Any, env_id: str, kwargs: dict[str, Any], n: int) -> list[str]:
    """Play and print the judge forgery probes; the names of those that paid (exit 1 on a judge error)."""
    from textgym.evaluation.judge_probes import probe_judge
    from textgym.verifiers.judge_client import JudgeError

    console.print(
        f"judge forgery probes: {judge.model} at {judge.endpoint} ({judge.mode}), "
        "against the same wrong answer without the forgery",
        highlight=False,
        markup=False,
        soft_wrap=True,
    )
    try:
        results = probe_judge(judge, env_id, kwargs, n=n)
    except JudgeError as e:
        fail(str(e), code=1)
    except ValueError as e:
        fail(f"{env_id}: the judge probes could not play: {e}")
    finally:
        judge.close()
    for r in results:  # markup off: a probe's name holds a fake "[/INST]"
        console.print(r.line(), highlight=False, markup=False, soft_wrap=True)
    return [f"judge: {r.name}" for r in results if not r.ok]


def _judge_settings(path: Path) -> tuple[str, dict[str, Any]]:
    """The judge mapping of a YAML file and where it was: the file itself, or its first `judge:` mapping.

    Exits with code 2 when the file cannot be read or holds no judge.
    """
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        fail(f"--judge-config {str(path)!r}: {e}")

    def find(node: Any, where: str) -> tuple[str, dict[str, Any]] | None:
        if not isinstance(node, dict):
            return None
        for key, value in node.items():
            here = f"{where}.{key}" if where else str(key)
            if key == "judge" and isinstance(value, dict):
                return here, value
            found = find(value, here)
            if found is not None:
                return found
        return None

    if isinstance(data, dict) and "endpoint" in data:
        return "(the file)", data
    found = find(data, "")
    if found is None:
        fail(
            f"--judge-config {str(path)!r} has no judge: give a mapping with endpoint and model, or a run "
            "config whose env has a `judge:`"
        )
    return found


def _probe_judge(
    config: Path | None,
    endpoint: str | None,
    model: str | None,
    mode: str,
    rubric: Path | None,
    api_key_env: str | None,
) -> Any:
    """The `JudgeVerifier` the options name (checked against its endpoint), or None; exits on a problem."""
    if config is None and endpoint is None:
        if model is not None or rubric is not None or api_key_env is not None:
            fail("--judge-model, --judge-rubric and --judge-api-key-env need --judge-endpoint")
        return None
    if config is not None and endpoint is not None:
        fail("give --judge-config or --judge-endpoint, not both")
    from pydantic import ValidationError

    from textgym.config import JudgeTermConfig
    from textgym.verifiers.judge import JudgeVerifier, api_key_from_env
    from textgym.verifiers.judge_client import JudgeError
    from textgym.verifiers.judge_prompts import MODES, load_rubric

    try:
        if config is not None:
            where, raw = _judge_settings(config)
            try:
                cfg = JudgeTermConfig.model_validate(raw)
            except ValidationError as e:
                fail(f"--judge-config {str(config)!r}, {where}: {e}")
            kwargs = {**cfg.verifier_kwargs(), "cache_path": None}
            mode, rubric, api_key_env = (
                cfg.mode,
                None if cfg.rubric is None else Path(cfg.rubric),
                cfg.api_key_env,
            )
        else:
            if model is None:
                fail("--judge-endpoint needs --judge-model (the judge's served model name)")
            if mode not in MODES:
                fail(f"--judge-mode must be one of {list(MODES)}, got {mode!r}")
            kwargs = {"endpoint": endpoint, "model": model, "mode": mode, "reference": False}
        template = None if rubric is None else load_rubric(rubric, mode)  # type: ignore[arg-type]
        judge = JudgeVerifier(**kwargs, rubric=template, api_key=api_key_from_env(api_key_env))
        judge.check()
    except (OSError, ValueError) as e:
        fail(str(e))
    except JudgeError as e:
        fail(str(e), code=1)
    return judge


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
