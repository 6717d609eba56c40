"""Models: `textgym model init`, `textgym check-template` and `textgym serve`.

`model init` builds a model locally, `check-template` checks its chat template, `serve` serves it
over an OpenAI-compatible API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from textgym.cli._common import console, fail

model_app = typer.Typer(help="Build models locally.", no_args_is_help=True)


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
        fail(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    if tokenizer not in ("bpe", "byte"):
        fail(f"unknown tokenizer {tokenizer!r}; choose bpe or byte")
    path = init_model(preset, out, seed=seed, tokenizer=tokenizer)
    model, _ = load_model(path)
    console.print(f"saved {preset} model ({count_parameters(model):,} parameters) to {path}")


def check_template_cmd(
    model_dir: Annotated[Path, typer.Argument(help="A local Hugging Face model (or tokenizer) folder.")],
) -> None:
    """Check that a chat template is append-only for multi-turn tool conversations (exit 1 if not)."""
    from transformers import AutoTokenizer

    from textgym.agents.template_check import check_template

    if not model_dir.is_dir():
        fail(f"model folder {str(model_dir)!r} not found")
    try:
        report = check_template(AutoTokenizer.from_pretrained(model_dir))
    except (OSError, ValueError) as e:
        fail(f"cannot check the template of {model_dir}: {e}")
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


def serve_cmd(
    model_dir: Annotated[Path, typer.Argument(help="A local Hugging Face model folder.")],
    port: Annotated[int, typer.Option(min=0, max=65535, help="TCP port.")] = 8000,
    host: Annotated[str, typer.Option(help="Address to bind (default: this machine only).")] = "127.0.0.1",
    served_model_name: Annotated[str | None, typer.Option(help="Model name clients ask for.")] = None,
    device: Annotated[str, typer.Option(help="cpu, cuda, ... (transformers backend)")] = "cpu",
    backend: Annotated[str, typer.Option(help="Generation backend: transformers or vllm.")] = "transformers",
    max_queue: Annotated[
        int, typer.Option(min=1, help="Requests that may wait for generation; more are answered 503.")
    ] = 256,
    max_batch: Annotated[int, typer.Option(min=1, help="Responses (requests x n) generated together.")] = 256,
    weight_sync: Annotated[
        bool,
        typer.Option(
            help="Let a trainer push new weights (/weights/* endpoints; docs/training/rollout-servers.md)."
        ),
    ] = False,
) -> None:
    """Serve a local model over an OpenAI-compatible API: /v1/models, /v1/completions, chat.

    Every response carries `policy_version`; with --weight-sync a trainer pushes new weights.
    """
    import uvicorn

    from textgym.serve import build_app

    if not model_dir.is_dir():
        fail(f"model folder {str(model_dir)!r} not found")
    try:
        server_app = build_app(
            model_dir,
            served_model_name,
            device,
            backend,
            max_queue=max_queue,
            max_batch=max_batch,
            weight_sync=weight_sync,
        )
    except (OSError, ValueError, ImportError) as e:
        fail(f"cannot load {model_dir}: {e}")
    uvicorn.run(server_app, host=host, port=port, log_level="warning")
