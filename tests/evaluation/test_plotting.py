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


def _eval_curves(monkeypatch, run_dir) -> list[tuple[list, list]]:
    figures: list[Figure] = []
    save = Figure.savefig

    def keep(self, *a, **k):
        figures.append(self)
        return save(self, *a, **k)

    monkeypatch.setattr(Figure, "savefig", keep)
    written = plot_run(run_dir)
    assert written and all(p.is_file() and p.stat().st_size > 0 for p in written)
    return [
        (list(line.get_xdata()), list(line.get_ydata()))
        for fig in figures
        for ax in fig.axes
        for line in ax.get_lines()
        if line.get_label() == "eval/accuracy"
    ]


def test_one_stage_run_draws_the_held_out_accuracy_from_step_0(tmp_path, monkeypatch):
    _run(tmp_path, ["grpo"])
    assert _eval_curves(monkeypatch, tmp_path) == [([0, 2, 4], [0.17, 0.38, 0.48])]


def test_a_later_stage_does_not_start_at_the_first_stages_before(tmp_path, monkeypatch):
    # after SFT, GRPO's step 0 is not the accuracy before SFT
    _run(tmp_path, ["grpo", "sft"])
    assert _eval_curves(monkeypatch, tmp_path) == [([2, 4], [0.38, 0.48])] * 2
