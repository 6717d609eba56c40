"""The stage registry of `textgym train`: which stages run, in what order, evaluated where, and
what the pipeline's loop makes of what they return (the stages are replaced by recording fakes)."""

from __future__ import annotations

import json

import pytest
from conftest import WARM_ENV

from textgym.config import ConfigError, load_config
from textgym.pipeline import preflight, run
from textgym.stages.registry import STAGES, Stage, StageResult, enabled_stages, register_stage


def _cfg(tmp_path, model_dir, **stages):
    return load_config(
        values={
            "name": "stages",
            "out_dir": str(tmp_path),
            "model": {"path": str(model_dir)},
            "log_with": [],
            **stages,
        }
    )


SFT = {"env": WARM_ENV, "steps": 1}
GRPO = {"env": WARM_ENV, "steps": 1}


def test_the_built_in_stages_are_registered_in_run_order(tmp_path, tiny_model_dir):
    assert [s.name for s in sorted(map(STAGES.get, STAGES.names()), key=lambda s: s.order)] == [
        "sft", "grpo", "ppo", "dpo", "rft", "online_dpo",
    ]  # fmt: skip
    both = _cfg(tmp_path, tiny_model_dir, sft=SFT, grpo=GRPO)
    assert [s.name for s in enabled_stages(both)] == ["sft", "grpo"]
    # SFT is evaluated before only when it is alone; the RL stage is evaluated before always
    assert [s.evaluate_before(both) for s in enabled_stages(both)] == [False, True]
    alone = _cfg(tmp_path, tiny_model_dir, sft=SFT)
    assert [s.evaluate_before(alone) for s in enabled_stages(alone)] == [True]


def test_register_stage_refuses_a_name_without_a_config_field_and_a_second_registration():
    def fn(ctx, model_path):
        return StageResult(model_path, 0.0)

    with pytest.raises(ValueError, match="RunConfig has no field 'distill'"):
        register_stage("distill", order=50)(fn)
    with pytest.raises(ValueError, match="stage 'sft' is already registered"):
        register_stage("sft", order=0)(fn)
    assert STAGES.get("sft").run is not fn


@pytest.fixture
def swap_stage():
    """Replace a registered stage for one test (`swap_stage(Stage(...))`); the original comes back."""
    saved: dict[str, Stage] = {}

    def swap(stage: Stage) -> None:
        saved.setdefault(stage.name, STAGES.get(stage.name))
        STAGES.register(stage.name, replace=True)(stage)

    yield swap
    for name, stage in saved.items():
        STAGES.register(name, replace=True)(stage)


def test_the_loop_chains_models_times_and_summaries_and_evaluates_before_the_right_stage(
    tmp_path, tiny_model_dir, monkeypatch, swap_stage
):
    calls: list[tuple[str, str]] = []
    evals: list[tuple[str, str]] = []

    def fake(name, seconds, extra):
        def stage(ctx, model_path):
            calls.append((name, str(model_path)))
            out = ctx.run_dir / name
            return StageResult(out, seconds, extra)

        return stage

    swap_stage(
        Stage(
            "sft", 0, fake("sft", 2.5, {"sft_target": {"reached": True}}), STAGES.get("sft").evaluate_before
        )
    )
    swap_stage(Stage("grpo", 10, fake("grpo", None, {"models_in_memory": ["policy"]})))

    def fake_eval(path, model_path, cfg, device, resume):
        evals.append((path.name, str(model_path)))
        return {"accuracy": 0.25, "n": cfg.n, "mean_reward": 0.5, "pass_at": {"1": 0.25}}

    def fake_baseline(path, model_path, cfg, device, resume):
        evals.append((path.name, str(model_path)))
        return {"accuracy": 0.125, "variant": "stem", "max_new_tokens": 8, "cut_share": 0.0}

    monkeypatch.setattr("textgym.pipeline.cached_eval", fake_eval)
    monkeypatch.setattr("textgym.pipeline.cached_baseline", fake_baseline)
    cfg = _cfg(tmp_path, tiny_model_dir, sft=SFT, grpo=GRPO, eval={"env": WARM_ENV, "n": 4})
    lines: list[str] = []
    summary = run(cfg, echo=lines.append)
    run_dir = tmp_path / "stages"
    assert calls == [("sft", str(tiny_model_dir)), ("grpo", str(run_dir / "sft"))]
    # the format-controlled baseline is of the model evaluated before (the SFT model), not the start
    assert evals == [("eval_before.json", str(run_dir / "sft")), ("eval_after.json", str(run_dir / "grpo")),
                     ("eval_baseline.json", str(run_dir / "sft"))]  # fmt: skip
    assert summary["accuracy_baseline"] == 0.125
    assert "eval before grpo: accuracy 0.250, cut 0.00, on 4 tasks" in lines
    assert summary["final_model"] == str(run_dir / "grpo")
    assert summary["stage_times_s"] == {"sft": 2.5}  # a skipped stage (None) has no time
    assert summary["sft_target"] == {"reached": True} and summary["models_in_memory"] == ["policy"]
    assert summary["accuracy_before"] == summary["accuracy_after"] == 0.25
    assert summary["accuracy_after_sft"] == 0.25  # the RL stage's start, named as such
    assert json.loads((run_dir / "summary.json").read_text())["final_model"] == summary["final_model"]


def test_preflight_runs_each_enabled_stage_check(tmp_path, tiny_model_dir, swap_stage):
    def refuse(cfg):
        raise ConfigError("grpo.thing: refused by the stage's check")

    swap_stage(Stage("grpo", 10, STAGES.get("grpo").run, check=refuse))
    with pytest.raises(ConfigError, match="refused by the stage's check"):
        preflight(_cfg(tmp_path, tiny_model_dir, grpo=GRPO))
    preflight(_cfg(tmp_path, tiny_model_dir, sft=SFT))  # the grpo check does not run without grpo
