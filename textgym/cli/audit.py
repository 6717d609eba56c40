"""`textgym audit`: false-positive and false-negative rates of a verifier, an LLM judge or a reward model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import EnvKwargs, fail, make_env, parse_kwargs


# long: a typer command read top to bottom: 39 lines of options, then build the set, grade, report
def audit_cmd(
    out: Annotated[Path, typer.Option(help="Folder for audit.md, audit.json and the set (items.jsonl).")],
    env: Annotated[
        str | None,
        typer.Option(help="Env whose first tasks make the built-in adversarial set (and whose verifier)."),
    ] = None,
    env_kwargs: EnvKwargs = None,
    n: Annotated[
        int, typer.Option(min=1, help="Tasks in the built-in set (15 to 17 completions each).")
    ] = 20,
    start: Annotated[int, typer.Option(min=0, help="First task index of the built-in set.")] = 0,
    input: Annotated[
        Path | None,
        typer.Option(
            "--input",
            help='Your labelled set instead: JSONL {"prompt", "completion", "label": true|false, "kind"?, '
            '"answer"?, "task_index"?}.',
        ),
    ] = None,
    verifier: Annotated[bool, typer.Option("--verifier", help="Audit the env's own verifier.")] = False,
    endpoint: Annotated[
        str | None, typer.Option(help="Audit an LLM judge at this OpenAI-compatible URL.")
    ] = None,
    model: Annotated[str | None, typer.Option(help="The judge's served model name.")] = None,
    rubric: Annotated[Path | None, typer.Option(help="The judge's rubric template file.")] = None,
    mode: Annotated[str, typer.Option(help="The judge's mode: pointwise or group.")] = "pointwise",
    reference: Annotated[bool, typer.Option(help="Show the gold answer to the judge.")] = False,
    pairwise: Annotated[
        bool, typer.Option(help="Measure the judge's position bias (2 requests per pair).")
    ] = True,
    concurrency: Annotated[int, typer.Option(min=1, help="Judge requests in flight at once.")] = 8,
    max_tokens: Annotated[int, typer.Option(min=1, help="The judge's reply budget in tokens.")] = 512,
    cache: Annotated[Path | None, typer.Option(help="JSONL judgement cache.")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="Variable holding the judge's API key.")] = None,
    reward_model: Annotated[
        Path | None, typer.Option(help="Audit a reward model folder (`textgym rm train`).")
    ] = None,
    threshold: Annotated[
        float | None,
        typer.Option(help="Accept when reward >= this (default 0.5; a reward model's default 0.0)."),
    ] = None,
) -> None:
    """Audit a reward: how often it accepts wrong completions and rejects right ones.

    Wrong completions include format tricks, empty and huge replies and prompt injection such as
    a forged "SCORE: 10". Writes audit.md and audit.json.

    Exactly one of --verifier (the env's), --endpoint/--model (an LLM judge; with --env it is also
    compared with the env's verifier, and --pairwise measures its position bias) or --reward-model.
    The set: the built-in one on --env's first --n tasks, or --input.
    """
    from textgym.evaluation.audit import (
        judge_scorer,
        reward_model_scorer,
        run_audit,
        verifier_scorer,
        write_audit,
    )
    from textgym.evaluation.audit_set import adversarial_set, load_items, save_items

    chosen = [
        name
        for name, on in (("--verifier", verifier), ("--endpoint", endpoint), ("--reward-model", reward_model))
        if on
    ]
    if len(chosen) != 1:
        fail(f"give exactly one of --verifier, --endpoint or --reward-model (got {chosen or 'none'})")
    if endpoint and not model:
        fail("--endpoint needs --model (the judge's served model name)")
    if input is None and env is None:
        fail("give --env (the built-in set on its tasks) or --input (a labelled JSONL), or both")
    kwargs = parse_kwargs(env_kwargs)
    if env is not None:
        make_env(env, kwargs).close()  # exits 2 with the reason when the env cannot be built
    if verifier and env is None:
        fail("--verifier audits an env's verifier: give --env")
    try:
        items = (
            load_items(input) if input is not None else adversarial_set(str(env), kwargs, n=n, start=start)
        )
    except (OSError, ValueError) as e:
        fail(str(e))
    source = (
        str(input)
        if input is not None
        else f"built-in adversarial set on {env} tasks {start}..{start + n - 1}"
    )
    judge = None
    describe: dict[str, Any] = {"set": source}
    if verifier:
        scorer = verifier_scorer(str(env), kwargs)
        describe["scorer"] = f"{env} verifier"
    elif reward_model is not None:
        if not (reward_model / "config.json").is_file():
            fail(f"reward model folder {str(reward_model)!r} has no config.json")
        scorer = reward_model_scorer(reward_model)
        describe["scorer"] = f"reward model {reward_model}"
    else:
        judge = _judge(
            str(endpoint), str(model), rubric, mode, reference, concurrency, max_tokens, cache, api_key_env
        )
        scorer = judge_scorer(judge)
        describe["scorer"] = f"judge {model} at {endpoint} ({mode})"
    default = 0.0 if reward_model is not None else 0.5
    from textgym.verifiers.judge_client import JudgeError

    try:
        report = run_audit(
            items,
            scorer,
            threshold=default if threshold is None else threshold,
            describe=describe,
            verifier=verifier_scorer(str(env), kwargs) if judge is not None and env is not None else None,
            judge=judge if pairwise else None,
        )
    except JudgeError as e:
        fail(str(e), code=1)
    out.mkdir(parents=True, exist_ok=True)
    save_items(items, out / "items.jsonl")
    paths = write_audit(report, out)
    typer.echo(paths["md"].read_text(encoding="utf-8"))
    typer.echo(f"wrote {paths['md']} and {paths['json']}")


def _judge(
    endpoint: str,
    model: str,
    rubric: Path | None,
    mode: str,
    reference: bool,
    concurrency: int,
    max_tokens: int,
    cache: Path | None,
    api_key_env: str | None,
) -> Any:
    """A `JudgeVerifier` from the command's options, checked against its endpoint; exits on a problem."""
    from textgym.verifiers.judge import JudgeVerifier, api_key_from_env
    from textgym.verifiers.judge_client import JudgeError
    from textgym.verifiers.judge_prompts import load_rubric

    if mode not in ("pointwise", "group"):
        fail(f"--mode must be pointwise or group, got {mode!r}")
    try:
        judge = JudgeVerifier(
            endpoint,
            model,
            rubric=None if rubric is None else load_rubric(rubric, mode),  # type: ignore[arg-type]
            mode=mode,  # type: ignore[arg-type]
            reference=reference,
            concurrency=concurrency,
            max_tokens=max_tokens,
            cache_path=cache,
            api_key=api_key_from_env(api_key_env),
        )
        judge.check()
    except (OSError, ValueError) as e:
        fail(str(e))
    except JudgeError as e:
        fail(str(e), code=1)
    return judge
