"""PNG training curves from a run directory's `metrics.jsonl` files (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["rollout/reward_mean"]),
    ("accuracy", ["rollout/accuracy", "eval/accuracy"]),
    ("KL (to reference; sampler vs trainer)", ["kl/ref", "kl/old_approx"]),
    ("response length (tokens)", ["rollout/response_length_mean"]),
    ("loss", ["loss/total", "loss/policy", "loss/sft"]),
    ("entropy (nats/token)", ["entropy"]),
    ("tool calls per episode", ["rollout/tool_calls_mean", "eval/tool_calls_mean"]),
]
SPARSE = {"rollout/tool_calls_mean", "eval/tool_calls_mean"}
"""Keys drawn only where some value is not 0 (a run without tools logs 0 tool calls every step)."""


def _read(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_metrics(
    metrics_path: Path, out_path: Path, title: str, before: dict[str, float] | None = None
) -> Path | None:
    """Draw every panel of `PANELS` that has data into one PNG; None when there is nothing to plot.

    `before`: metrics of the policy before training (`eval/accuracy` of the run's
    `eval_before.json`, and `eval/tool_calls_mean` from its transcripts), drawn at step 0 so
    that the held-out curves start where training did.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _read(metrics_path)
    if before and any("eval/accuracy" in r for r in records):
        records = [{"step": 0, **before}, *records]
    panels = [
        (name, [k for k in keys if any(r.get(k) if k in SPARSE else k in r for r in records)])
        for name, keys in PANELS
    ]
    panels = [(name, keys) for name, keys in panels if keys]
    if not records or not panels:
        return None
    cols = min(3, len(panels))
    rows = (len(panels) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False)
    for ax, (name, keys) in zip(axes.flat, panels, strict=False):
        for k in keys:
            pts = [(r["step"], r[k]) for r in records if k in r]
            ax.plot(
                [p[0] for p in pts], [p[1] for p in pts], marker="o" if len(pts) < 30 else None, ms=3, label=k
            )
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    fig.suptitle(title)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


def _before(run_dir: Path) -> dict[str, float] | None:
    """`eval/accuracy` (and `eval/tool_calls_mean` from the transcripts) of `eval_before.json`."""
    path = run_dir / "eval_before.json"
    if not path.is_file():
        return None
    out = {"eval/accuracy": float(json.loads(path.read_text(encoding="utf-8"))["accuracy"])}
    episodes = path.with_suffix(".jsonl")
    if episodes.is_file():
        rows: list[dict[str, Any]] = [
            json.loads(x) for x in episodes.read_text(encoding="utf-8").splitlines() if x.strip()
        ]
        calls = [sum(m.get("role") == "tool" for m in r.get("messages", [])) for r in rows]
        out["eval/tool_calls_mean"] = sum(calls) / max(len(calls), 1)
    return out


def plot_run(run_dir: Path) -> list[Path]:
    """Plot `run_dir/metrics.jsonl` or each `run_dir/<stage>/metrics.jsonl` to `<dir>/plots/curves.png`.

    A stage that evaluated during training (`eval_every`) gets its held-out panels started at
    step 0 with the run's `eval_before.json`, when that evaluation is the stage's start: the run's
    only stage, or the stage after SFT (the pipeline evaluates the model entering it).
    """
    before_of: str | None = None
    stages = [m.parent.name for m in sorted(run_dir.glob("*/metrics.jsonl"))]
    after_sft = [s for s in stages if s != "sft"]
    if len(stages) == 1:
        before_of = stages[0]
    elif "sft" in stages and len(after_sft) == 1:
        before_of = after_sft[0]
    before = _before(run_dir) if before_of is not None else None
    found = (
        [run_dir / "metrics.jsonl"]
        if (run_dir / "metrics.jsonl").is_file()
        else sorted(run_dir.glob("*/metrics.jsonl"))
    )
    written = []
    for m in found:
        title = f"{m.parent.parent.name}/{m.parent.name}"
        start = before if m.parent.name == before_of else None
        p = plot_metrics(m, m.parent / "plots" / "curves.png", title, before=start)
        if p is not None:
            written.append(p)
    return written
