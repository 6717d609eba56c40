"""`textgym verify judge`: an LLM judge at an OpenAI-compatible endpoint grades completions from a file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import BadLineError, fail, json_object

CHUNK = 256
"""Input lines judged together (concurrently) before their output lines are printed."""

INPUT_HELP = (
    'JSONL, one object per line: pointwise {"prompt", "completion"}; pairwise {"prompt", '
    '"completion_a", "completion_b"}; group {"prompt", "completions": [...]}; each may add "answer" '
    "(a reference shown to the judge)."
)


def _text(row: dict[str, Any], key: str) -> str:
    value = row.get(key)
    if not isinstance(value, str):
        raise BadLineError(f"needs a string {key!r}")
    return value


def parse_row(row: dict[str, Any], mode: str) -> Any:
    """The `JudgeItem` of one input line in `mode`.

    Raises:
        BadLineError: a field the mode needs is missing or not text.
    """
    from textgym.verifiers.judge import JudgeItem

    prompt = _text(row, "prompt")
    answer = row.get("answer")
    if answer is not None and not isinstance(answer, str | int | float):
        raise BadLineError("'answer' must be a string or a number")
    ref = None if answer is None else str(answer)
    if mode == "pointwise":
        return JudgeItem(prompt, (_text(row, "completion"),), ref)
    if mode == "pairwise":
        return JudgeItem(prompt, (_text(row, "completion_a"), _text(row, "completion_b")), ref)
    cs = row.get("completions")
    if not isinstance(cs, list) or not cs or not all(isinstance(c, str) for c in cs):
        raise BadLineError("needs 'completions', a non-empty list of strings")
    return JudgeItem(prompt, tuple(cs), ref)


def judge_rows(judge: Any, mode: str, items: list[Any]) -> list[dict[str, Any]]:
    """The output fields of each item: `reward` and `details` (group mode: `rewards` and `details`)."""
    if mode == "pointwise":
        return [{"reward": s.reward, "details": s.details} for s in judge.score(items)]
    if mode == "pairwise":
        return [{"reward": s.reward, "details": s.details} for s in judge.compare(items)]
    out = []
    for scores in judge.rank(items):
        details: dict[str, Any] = {
            "judgement": scores[0].details["judgement"],
            "cached": scores[0].details["cached"],
        }
        errors = [s.details["error"] for s in scores if "error" in s.details]
        if errors:
            details["error"] = "; ".join(errors)
        out.append({"rewards": [s.reward for s in scores], "details": details})
    return out


# long: a typer command read top to bottom: 23 lines of options, then check, grade, write, summarise
def verify_judge_cmd(
    endpoint: Annotated[str, typer.Option(help="Base URL of the judge's OpenAI-compatible server.")],
    model: Annotated[str, typer.Option(help="The served judge model's name.")],
    input: Annotated[Path, typer.Option("--input", help=INPUT_HELP)],
    rubric: Annotated[
        Path | None,
        typer.Option(help="Rubric template file ({prompt}, {completion}, ...); default: built-in."),
    ] = None,
    mode: Annotated[
        str, typer.Option(help="pointwise | pairwise (both orders asked) | group.")
    ] = "pointwise",
    concurrency: Annotated[int, typer.Option(min=1, help="Judge requests in flight at once.")] = 8,
    cache: Annotated[Path | None, typer.Option(help="JSONL judgement cache, reused by later runs.")] = None,
    temperature: Annotated[float, typer.Option(min=0.0, help="The judge's temperature (0 = greedy).")] = 0.0,
    max_tokens: Annotated[int, typer.Option(min=1, help="The judge's reply budget in tokens.")] = 512,
    timeout_s: Annotated[float, typer.Option(min=0.1, help="Seconds per request.")] = 60.0,
    max_retries: Annotated[int, typer.Option(min=0, help="Retries of a 429, 5xx or lost connection.")] = 4,
    api_key_env: Annotated[
        str | None, typer.Option(help="Environment variable holding the endpoint's API key.")
    ] = None,
    neutral_sampling: Annotated[
        bool, typer.Option(help="Also send top_k=0, min_p=0 and neutral penalties (off for strict APIs).")
    ] = True,
) -> None:
    """Grade completions with an LLM judge: one JSON line out per input line, in order.

    Pointwise: reward = the judge's last `SCORE: <0-10>` line inside the request's verdict tags
    / 10 (0.0 with details.error when there is none); pairwise: reward = the first completion's
    preference over both orders; group: rewards, one per completion. A score equal to one the
    completion claims (`Score = 10`, `10/10`, a note to the grader) is not paid, and the summary
    counts such completions. Exit 1 when a line was unusable or the endpoint failed.
    """
    from textgym.verifiers.judge import JudgeVerifier, api_key_from_env
    from textgym.verifiers.judge_client import JudgeError
    from textgym.verifiers.judge_prompts import MODES, load_rubric

    if mode not in MODES:
        fail(f"--mode must be one of {list(MODES)}, got {mode!r}")
    if not input.is_file():
        fail(f"input file {str(input)!r} not found")
    try:
        template = None if rubric is None else load_rubric(rubric, mode)  # type: ignore[arg-type]
        key = api_key_from_env(api_key_env)
    except (OSError, ValueError) as e:
        fail(str(e))
    judge = JudgeVerifier(
        endpoint,
        model,
        rubric=template,
        mode=mode,  # type: ignore[arg-type]
        temperature=temperature,
        max_tokens=max_tokens,
        concurrency=concurrency,
        timeout_s=timeout_s,
        max_retries=max_retries,
        api_key=key,
        cache_path=cache,
        neutral_sampling=neutral_sampling,
    )
    failed = 0
    pending: list[tuple[int, Any]] = []  # (line number, JudgeItem or the error text)
    picks = {"a": 0, "b": 0, "pairs": 0, "consistent": 0}

    def flush() -> None:
        items = [x for _, x in pending if not isinstance(x, str)]
        try:
            results = iter(judge_rows(judge, mode, items))
        except JudgeError as e:
            fail(str(e), code=1)
        for n, x in pending:
            out: dict[str, Any] = {"line": n}
            if isinstance(x, str):
                out["error"] = x
            else:
                out.update(next(results))
                if mode == "pairwise":
                    d = out["details"]
                    picks["a"] += d["picked_a"]
                    picks["b"] += d["picked_b"]
                    picks["pairs"] += 1
                    picks["consistent"] += d["consistent"]
            print(json.dumps(out, ensure_ascii=False), flush=True)
        pending.clear()

    with input.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                pending.append((n, parse_row(json_object(line), mode)))
            except BadLineError as e:
                pending.append((n, f"line {n}: {e}"))
                failed += 1
            if len(pending) >= CHUNK:
                flush()
    flush()
    m = judge.metrics()
    summary = (
        f"judge: {int(m['judge/judgements'])} judgements, {int(m['judge/requests'])} requests "
        f"({int(m['judge/retries'])} retries, {int(m['judge/cache_hits'])} cached), "
        f"{int(m['judge/unparsable'])} unparsable ({int(m['judge/echoed'])} with a verdict dropped as an "
        f"echo), {m['judge/latency_s_mean']:.3f} s mean latency"
    )
    if m["judge/claimed"]:  # rule 4: responses claiming a score, and those the judge gave that score
        summary += (
            f"; {int(m['judge/claimed'])} response(s) claiming a score, {int(m['judge/adopted'])} given "
            "the score claimed (not paid)"
        )
    if picks["pairs"]:
        decisive = picks["a"] + picks["b"]
        bias = (picks["a"] - picks["b"]) / decisive if decisive else 0.0
        summary += (
            f"; pairwise: consistent {picks['consistent']}/{picks['pairs']}, position A chosen "
            f"{picks['a']} times and B {picks['b']} (position bias {bias:+.2f})"
        )
    typer.echo(summary, err=True)
    judge.close()
    if failed:
        raise typer.Exit(1)
