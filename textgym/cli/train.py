"""`textgym train`: a YAML config's stages (SFT, then GRPO family, PPO or preference) with an evaluation."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from textgym.cli._common import console, leave_world


def train_cmd(
    config: Annotated[Path, typer.Argument(help="YAML run config (see configs/).")],
    overrides: Annotated[list[str] | None, typer.Argument(help="Overrides such as grpo.steps=10.")] = None,
    resume: Annotated[
        bool, typer.Option(help="Continue the run directory from its newest checkpoint.")
    ] = False,
    overwrite: Annotated[bool, typer.Option(help="Delete an existing run directory first.")] = False,
) -> None:
    """Train per the config: optional SFT, then GRPO-family or PPO, with a before/after evaluation.

    Under `torchrun --nproc-per-node N -m textgym train CONFIG` the stages train on N ranks.
    """
    from textgym.agents.openai_backend import EndpointError
    from textgym.config import ConfigError, load_config
    from textgym.envs.registry import EnvError
    from textgym.pipeline import run
    from textgym.training.sources.servers import WeightSyncError
    from textgym.verifiers.judge_client import JudgeError

    # the command that continues this run: the same config and overrides, with --resume
    words = [str(config), *(overrides or [])]
    again = " ".join(["textgym train", *(shlex.quote(w) for w in words), "--resume"])
    try:
        cfg = load_config(config, overrides or [])
        summary = run(cfg, resume=resume, overwrite=overwrite, echo=console.print)
    except ConfigError as e:
        leave_world(error=e)
    except EnvError as e:
        # An env raised mid-run: say which env, task and action; the run directory keeps its
        # last checkpoint, logs and trajectories, so the run resumes once the env is fixed.
        leave_world(
            error=RuntimeError(
                f"{e}\nThe run directory {cfg.run_dir} keeps its last checkpoint and logs: fix the env, "
                f"then continue with `{again}`."
            ),
            code=1,
        )
    except JudgeError as e:  # the judge's endpoint failed mid-run (4xx, or 5xx after the retries)
        leave_world(
            error=RuntimeError(
                f"{e}\nThe run directory {cfg.run_dir} keeps its last checkpoint and logs: once the judge "
                f"answers again, continue with `{again}`."
            ),
            code=1,
        )
    except (WeightSyncError, EndpointError) as e:  # a rollout server died, hung or refused mid-run
        leave_world(
            error=RuntimeError(
                f"{type(e).__name__}: {e}\nThe run directory {cfg.run_dir} keeps its last checkpoint "
                "and logs: "
                f"once every rollout server answers again, continue with `{again}` "
                "(the first push after the resume sends the checkpoint's weights)."
            ),
            code=1,
        )
    if not leave_world():
        return
    if "accuracy_before" in summary:
        console.print(_before_after_table(cfg.name, summary))
    console.print(f"wall time {summary['wall_time_s']:.0f}s · summary in {cfg.run_dir / 'summary.json'}")


def _before_after_table(name: str, summary: dict[str, Any]) -> Table:
    """Accuracy and mean reward before and after training, titled with the eval env and its kwargs."""
    kwargs = " ".join(f"{k}={v!r}" for k, v in summary["eval_env_kwargs"].items())
    table = Table(title=f"{name} · {summary['eval_env']} · n={summary['n_eval']}", caption=kwargs)
    table.add_column("")
    table.add_column("before", justify="right")
    table.add_column("after", justify="right")
    table.add_row("accuracy", f"{summary['accuracy_before']:.3f}", f"{summary['accuracy_after']:.3f}")
    table.add_row(
        "mean reward", f"{summary['mean_reward_before']:.3f}", f"{summary['mean_reward_after']:.3f}"
    )
    return table
