"""PNG training curves from a run directory's `metrics.jsonl` files (matplotlib, no display needed)."""

from __future__ import annotations

import json
from pathlib import Path

PANELS: list[tuple[str, list[str]]] = [
    ("reward", ["rollout/reward_mean"]),
    ("accuracy", ["rollout/accuracy", "eval/accuracy"]),
    ("KL (to reference; sampler vs trainer)", ["kl/ref", "kl/old_approx"]),
    ("response length (tokens)", ["rollout/response_length_mean"]),
    ("loss", ["loss/total", "loss/policy", "loss/sft"]),
    ("entropy (nats/token)", ["entropy"]),
]


def _read(path: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def plot_metrics(
    metrics_path: Path, out_path: Path, title: str, before: dict[str, float] | None = None
) -> Path | None:
    """Draw every panel of `PANELS` that has data into one PNG; None when there is nothing to plot.

    `before`: metrics of the policy before training (`eval/accuracy` of the run's
    `eval_before.json`), drawn at step 0 so that the held-out curve starts where training did.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    records = _read(metrics_path)
    if before and any("eval/accuracy" in r for r in records):
        records = [{"step": 0, **before}, *records]
    panels = [(name, [k for k in keys if any(k in r for r in records)]) for name, keys in PANELS]
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


def plot_run(run_dir: Path) -> list[Path]:
    """Plot `run_dir/metrics.jsonl` or each `run_dir/<stage>/metrics.jsonl` to `<dir>/plots/curves.png`.

    A run of one stage that evaluated during training (`eval_every`) gets its held-out accuracy
    panel started at step 0 with the run's `eval_before.json` (with several stages, the accuracy
    before the first is not the second's start, so none is drawn).
    """
    before = None
    stages = sorted(run_dir.glob("*/metrics.jsonl"))
    if len(stages) == 1 and (run_dir / "eval_before.json").is_file():
        before = {"eval/accuracy": float(json.loads((run_dir / "eval_before.json").read_text())["accuracy"])}
    found = (
        [run_dir / "metrics.jsonl"]
        if (run_dir / "metrics.jsonl").is_file()
        else sorted(run_dir.glob("*/metrics.jsonl"))
    )
    written = []
    for m in found:
        title = f"{m.parent.parent.name}/{m.parent.name}"
        p = plot_metrics(m, m.parent / "plots" / "curves.png", title, before=before)
        if p is not None:
            written.append(p)
    return written
