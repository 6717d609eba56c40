"""RLAIF on the quickstart task from the benchmarks' shared SFT start, with the stand-in judge.

Starts `examples/verifier_judge_server.py` (an OpenAI-compatible "judge" that grades with the
math verifier; see its docstring and docs/judge.md) on a free port, runs the RL stage of
`configs/rlaif_arithmetic.yaml` from `<out>/sft_start/sft/final` (the checkpoint
`bench/algorithms.py` builds; this script builds it the same way when it is missing), then
stops the judge. Prints one row in the format of bench/algorithms.py's table plus the judge's
figures: requests, cache hits, the request rate during the judge's calls, its mean latency,
and the share of the RL wall time spent waiting for it.

    python bench/rlaif.py [--steps 300] [--mode pointwise|group] [--delay-s 0] [--out runs/bench_algorithms]

Results go to `<out>/rlaif_results.json` (a list; a run replaces the row of its name).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def textgym(*args: str) -> None:
    """Run `python -m textgym ...` and fail loudly if it fails."""
    cmd = [sys.executable, "-m", "textgym", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def start_judge(delay_s: float) -> tuple[subprocess.Popen[str], str]:
    """Start the stand-in judge on a free port; return the process and its URL once it answers."""
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "verifier_judge_server.py"),
            "--port",
            "0",
            "--delay-s",
            str(delay_s),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # "stand-in judge 'verifier-judge' on http://127.0.0.1:PORT"
    url = line.strip().rsplit(" ", 1)[-1]
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/health", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"the stand-in judge did not answer at {url!r}")


def judge_metrics(stage_dir: Path) -> dict[str, float]:
    """Sums and means of the judge's per-step metrics in `metrics.jsonl`."""
    rows = [json.loads(x) for x in (stage_dir / "metrics.jsonl").read_text().splitlines()]
    total = {
        k: sum(r.get(k, 0.0) for r in rows)
        for k in ("judge/requests", "judge/cache_hits", "judge/judgements")
    }
    judge_s = sum(r.get("time/judge_s", 0.0) for r in rows)
    step_s = sum(r.get("time/step_s", 0.0) for r in rows)
    lat = [r["judge/latency_s_mean"] for r in rows if r.get("judge/requests")]
    return {
        **total,
        "judge_s": judge_s,
        "judge_share_of_step_time": judge_s / step_s if step_s else float("nan"),
        "requests_per_s": total["judge/requests"] / judge_s if judge_s else float("nan"),
        "latency_s_mean": sum(lat) / len(lat) if lat else float("nan"),
        "unparsable": sum(r.get("judge/unparsable", 0.0) for r in rows),
        "steps": len(rows),
    }


def main() -> None:
    """Run the RLAIF stage and print its row."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=None, help="RL steps (default: the preset's 300)")
    ap.add_argument("--mode", choices=["pointwise", "group"], default="pointwise")
    ap.add_argument("--delay-s", type=float, default=0.0, help="latency the stand-in judge adds per request")
    ap.add_argument("--out", default="runs/bench_algorithms")
    ap.add_argument("--name", default=None, help="run name (default rlaif or rlaif_group)")
    args = ap.parse_args()
    out = Path(args.out)
    name = args.name or ("rlaif" if args.mode == "pointwise" else "rlaif_group")
    sft_final = out / "sft_start" / "sft" / "final"
    if not (sft_final / "config.json").is_file():
        textgym("train", "configs/quickstart.yaml", "name=sft_start", f"out_dir={out}", "grpo=null",
                "eval=null", "--overwrite")  # fmt: skip
    proc, url = start_judge(args.delay_s)
    try:
        extra = [f"grpo.steps={args.steps}"] if args.steps else []
        t = time.perf_counter()
        textgym(
            "train", "configs/rlaif_arithmetic.yaml", f"name={name}", f"out_dir={out}",
            f"model.path={sft_final}", "model.init_preset=null", "sft=null", f"grpo.env.judge.endpoint={url}",
            f"grpo.env.judge.mode={args.mode}", *extra, "--overwrite",
        )  # fmt: skip
        wall = time.perf_counter() - t
        server = json.loads(urllib.request.urlopen(url + "/stats", timeout=5).read())
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    summary = json.loads((out / name / "summary.json").read_text())
    row = {
        "algo": name,
        "accuracy_before": summary["accuracy_before"],
        "accuracy_after": summary["accuracy_after"],
        "gain_points": 100 * (summary["accuracy_after"] - summary["accuracy_before"]),
        "rl_time_s": summary["stage_times_s"].get("grpo", float("nan")),
        "wall_time_s": wall,
        "peak_rss_mb": summary["peak_rss_mb"],
        "models_in_memory": summary.get("models_in_memory", []),
        "judge": judge_metrics(out / name / "grpo"),
        "judge_server": server,
    }
    path = out / "rlaif_results.json"
    rows = [r for r in (json.loads(path.read_text()) if path.is_file() else []) if r["algo"] != name]
    path.write_text(json.dumps([*rows, row], indent=2))
    j = row["judge"]
    print()
    print("| algorithm | accuracy before | after | gain (points) | RL time (s) | peak RSS (MB) | models |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| {name} | {row['accuracy_before']:.3f} | {row['accuracy_after']:.3f} | {row['gain_points']:+.1f} "
        f"| {row['rl_time_s']:.0f} | {row['peak_rss_mb']:.0f} | {', '.join(row['models_in_memory'])} |"
    )
    print(
        f"judge: {j['judge/judgements']:.0f} judgements over {j['steps']} steps, "
        f"{j['judge/requests']:.0f} requests ({j['judge/cache_hits']:.0f} from the cache), "
        f"{j['requests_per_s']:.0f} requests/s while judging, "
        f"mean latency {1000 * j['latency_s_mean']:.1f} ms "
        f"(server side {1000 * server['latency_s_mean']:.1f} ms), "
        f"{100 * j['judge_share_of_step_time']:.1f} % of the step time, {j['unparsable']:.0f} unparsable"
    )


if __name__ == "__main__":
    main()
