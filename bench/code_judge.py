"""The code judge's cost per task: the two-process judge against the one-process harness it replaced.

Scores HumanEval's 164 canonical solutions (and, with `--mbpp`, MBPP's 427 sanitized
references) on each sandbox backend twice, side by side in one run: with today's judge (the
trusted process and the candidate process, plain data between them: `CodeVerifier`) and
with the harness of `--baseline` (a commit before the judge was split: the solution and the
tests in one process), whose source is read from git. Both run one task at a time (seconds
per task, the latency a rollout sees) and batched over `--workers` (tasks per second). Every
reference must pass under both, or the script exits 1.

    python bench/code_judge.py [--baseline 2cdd389] [--workers 2] [--mbpp] [--backends process docker]
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
import warnings
from pathlib import Path

from textgym import sandbox
from textgym.envs.code import humaneval_tasks, mbpp_tasks
from textgym.sandbox import ExecRequest, SandboxUnavailableError, get_backend
from textgym.types import Task
from textgym.verifiers.code import CodeVerifier, build_program, entry_points

ROOT = Path(__file__).resolve().parents[1]


class BaselineHarness:
    """The one-process harness of an earlier commit, driven as its `CodeVerifier` drove it."""

    def __init__(self, backend: object, commit: str, timeout_s: float = 30.0):
        self.backend, self.timeout_s = backend, timeout_s
        self.source = subprocess.run(
            ["git", "show", f"{commit}:textgym/verifiers/_code_harness.py"],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout  # fmt: skip

    def request(self, completion: str, task: Task) -> tuple[ExecRequest, str]:
        program, setup, tests = build_program(completion, task)
        nonce = secrets.token_hex(16)
        spec = {"program": program, "setup": setup, "tests": tests, "entry_points": entry_points(task),
                "stop_at_first_failure": True}  # fmt: skip
        files = {"harness.py": self.source, "spec.json": json.dumps(spec)}
        req = ExecRequest(files=files, cmd=("python3", "-I", "harness.py"), stdin=nonce + "\n",
                          timeout_s=self.timeout_s, memory_mb=1024)  # fmt: skip
        return req, nonce

    @staticmethod
    def passed(stdout: str, nonce: str, n_tests: int) -> bool:
        ok = {}
        for line in stdout.splitlines():
            if line.startswith(nonce + " "):
                rec = json.loads(line[len(nonce) + 1 :])
                ok[rec.get("unit")] = rec.get("ok")
        return ok.get("program") is True and all(ok.get(i) is True for i in range(n_tests))

    def score(self, completion: str, task: Task) -> bool:
        req, nonce = self.request(completion, task)
        return self.passed(self.backend.execute(req).stdout, nonce, len(task.metadata["tests"]))  # type: ignore[attr-defined]

    def score_batch(self, completions: list[str], tasks: list[Task]) -> list[bool]:
        built = [self.request(c, t) for c, t in zip(completions, tasks, strict=True)]
        results = self.backend.run_batch([b[0] for b in built])  # type: ignore[attr-defined]
        return [
            self.passed(r.stdout, n, len(t.metadata["tests"]))
            for r, (_, n), t in zip(results, built, tasks, strict=True)
        ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", default="2cdd389", help="commit of the one-process harness")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--mbpp", action="store_true", help="also MBPP's 427 sanitized references")
    parser.add_argument("--backends", nargs="+", default=["process", "docker"])
    args = parser.parse_args()
    sets = [("HumanEval", list(humaneval_tasks("binary")))]
    if args.mbpp:
        sets.append(("MBPP sanitized", list(mbpp_tasks("sanitized"))))
    rows, failed = [], False
    for name in args.backends:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                backend = get_backend(name, max_workers=args.workers)
        except SandboxUnavailableError as e:
            print(f"{name}: unavailable ({e})")
            continue
        judges = {
            "two processes (now)": CodeVerifier(backend, timeout_s=30.0),
            f"one process ({args.baseline})": BaselineHarness(backend, args.baseline),
        }
        for label, tasks in sets:
            completions = [t.solution or "" for t in tasks]
            for judge_name, judge in judges.items():
                one = judge if isinstance(judge, BaselineHarness) else None
                score = (lambda c, t, j=judge: j(c, t).reward == 1.0) if one is None else one.score
                score(completions[0], tasks[0])  # warm: a container, the page cache
                t0 = time.perf_counter()
                serial = [score(c, t) for c, t in zip(completions, tasks, strict=True)]
                per_task = (time.perf_counter() - t0) / len(tasks)
                t0 = time.perf_counter()
                batched = judge.score_batch(completions, tasks)
                rate = len(tasks) / (time.perf_counter() - t0)
                ok = sum(serial), sum(b if isinstance(b, bool) else b.reward == 1.0 for b in batched)
                failed |= ok != (len(tasks), len(tasks))
                rows.append((name, label, judge_name, per_task, rate, ok, len(tasks)))
    sandbox.close_all()
    print(f"\nreference solutions, one at a time and batched over {args.workers} workers\n")
    print(
        "| backend | tasks | judge | s per task | vs one process | tasks/s batched | vs one process "
        "| passed |"
    )
    print("|---|---|---|---|---|---|---|---|")
    base = {(r[0], r[1]): r for r in rows if r[2].startswith("one process")}
    for backend_name, label, judge_name, per_task, rate, ok, n in rows:
        b = base.get((backend_name, label))
        rel_t = f"{per_task / b[3]:.2f}×" if b else "-"
        rel_r = f"{rate / b[4]:.2f}×" if b else "-"
        print(
            f"| {backend_name} | {label} | {judge_name} | {per_task:.3f} | {rel_t} | {rate:.1f} | {rel_r} "
            f"| {ok[0]}/{n}, {ok[1]}/{n} |"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
