"""Where a trainer's metrics go: `metrics.jsonl` and TensorBoard on rank 0, and the progress bar.

Keys are slash-namespaced (`rollout/reward_mean`, `loss/policy`, `time/step_s`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textgym import distributed
from textgym.tracking import CompositeLogger, make_loggers


def MetricsLogger(stage_dir: Path, resume_step: int | None = None) -> CompositeLogger:  # noqa: N802
    """`metrics.jsonl` and TensorBoard for a stage, on any rank (the name of textgym 0.1's class).

    Same as `textgym.tracking.make_loggers(["tensorboard"], stage_dir, ..., main_process=True)`;
    trainers call `metrics_logger`, which adds the other trackers and writes on rank 0 only.
    """
    return make_loggers(
        ["tensorboard"], stage_dir, Path(stage_dir).name, resume_step=resume_step, main_process=True
    )


def NullLogger() -> CompositeLogger:  # noqa: N802
    """A logger that drops everything (what ranks other than 0 get from `metrics_logger`)."""
    return CompositeLogger([])


def metrics_logger(
    stage_dir: Path,
    resume_step: int | None = None,
    log_with: Sequence[str] = ("tensorboard",),
    config: Any = None,
) -> CompositeLogger:
    """The stage's loggers on rank 0 (rank 0 alone writes the run directory), nothing elsewhere.

    `metrics.jsonl` always, then one tracker per name in `log_with` ("tensorboard", "wandb",
    "mlflow", "trackio"; `textgym.tracking.make_loggers`). The run name in the trackers is
    `<run>/<stage>` (the run directory's and the stage directory's names); `config`, a pydantic
    stage config, is recorded as the trackers' run config.

    Raises:
        ValueError: an unknown or repeated tracker name.
        textgym.tracking.TrackerUnavailableError: a named tracker's package is not installed.
    """
    stage_dir = Path(stage_dir)
    config_dict = config.model_dump(mode="json") if hasattr(config, "model_dump") else None
    return make_loggers(
        log_with,
        stage_dir,
        run_name=f"{stage_dir.parent.name}/{stage_dir.name}",
        config_dict=config_dict,
        resume_step=resume_step,
        main_process=distributed.is_main(),
    )


def progress_bar(total: int, initial: int, desc: str, disable: bool = False) -> Any:
    """A tqdm bar on stderr (disabled when asked, or off a terminal unless TEXTGYM_PROGRESS is set)."""
    from tqdm.auto import tqdm

    disable = disable or not (sys.stderr.isatty() or os.environ.get("TEXTGYM_PROGRESS"))
    return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True)
