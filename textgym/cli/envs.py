"""`textgym envs` (the registered environments) and `textgym plot` (a run's training curves)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from textgym.cli._common import console, fail


def envs_cmd() -> None:
    """List the registered textgym environment ids with a one-line description."""
    import importlib

    import gymnasium as gym

    table = Table("id", "description")
    for env_id, spec in sorted(gym.registry.items()):
        if not env_id.startswith("textgym/"):
            continue
        mod, _, cls = str(spec.entry_point).partition(":")
        doc = (getattr(importlib.import_module(mod), cls).__doc__ or "").strip().splitlines()
        table.add_row(env_id, doc[0] if doc else "")
    console.print(table)


def plot_cmd(
    run_dir: Annotated[
        Path, typer.Argument(help="A run directory (runs/NAME) or one stage of it (runs/NAME/grpo).")
    ],
) -> None:
    """Write PNG training curves (reward, accuracy, KL, response length, loss) for each stage."""
    from textgym.evaluation.plotting import plot_run

    if not run_dir.is_dir():
        fail(f"run directory {str(run_dir)!r} not found")
    written = plot_run(run_dir)
    if not written:
        fail(f"no metrics.jsonl under {run_dir}", code=1)
    for p in written:
        console.print(f"wrote {p}")
