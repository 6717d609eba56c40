"""Statistics of a step's trajectories (`rollout_metrics`) and the hack signs among them (`hack_warning`).

DAPO's overlong penalty is in `training/shaping.py`, the training rollouts' shards of the
trajectory store in `training/trajectory_log.py`.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from textgym import distributed
from textgym.agents.trajectory import EPISODE_COUNTS, TRUNCATION_CAUSES, Trajectory
from textgym.verifiers.hack_telemetry import hack_signs, judge_signs, shares_of

HACK_WARN_FRAC = 0.25
"""A step whose rewarded responses show a hack sign (`hack/*_frac`) at least this often says so."""


def hack_warning(metrics: dict[str, float], threshold: float = HACK_WARN_FRAC) -> str:
    """A note naming each `hack/*_frac` at or above `threshold` (for the progress line), or ""."""
    high = {k: v for k, v in metrics.items() if k.startswith("hack/") and v >= threshold}
    if not high:
        return ""
    return "  reward hacking? " + ", ".join(f"{k[5:-5]} {v:.2f}" for k, v in sorted(high.items()))


def episode_hack_signs(t: Trajectory) -> dict[str, int] | None:
    """A paid episode's reward-hacking signs (`hack_telemetry.hack_signs`) and its judge signs; None: unpaid.

    The judge signs (`hack_telemetry.judge_signs`), whether or not the env has a judge term:
    `forged_verdict` (issue 50), its last assistant message writes something shaped like an LLM
    judge's verdict (a `SCORE:`/`WINNER:` line, a `<verdict...>` tag, a JSON score);
    `claims_score` (issue 61), what it wrote claims a score or addresses the grader.
    """
    signs = hack_signs(t.reward, t.reward_terms, t.messages)
    if signs is not None:
        signs.update(judge_signs(t.messages))
    return signs


def rollout_metrics(trajs: list[Trajectory], gather: bool = True) -> dict[str, float]:
    """Reward, accuracy, reward terms, length, turn and reward-hacking statistics of a rollout batch.

    Multi-turn: `rollout/turns_mean` is the agent's turns per episode (`Trajectory.turns`, its
    tool-calling turns included; assistant messages an env opened with are not counted) and
    `rollout/tool_results_mean` the tool messages it got back per episode (one per call
    answered, errors included); both are 1 and 0 for single-turn envs.
    `rollout/reward_per_turn_mean` is the mean of each episode's return over its turns;
    `rollout/tool_calls_mean`, `rollout/tool_errors_mean` and `rollout/invalid_actions_mean`
    are per-episode counts (`Trajectory.counts`); `rollout/truncated_<cause>_frac` splits
    `rollout/truncated_frac` by cause: `time_limit`, `max_turns`, `context`.

    With `gather` (and several ranks), over every rank's trajectories: their rewards, lengths
    and terms are gathered first, so the statistics are those of the global batch, the hack
    shares (`hack_telemetry.hack_shares`, and `hack/forged_verdict_frac`: `episode_hack_signs`)
    included: each rank's episodes' signs are gathered.
    """
    rows = [
        (t.reward, t.response_length, t.finish_reason, t.reward_terms, t.truncated,
         episode_hack_signs(t),
         t.turns,
         sum(m.get("role") == "tool" for m in t.messages),
         t.truncation, dict(t.counts))
        for t in trajs
    ]  # fmt: skip
    if gather:
        rows = distributed.all_gather_list(rows)
    rewards = torch.tensor([r[0] for r in rows])
    lengths = torch.tensor([float(r[1]) for r in rows])
    m = {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()) if len(rows) > 1 else 0.0,
        "rollout/response_length_mean": float(lengths.mean()),
        "rollout/response_length_max": float(lengths.max()),
        "rollout/overlong_frac": sum(r[2] == "length" for r in rows) / len(rows),
        # episodes cut by the env's time limit or by the rollout's `max_turns` cap (default 16):
        # a multi-turn env that never ends shows here as 1.0
        "rollout/truncated_frac": sum(bool(r[4]) for r in rows) / len(rows),
        "rollout/turns_mean": sum(r[6] for r in rows) / len(rows),
        "rollout/tool_results_mean": sum(r[7] for r in rows) / len(rows),
        "rollout/reward_per_turn_mean": sum(r[0] / max(1, r[6]) for r in rows) / len(rows),
    }
    for cause in TRUNCATION_CAUSES:
        m[f"rollout/truncated_{cause}_frac"] = sum(r[8] == cause for r in rows) / len(rows)
    for key in EPISODE_COUNTS:
        m[f"rollout/{key}_mean"] = sum(r[9].get(key, 0) for r in rows) / len(rows)
    # code judges' refusals (a class or callable as the entry point, an object that is not plain
    # data): attempts, paid or not, so a share of every episode and not only of the paid ones
    if any(r[9].get("judge_refusals", 0) for r in rows):
        m["hack/judge_refused_frac"] = sum(r[9].get("judge_refusals", 0) > 0 for r in rows) / len(rows)
    terms: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        for k, v in r[3].items():
            terms[k].append(v)
    for k, vs in terms.items():
        m[f"rollout/{k.split('/', 1)[1]}_mean"] = sum(vs) / len(vs)
    if "reward/correct" in terms:
        m["rollout/accuracy"] = sum(v >= 1.0 for v in terms["reward/correct"]) / len(terms["reward/correct"])
    m.update(shares_of([r[5] for r in rows]))
    return m
