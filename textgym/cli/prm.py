"""`textgym prm label` and `textgym prm train`: a process reward model from a run config's `prm:` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from textgym.cli._common import console, fail

prm_app = typer.Typer(
    help="Process reward models: Monte-Carlo step labels, then a per-step scorer trained on them.",
    no_args_is_help=True,
)

Config = Annotated[Path, typer.Argument(help="YAML run config with a prm stage.")]
Overrides = Annotated[list[str] | None, typer.Argument(help="Overrides such as prm.label.tasks=64.")]


def _load(config: Path, overrides: list[str] | None):  # type: ignore[no-untyped-def]
    from textgym.config import ConfigError, load_config

    try:
        return load_config(config, overrides or [])
    except ConfigError as e:
        fail(str(e))


@prm_app.command("label")
def prm_label_cmd(config: Config, overrides: Overrides = None) -> None:
    """Answer CONFIG's `prm.label` tasks with the policy and label every step by K continuations.

    A step's soft label is the share of continuations from its end that reach the correct
    answer, its hard label whether any does (Math-Shepherd); the labels file is `prm.label.out`.
    """
    from textgym.config import ConfigError
    from textgym.stages.process_reward import run_prm_label

    cfg = _load(config, overrides)
    try:
        res = run_prm_label(cfg, echo=console.print)
    except ConfigError as e:
        fail(str(e))
    agree = (
        f"; labels agree with the env's step checker on {res['agreement_soft']:.3f}"
        if "agreement_soft" in res
        else ""
    )
    console.print(
        f"labels in {res['out']}: {res['answers']} answers ({res['answer_accuracy']:.3f} correct), "
        f"{res['steps']} steps, mean soft label {res['soft_mean']:.3f}, hard {res['hard_mean']:.3f}{agree}; "
        f"{res['wall_time_s']:.0f}s"
    )


@prm_app.command("train")
def prm_train_cmd(config: Config, overrides: Overrides = None) -> None:
    """Train CONFIG's process reward model on its labels; print held-out step accuracy."""
    from textgym.config import ConfigError
    from textgym.stages.process_reward import run_prm_train

    cfg = _load(config, overrides)
    try:
        res = run_prm_train(cfg, echo=console.print)
    except (ConfigError, FileNotFoundError, ValueError) as e:
        fail(str(e))
    console.print(
        f"process reward model in {res['out']}: held-out step accuracy {res['heldout_step_accuracy']:.3f} "
        f"(before training {res['heldout_step_accuracy_before']:.3f}, majority class "
        f"{res['heldout_majority_baseline']:.3f}) on {res['heldout_steps']} steps; against the env's checker "
        f"{res['heldout_gold_step_accuracy']:.3f}; {res['train_steps']} training steps, "
        f"{res['wall_time_s']:.0f}s"
    )
