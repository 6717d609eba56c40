"""Where a trainer's metrics go: `metrics.jsonl` and TensorBoard on rank 0, and the progress bar.

Keys are slash-namespaced (`rollout/reward_mean`, `loss/policy`, `time/step_s`).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from textgym import distributed


class MetricsLogger:
    """Append metrics to `metrics.jsonl` and TensorBoard; on resume, drop records past the checkpoint.

    Keys are slash-namespaced (`rollout/reward_mean`, `loss/policy`, `time/step_s`).
    """

    def __init__(self, stage_dir: Path, resume_step: int | None = None):
        self.path = stage_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(
            log_dir=str(stage_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one record (`{"step": step, **metrics}`)."""
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in metrics.items():
            self.tb.add_scalar(k, float(v), step)
        self.tb.flush()

    def close(self) -> None:
        """Close the TensorBoard writer."""
        self.tb.close()


class NullLogger:
    """The metrics logger of ranks other than 0: drops everything."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


def metrics_logger(
    stage_dir: Path,
    resume_step: int | None = None,
    log_with: Sequence[str] = ("tensorboard",),
    config: Any = None,
) -> Any:
    """The stage's loggers on rank 0 (rank 0 alone writes the run directory), nothing elsewhere.

    `metrics.jsonl` always, then one tracker per name in `log_with` ("tensorboard", "wandb",
    "mlflow", "trackio"; `textgym.tracking.make_loggers`). The run name in the trackers is
    `<run>/<stage>` (the run directory's and the stage directory's names); `config`, a pydantic
    stage config, is recorded as the trackers' run config.

    Raises:
        ValueError: an unknown or repeated tracker name.
        textgym.tracking.TrackerUnavailableError: a named tracker's package is not installed.
    """
    from textgym.tracking import make_loggers

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
