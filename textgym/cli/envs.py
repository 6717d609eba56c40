"""`textgym envs` (the registered environments) and `textgym plot` (a run's training curves)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from textgym.cli._common import console, fail


def envs_cmd(
    all_ids: Annotated[
        bool, typer.Option("--all", help="Also list gymnasium's own ids (classic control, toy text, ...).")
    ] = False,
) -> None:
    """List every registered env id (textgym's, imported modules', installed packages') and its namespace."""
    import gymnasium as gym

    from textgym.envs.registry import env_ids

    table = Table("namespace", "id", "description")
    for env_id in env_ids(include_gymnasium=all_ids):
        spec = gym.registry[env_id]
        table.add_row(spec.namespace or "", env_id, _describe(spec.entry_point))
    console.print(table)


def _describe(entry_point: object) -> str:
    """First docstring line of an env's entry point (imported when named by a string); never raises."""
    import importlib

    target = entry_point
    if isinstance(entry_point, str):
        mod, _, attr = entry_point.partition(":")
        try:
            target = getattr(importlib.import_module(mod), attr)
        except Exception as e:  # an optional dependency missing: say so rather than fail the listing
            return f"(cannot import {mod}: {type(e).__name__})"
    doc = (getattr(target, "__doc__", None) or "").strip().splitlines()
    return doc[0] if doc else ""


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
