"""The DPO stage's rounds: roll out the policy, pair the rollouts, train on the pairs."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.config import RunConfig
from textgym.models import load_model
from textgym.stages.registry import StageContext, StageResult, register_stage
from textgym.training.seeding import seed_everything


def preference_rounds(
    cfg: RunConfig,
    run_dir: Path,
    model_path: Path,
    device: torch.device,
    resume: bool,
    echo: Callable[[str], None],
) -> tuple[Path, list[dict[str, Any]]]:
    """Run `cfg.dpo.rounds` rounds of collect → pair → train; return the last model and per-round counts.

    Each round rolls out the current policy (`collect_round`, on rank 0 under torchrun), pairs
    the rollouts and trains a `PreferenceTrainer` on them, in `<run_dir>/dpo/round_<r>/`.
    With `resume`, finished rounds are skipped.

    Returns:
        (the last round's final model folder, one dict of counts per round trained now).
    """
    from textgym.trainers.preference.offline import PreferenceTrainer

    pc = cfg.dpo
    assert pc is not None
    info: list[dict[str, Any]] = []
    for r in range(pc.rounds):
        round_dir = run_dir / "dpo" / f"round_{r}"
        final = round_dir / "train" / "final"
        if resume and (final / "config.json").is_file():
            echo(f"dpo round {r}: finished earlier, skipped")
            model_path = final
            continue
        model, tok = load_model(model_path, getattr(torch, cfg.model.dtype), device)

        # Distributed: rank 0 collects with the whole model (the others wait) and every rank
        # gets the pairs; the training below is sharded.
        collect = functools.partial(collect_round, cfg, r, round_dir, model, tok, model_path, echo)
        pairs, unpaired, counts = distributed.on_main(collect)
        seed_everything(distributed.rank_seed(cfg.seed + 100 + r))
        trainer = PreferenceTrainer(
            pc,
            model,
            tok,
            round_dir / "train",
            pairs,
            unpaired,
            seed=cfg.seed + r,
            resume=resume,
            parallel=cfg.parallel,
            log_with=cfg.log_with,
        )
        model_path = trainer.train(echo)
        info.append(counts)
    return model_path, info


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
    """The DPO family's rounds (`preference_rounds`); the summary gets `dpo_rounds`."""
    t = time.perf_counter()
    final, rounds = preference_rounds(ctx.cfg, ctx.run_dir, model_path, ctx.device, ctx.resume, ctx.echo)
    return StageResult(final, time.perf_counter() - t, {"dpo_rounds": rounds, "models_in_memory": ["policy"]})
