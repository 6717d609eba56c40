"""The DPO stage's rounds: roll out the policy, pair the rollouts, train on the pairs."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.config import RunConfig
from textgym.stages.registry import StageContext, StageResult, register_stage
from textgym.stages.rounds import Round, run_rounds, train_round


def collect_round(
    cfg: RunConfig,
    r: int,
    round_dir: Path,
    model: Any,
    tok: Any,
    model_path: Path,
    echo: Callable[[str], None],
) -> tuple[Any, Any, dict[str, Any]]:
    """Round `r` of the DPO stage: roll out the policy, build and write the pairs; return them and counts.

    Returns:
        (pairs, unpaired examples, counts: rollouts, new tasks, mean reward, pairs, desirable/undesirable).
    """
    from textgym.offline import build_pairs, collect_rollouts, write_pairs
    from textgym.offline.store import read_trajectories

    pc = cfg.dpo
    assert pc is not None
    agent = LLMAgent(model, tok, batch_size=256)
    c = pc.collect
    t0 = time.perf_counter()
    res = collect_rollouts(
        agent,
        pc.env.id,
        round_dir / "trajectories",
        env_kwargs=pc.env.kwargs,
        n=c.n,
        samples=c.samples,
        start=c.start + r * c.n,
        params=SamplingParams(**c.sampling.model_dump()),
        policy=str(model_path),
        policy_version=r,
        seed=cfg.seed,
        run=cfg.name,
    )
    table = read_trajectories(round_dir / "trajectories")
    pairs, unpaired, stats = build_pairs(
        table,
        margin=pc.pairs.margin,
        mode=pc.pairs.mode,
        max_per_prompt=pc.pairs.max_per_prompt,
        dedup=pc.pairs.dedup,
        desirable_threshold=pc.pairs.desirable_threshold,
        seed=cfg.seed + r,
    )
    write_pairs(pairs, unpaired, round_dir / "pairs")
    mean_reward = sum(table.column("reward").to_pylist()) / max(table.num_rows, 1)
    echo(
        f"dpo round {r}: {table.num_rows} rollouts (mean reward {mean_reward:.3f}, "
        f"{time.perf_counter() - t0:.0f}s) -> {stats.pairs} pairs, "
        f"{stats.desirable}/{stats.undesirable} desirable/undesirable"
    )
    counts = {
        "round": r,
        "rollouts": table.num_rows,
        "new_tasks": res.new_tasks,
        "rollout_mean_reward": mean_reward,
        "pairs": stats.pairs,
        "desirable": stats.desirable,
        "undesirable": stats.undesirable,
    }
    return pairs, unpaired, counts


@register_stage("dpo", order=20)
def dpo_stage(ctx: StageContext, model_path: Path) -> StageResult:
    """Run `cfg.dpo.rounds` rounds of collect → pair → train (`run_rounds`, in `<run_dir>/dpo/round_<r>/`).

    Each round rolls out the current policy (`collect_round`, on rank 0 under torchrun), pairs
    the rollouts and trains a `PreferenceTrainer` on them in `round_<r>/train/`. With `resume`,
    finished rounds (`train/final/`) are skipped. The summary gets `dpo_rounds`, one dict of
    counts per round trained now.
    """
    cfg, pc = ctx.cfg, ctx.cfg.dpo
    assert pc is not None

    def collect(rnd: Round) -> tuple[Any, Any, dict[str, Any]]:
        return collect_round(cfg, rnd.index, rnd.dir, rnd.model, rnd.tok, rnd.model_path, ctx.echo)

    def train(rnd: Round, data: tuple[Any, Any, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
        from textgym.trainers.preference.offline import PreferenceTrainer

        pairs, unpaired, counts = data
        return train_round(ctx, rnd, PreferenceTrainer, pc, pairs, unpaired), counts

    return run_rounds(ctx, "dpo", pc.rounds, model_path, finished=_finished, collect=collect, train=train)


def _finished(round_dir: Path) -> tuple[Path, None] | None:
    """A finished round's model (`train/final/`; its counts are not kept), or None."""
    final = round_dir / "train" / "final"
    return (final, None) if (final / "config.json").is_file() else None
