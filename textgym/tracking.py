"""Where a stage's metrics go: `metrics.jsonl` always, plus the trackers a run asks for.

A run chooses its trackers by name (`log_with`); `make_loggers` builds one logger per name
behind a single `CompositeLogger`. Every logger has the interface the trainers use:
`log(step, metrics)` once per logged step (`metrics` maps slash-namespaced keys such as
`rollout/reward_mean` to floats) and `close()` once at the end.

| name          | writes to (under the stage directory)        | needs                        |
|---------------|----------------------------------------------|------------------------------|
| (always)      | `metrics.jsonl`, one JSON object per step    | -                            |
| `tensorboard` | `tb/` event files                            | tensorboard (a dependency)   |
| `wandb`       | `wandb/offline-run-*/` (offline by default)  | `pip install textgym[trackers]` |
| `mlflow`      | `mlruns/`, an MLflow file store              | `pip install textgym[trackers]` |
| `trackio`     | `trackio/<project>.db` (SQLite)              | `pip install textgym[trackers]` |

Nothing is sent over the network unless asked: W&B runs in offline mode unless `WANDB_MODE`
says otherwise (`wandb sync <dir>` uploads an offline run later); MLflow writes a local file
store unless `MLFLOW_TRACKING_URI` names another; trackio writes its local SQLite storage
unless `TRACKIO_SPACE_ID` / `TRACKIO_SERVER_URL` point it elsewhere.

The trainers call `metrics_logger` (these loggers on rank 0, nothing on the other ranks) and
`progress_bar` (tqdm on stderr).

Resuming: `metrics.jsonl` drops the records after the checkpoint's step and TensorBoard purges
its events after it (as before); W&B, MLflow and trackio start a new run, which logs the steps
after the checkpoint and records `resume_step` in its config.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

TRACKERS = ("tensorboard", "wandb", "mlflow", "trackio")
"""The names `log_with` accepts."""

DEFAULT_PROJECT = "textgym"
"""The W&B project, MLflow experiment and trackio project runs are filed under by default."""


class Logger(Protocol):
    """What a trainer calls: `log` once per logged step, `close` once at the end."""

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record `metrics` (slash-namespaced keys → floats) at `step`."""

    def close(self) -> None:
        """Flush and release the tracker."""


class TrackerUnavailableError(ImportError):
    """A tracker named in `log_with` whose package is not installed."""


def _require(module: str, tracker: str) -> Any:
    """Import `module` for `tracker`, or raise `TrackerUnavailableError` with the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise TrackerUnavailableError(
            f"log_with: {tracker!r} needs the {module!r} package; install the trackers extra: "
            f"pip install 'textgym[trackers]'"
        ) from e


def check_log_with(names: Iterable[str]) -> list[str]:
    """Validate tracker names (for a config validator): known, no repeats; return them as a list.

    Raises:
        ValueError: on an unknown or repeated name.
    """
    names = list(names)
    unknown = [n for n in names if n not in TRACKERS]
    if unknown:
        raise ValueError(f"log_with: unknown tracker(s) {unknown}; choose from {list(TRACKERS)}")
    if len(set(names)) != len(names):
        raise ValueError(f"log_with: a tracker is named twice in {names}")
    return names


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """`{"optim": {"lr": 1e-3}}` → `{"optim.lr": 1e-3}` (lists and scalars are leaves)."""
    out: dict[str, Any] = {}
    for k, v in config.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping) and v:
            out.update(flatten_config(v, key + "."))
        else:
            out[key] = v
    return out


class JsonlLogger:
    """Append one JSON object per step to `<stage_dir>/metrics.jsonl`; on resume, drop later records.

    A record is `{"step": step, "time": unix_seconds, **metrics}` (values as floats).
    """

    def __init__(self, stage_dir: Path, resume_step: int | None = None):
        self.path = Path(stage_dir) / "metrics.jsonl"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and self.path.exists():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Append one record."""
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")

    def close(self) -> None:
        """Nothing to release (each record is written and closed at once)."""


class TensorBoardLogger:
    """TensorBoard scalars in `<stage_dir>/tb/`; on resume, events after `resume_step` are purged."""

    def __init__(self, stage_dir: Path, resume_step: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(
            log_dir=str(Path(stage_dir) / "tb"),
            purge_step=None if resume_step is None else resume_step + 1,
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One scalar per key at `step`, flushed."""
        for k, v in metrics.items():
            self.tb.add_scalar(k, float(v), step)
        self.tb.flush()

    def close(self) -> None:
        """Close the event writer."""
        self.tb.close()


class WandbLogger:
    """A Weights & Biases run, offline by default, written under `<stage_dir>/wandb/`.

    The mode is `WANDB_MODE` when set, else "offline" (nothing leaves the machine; upload
    later with `wandb sync <stage_dir>/wandb/offline-run-*`). System statistics, git state and
    code saving are off, so the run holds the metrics and the config alone.

    Raises:
        TrackerUnavailableError: when `wandb` is not installed.
    """

    def __init__(
        self,
        stage_dir: Path,
        run_name: str,
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
        project: str = DEFAULT_PROJECT,
    ):
        wandb = _require("wandb", "wandb")
        Path(stage_dir).mkdir(parents=True, exist_ok=True)
        settings = wandb.Settings(
            silent=True,
            console="off",
            disable_git=True,
            save_code=False,
            x_disable_stats=True,
            x_disable_machine_info=True,
        )
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", project),
            name=run_name,
            dir=str(stage_dir),
            config=_with_resume(config, resume_step),
            mode=os.environ.get("WANDB_MODE", "offline"),
            reinit="create_new",
            settings=settings,
        )

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """One history row at `step` (W&B needs steps to increase within a run)."""
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run (writes its last records)."""
        self.run.finish()


_MLFLOW_BAD_CHARS = re.compile(r"[^\w./\- :]")


class MLflowLogger:
    """An MLflow run in a local file store, `<stage_dir>/mlruns/`, unless `MLFLOW_TRACKING_URI` is set.

    The run is filed under the experiment `project`; the config goes in as parameters
    (flattened to `a.b.c` keys; values longer than MLflow's limit are cut). MLflow 3 keeps the
    file store in maintenance mode behind `MLFLOW_ALLOW_FILE_STORE`; for a `file:` URI this
    logger sets it to "true" unless it is set already. Read a run back with
    `mlflow.tracking.MlflowClient(tracking_uri=logger.tracking_uri)`.

    Raises:
        TrackerUnavailableError: when `mlflow` (or `mlflow-skinny`) is not installed.
    """

    MAX_PARAM_CHARS = 6000
    BATCH = 1000  # MLflow's limit on metrics per log_batch call

    def __init__(
        self,
        stage_dir: Path,
        run_name: str,
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
        project: str = DEFAULT_PROJECT,
    ):
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (Path(stage_dir).resolve() / "mlruns").as_uri()
        if uri.startswith("file:"):
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        mlflow = _require("mlflow", "mlflow")
        from mlflow.tracking import MlflowClient

        self._entities = mlflow.entities
        self.tracking_uri = uri
        self.client = MlflowClient(tracking_uri=uri)
        experiment = self.client.get_experiment_by_name(project)
        experiment_id = (
            experiment.experiment_id if experiment is not None else self.client.create_experiment(project)
        )
        self.run_id: str = self.client.create_run(experiment_id, run_name=run_name).info.run_id
        params = [
            self._entities.Param(_MLFLOW_BAD_CHARS.sub("_", k)[:250], json.dumps(v)[: self.MAX_PARAM_CHARS])
            for k, v in flatten_config(_with_resume(config, resume_step)).items()
        ]
        for i in range(0, len(params), 100):  # MLflow's limit on params per call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Every metric at `step`, in one batch (keys with characters MLflow refuses get `_`)."""
        now = int(time.time() * 1000)
        rows = [
            self._entities.Metric(_MLFLOW_BAD_CHARS.sub("_", k), float(v), now, step)
            for k, v in metrics.items()
        ]
        for i in range(0, len(rows), self.BATCH):
            self.client.log_batch(self.run_id, metrics=rows[i : i + self.BATCH])

    def close(self) -> None:
        """Mark the run finished."""
        self.client.set_terminated(self.run_id)


class TrackioLogger:
    """A trackio run in trackio's local SQLite storage (`<TRACKIO_DIR>/<project>.db`).

    trackio reads its storage folder from `TRACKIO_DIR` once, when it is first imported; if
    that has not happened and `TRACKIO_DIR` is unset, this logger sets it to
    `<stage_dir>/trackio`. Later stages of the same process then write to that same folder
    (one database, one run per stage); `directory` says where. GPU/CPU system logging is off
    and trackio's console messages are swallowed. `trackio show --project textgym` (with the
    same `TRACKIO_DIR`) opens the dashboard.

    Raises:
        TrackerUnavailableError: when `trackio` is not installed.
    """

    def __init__(
        self,
        stage_dir: Path,
        run_name: str,
        config: Mapping[str, Any] | None = None,
        resume_step: int | None = None,
        project: str = DEFAULT_PROJECT,
    ):
        if "trackio" not in sys.modules and not os.environ.get("TRACKIO_DIR"):
            os.environ["TRACKIO_DIR"] = str(Path(stage_dir).resolve() / "trackio")
        trackio = _require("trackio", "trackio")
        from trackio.utils import TRACKIO_DIR

        self.directory = Path(TRACKIO_DIR)
        self.project = project
        with contextlib.redirect_stdout(io.StringIO()):
            self.run = trackio.init(
                project=project,
                name=run_name,
                config=_with_resume(config, resume_step),
                auto_log_gpu=False,
                auto_log_cpu=False,
                embed=False,
            )
        self.name: str = self.run.name

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Every metric at `step`."""
        self.run.log({k: float(v) for k, v in metrics.items()}, step=step)

    def close(self) -> None:
        """Finish the run (flushes the pending rows to the database)."""
        with contextlib.redirect_stdout(io.StringIO()):
            self.run.finish()


class CompositeLogger:
    """Several loggers behind one: `log` and `close` go to each, in order.

    `close` closes every logger even when one raises, then raises the first error.
    """

    def __init__(self, loggers: Iterable[Logger]):
        self.loggers = list(loggers)

    def log(self, step: int, metrics: Mapping[str, float]) -> None:
        """Log to every logger."""
        for lg in self.loggers:
            lg.log(step, metrics)

    def close(self) -> None:
        """Close every logger."""
        errors: list[BaseException] = []
        for lg in self.loggers:
            try:
                lg.close()
            except Exception as e:  # the others still get closed
                errors.append(e)
        if errors:
            raise errors[0]


def make_loggers(
    log_with: Iterable[str],
    run_dir: Path,
    run_name: str,
    config_dict: Mapping[str, Any] | None = None,
    *,
    resume_step: int | None = None,
    project: str = DEFAULT_PROJECT,
    main_process: bool | None = None,
) -> CompositeLogger:
    """The loggers of one stage: `metrics.jsonl` always, then one per name in `log_with`.

    `make_loggers(["tensorboard"], stage_dir, ...)` writes exactly what the trainers wrote
    before trackers existed (`metrics.jsonl` and `tb/`).

    Args:
        log_with: tracker names, from `TRACKERS` ("tensorboard", "wandb", "mlflow", "trackio").
        run_dir: the folder the stage writes to (`metrics.jsonl`, `tb/`, `wandb/`, `mlruns/`,
            `trackio/` go under it).
        run_name: the run's name in W&B, MLflow and trackio (e.g. "quickstart/grpo").
        config_dict: the stage's resolved config, JSON-like (`cfg.model_dump(mode="json")`),
            recorded as the W&B config, MLflow parameters and trackio config.
        resume_step: the checkpoint's step when the stage resumes (see the module docstring).
        project: W&B project, MLflow experiment and trackio project.
        main_process: whether this process writes; default `textgym.distributed.is_main()`.
            Elsewhere the result logs nothing (rank 0 alone writes the run directory).

    Raises:
        ValueError: on an unknown or repeated tracker name.
        TrackerUnavailableError: when a named tracker's package is not installed.
    """
    names = check_log_with(log_with)
    if main_process is None:
        from textgym import distributed

        main_process = distributed.is_main()
    if not main_process:
        return CompositeLogger([])
    run_dir = Path(run_dir)
    loggers: list[Logger] = [JsonlLogger(run_dir, resume_step)]
    try:
        for name in names:
            if name == "tensorboard":
                loggers.append(TensorBoardLogger(run_dir, resume_step))
            else:
                tracker: Callable[..., Logger] = _TRACKER_CLASSES[name]
                loggers.append(tracker(run_dir, run_name, config_dict, resume_step, project))
    except BaseException:
        CompositeLogger(loggers).close()  # release what was opened before the failure
        raise
    return CompositeLogger(loggers)


_TRACKER_CLASSES: dict[str, Callable[..., Logger]] = {
    "wandb": WandbLogger,
    "mlflow": MLflowLogger,
    "trackio": TrackioLogger,
}


def _with_resume(config: Mapping[str, Any] | None, resume_step: int | None) -> dict[str, Any]:
    """The config to record, with `resume_step` added when the stage resumes."""
    out = dict(config or {})
    if resume_step is not None:
        out["resume_step"] = resume_step
    return out


# --- what the trainers call (rank 0 writes; the progress bar) ---------------------------------
def MetricsLogger(stage_dir: Path, resume_step: int | None = None) -> CompositeLogger:  # noqa: N802
    """`metrics.jsonl` and TensorBoard for a stage, on any rank (the name of textgym 0.1's class).

    Same as `make_loggers(["tensorboard"], stage_dir, ..., main_process=True)`;
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
    "mlflow", "trackio"; `make_loggers`). The run name in the trackers is
    `<run>/<stage>` (the run directory's and the stage directory's names); `config`, a pydantic
    stage config, is recorded as the trackers' run config.

    Raises:
        ValueError: an unknown or repeated tracker name.
        TrackerUnavailableError: a named tracker's package is not installed.
    """
    from textgym import distributed  # torch: only when a trainer asks

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
