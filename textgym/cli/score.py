"""`textgym score` (an env's verifier on completions made elsewhere) and `textgym verify math`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import BadLineError, EnvKwargs, make_env, map_jsonl, parse_kwargs

verify_app = typer.Typer(help="Run a verifier on completions from a file.", no_args_is_help=True)


def score_cmd(
    env: Annotated[str, typer.Option(help="Environment id.")],
    input: Annotated[
        Path, typer.Option("--input", help='JSONL: {"task_index": i, "completion": "..."} per line.')
    ],
    env_kwargs: EnvKwargs = None,
) -> None:
    """Score completions produced elsewhere: one JSON line out per line in, in order."""
    e = make_env(env, parse_kwargs(env_kwargs))

    def score(row: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(row.get("task_index"), int) or "completion" not in row:
            raise BadLineError("needs an integer 'task_index' and a 'completion'")
        try:
            e.reset(options={"task_index": row["task_index"]})
        except ValueError as exc:
            raise BadLineError(str(exc)) from None
        _, reward, _, _, info = e.step(row["completion"])
        out = {"task_index": row["task_index"], "reward": float(reward)}
        out.update({k: v for k, v in info.items() if k.startswith("reward/")})
        if "error" in info:
            out["reason"] = info["error"]
        return out

    map_jsonl(input, score)


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
            raise BadLineError("needs a string 'completion' and an 'answer'")
        if not str(answer).strip():
            raise BadLineError("empty 'answer'")
        s = v(completion, Task(task_id="line", prompt="", answer=str(answer)))
        out = {"reward": s.reward, "extracted": s.details.get("extracted"), "parsed": s.details.get("parsed")}
        if "error" in s.details:
            out["reason"] = s.details["error"]
        return out

    map_jsonl(input, check)
