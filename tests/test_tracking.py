"""Trackers beside TensorBoard: each writes offline to a temp dir, and what it logged reads back."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from textgym.tracking import (
    TRACKERS,
    CompositeLogger,
    TrackerUnavailableError,
    check_log_with,
    flatten_config,
    make_loggers,
)

ROOT = Path(__file__).resolve().parents[1]
CONFIG = {"env": {"id": "textgym/Arithmetic-v0", "kwargs": {"digits": 2}}, "optim": {"lr": 3e-4}, "steps": 3}
STEPS = {
    1: {"loss/policy": 0.5, "rollout/reward_mean": 0.25},
    2: {"loss/policy": 0.25, "rollout/reward_mean": 0.5},
}


def needs(module: str):
    return pytest.mark.skipif(
        importlib.util.find_spec(module) is None,
        reason=f"{module} is not installed (pip install 'textgym[trackers]')",
    )


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    for var in ("MLFLOW_TRACKING_URI", "WANDB_PROJECT", "TRACKIO_SPACE_ID", "TRACKIO_SERVER_URL"):
        monkeypatch.delenv(var, raising=False)


def log_steps(logger) -> None:
    for step, metrics in STEPS.items():
        logger.log(step, metrics)
    logger.close()


def test_tensorboard_loggers_write_what_the_trainers_metrics_logger_writes(tmp_path):
    """`metrics.jsonl` and `tb/` as textgym 0.1's trainers wrote them (its `MetricsLogger` name
    is kept, now built by `make_loggers`)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from textgym.tracking import MetricsLogger

    log_steps(MetricsLogger(tmp_path / "old"))
    log_steps(make_loggers(["tensorboard"], tmp_path / "new", "run/stage", CONFIG, main_process=True))
    for d in ("old", "new"):
        rows = [json.loads(line) for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        assert [{k: v for k, v in r.items() if k != "time"} for r in rows] == [
            {"step": s, **m} for s, m in STEPS.items()
        ]
        assert all(abs(r["time"] - time.time()) < 600 for r in rows)
        events = EventAccumulator(str(tmp_path / d / "tb"))
        events.Reload()
        assert [(e.step, e.value) for e in events.Scalars("loss/policy")] == [(1, 0.5), (2, 0.25)]


def test_a_resumed_stage_drops_the_records_after_its_checkpoint(tmp_path):
    log_steps(make_loggers(["tensorboard"], tmp_path, "r", main_process=True))
    resumed = make_loggers(["tensorboard"], tmp_path, "r", resume_step=1, main_process=True)
    resumed.log(2, {"loss/policy": 0.125})
    resumed.close()
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["loss/policy"]) for r in rows] == [(1, 0.5), (2, 0.125)]


def test_metrics_jsonl_is_always_written_and_other_ranks_write_nothing(tmp_path):
    log_steps(make_loggers([], tmp_path / "main", "r", main_process=True))
    assert len((tmp_path / "main" / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (tmp_path / "main" / "tb").exists()
    log_steps(make_loggers(["tensorboard"], tmp_path / "rank1", "r", main_process=False))
    assert not (tmp_path / "rank1").exists()


def test_unknown_or_repeated_tracker_names_are_refused(tmp_path):
    assert check_log_with(TRACKERS) == list(TRACKERS)
    with pytest.raises(ValueError, match="unknown tracker"):
        make_loggers(["tensorbored"], tmp_path, "r", main_process=True)
    with pytest.raises(ValueError, match="twice"):
        check_log_with(["wandb", "wandb"])


def test_a_tracker_whose_package_is_missing_says_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb -> ImportError
    with pytest.raises(TrackerUnavailableError, match=r"textgym\[trackers\]"):
        make_loggers(["tensorboard", "wandb"], tmp_path, "r", main_process=True)


def test_composite_logger_closes_every_logger_even_when_one_fails():
    closed = []

    class Broken:
        def log(self, step, metrics):
            pass

        def close(self):
            closed.append("broken")
            raise RuntimeError("disk full")

    class Fine(Broken):
        def close(self):
            closed.append("fine")

    with pytest.raises(RuntimeError, match="disk full"):
        CompositeLogger([Broken(), Fine()]).close()
    assert closed == ["broken", "fine"]


def test_flatten_config_joins_nested_keys_with_dots():
    assert flatten_config(CONFIG) == {
        "env.id": "textgym/Arithmetic-v0",
        "env.kwargs.digits": 2,
        "optim.lr": 3e-4,
        "steps": 3,
    }


def read_wandb_records(path: Path) -> list:
    """The records of a `.wandb` transaction log (LevelDB log format: 32 KiB blocks of chunks)."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        pos += 7
        if kind == 0 and length == 0:
            pos += left - 7
            continue
        chunk += data[pos : pos + length]
        pos += length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunk)
            records.append(record)
            chunk = b""
    return records


@needs("wandb")
def test_wandb_offline_run_holds_the_logged_metrics_and_config(tmp_path):
    log_steps(make_loggers(["wandb"], tmp_path, "quickstart/grpo", CONFIG, main_process=True))
    import wandb

    wandb.teardown()  # the W&B service process writes the run file; this waits for it
    (run_file,) = [Path(p) for p in glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))]
    records = read_wandb_records(run_file)
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            # a flat key is in `key` or alone in `nested_key`, depending on the W&B version
            items = {i.key or ".".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            history[items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
    assert history == STEPS
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.display_name == "quickstart/grpo" and run.project == "textgym"
    config = {i.key: json.loads(i.value_json) for i in run.config.update if not i.key.startswith("_")}
    assert config == CONFIG


@needs("mlflow")
def test_mlflow_file_store_holds_the_logged_metrics_and_params(tmp_path):
    from mlflow.tracking import MlflowClient

    logger = make_loggers(["mlflow"], tmp_path, "quickstart/grpo", CONFIG, resume_step=0, main_process=True)
    log_steps(logger)
    (mlf,) = logger.loggers[1:]
    assert mlf.tracking_uri == (tmp_path / "mlruns").as_uri()
    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("textgym").experiment_id])
    assert run.info.run_name == "quickstart/grpo" and run.info.status == "FINISHED"
    for key in STEPS[1]:
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(s, STEPS[s][key]) for s in STEPS]
    assert run.data.params == {
        "env.id": '"textgym/Arithmetic-v0"',
        "env.kwargs.digits": "2",
        "optim.lr": "0.0003",
        "steps": "3",
        "resume_step": "0",
    }


TRACKIO_SCRIPT = """
import json, sys
from pathlib import Path
from textgym.tracking import make_loggers
stage = Path(sys.argv[1])
logger = make_loggers(["trackio"], stage, "quickstart/grpo", json.loads(sys.argv[2]), main_process=True)
steps = {int(k): v for k, v in json.loads(sys.argv[3]).items()}
for step, metrics in steps.items():
    logger.log(step, metrics)
logger.close()
from trackio.sqlite_storage import SQLiteStorage
from trackio.utils import TRACKIO_DIR
name = logger.loggers[1].name
print("RESULT", json.dumps({
    "dir": str(TRACKIO_DIR),
    "logs": SQLiteStorage.get_logs("textgym", name),
    "config": SQLiteStorage.get_run_config("textgym", name),
}))
"""


@needs("trackio")
def test_trackio_local_storage_holds_the_logged_metrics_and_config(tmp_path):
    # trackio fixes its storage folder when first imported: a fresh process starts clean.
    env = {k: v for k, v in os.environ.items() if k != "TRACKIO_DIR"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-c", TRACKIO_SCRIPT, str(tmp_path), json.dumps(CONFIG), json.dumps(STEPS)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
    out = json.loads(line.removeprefix("RESULT "))
    assert out["dir"] == str(tmp_path / "trackio")
    assert (tmp_path / "trackio" / "textgym.db").is_file()
    assert [{k: v for k, v in r.items() if k != "timestamp"} for r in out["logs"]] == [
        {"step": s, **m} for s, m in STEPS.items()
    ]
    assert {k: v for k, v in out["config"].items() if not k.startswith("_")} == CONFIG


def test_a_run_config_names_its_trackers_and_refuses_unknown_ones():
    from pydantic import ValidationError

    from textgym.config import RunConfig

    base = {"name": "t", "model": {"init_preset": "tiny"}, "sft": {"env": {"id": "textgym/Arithmetic-v0"}}}
    assert RunConfig.model_validate(base).log_with == ["tensorboard"]
    with pytest.raises(ValidationError, match="unknown tracker"):
        RunConfig.model_validate({**base, "log_with": ["tensorboard", "neptune"]})


@needs("mlflow")
def test_an_sft_stage_logs_to_the_trackers_named_in_log_with(tmp_path, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    from textgym.config import SFTConfig
    from textgym.models import load_model
    from textgym.trainers.sft import SFTTrainer

    model, tok = load_model(tiny_model_dir)
    cfg = SFTConfig.model_validate(
        {
            "env": {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 2}},
            "steps": 2,
            "batch_size": 4,
        }
    )
    stage = tmp_path / "run" / "sft"
    SFTTrainer(cfg, model, tok, stage, log_with=["mlflow"]).train()
    assert not (stage / "tb").exists()  # only the trackers named
    jsonl = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]
    client = MlflowClient(tracking_uri=(stage / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("textgym").experiment_id])
    assert run.info.run_name == "run/sft" and run.data.params["steps"] == "2"
    losses = sorted((m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss"))
    assert losses == [(r["step"], pytest.approx(r["loss"])) for r in jsonl if "loss" in r]
