"""KL estimator × placement sweep, as curves on one seed.

The table it measures: docs/maths.md#kl-estimators-and-where-they-go.

Runs GRPO from one SFT checkpoint (the one `bench/algorithms.py` builds, or `--model`)
six times with the same seed and β, changing only the KL estimator (k1, k2, k3) and where
it goes (differentiated in the loss, or subtracted from the reward), and plots per step
the KL to the reference (k3 estimate, nats/token, measured the same way for every run),
the rollout reward, and the response length into one PNG.

    python bench/kl_sweep.py [--model runs/bench_algorithms/sft_start/sft/final] [--steps 100]
                             [--kl-coef 0.1] [--out runs/kl_sweep]

Writes `<out>/kl_sweep.png` and `<out>/kl_sweep.json` (the per-step series).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ENV = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 2, "instruction": ""}}


def run_one(
    model_dir: Path, estimator: str, placement: str, steps: int, kl_coef: float, out: Path
) -> list[dict]:
    """Train one GRPO run and return its per-step metrics."""
    from textgym.config import GRPOConfig
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.seeding import seed_everything

    seed_everything(0)
    model, tok = load_model(model_dir)
    cfg = GRPOConfig.model_validate(
        {
            "env": ENV,
            "steps": steps,
            "prompts_per_step": 16,
            "group_size": 8,
            "sampling": {"temperature": 1.0, "max_new_tokens": 10},
            "optim": {"lr": 3e-4, "warmup_steps": 10},
            "kl_coef": kl_coef,
            "kl_estimator": estimator,
            "kl_placement": "loss",
        }
    )
    # The config refuses k3 in the reward (its biased gradient is what this sweep shows), so
    # every run validates with the KL in the loss and is then placed where the sweep asks.
    cfg.kl_placement = placement
    trainer = GRPOTrainer(cfg, model, tok, out / f"{estimator}_{placement}")
    rows = []
    while trainer.step < steps:
        m = trainer.train_step()
        rows.append(  # the same KL measure for every run: k3 of π_old vs π_ref on the rollout's tokens
            {
                "step": trainer.step,
                "reward": m["rollout/reward_mean"],
                "length": m["rollout/response_length_mean"],
                "kl_k3": m["kl/rollout_k3"],
            }
        )
    return rows


def main() -> None:
    """Run the six configurations and plot them."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="runs/bench_algorithms/sft_start/sft/final")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--kl-coef", type=float, default=0.1)
    ap.add_argument("--out", default="runs/kl_sweep")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    series = {}
    for placement in ("reward", "loss"):
        for estimator in ("k1", "k2", "k3"):
            key = f"{estimator} in {placement}"
            print(f"== {key}", flush=True)
            series[key] = run_one(Path(args.model), estimator, placement, args.steps, args.kl_coef, out)
            last = series[key][-10:]
            print(
                f"   last 10 steps: reward {sum(r['reward'] for r in last) / len(last):.3f}  "
                f"KL(k3) {sum(r['kl_k3'] for r in last) / len(last):.4f}",
                flush=True,
            )
            (out / "kl_sweep.json").write_text(json.dumps(series, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key, rows in series.items():
        style = "-" if key.endswith("reward") else "--"
        steps = [r["step"] for r in rows]
        axes[0].plot(steps, [r["kl_k3"] for r in rows], style, label=key)
        axes[1].plot(steps, [r["reward"] for r in rows], style, label=key)
        axes[2].plot(steps, [r["length"] for r in rows], style, label=key)
    for ax, title in zip(
        axes,
        ["KL(π‖π_ref), k3 estimate, nats/token", "rollout reward", "response length (tokens)"],
        strict=True,
    ):
        ax.set_title(title)
        ax.set_xlabel("step")
    axes[0].set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.suptitle(f"GRPO on Arithmetic, β = {args.kl_coef}, same seed: KL estimator × placement")
    fig.tight_layout()
    fig.savefig(out / "kl_sweep.png", dpi=110)
    print(f"wrote {out / 'kl_sweep.png'}")


if __name__ == "__main__":
    main()
