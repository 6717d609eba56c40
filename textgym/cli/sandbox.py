"""`textgym sandbox check` (which backends run here) and `textgym sandbox build-image` (the docker image)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from textgym.cli._common import console, fail

sandbox_app = typer.Typer(
    help="Isolated code execution: check backends, build the docker image.", no_args_is_help=True
)


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
        fail(str(e), code=1)
    console.print(
        f"built {facts['image']} ({facts['id'][:19]}): python {facts['version']} from {facts['python']}, "
        f"{facts['files']} files, {facts['bytes'] / 1e6:.1f} MB"
    )
