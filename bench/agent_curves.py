"""Curves of multi-turn agent runs: success and turns per episode over GRPO steps, one line per run.

Reads each run's `grpo/metrics.jsonl` (`rollout/accuracy`: the share of the step's sampled
episodes whose `reward/correct` is 1; `rollout/turns_mean`: agent turns per episode, tool
calls included) and its `summary.json` (held-out greedy accuracy before and after GRPO), and
draws both against the step, smoothed over `--window` steps, into one PNG (the figure on the
docs' "Train an agent" page). A run that evaluated during training (`grpo.eval_every`) also
gets its held-out greedy accuracy at those steps (`eval/accuracy`; step 0 is the start's), as
a dashed line with markers in the run's colour.

    python bench/agent_curves.py runs/agent_toolmath runs/agent_toolmath_s1 ... --out docs/agent_toolmath.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over the last `window` values (fewer at the start)."""
    return [sum(values[max(0, i - window + 1) : i + 1]) / len(values[max(0, i - window + 1) : i + 1])
            for i in range(len(values))]  # fmt: skip


def main() -> None:
    """Draw the curves of the given runs."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--window", type=int, default=6)
    args = ap.parse_args()
    fig, (ax_acc, ax_turns) = plt.subplots(1, 2, figsize=(10, 3.6))
    for run in args.runs:
        rows = [json.loads(x) for x in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
        summary = json.loads((run / "summary.json").read_text())
        steps = [r["step"] for r in rows]
        label = f"{run.name}: held-out {summary['accuracy_before']:.3f} → {summary['accuracy_after']:.3f}"
        (line,) = ax_acc.plot(steps, smooth([r["rollout/accuracy"] for r in rows], args.window), label=label)
        evals = [(r["step"], r["eval/accuracy"]) for r in rows if "eval/accuracy" in r]
        if evals:
            at, acc = zip(*[(0, summary["accuracy_before"]), *evals], strict=True)
            ax_acc.plot(at, acc, "--o", color=line.get_color(), markersize=3, linewidth=1)
        ax_turns.plot(steps, smooth([r["rollout/turns_mean"] for r in rows], args.window), label=run.name)
    ax_acc.set(xlabel="GRPO step", ylabel="success (T = 1); dashed: test, greedy", ylim=(0, 1))
    ax_turns.set(xlabel="GRPO step", ylabel="agent turns per episode")
    ax_acc.legend(fontsize=7)
    ax_turns.legend(fontsize=7)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
