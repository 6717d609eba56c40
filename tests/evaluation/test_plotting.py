"""`textgym plot`: the held-out accuracy curve starts from the accuracy before training."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
from matplotlib.figure import Figure

from textgym.evaluation.plotting import plot_run


def _run(tmp_path, stages: list[str]) -> None:
    (tmp_path / "eval_before.json").write_text(json.dumps({"accuracy": 0.17}))
    for stage in stages:
        rows = [
            {"step": 1, "rollout/reward_mean": 0.1, "rollout/accuracy": 0.1},
            {"step": 2, "rollout/reward_mean": 0.2, "rollout/accuracy": 0.2, "eval/accuracy": 0.38},
            {"step": 3, "rollout/reward_mean": 0.3, "rollout/accuracy": 0.3},
            {"step": 4, "rollout/reward_mean": 0.4, "rollout/accuracy": 0.4, "eval/accuracy": 0.48},
        ]
        (tmp_path / stage).mkdir()
        (tmp_path / stage / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def _drawn(monkeypatch, run_dir) -> list[tuple[str, list, list]]:
    """Every line `plot_run` draws: (label, x, y), in figure order."""
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self, *a, **k):
        figures.append(self)
        return save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    written = plot_run(run_dir)
    assert written and all(p.is_file() and p.stat().st_size > 0 for p in written)
    return [
        (line.get_label(), list(line.get_xdata()), list(line.get_ydata()))
        for fig in figures
        for ax in fig.axes
        for line in ax.get_lines()
    ]


def _eval_curves(monkeypatch, run_dir) -> list[tuple[list, list]]:
    return [(x, y) for label, x, y in _drawn(monkeypatch, run_dir) if label == "eval/accuracy"]


def test_one_stage_run_draws_the_held_out_accuracy_from_step_0(tmp_path, monkeypatch):
    _run(tmp_path, ["grpo"])
    assert _eval_curves(monkeypatch, tmp_path) == [([0, 2, 4], [0.17, 0.38, 0.48])]


def test_after_sft_the_rl_stage_starts_at_the_evaluation_before_it(tmp_path, monkeypatch):
    # with SFT then GRPO the pipeline evaluates the model entering GRPO (eval_before.json is
    # after SFT): GRPO's curve starts there, SFT's does not
    _run(tmp_path, ["grpo", "sft"])
    assert _eval_curves(monkeypatch, tmp_path) == [([0, 2, 4], [0.17, 0.38, 0.48]), ([2, 4], [0.38, 0.48])]


def test_two_rl_stages_draw_no_start(tmp_path, monkeypatch):
    # eval_before.json is the later stage's start, and which one that is needs the run order
    _run(tmp_path, ["dpo", "grpo"])
    assert _eval_curves(monkeypatch, tmp_path) == [([2, 4], [0.38, 0.48])] * 2


def test_tool_calls_get_a_panel_only_when_there_are_some(tmp_path, monkeypatch):
    _run(tmp_path, ["grpo"])
    metrics = tmp_path / "grpo" / "metrics.jsonl"
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    for r in rows:
        r["rollout/tool_calls_mean"] = 0.0
    _write(metrics, rows)
    assert _labels(monkeypatch, tmp_path).isdisjoint({"rollout/tool_calls_mean", "eval/tool_calls_mean"})
    calls = [{"role": "user"}, {"role": "assistant"}, {"role": "tool"}, {"role": "assistant"}]
    episodes = [{"messages": calls}, {"messages": calls[:2]}]  # 0.5 calls per episode before
    (tmp_path / "eval_before.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))
    rows[1]["rollout/tool_calls_mean"], rows[1]["eval/tool_calls_mean"] = 0.75, 1.0
    _write(metrics, rows)
    lines = _lines(monkeypatch, tmp_path)
    assert lines["eval/tool_calls_mean"] == ([0, 2], [0.5, 1.0])
    assert lines["rollout/tool_calls_mean"] == ([1, 2, 3, 4], [0.0, 0.75, 0.0, 0.0])


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _lines(monkeypatch, run_dir) -> dict[str, tuple[list, list]]:
    return {label: (x, y) for label, x, y in _drawn(monkeypatch, run_dir)}


def _labels(monkeypatch, run_dir) -> set[str]:
    return set(_lines(monkeypatch, run_dir))
