"""The reward audit (`textgym audit`): how often a reward accepts what it should reject, and the reverse.

A scorer (an env's verifier, an LLM judge, or a reward model) scores a set of labelled
completions (`textgym.evaluation.audit_set`); a completion counts as accepted when its reward
is at least `threshold`. The report gives the false-positive rate (wrong completions
accepted, over all wrong ones), the false-negative rate (right completions rejected, over all
right ones), and both per kind of completion. For a judge it adds, when the items carry task
indices of an env, the env verifier's verdicts on the same items (agreement and Cohen's κ,
Cohen 1960, eq. 1: κ = (p_o − p_e) / (1 − p_e)), and the judge's position bias: each prompt's first
right completion is compared with each of its wrong ones in both orders, and the report gives
how often the two orders agree, how often each position won, and how often the right
completion was preferred (Zheng et al. 2023, arXiv:2306.05685, §3.3). Markdown + JSON.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textgym.evaluation.audit_set import AuditItem
from textgym.verifiers.base import Score

Scorer = Callable[[list[AuditItem]], list[Score]]
"""Scores a list of items, in order."""


def verifier_scorer(env_id: str, env_kwargs: dict[str, Any] | None = None) -> Scorer:
    """Score items with an env's own verifier: reset to the item's `task_index`, step the completion.

    The reward is the env's accuracy term (`info["reward/<accuracy_term>"]`, e.g. `reward/correct`)
    when it reports one, else the step's reward. An item without `task_index` scores 0.0 with an
    `error` in its details.
    """
    from textgym.envs.registry import make

    env = make(env_id, **(env_kwargs or {}))
    term = "reward/" + str(getattr(env.unwrapped, "accuracy_term", "correct"))

    def score(items: list[AuditItem]) -> list[Score]:
        out = []
        for it in items:
            if it.task_index is None:
                out.append(Score(0.0, {"error": "no task_index: the env's verifier needs one"}))
                continue
            env.reset(options={"task_index": it.task_index})
            _, reward, _, _, info = env.step(it.completion)
            value = float(info.get(term, reward))
            out.append(Score(value, {"error": info["error"]} if "error" in info else {}))
        return out

    return score


def judge_scorer(judge: Any) -> Scorer:
    """Score items with a `JudgeVerifier`: pointwise, or in group mode a prompt's items in one request."""
    from textgym.verifiers.judge import JudgeItem

    def score(items: list[AuditItem]) -> list[Score]:
        if judge.mode != "group":
            return list(judge.score([JudgeItem(it.prompt, (it.completion,), it.answer) for it in items]))
        by_prompt: dict[str, list[int]] = defaultdict(list)
        for i, it in enumerate(items):
            by_prompt[it.prompt].append(i)
        groups = list(by_prompt.values())
        asks = [
            JudgeItem(items[g[0]].prompt, tuple(items[i].completion for i in g), items[g[0]].answer)
            for g in groups
        ]
        out: list[Score] = [Score(0.0)] * len(items)
        for g, scores in zip(groups, judge.rank(asks), strict=True):
            for i, s in zip(g, scores, strict=True):
                out[i] = s
        return out

    return score


def reward_model_scorer(model_dir: str | Path, device: str = "cpu") -> Scorer:
    """Score items with a trained reward model (its scalar; pick the audit's threshold on that scale)."""
    from textgym.verifiers.reward_model import RewardModelVerifier

    rm = RewardModelVerifier(model_dir, device=device)

    def score(items: list[AuditItem]) -> list[Score]:
        convs = [
            [{"role": "user", "content": it.prompt}, {"role": "assistant", "content": it.completion}]
            for it in items
        ]
        return [Score(float(r)) for r in rm.score_messages(convs)]  # type: ignore[arg-type]

    return score


def _rates(labels: list[bool], accepted: list[bool]) -> dict[str, Any]:
    pos = sum(labels)
    neg = len(labels) - pos
    fp = sum(a and not y for y, a in zip(labels, accepted, strict=True))
    fn = sum(y and not a for y, a in zip(labels, accepted, strict=True))
    return {
        "positives": pos,
        "negatives": neg,
        "false_positives": fp,
        "false_negatives": fn,
        "false_positive_rate": fp / neg if neg else None,
        "false_negative_rate": fn / pos if pos else None,
    }


def cohen_kappa(a: list[bool], b: list[bool]) -> float | None:
    """Cohen's κ of two binary raters (None when chance agreement is 1, e.g. both constant)."""
    n = len(a)
    if n == 0:
        return None
    po = sum(x == y for x, y in zip(a, b, strict=True)) / n
    pa, pb = sum(a) / n, sum(b) / n
    pe = pa * pb + (1 - pa) * (1 - pb)
    return None if pe >= 1.0 else (po - pe) / (1 - pe)


def position_bias(judge: Any, items: list[AuditItem]) -> dict[str, Any] | None:
    """The judge's pairwise verdicts on (first right completion, each wrong one) of every prompt, both orders.

    Returns:
        None when no prompt has both; else `pairs`, `consistent_rate` (both orders name the
        same winner), `picked_a` / `picked_b` (verdicts for each position), `bias`
        ((A − B) / decisive verdicts, in [−1, 1]), `right_preferred` (mean preference for the
        right completion), `wrong_preferred_by_kind` and `unparsable`.
    """
    from textgym.verifiers.judge import JudgeItem

    by_prompt: dict[str, list[AuditItem]] = defaultdict(list)
    for it in items:
        by_prompt[it.prompt].append(it)
    pairs = []
    for p, its in by_prompt.items():
        good = next((it for it in its if it.label), None)
        if good is not None:
            pairs += [
                (JudgeItem(p, (good.completion, bad.completion), good.answer), bad.kind)
                for bad in its
                if not bad.label
            ]
    if not pairs:
        return None
    results = judge.compare([p for p, _ in pairs])
    a = sum(s.details["picked_a"] for s in results)
    b = sum(s.details["picked_b"] for s in results)
    lost: dict[str, list[float]] = defaultdict(list)
    for (_, kind), s in zip(pairs, results, strict=True):
        lost[kind].append(1.0 - s.reward)
    return {
        "pairs": len(pairs),
        "requests": 2 * len(pairs),
        "consistent_rate": sum(bool(s.details["consistent"]) for s in results) / len(pairs),
        "picked_a": a,
        "picked_b": b,
        "bias": (a - b) / (a + b) if a + b else 0.0,
        "right_preferred": sum(s.reward for s in results) / len(pairs),
        "wrong_preferred_by_kind": {k: sum(v) / len(v) for k, v in sorted(lost.items())},
        "unparsable": sum("error" in s.details for s in results),
    }


def run_audit(
    items: list[AuditItem],
    scorer: Scorer,
    *,
    threshold: float = 0.5,
    describe: dict[str, Any] | None = None,
    verifier: Scorer | None = None,
    judge: Any = None,
) -> dict[str, Any]:
    """Score `items` and report false-positive / false-negative rates, overall and per kind.

    Args:
        items: labelled completions.
        scorer: what is audited.
        threshold: a completion is accepted when its reward is >= this.
        describe: facts about the scorer and the set, copied into the report.
        verifier: the env's verifier, for a judge's agreement with it (items with task indices only).
        judge: a `JudgeVerifier`, to measure its position bias with pairwise comparisons.

    Returns:
        The report (JSON-serialisable): `false_positive_rate`, `false_negative_rate`, `kinds`,
        `verifier` (or None), `position_bias` (or None), and every scored `rows`.
    """
    scores = scorer(items)
    accepted = [s.reward >= threshold for s in scores]
    labels = [it.label for it in items]
    rows = [
        {
            "kind": it.kind,
            "label": "correct" if it.label else "wrong",
            "reward": s.reward,
            "accepted": ok,
            "task_index": it.task_index,
            **({"error": s.details["error"]} if "error" in s.details else {}),
        }
        for it, s, ok in zip(items, scores, accepted, strict=True)
    ]
    kinds = []
    for kind in dict.fromkeys(it.kind for it in items):
        idx = [i for i, it in enumerate(items) if it.kind == kind]
        kinds.append(
            {
                "kind": kind,
                "label": rows[idx[0]]["label"],
                "n": len(idx),
                "accepted_rate": sum(accepted[i] for i in idx) / len(idx),
                "reward_mean": sum(scores[i].reward for i in idx) / len(idx),
                "errors": sum("error" in rows[i] for i in idx),
            }
        )
    report: dict[str, Any] = {
        **(describe or {}),
        "n": len(items),
        "threshold": threshold,
        **_rates(labels, accepted),
        "kinds": kinds,
        "verifier": None,
        "position_bias": None,
    }
    if verifier is not None:
        idx = [i for i, it in enumerate(items) if it.task_index is not None]
        v_scores = verifier([items[i] for i in idx])
        v_ok = [s.reward >= 0.5 for s in v_scores]
        mine = [accepted[i] for i in idx]
        for i, s in zip(idx, v_scores, strict=True):
            rows[i]["verifier_reward"] = s.reward
        report["verifier"] = {
            "n": len(idx),
            **_rates([labels[i] for i in idx], v_ok),
            "agreement": sum(x == y for x, y in zip(mine, v_ok, strict=True)) / len(idx) if idx else None,
            "kappa": cohen_kappa(mine, v_ok),
        }
    if judge is not None:
        report["position_bias"] = position_bias(judge, items)
    report["rows"] = rows
    return report


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def audit_markdown(report: dict[str, Any]) -> str:
    """The report as Markdown: the rates, the per-kind table, the verifier's agreement, the position bias."""
    lines = [f"# Reward audit: {report.get('scorer', 'scorer')}", ""]
    if report.get("set"):
        lines += [
            f"Set: {report['set']} · {report['n']} completions · "
            f"accepted when reward ≥ {report['threshold']}",
            "",
        ]
    lines += [
        "| false-positive rate | false-negative rate | wrong accepted | right rejected |",
        "|---|---|---|---|",
        f"| {_pct(report['false_positive_rate'])} | {_pct(report['false_negative_rate'])} "
        f"| {report['false_positives']} / {report['negatives']} "
        f"| {report['false_negatives']} / {report['positives']} |",
        "",
        "| kind | label | n | accepted | mean reward | unparsable / errors |",
        "|---|---|---|---|---|---|",
    ]
    for k in report["kinds"]:
        lines.append(
            f"| {k['kind']} | {k['label']} | {k['n']} | {_pct(k['accepted_rate'])} "
            f"| {k['reward_mean']:.3f} | {k['errors']} |"
        )
    v = report.get("verifier")
    if v:
        kappa = "—" if v["kappa"] is None else f"{v['kappa']:.3f}"
        lines += [
            "",
            f"Agreement with the env's verifier on {v['n']} items: {_pct(v['agreement'])} "
            f"(Cohen's κ {kappa}); "
            f"the verifier's own false-positive rate {_pct(v['false_positive_rate'])}, "
            f"false-negative rate {_pct(v['false_negative_rate'])}.",
        ]
    pb = report.get("position_bias")
    if pb:
        lines += [
            "",
            f"Position bias ({pb['pairs']} right-vs-wrong pairs, each asked in both orders): "
            f"the orders agree on "
            f"{_pct(pb['consistent_rate'])}; position A won {pb['picked_a']} times, B {pb['picked_b']} "
            f"(bias {pb['bias']:+.2f}, 0 = none); the right completion was preferred "
            f"{_pct(pb['right_preferred'])}.",
        ]
    return "\n".join(lines) + "\n"


def write_audit(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write `audit.json` and `audit.md` into `out_dir`; return their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "audit.json", "md": out / "audit.md"}
    paths["json"].write_text(json.dumps(report, indent=1, ensure_ascii=False), encoding="utf-8")
    paths["md"].write_text(audit_markdown(report), encoding="utf-8")
    return paths
