"""Evaluation suites: named sets of environments, run as one report (Markdown, JSON, PNG).

Built-in suites: `math`, `code`, `tools`, and `core` (all three). A user suite is a YAML
file:

    name: my_suite
    envs:
      - {id: textgym/Arithmetic-v0, kwargs: {split: test}, n: 200}
      - {id: textgym/MBPP-v0, kwargs: {split: test}, n: 100}

`textgym eval --suite NAME_OR_FILE (--model DIR | --agent oracle|random) [--samples K] [--out DIR]`
writes `report.json`, `report.md` and `report.png`; `textgym report compare A.json B.json`
puts two reports side by side with, per env, the accuracy difference and whether it is
significant (exact McNemar test on the tasks both evaluated, α = 0.05).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from textgym.evaluation.core import EvalResult, pass_at_k

__all__ = [
    "BUILTIN_SUITES",
    "Z_95",
    "Suite",
    "SuiteEnv",
    "bootstrap_interval",
    "compare_reports",
    "env_report",
    "load_suite",
    "markdown_table",
    "mcnemar_p",
    "plot_report",
    "run_suite",
    "wilson_interval",
    "write_report",
]

Z_95 = 1.959963984540054
"""Standard normal quantile of 0.975 (two-sided 95%)."""


class SuiteEnv(BaseModel):
    """One environment of a suite: its id, constructor kwargs and task count `n` (tasks 0..n-1).

    `max_new_tokens`, when set, is this env's token budget per turn in place of the job's
    (`--max-new-tokens`): a multi-turn game whose moves are a few tokens long need not give
    every turn the budget a worked solution needs.
    """

    model_config = ConfigDict(extra="forbid")
    id: str
    kwargs: dict[str, Any] = Field(default_factory=dict)
    n: int = Field(ge=1)
    max_new_tokens: int | None = Field(default=None, ge=1)

    @field_validator("id")
    @classmethod
    def _registered(cls, v: str) -> str:
        import textgym.envs  # noqa: F401  (registers the textgym/... ids)
        from textgym.envs.registry import ensure_registered

        return ensure_registered(v)


class Suite(BaseModel):
    """A named list of `SuiteEnv`, after importing the modules in `imports` (they register env ids)."""

    model_config = ConfigDict(extra="forbid")
    name: str
    imports: list[str] = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _imports_first(cls, data: Any) -> Any:
        from textgym.config.base import import_before_validation

        return import_before_validation(data)

    envs: list[SuiteEnv] = Field(min_length=1)


_MATH = [
    {"id": "textgym/Arithmetic-v0", "kwargs": {"split": "test"}, "n": 100},
    {"id": "textgym/GSM8K-v0", "kwargs": {"split": "test"}, "n": 50},
    {"id": "textgym/MATH500-v0", "n": 50},
]
_CODE = [
    {"id": "textgym/HumanEval-v0", "n": 50},
    {"id": "textgym/MBPP-v0", "kwargs": {"split": "test"}, "n": 50},
]
_TOOLS = [
    {"id": "textgym/ToolMath-v0", "kwargs": {"split": "test"}, "n": 50},
    {"id": "textgym/WebShop-v0", "n": 50},
    {"id": "textgym/WikiSearch-v0", "n": 50},
    {"id": "textgym/Wordle-v0", "n": 50},
    {"id": "textgym/GuessNumber-v0", "kwargs": {"split": "test"}, "n": 50},
]
BUILTIN_SUITES: dict[str, list[dict[str, Any]]] = {
    "math": _MATH,
    "code": _CODE,
    "tools": _TOOLS,
    "core": _MATH + _CODE + _TOOLS,
}


def load_suite(name_or_path: str) -> Suite:
    """A built-in suite by name, or a suite from a YAML file.

    Raises:
        ValueError: on an unknown name, a missing file, or an invalid suite (the message names the field).
    """
    if name_or_path in BUILTIN_SUITES:
        return Suite(name=name_or_path, envs=[SuiteEnv(**e) for e in BUILTIN_SUITES[name_or_path]])
    path = Path(name_or_path)
    if not path.is_file():
        raise ValueError(
            f"unknown suite {name_or_path!r}: not one of {sorted(BUILTIN_SUITES)} and not a file"
        )
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict):
        raise ValueError(f"suite file {path} must hold a mapping with 'name' and 'envs'")
    data.setdefault("name", path.stem)
    try:
        return Suite.model_validate(data)
    except ValidationError as e:
        from textgym.config.run import format_validation_error

        raise ValueError(f"suite file {path}: {format_validation_error(e)}") from None


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval of a binomial proportion (Wilson 1927, JASA 22:209, eq. for p±).

    `(p̂ + z²/2n ± z·sqrt(p̂(1−p̂)/n + z²/4n²)) / (1 + z²/n)`; for n = 0 it returns (0.0, 1.0).
    """
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    lo = 0.0 if successes == 0 else max(0.0, centre - half)  # exact at the ends (no rounding residue)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def bootstrap_interval(
    values: list[float], n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Percentile bootstrap interval of a mean over tasks (Efron & Tibshirani 1993, ch. 13)."""
    if not values:
        return 0.0, 1.0
    rng = np.random.default_rng(seed)
    arr = np.asarray(values, dtype=float)
    means = arr[rng.integers(0, len(arr), size=(n_boot, len(arr)))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return float(lo), float(hi)


def mcnemar_p(b: int, c: int) -> float:
    """Exact two-sided McNemar p-value for discordant counts b (A right, B wrong) and c (A wrong, B right).

    Under H0 the b of the b + c discordant tasks is Binomial(b + c, 1/2) (McNemar 1947).
    """
    n = b + c
    if n == 0:
        return 1.0
    k = min(b, c)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def env_report(res: EvalResult) -> dict[str, Any]:
    """One env's row of a report: figures, 95% intervals, and per-task correctness for comparisons."""
    episodes = [c for task in res.per_task for c in task]
    lo, hi = wilson_interval(sum(episodes), len(episodes))
    row = res.summary()
    row["accuracy_ci95"] = [lo, hi]
    for k in res.pass_at:
        per_task = [pass_at_k(res.samples, sum(t), k) for t in res.per_task]
        row[f"pass@{k}_ci95"] = list(bootstrap_interval(per_task))
    row["per_task"] = res.per_task
    return row


def run_suite(
    suite: Suite,
    evaluate_env: Callable[[str, dict[str, Any], int, int | None], EvalResult],
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Evaluate each env of `suite` by `evaluate_env(id, kwargs, n, max_new_tokens)`; a report row per env.

    `max_new_tokens` is the env's own budget (`SuiteEnv.max_new_tokens`), None for the job's;
    a row names it as `max_new_tokens` only when the env sets one.
    """
    from tqdm import tqdm

    rows = []
    for env in tqdm(suite.envs, desc=f"suite {suite.name}", unit="env", disable=not progress):
        result = evaluate_env(env.id, env.kwargs, env.n, env.max_new_tokens)
        row = env_report(result) | {"env_kwargs": env.kwargs}
        if env.max_new_tokens is not None:
            row["max_new_tokens"] = env.max_new_tokens
        rows.append(row)
    return rows


def markdown_table(report: dict[str, Any]) -> str:
    """The report as a Markdown table (one row per env)."""
    ks = sorted({k for r in report["envs"] for k in r["pass_at"]}, key=int)
    head = ["env", "n", "samples", "accuracy [95% CI]", "mean reward", *[f"pass@{k}" for k in ks]]
    head += ["resp. tokens", "wall s", "tokens/s"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report["envs"]:
        lo, hi = r["accuracy_ci95"]
        cells = [
            r["env_id"],
            str(r["n"]),
            str(r["samples"]),
            f"{r['accuracy']:.3f} [{lo:.3f}, {hi:.3f}]",
            f"{r['mean_reward']:.3f}",
            *[f"{r['pass_at'][k]:.3f}" if k in r["pass_at"] else "" for k in ks],
            f"{r['mean_response_tokens']:.1f}",
            f"{r['wall_time_s']:.1f}",
            f"{r['tokens_per_s']:.0f}",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot_report(report: dict[str, Any], out_path: Path) -> Path:
    """A bar chart of accuracy per env with its 95% interval as error bars (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = report["envs"]
    names = [r["env_id"].removeprefix("textgym/") for r in rows]
    acc = [r["accuracy"] for r in rows]
    err = [[max(0.0, a - r["accuracy_ci95"][0]) for a, r in zip(acc, rows, strict=True)]]
    err.append([max(0.0, r["accuracy_ci95"][1] - a) for a, r in zip(acc, rows, strict=True)])
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(rows) + 2), 4))
    bars = ax.bar(names, acc, yerr=err, capsize=4, color="#4C72B0")
    for bar, a in zip(bars, acc, strict=True):
        ax.text(bar.get_x() + bar.get_width() / 2, min(a + 0.03, 1.02), f"{a:.2f}", ha="center", fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_ylabel("accuracy (95% Wilson interval)")
    ax.set_title(f"suite {report['suite']} · {report['policy']}")
    plt.setp(ax.get_xticklabels(), rotation=30, ha="right")
    fig.tight_layout()
    fig.savefig(out_path, dpi=120)
    plt.close(fig)
    return out_path


def write_report(report: dict[str, Any], out_dir: Path) -> dict[str, Path]:
    """Write `report.json`, `report.md` and `report.png` into `out_dir`; return their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "md": out_dir / "report.md", "png": out_dir / "report.png"}
    paths["json"].write_text(json.dumps(report, indent=1), encoding="utf-8")
    title = f"# suite {report['suite']} · {report['policy']}\n\n"
    paths["md"].write_text(title + markdown_table(report), encoding="utf-8")
    plot_report(report, paths["png"])
    return paths


def compare_reports(a: dict[str, Any], b: dict[str, Any], alpha: float = 0.05) -> list[dict[str, Any]]:
    """Per env present in both reports: accuracies, B − A, and an exact McNemar test on shared tasks.

    Tasks are paired by index (task_index 0..n−1 in both); a task counts as correct when its
    first sample is. Envs present in one report only are listed with `"only_in"`.
    """
    rows = []
    index_b = {(r["env_id"], json.dumps(r.get("env_kwargs", {}), sort_keys=True)): r for r in b["envs"]}
    seen = set()
    for ra in a["envs"]:
        key = (ra["env_id"], json.dumps(ra.get("env_kwargs", {}), sort_keys=True))
        rb = index_b.get(key)
        if rb is None:
            rows.append({"env_id": ra["env_id"], "only_in": "A", "accuracy_a": ra["accuracy"]})
            continue
        seen.add(key)
        m = min(len(ra["per_task"]), len(rb["per_task"]))
        first_a = [t[0] for t in ra["per_task"][:m]]
        first_b = [t[0] for t in rb["per_task"][:m]]
        n_b = sum(1 for x, y in zip(first_a, first_b, strict=True) if x and not y)
        n_c = sum(1 for x, y in zip(first_a, first_b, strict=True) if y and not x)
        p = mcnemar_p(n_b, n_c)
        rows.append(
            {
                "env_id": ra["env_id"],
                "paired_tasks": m,
                "accuracy_a": ra["accuracy"],
                "accuracy_b": rb["accuracy"],
                "diff": rb["accuracy"] - ra["accuracy"],
                "a_only_correct": n_b,
                "b_only_correct": n_c,
                "p_value": p,
                "significant": p < alpha,
            }
        )
    for key, rb in index_b.items():
        if key not in seen:
            rows.append({"env_id": rb["env_id"], "only_in": "B", "accuracy_b": rb["accuracy"]})
    return rows
