"""The learning figures, regenerated: the quickstart across init seeds, CPU kernels and threads.

Each cell of the matrix is one run of the README's main job,
`textgym train configs/quickstart.yaml model.init_seed=S threads=T` with
`ATEN_CPU_CAPABILITY=K` set before Python starts (K = "own": unset, the CPU's best kernels).
Each run is its own process, one after another. The figures (held-out greedy accuracy before
and after GRPO, the gain, SFT steps to the probe target, wall time) are written to
`bench/results/learning.json` together with the commit, the date and the machine (CPU model
and the `lscpu` flags that pick kernels), and the docs render their tables from that file
(`tools/mkdocs_hooks.py`), so every figure names the commit and machine it came from.

    python bench/learning.py run [--seeds 0 1 2 3 4] [--kernels own avx2 default] [--threads 1 2]
        [--diagonal] [--out runs/bench_learning] [--results bench/results/learning.json]
    python bench/learning.py check [--tolerance 10] [--kernel own] [--threads 2]
    python bench/learning.py llm [--seeds 0 1 2] [--kernels own default] [--threads 2 1]
        [--side-by-side] [--collect DIR] [--config configs/smollm2_grpo.yaml]   # the real model
    python bench/learning.py table [NAME]   # print a recorded table as markdown

`run --record quickstart_<machine>` keeps another CPU's runs beside the main table (each
record is one machine's); `check` holds a run to the strictest record for its kernels.

`run --diagonal` runs every seed with the machine's own kernels and 2 threads, and seed 0
under each other kernel and thread count (the docs' table); without it, the full product.
`check` (`make learning-check`) runs a fresh seed-0 quickstart and fails when its gain is more
than `tolerance` points below the recorded seed-0 gain for the same kernels and threads, or
below +15 points (the floor every recorded seed and setting clears) where the record holds no
run on such kernels ("own" kernels are the machine's best: AVX-512, AVX2 or default).
`tests/test_quickstart.py` applies the same bar (`bar`) to the quickstart it runs in CI.

`llm` runs the real-model config, `textgym train configs/smollm2_grpo.yaml seed=S threads=T`
(SmolLM2-135M-Instruct, pulled once into the cache; the seed is the training seed: sampling
and task order, the weights being pretrained), records it as `smollm2_grpo` (held-out greedy
accuracy before and after, the gain, the share of step 1's samples cut at the token budget,
GRPO and whole-run time, peak RSS) and the docs render it (docs/models.md).
`--side-by-side` runs the 1-thread cells two at a time (one core each: their learning figures
are exact, their times are not an idle run's); `--collect DIR` records finished run folders
`DIR/m_s{S}_{K}_t{T}` instead of running them. `--config configs/smollm2_grpo_lora.yaml` runs
the low-memory variant (LoRA and gradient checkpointing) instead, recorded as `smollm2_grpo_lora`.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "learning.json"
KERNEL_FLAGS = ("avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile")
"""The `lscpu` flags that decide which kernels PyTorch's CPU backend picks."""


def machine() -> dict[str, Any]:
    """The CPU model, core count and kernel-relevant `lscpu` flags of this machine."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        out = ""
    model = re.search(r"Model name:\s*(.+)", out)
    flags_line = re.search(r"Flags:\s*(.+)", out)
    flags = set(flags_line.group(1).split()) if flags_line else set()
    return {
        "cpu": model.group(1).strip() if model else platform.processor(),
        "cores": os.cpu_count(),
        "flags": [f for f in KERNEL_FLAGS if f in flags],
    }


def kernels_of(kernel: str, flags: list[str]) -> str:
    """The kernels a run used: `kernel` as given, or for "own" the best of the machine's `flags`."""
    if kernel != "own":
        return kernel
    return "avx512" if "avx512f" in flags else "avx2" if "avx2" in flags else "default"


def bar(
    record: dict[str, Any], kernels: str, threads: int, tolerance: float = 10.0, floor: float = 15.0
) -> float:
    """The smallest seed-0 gain (points) a fresh quickstart run may show against `record`.

    The recorded seed-0 gain for the same kernels (`kernels_of`) and threads minus `tolerance`,
    never below `floor`; `floor` alone when the record holds no such row (another machine's
    kernels: a run there is compared with the floor every init seed and setting has cleared).
    """
    if not record:
        return floor
    flags = record["machine"]["flags"]
    same = [
        r["gain"] for r in record["rows"]
        if r["seed"] == 0 and r["threads"] == threads and kernels_of(r["kernel"], flags) == kernels
    ]  # fmt: skip
    return max(floor, same[0] - tolerance) if same else floor


def commit() -> str:
    """The checked-out commit (short hash, "+dirty" when the tree has changes)."""
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                            text=True, cwd=ROOT).stdout.splitlines()  # fmt: skip
    dirty = [x for x in status if not x[3:].startswith("bench/results/")]  # a record is not code
    return sha.stdout.strip() + ("+dirty" if dirty else "")


def run_quickstart(seed: int, kernel: str, threads: int, out: Path, overrides: list[str]) -> dict[str, Any]:
    """One quickstart run in its own process; returns its row of figures.

    Raises:
        RuntimeError: when the run fails (its output's tail in the message).
    """
    name = f"qs_s{seed}_{kernel}_t{threads}"
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "own":
        env["ATEN_CPU_CAPABILITY"] = kernel
    cmd = [sys.executable, "-m", "textgym", "train", str(ROOT / "configs" / "quickstart.yaml"),
           f"name={name}", f"out_dir={out}", f"model.init_seed={seed}", f"threads={threads}", *overrides,
           "--overwrite"]  # fmt: skip
    print("$", ("" if kernel == "own" else f"ATEN_CPU_CAPABILITY={kernel} ") + " ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    s = json.loads((out / name / "summary.json").read_text())
    row = {
        "seed": seed,
        "kernel": kernel,
        "threads": threads,
        "sft_steps": s.get("sft_target", {}).get("steps"),
        "before": s["accuracy_before"],
        "after": s["accuracy_after"],
        "gain": round(100 * (s["accuracy_after"] - s["accuracy_before"]), 1),
        "wall_s": round(time.perf_counter() - t0),
    }
    print(json.dumps(row), flush=True)
    return row


LLM_CONFIG = ROOT / "configs" / "smollm2_grpo.yaml"


def llm_command(
    seed: int, kernel: str, threads: int, out: Path, overrides: list[str], config: Path = LLM_CONFIG
) -> tuple[list[str], dict[str, str]]:
    """The command and environment of one `llm` cell (`config`, default `configs/smollm2_grpo.yaml`)."""
    env = dict(os.environ)
    env.pop("ATEN_CPU_CAPABILITY", None)
    if kernel != "own":
        env["ATEN_CPU_CAPABILITY"] = kernel
    cmd = [sys.executable, "-m", "textgym", "train", str(config), f"name=m_s{seed}_{kernel}_t{threads}",
           f"out_dir={out}", f"seed={seed}", f"threads={threads}", *overrides, "--overwrite"]  # fmt: skip
    return cmd, env


def llm_row(run: Path, seed: int, kernel: str, threads: int, side_by_side: bool) -> dict[str, Any]:
    """The figures of one finished `llm` run folder.

    Raises:
        FileNotFoundError: when the run has no `summary.json` (it did not finish).
    """
    s = json.loads((run / "summary.json").read_text())
    steps = [json.loads(x) for x in (run / "grpo" / "metrics.jsonl").read_text().splitlines()]
    first = steps[0]
    tokens = [
        json.loads((run / f"eval_{w}.json").read_text())["mean_response_tokens"] for w in ("before", "after")
    ]
    return {
        "seed": seed, "kernel": kernel, "threads": threads, "side_by_side": side_by_side, "steps": len(steps),
        "before": s["accuracy_before"], "after": s["accuracy_after"],
        "gain": round(100 * (s["accuracy_after"] - s["accuracy_before"]), 1),
        "cut_step1": round(first["rollout/overlong_frac"], 3), "tokens_before": tokens[0],
        "tokens_after": tokens[1], "grpo_s": round(s["stage_times_s"]["grpo"]),
        "wall_s": round(s["wall_time_s"]), "peak_rss_mb": round(s["peak_rss_mb"]),
        "heldout_during": {str(m["step"]): m["eval/accuracy"] for m in steps if "eval/accuracy" in m},
        "step_s": [round(m["time/step_s"], 1) for m in steps],
        **baseline_figures(s),
    }  # fmt: skip


def baseline_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The format-controlled figures of a run's `summary.json` (empty when it ran without a baseline).

    `baseline`: the untrained model's held-out accuracy with the answer format given (the best
    variant, named in `baseline_variant`, at a budget cutting <= 2% of answers); `gain_above_baseline`
    in points; the stated-answer accuracy and cut share before and after; the error split.
    """
    if summary.get("accuracy_baseline") is None:
        return {}
    base = summary.get("baseline") or {}
    return {
        "baseline": summary["accuracy_baseline"],
        "baseline_variant": base.get("variant"),
        "baseline_tokens": base.get("max_new_tokens"),
        "gain_above_baseline": round(100 * summary["gain_above_baseline"], 1),
        "stated_before": summary.get("stated_accuracy_before"),
        "stated_after": summary.get("stated_accuracy_after"),
        "cut_before": summary.get("cut_share_before"),
        "cut_after": summary.get("cut_share_after"),
        "error_split_before": summary.get("error_split_before"),
        "error_split_after": summary.get("error_split_after"),
    }


def run_llm(
    cells_: list[tuple[int, str, int]],
    out: Path,
    side_by_side: bool,
    overrides: list[str],
    config: Path = LLM_CONFIG,
) -> list[dict[str, Any]]:
    """Run the `llm` cells: 2-thread cells one at a time, 1-thread ones two at a time if `side_by_side`.

    Raises:
        RuntimeError: when a run fails (its output's tail in the message).
    """
    rows: list[dict[str, Any]] = []
    solo = [c for c in cells_ if not (side_by_side and c[2] == 1)]
    paired = [c for c in cells_ if side_by_side and c[2] == 1]
    batches = [[c] for c in solo] + [paired[i : i + 2] for i in range(0, len(paired), 2)]
    out.mkdir(parents=True, exist_ok=True)
    for batch in batches:
        procs = []
        for seed, kernel, threads in batch:
            cmd, env = llm_command(seed, kernel, threads, out, overrides, config)
            shown = ("" if kernel == "own" else f"ATEN_CPU_CAPABILITY={kernel} ") + " ".join(cmd[2:])
            print("$", shown, flush=True)
            log = open(out / f"m_s{seed}_{kernel}_t{threads}.log", "w")  # noqa: SIM115 (closed below)
            procs.append((subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT), log))
        for (seed, kernel, threads), (p, log) in zip(batch, procs, strict=True):
            p.wait()
            log.close()
            name = f"m_s{seed}_{kernel}_t{threads}"
            if p.returncode != 0:
                raise RuntimeError(f"{name} failed:\n{(out / f'{name}.log').read_text()[-3000:]}")
            rows.append(llm_row(out / name, seed, kernel, threads, len(batch) > 1))
            print(json.dumps(rows[-1]), flush=True)
    return rows


def render_llm(record: dict[str, Any]) -> str:
    """The SmolLM2 GRPO table of a recorded `llm` run (markdown), with its provenance."""
    lines = [
        "| training seed | kernels | threads | GRPO steps | before | format-controlled baseline | after "
        "| gain above the baseline | stated answers before → after | cut before → after "
        "| GRPO | whole run | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    own = kernels_of("own", record["machine"]["flags"]).upper().replace("AVX512", "AVX-512")
    for r in record["rows"]:
        kernel = f"own ({own})" if r["kernel"] == "own" else f"`ATEN_CPU_CAPABILITY={r['kernel']}`"
        pair = " (two side by side)" if r["side_by_side"] else ""
        if "baseline" in r:
            base = f"{r['baseline']:.2f} ({r['baseline_variant']}, {r['baseline_tokens']} tokens)"
            above = f"{r['gain_above_baseline']:+.0f} points"
            stated = f"{r['stated_before']:.2f} → {r['stated_after']:.2f}"
            cut = f"{100 * r['cut_before']:.0f}% → {100 * r['cut_after']:.0f}%"
        else:  # recorded before the baseline existed
            base, above, stated, cut = "—", "—", "—", f"step 1: {100 * r['cut_step1']:.0f}%"
        lines.append(
            f"| {r['seed']} | {kernel} | {r['threads']}{pair} | {r.get('steps', '')} | {r['before']:.2f} | "
            f"{base} | {r['after']:.2f} | {above} | {stated} | {cut} | {r['grpo_s']} s | {r['wall_s']} s | "
            f"{r['peak_rss_mb']:,} MB |"
        )
    gains = [r["gain"] for r in record["rows"]]
    above_ = [r["gain_above_baseline"] for r in record["rows"] if "gain_above_baseline" in r]
    summary = f"Gains over the untrained model {min(gains):+.0f} to {max(gains):+.0f} points"
    summary += f" over {len(gains)} runs"
    if above_:
        summary += f"; above the format-controlled baseline {min(above_):+.0f} to {max(above_):+.0f}"
    lines += ["", f"{summary}. " + provenance(record)]
    return "\n".join(lines)


def cells(
    seeds: list[int], kernels: list[str], threads: list[int], diagonal: bool
) -> list[tuple[int, str, int]]:
    """The (seed, kernel, threads) runs of the matrix (see the module docstring for `diagonal`)."""
    if not diagonal:
        return [(s, k, t) for s in seeds for k in kernels for t in threads]
    own = [(s, kernels[0], threads[-1]) for s in seeds]
    return own + [(seeds[0], k, t) for k in kernels for t in threads if (k, t) != (kernels[0], threads[-1])]


def provenance(record: dict[str, Any]) -> str:
    """One sentence naming the date, commit, machine and command of a recorded run, then its note."""
    m = record["machine"]
    own = "AVX-512" if "avx512f" in m["flags"] else "AVX2" if "avx2" in m["flags"] else "default"
    kernel = record.get("kernel", "own")
    return (
        f"Measured {record['date']} at commit `{record['commit']}` on {m['cpu']} ({m['cores']} cores; "
        f"kernel flags: {', '.join(m['flags']) or 'none'}; own kernels = {own}"
        + (f"; run with `ATEN_CPU_CAPABILITY={kernel}`" if kernel != "own" else "")
        + f"), by `{record['command']}`."
        + (f" {record['note']}" if record.get("note") else "")
    )


def render(record: dict[str, Any]) -> str:
    """The quickstart table of a recorded run (markdown), with the commit, date and machine under it."""
    lines = [
        "| init seed | kernels | threads | SFT steps to target | after SFT (GRPO start) | after GRPO "
        "| gain | wall time |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        own = kernels_of("own", record["machine"]["flags"]).upper().replace("AVX512", "AVX-512")
        kernel = f"own ({own})" if r["kernel"] == "own" else f"`ATEN_CPU_CAPABILITY={r['kernel']}`"
        lines.append(
            f"| {r['seed']} | {kernel} | {r['threads']} | {r['sft_steps']} | {r['before']:.3f} | "
            f"{r['after']:.3f} | {r['gain']:+.1f} points | {r['wall_s']} s |"
        )
    gains = [r["gain"] for r in record["rows"]]
    lines += [
        "",
        f"Gains {min(gains):+.1f} to {max(gains):+.1f} points over {len(gains)} runs. " + provenance(record),
    ]
    return "\n".join(lines)


def render_algorithms(record: dict[str, Any]) -> str:
    """The algorithm table of a recorded `bench/algorithms.py` run (markdown), with its provenance."""
    lines = [
        "| algorithm | accuracy before | after | gain (points) | RL time (s) | peak RSS (MB) | models "
        "| best EV |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in record["rows"]:
        ev = r.get("best_explained_variance")
        ev_text = "" if ev is None or ev != ev else f"{ev:.2f}"
        accuracy = f"{r['accuracy_before']:.3f} | {r['accuracy_after']:.3f} | {r['gain_points']:+.1f}"
        memory = f"{r['rl_time_s']:.0f} | {r['peak_rss_mb']:.0f} | {', '.join(r['models_in_memory'])}"
        lines.append(f"| {r['algo']} | {accuracy} | {memory} | {ev_text} |")
    return "\n".join([*lines, "", provenance(record)])


RENDERERS = {
    "quickstart": render,
    "algorithms": render_algorithms,
    "smollm2_grpo": render_llm,
    "smollm2_grpo_lora": render_llm,
}
"""The tables the docs render from `bench/results/learning.json` (`tools/mkdocs_hooks.py`); a
record named `quickstart_<machine>` (`run --record`) renders as the quickstart's."""


def renderer(name: str) -> Any:
    """The function that renders the recorded results `name` (see `RENDERERS`).

    Raises:
        KeyError: for a name that is none of `RENDERERS`' nor `quickstart_*`.
    """
    if name.startswith("quickstart_"):
        return render
    if name == "smollm2_agent_rl":  # recorded by bench/agent_rl.py
        spec = importlib.util.spec_from_file_location("bench_agent_rl", ROOT / "bench" / "agent_rl.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module.render
    return RENDERERS[name]


def least_gain(results: dict[str, Any], kernels: str, threads: int, tolerance: float = 10.0) -> float:
    """`bar` over every recorded quickstart (`quickstart`, `quickstart_*`): the strictest one.

    Each record is one machine's; a record without a seed-0 row for `kernels` and `threads`
    gives the floor, so the bar is the recorded seed-0 gain of the machine(s) whose kernels
    these are, minus `tolerance`, never below the floor.
    """
    records = [r for k, r in results.items() if k == "quickstart" or k.startswith("quickstart_")]
    return max([bar(r, kernels, threads, tolerance) for r in records] or [bar({}, kernels, threads)])


def new_record(rows: list[dict[str, Any]], note: str = "") -> dict[str, Any]:
    """A record of `rows` with this commit, today's date, this machine and the command line."""
    argv = sys.argv[1:]
    if "--note" in argv:  # the note is printed under the table, not in the command
        i = argv.index("--note")
        argv = argv[:i] + argv[i + 2 :]
    command = "python bench/learning.py " + " ".join(argv)
    return {"commit": commit(), "date": dt.date.today().isoformat(), "machine": machine(),
            "command": command, "rows": rows, "note": note}  # fmt: skip


def load(path: Path = RESULTS) -> dict[str, Any]:
    """The recorded results (an empty dict when there are none)."""
    return json.loads(path.read_text()) if path.is_file() else {}


def save(path: Path, name: str, record: dict[str, Any]) -> None:
    """Record `record` as results `name` in `path` (other results kept)."""
    results = load(path)
    results[name] = record
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def main() -> None:
    """Run the matrix, check against the record, or print the recorded table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    r.add_argument("--kernels", nargs="+", default=["own", "avx2", "default"])
    r.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    r.add_argument("--diagonal", action="store_true")
    r.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_learning")
    r.add_argument("--results", type=Path, default=RESULTS)
    r.add_argument("--note", default="", help="a sentence printed under the table (e.g. what else ran)")
    r.add_argument(
        "--record", default="quickstart",
        help="results name: quickstart (the docs' main table), or quickstart_<machine> (another CPU's)",
    )  # fmt: skip
    r.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    c = sub.add_parser("check")
    c.add_argument("--tolerance", type=float, default=10.0, help="points the gain may drop")
    c.add_argument("--kernel", default="own")
    c.add_argument("--threads", type=int, default=2)
    c.add_argument("--out", type=Path, default=ROOT / "runs" / "learning_check")
    a = sub.add_parser("algorithms", help="run bench/algorithms.py and record its table")
    a.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_algorithms")
    a.add_argument("--results", type=Path, default=RESULTS)
    a.add_argument("--kernel", default="own", help="ATEN_CPU_CAPABILITY for the runs (own: unset)")
    a.add_argument("--note", default="", help="a sentence printed under the table")
    a.add_argument("rest", nargs="*", help="arguments for bench/algorithms.py (e.g. --algos grpo ppo)")
    m = sub.add_parser("llm", help="configs/smollm2_grpo.yaml across seeds, kernels and threads")
    m.add_argument(
        "--config", type=Path, default=LLM_CONFIG, help="a real-model GRPO config (recorded by its file name)"
    )
    m.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    m.add_argument("--kernels", nargs="+", default=["own", "avx2", "default"])
    m.add_argument("--threads", type=int, nargs="+", default=[2, 1])
    m.add_argument("--side-by-side", action="store_true", help="run the 1-thread cells two at a time")
    m.add_argument("--collect", type=Path, help="record the finished runs in this folder instead of running")
    m.add_argument("--out", type=Path, default=ROOT / "runs" / "bench_llm")
    m.add_argument("--results", type=Path, default=RESULTS)
    m.add_argument("--note", default="", help="a sentence printed under the table")
    m.add_argument("overrides", nargs="*", help="config overrides for every run (key=value)")
    t = sub.add_parser("table")
    t.add_argument(
        "name", nargs="?", default="quickstart", help="algorithms, smollm2_grpo, quickstart or quickstart_*"
    )
    args = ap.parse_args()
    if args.cmd == "table":
        print(renderer(args.name)(load()[args.name]))
        return
    if args.cmd == "algorithms":
        cmd = [sys.executable, str(ROOT / "bench" / "algorithms.py"), "--out", str(args.out), *args.rest]
        env = dict(os.environ)
        env.pop("ATEN_CPU_CAPABILITY", None)
        if args.kernel != "own":
            env["ATEN_CPU_CAPABILITY"] = args.kernel
        subprocess.run(cmd, check=True, cwd=ROOT, env=env)
        record = new_record(json.loads((args.out / "results.json").read_text()), args.note)
        record["kernel"] = args.kernel
        save(args.results, "algorithms", record)
        print(render_algorithms(record))
        return
    if args.cmd == "llm":
        grid = [(s_, k, t) for t in args.threads for k in args.kernels for s_ in args.seeds]
        if args.collect:
            rows = []
            for s_, k, t in grid:
                run = args.collect / f"m_s{s_}_{k}_t{t}"
                if (run / "summary.json").is_file():
                    rows.append(llm_row(run, s_, k, t, args.side_by_side and t == 1))
        else:
            rows = run_llm(grid, args.out, args.side_by_side, args.overrides, args.config)
        record = new_record(rows, args.note)
        save(args.results, args.config.stem, record)
        print(render_llm(record))
        return
    if args.cmd == "check":
        row = run_quickstart(0, args.kernel, args.threads, args.out, [])
        least = least_gain(load(), kernels_of(args.kernel, machine()["flags"]), args.threads, args.tolerance)
        print(
            f"gain {row['gain']:+.1f} points; the bar {least:+.1f} (recorded seed 0 minus {args.tolerance:g})"
        )
        if row["gain"] < least:
            raise SystemExit(f"learning check failed: gain {row['gain']:+.1f} < {least:+.1f}")
        return
    rows = [run_quickstart(s, k, t, args.out, args.overrides) for s, k, t in
            cells(args.seeds, args.kernels, args.threads, args.diagonal)]  # fmt: skip
    record = new_record(rows, args.note)
    save(args.results, args.record, record)
    print(render(record))


if __name__ == "__main__":
    main()
