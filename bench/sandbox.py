"""Sandbox throughput: runs per second of each backend on the same HumanEval programs, side by side.

Scores HumanEval's 164 canonical solutions with the `CodeVerifier` on each available backend,
one at a time and batched (`--workers` at once), and prints the throughput with its ratio
to `unsafe_local` (a plain subprocess, no isolation) measured in the same run. Every
solution must score 1.0 on every backend, or the script exits 1.

    python bench/sandbox.py [--workers 4] [--repeat 1]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings

from textgym import sandbox
from textgym.envs.code import humaneval_tasks
from textgym.sandbox import SandboxUnavailableError, get_backend
from textgym.verifiers.code import CodeVerifier


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1)
    args = parser.parse_args()
    tasks = list(humaneval_tasks("binary")) * args.repeat
    completions = [t.metadata["canonical_solution"] for t in tasks]
    rows = []
    failed = False
    for name in ("unsafe_local", "process", "docker"):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backend = get_backend(name, max_workers=args.workers)
        except SandboxUnavailableError as e:
            print(f"{name}: unavailable ({e})")
            continue
        verifier = CodeVerifier(backend)
        verifier(completions[0], tasks[0])  # warm: start a container, load caches
        t0 = time.perf_counter()
        serial = [verifier(c, t) for c, t in zip(completions, tasks, strict=True)]
        t_serial = time.perf_counter() - t0
        t0 = time.perf_counter()
        batched = verifier.score_batch(completions, tasks)
        t_batch = time.perf_counter() - t0
        passed = sum(s.reward for s in serial), sum(s.reward for s in batched)
        failed |= passed != (len(tasks), len(tasks))
        rows.append((name, len(tasks) / t_serial, len(tasks) / t_batch, passed))
    sandbox.close_all()
    base = {r[0]: r for r in rows}.get("unsafe_local")
    print(f"\n{len(tasks)} HumanEval canonical solutions per mode; batched = {args.workers} workers\n")
    print("| backend | serial runs/s | vs unsafe_local | batched runs/s | vs unsafe_local | passed |")
    print("|---|---|---|---|---|---|")
    for name, serial_rate, batch_rate, passed in rows:
        rel_s = f"{serial_rate / base[1]:.2f}" if base else "-"
        rel_b = f"{batch_rate / base[2]:.2f}" if base else "-"
        print(
            f"| {name} | {serial_rate:.1f} | {rel_s} | {batch_rate:.1f} | {rel_b} | "
            f"{int(passed[0])}/{len(tasks)}, {int(passed[1])}/{len(tasks)} |"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
