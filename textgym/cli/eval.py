"""`textgym eval` (one env or a suite, with a model or a scripted agent) and `textgym report compare`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from textgym.cli._common import (
    EnvKwargs,
    MaxNewTokens,
    ModelHelp,
    Temperature,
    check_backend,
    console,
    fail,
    model_source,
    parse_kwargs,
)
from textgym.config import EvalJobConfig

report_app = typer.Typer(help="Compare evaluation reports.", no_args_is_help=True)

_DEFAULT = EvalJobConfig()
EnvId = Annotated[str | None, typer.Option(help="Environment id, e.g. textgym/Arithmetic-v0.")]
Suite = Annotated[
    str | None,
    typer.Option(help="A suite instead of one env: math, code, tools, core, or a suite YAML file."),
]
Out = Annotated[
    Path | None,
    typer.Option(
        help="Keep finished episodes in OUT/episodes.jsonl (rerunning resumes an interrupted eval); "
        "with --suite also write report.json, report.md and report.png there."
    ),
]
Model = Annotated[str | None, typer.Option(help=ModelHelp + " (--agent model)")]
AgentKind = Annotated[
    str, typer.Option("--agent", help="model (needs --model), oracle (reads the hidden solution) or random.")
]
Endpoint = Annotated[
    str | None,
    typer.Option(help="Generate through an OpenAI-compatible server; --model is then its tokenizer folder."),
]
ServedModel = Annotated[str | None, typer.Option(help="Model name on --endpoint.")]
Backend = Annotated[str, typer.Option(help="Local generation backend for --model: transformers or vllm.")]
LogTrajectories = Annotated[
    bool, typer.Option(help="With --out: also write full trajectories to OUT/trajectories (Parquet).")
]
NTasks = Annotated[int, typer.Option(min=1, help="Number of tasks (task_index 0..n-1).")]
Samples = Annotated[int, typer.Option(min=1, help="Samples per task (pass@k for k=1 and k=samples).")]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Prm = Annotated[
    Path | None,
    typer.Option(
        help="A process reward model (textgym prm train): rank the --samples of each task by it and "
        "report best-of-n accuracy beside majority vote and pass@n."
    ),
]
PrmAggregate = Annotated[
    str | None,
    typer.Option(help="How --prm's step scores make one: min, product or last (default: the PRM's)."),
]
Show = Annotated[
    int, typer.Option("--show", min=0, help="Also print the first N episodes: conversation, reward, terms.")
]
RunDir = Annotated[
    Path | None,
    typer.Option(
        "--run",
        help="Read a training run's folder instead of evaluating: its before/after figures, the "
        "format-controlled baseline, the error split, and --show N (default 3) tasks' transcripts "
        "before and after (eval_before.jsonl, eval_after.jsonl).",
    ),
]


def eval_cmd(
    env: EnvId = None,
    suite: Suite = None,
    out: Out = None,
    model: Model = None,
    agent_kind: AgentKind = _DEFAULT.agent.kind,
    seed: Annotated[int, typer.Option(help="Seed of the random agent.")] = _DEFAULT.agent.seed,
    endpoint: Endpoint = None,
    served_model: ServedModel = None,
    backend: Backend = _DEFAULT.agent.backend,
    log_trajectories: LogTrajectories = False,
    env_kwargs: EnvKwargs = None,
    n: NTasks = _DEFAULT.n,
    samples: Samples = _DEFAULT.samples,
    temperature: Temperature = _DEFAULT.sampling.temperature,
    max_new_tokens: MaxNewTokens = _DEFAULT.sampling.max_new_tokens,
    as_json: AsJson = False,
    show: Show = 0,
    prm: Prm = None,
    prm_aggregate: PrmAggregate = None,
    run: RunDir = None,
) -> None:
    """Evaluate a model, or the scripted oracle / random agent, on an env: accuracy, reward, pass@k.

    With --run, read a training run's evaluations instead (nothing is evaluated).
    """
    from textgym.config import ConfigError
    from textgym.evaluation.job import run_eval

    if run is not None:
        print_run(run, show or 3)
        return

    agent = {"kind": agent_kind, "seed": seed, "endpoint": endpoint, "served_model": served_model}
    if agent_kind == "model":
        agent.update(model=None if model is None else model_source(model), backend=backend)
    job = _job(
        {"env": env, "suite": suite, "env_kwargs": parse_kwargs(env_kwargs), "n": n, "samples": samples,
         "sampling": {"temperature": temperature, "max_new_tokens": max_new_tokens}, "agent": agent,
         "out": None if out is None else str(out), "log_trajectories": log_trajectories,
         "prm": None if prm is None else str(prm), "prm_aggregate": prm_aggregate}
    )  # fmt: skip
    try:
        outcome = run_eval(job)
    except ConfigError as e:
        fail(str(e))
    if outcome.report is not None:
        _print_suite(outcome.report, outcome.written)
    elif as_json:
        summary = outcome.result.summary()  # type: ignore[union-attr]
        if show:
            summary["episodes"] = outcome.result.episodes[:show]  # type: ignore[union-attr]
        if outcome.best_of_n is not None:
            summary["best_of_n"] = outcome.best_of_n
        print(json.dumps(summary))
    else:
        if show:
            print_episodes(outcome.result.episodes[:show])  # type: ignore[union-attr]
        who = str(model) if agent_kind == "model" else f"{agent_kind} agent"
        console.print(_result_table(outcome.result, f"{env} {job.env_kwargs or ''} · {who}"))
        if outcome.best_of_n is not None:
            console.print(_best_of_n_table(outcome.best_of_n, f"best-of-n by the PRM {prm}"))


def print_episodes(episodes: list[dict[str, Any]], max_chars: int = 2000) -> None:
    """Print each episode: its conversation, tool turns included, its agent turns, reward and terms.

    Messages longer than `max_chars` characters are cut.
    """
    from rich.markup import escape
    from rich.panel import Panel

    for e in episodes:
        lines = []
        for m in e.get("messages", []):
            text = str(m.get("content", ""))
            text = text if len(text) <= max_chars else text[:max_chars] + f" ... [{len(text)} chars]"
            lines.append(f"[bold]{escape(str(m.get('role')))}[/bold]: {escape(text)}")
        terms = " ".join(f"{k.split('/', 1)[-1]}={v:.3g}" for k, v in sorted(e.get("terms", {}).items()))
        title = f"task {e.get('task_index')} · sample {e.get('sample', 0)}"
        roles = [m.get("role") for m in e.get("messages", [])]
        turns = f"{roles.count('assistant')} turns, {roles.count('tool')} tool results"
        subtitle = f"reward {float(e['reward']):.3f} · correct {e['correct']} · {turns} · {terms}"
        console.print(Panel("\n".join(lines), title=title, subtitle=subtitle, title_align="left"))


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a half-written last line of a killed run
            continue
    return rows


def _reply(episode: dict[str, Any], max_chars: int = 600) -> str:
    """The episode's last reply, stripped and cut at `max_chars` (`(empty)` for whitespace only)."""
    msgs = episode.get("messages", [])
    text = next((str(m["content"]) for m in reversed(msgs) if m["role"] == "assistant"), "").strip()
    return (text[:max_chars] + " ...") if len(text) > max_chars else (text or "(empty)")


def print_run(run_dir: Path, show: int) -> None:
    """Print what a training run's evaluations say: figures, then `show` tasks before and after.

    The figures: accuracy before and after, the stated-answer accuracy and the cut share of each,
    the format-controlled baseline (its variant and budget) and the gain above it, and the error
    split by task category. The tasks shown are those whose correctness changed first, then the rest.

    Exits with code 2 when `run_dir` has no `summary.json` (a run that has not finished its eval).
    """
    from rich.markup import escape

    summary_path = run_dir / "summary.json"
    if not summary_path.is_file():
        fail(f"{run_dir} has no summary.json: not a finished training run with an eval section")
    s = json.loads(summary_path.read_text(encoding="utf-8"))
    table = Table(title=f"{s.get('name', run_dir.name)} · {s.get('eval_env', '')} · n={s.get('n_eval', '')}")
    for col in ("", "before", "after", "baseline"):
        table.add_column(col, justify="right")
    base = s.get("baseline") or {}

    def cell(v: Any) -> str:
        return "" if v is None else f"{v:.3f}"

    table.add_row(
        "accuracy",
        cell(s.get("accuracy_before")),
        cell(s.get("accuracy_after")),
        cell(s.get("accuracy_baseline")),
    )
    table.add_row(
        "stated answers",
        cell(s.get("stated_accuracy_before")),
        cell(s.get("stated_accuracy_after")),
        cell(base.get("stated_accuracy")),
    )
    table.add_row(
        "cut share",
        cell(s.get("cut_share_before")),
        cell(s.get("cut_share_after")),
        cell(base.get("cut_share")),
    )
    console.print(table)
    if base:
        console.print(
            f"baseline: the model before with the answer format given ({escape(str(base.get('variant')))}, "
            f"{base.get('max_new_tokens')} tokens); gain above it {s.get('gain_above_baseline', 0.0):+.3f}"
        )
    split_before, split_after = s.get("error_split_before") or {}, s.get("error_split_after") or {}
    for cat in sorted(set(split_before) | set(split_after)):
        b, a = split_before.get(cat, {}), split_after.get(cat, {})
        right = [f"{x.get('correct', 0)}/{x.get('n', 0)}" for x in (b, a)]
        console.print(f"{cat}: correct {right[0]} before, {right[1]} after")
    before = {(e["task_index"], e.get("sample", 0)): e for e in _read_jsonl(run_dir / "eval_before.jsonl")}
    after = {(e["task_index"], e.get("sample", 0)): e for e in _read_jsonl(run_dir / "eval_after.jsonl")}
    keys = sorted(set(before) & set(after), key=lambda k: (before[k]["correct"] == after[k]["correct"], k))
    for k in keys[:show]:
        b, a = before[k], after[k]
        question = next((str(m["content"]) for m in b.get("messages", []) if m["role"] == "user"), "")
        console.print(
            f"\n[bold]task {k[0]}[/bold] (gold {escape(str(b.get('gold', '?')))}): {escape(question)}"
        )
        console.print(f"  before ({'right' if b['correct'] else 'wrong'}): {escape(_reply(b))}")
        console.print(f"  after  ({'right' if a['correct'] else 'wrong'}): {escape(_reply(a))}")


def _job(options: dict[str, Any]) -> EvalJobConfig:
    """The eval job of the command's options; exits with code 2 on a bad agent or backend."""
    agent = options["agent"]
    if agent["kind"] not in ("model", "oracle", "random"):
        fail(f"--agent must be model, oracle or random, got {agent['kind']!r}")
    if agent["kind"] == "model":
        check_backend(agent["backend"])
    one_env = options["env"] is not None and options["suite"] is None
    greedy = options["sampling"]["temperature"] == 0.0
    if one_env and agent["kind"] == "model" and options["samples"] > 1 and greedy:
        note = "note: --samples > 1 with greedy decoding gives identical samples; set --temperature"
        typer.echo(note, err=True)
    return EvalJobConfig.model_validate(options)


def _print_suite(report: dict[str, Any], written: dict[str, Path]) -> None:
    """The suite's markdown table, then the report files written."""
    from textgym.evaluation.suites import markdown_table

    print(markdown_table(report))
    for kind, path in written.items():
        console.print(f"wrote {kind}: {path}")


def _result_table(res: Any, title: str) -> Table:
    """One row of an `EvalResult`: n, samples, accuracy, mean reward, pass@k, response tokens, tokens/s."""
    hacks = res.hacks()
    if hacks:  # shares of the rewarded episodes that hedge, restate the question, ... (hack_telemetry)
        title += "\nrewarded episodes that " + ", ".join(f"{k[5:-5]}: {v:.2f}" for k, v in hacks.items())
    turns = res.turn_stats() if hasattr(res, "turn_stats") else {}
    if turns and turns["turns_mean"] > 1:  # multi-turn: what the agent did per episode
        cut = ", ".join(f"{k[10:-5]} {v:.2f}" for k, v in turns.items() if k.startswith("truncated_") and v)
        title += (
            f"\nper episode: turns {turns['turns_mean']:.2f}, tool calls {turns['tool_calls_mean']:.2f}, "
            f"tool errors {turns['tool_errors_mean']:.2f}, "
            f"invalid actions {turns['invalid_actions_mean']:.2f}, "
            f"reward/turn {turns['reward_per_turn_mean']:.3f}" + (f"; truncated: {cut}" if cut else "")
        )
    table = Table(title=title)
    pass_cols = [f"pass@{k}" for k in res.pass_at]
    accuracy = "accuracy" if res.accuracy_term == "correct" else f"accuracy ({res.accuracy_term})"
    for col in ("n", "samples", accuracy, "mean reward", *pass_cols, "resp. tokens", "tokens/s"):
        table.add_column(col, justify="right")
    table.add_row(
        str(res.n),
        str(res.samples),
        f"{res.accuracy:.3f}",
        f"{res.mean_reward:.3f}",
        *[f"{v:.3f}" for v in res.pass_at.values()],
        f"{res.mean_response_tokens:.1f}",
        f"{res.tokens_per_s:.0f}",
    )
    return table


def _best_of_n_table(rows: list[dict[str, Any]], title: str) -> Table:
    """Accuracy against n: the PRM's pick, majority vote, pass@n, and the mean single sample."""
    table = Table(title=title)
    for col in ("n", "best-of-n (PRM)", "majority vote", "pass@n", "single sample"):
        table.add_column(col, justify="right")
    for r in rows:
        table.add_row(
            str(r["n"]),
            f"{r['best_of_n']:.3f}",
            f"{r['majority']:.3f}",
            f"{r['pass_at_n']:.3f}",
            f"{r['mean']:.3f}",
        )
    return table


@report_app.command("compare")
def report_compare_cmd(
    a: Annotated[Path, typer.Argument(help="report.json of policy A (textgym eval --suite ... --out).")],
    b: Annotated[Path, typer.Argument(help="report.json of policy B.")],
    alpha: Annotated[float, typer.Option(min=0.0, max=1.0, help="Significance level.")] = 0.05,
    as_json: AsJson = False,
) -> None:
    """Two policies side by side: accuracy per env, B − A, exact McNemar p-value on shared tasks."""
    from textgym.evaluation.suites import compare_reports

    reports = [_read_report(path) for path in (a, b)]
    rows = compare_reports(reports[0], reports[1], alpha)
    if as_json:
        print(json.dumps(rows))
        return
    print(f"A: {reports[0]['policy']} ({a})\nB: {reports[1]['policy']} ({b})\n")
    print("| env | paired tasks | accuracy A | accuracy B | B − A | McNemar p | significant |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        if "only_in" in r:
            print(f"| {r['env_id']} | | | | | | only in {r['only_in']} |")
            continue
        print(
            f"| {r['env_id']} | {r['paired_tasks']} | {r['accuracy_a']:.3f} | {r['accuracy_b']:.3f} | "
            f"{r['diff']:+.3f} | {r['p_value']:.3g} | {'yes' if r['significant'] else 'no'} |"
        )


def _read_report(path: Path) -> dict[str, Any]:
    """A suite report (report.json), or exit 2 saying why it is not one."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict) or not isinstance(data.get("envs"), list):
            raise ValueError("not a textgym report (no 'envs' list)")
    except (OSError, ValueError) as e:
        fail(f"cannot read report {str(path)!r}: {e}")
    return data
