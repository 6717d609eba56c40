"""Compare the RL algorithms on the quickstart task from one shared SFT checkpoint.

Builds the quickstart's start (tiny model + SFT until 30% of a probe set is right,
`configs/quickstart.yaml` without its GRPO stage) once, then runs each preset's RL stage from it
(`configs/<algo>_arithmetic.yaml`, `model.path=<sft> sft=null`), each in its own process
so its peak memory is its own. Prints one table: held-out accuracy before/after, the
gain, RL wall time, peak resident memory, the models in memory, and (PPO) the critic's
best explained variance.

    python bench/algorithms.py [--algos ppo grpo dapo rloo drgrpo gspo cispo rft online_dpo] \\
        [--steps 300] [--out runs/bench_algorithms]
        [--out runs/bench_algorithms]

Results also go to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from pathlib import Path

ALGOS = ["ppo", "grpo", "dapo", "rloo", "drgrpo", "gspo", "cispo", "rft", "online_dpo"]


def textgym(*args: str) -> None:
    """Run `python -m textgym ...` and fail loudly if it fails."""
    cmd = [sys.executable, "-m", "textgym", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


STAGES = ("ppo", "grpo", "dpo", "rft", "online_dpo")
"""The stage keys an algorithm's config may train with (after `sft=null`); the first present is its stage."""


def rl_stage(config: Path) -> str:
    """The training stage of an algorithm's preset config: the first of `STAGES` it sets."""
    import yaml

    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    for key in STAGES:
        if data.get(key) is not None:
            return key
    raise SystemExit(f"{config}: none of the stages {STAGES} is set")


def best_explained_variance(stage_dir: Path) -> float:
    """The highest logged `value/explained_variance` of a PPO stage (nan when absent)."""
    best = float("nan")
    path = stage_dir / "metrics.jsonl"
    if not path.is_file():
        return best
    for line in path.read_text().splitlines():
        ev = json.loads(line).get("value/explained_variance")
        if ev is not None and math.isfinite(ev) and not ev <= best:
            best = ev
    return best


def main() -> None:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--algos", nargs="+", default=ALGOS, choices=ALGOS)
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the presets' 300)")
    ap.add_argument("--out", default="runs/bench_algorithms")
    ap.add_argument("--init-seed", type=int, default=0)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)

    sft_final = out / "sft_start" / "sft" / "final"
    if not (sft_final / "config.json").is_file():
        textgym(
            "train", "configs/quickstart.yaml", "name=sft_start", f"out_dir={out}", "grpo=null",
            "eval=null", f"model.init_seed={args.init_seed}", "--overwrite",
        )  # fmt: skip

    results_path = out / "results.json"
    previous = json.loads(results_path.read_text()) if results_path.is_file() else []
    results = [r for r in previous if r["algo"] not in args.algos]  # keep other algorithms' rows
    for algo in args.algos:
        stage = rl_stage(Path(f"configs/{algo}_arithmetic.yaml"))
        # --steps is the RL stages' step count; rft's `steps` would be SFT steps per round
        extra = [f"{stage}.steps={args.steps}"] if args.steps and stage in ("grpo", "ppo") else []
        t = time.perf_counter()
        textgym(
            "train", f"configs/{algo}_arithmetic.yaml", f"name={algo}", f"out_dir={out}",
            f"model.path={sft_final}", "model.init_preset=null", "sft=null", *extra, "--overwrite",
        )  # fmt: skip
        wall = time.perf_counter() - t
        summary = json.loads((out / algo / "summary.json").read_text())
        results.append(
            {
                "algo": algo,
                "accuracy_before": summary["accuracy_before"],
                "accuracy_after": summary["accuracy_after"],
                "gain_points": 100 * (summary["accuracy_after"] - summary["accuracy_before"]),
                "rl_time_s": summary["stage_times_s"].get(stage, float("nan")),
                "wall_time_s": wall,
                "peak_rss_mb": summary["peak_rss_mb"],
                "models_in_memory": summary.get("models_in_memory", []),
                "best_explained_variance": best_explained_variance(out / algo / stage),
            }
        )
        results.sort(key=lambda r: ALGOS.index(r["algo"]))
        results_path.write_text(json.dumps(results, indent=2))

    print()
    header = ["algorithm", "accuracy before", "after", "gain (points)", "RL time (s)", "peak RSS (MB)"]
    print("| " + " | ".join([*header, "models", "best EV"]) + " |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        ev = r["best_explained_variance"]
        acc = f"{r['accuracy_before']:.3f} | {r['accuracy_after']:.3f}"
        print(
            f"| {r['algo']} | {acc} | {r['gain_points']:+.1f} "
            f"| {r['rl_time_s']:.0f} | {r['peak_rss_mb']:.0f} | {', '.join(r['models_in_memory'])} "
            f"| {'' if math.isnan(ev) else f'{ev:.2f}'} |"
        )


if __name__ == "__main__":
    main()
