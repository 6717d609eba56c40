"""The round loop of the `dpo:` and `rft:` stages: sample the latest model → build data → train.

Round r runs in `<run_dir>/<stage>/round_<r>/`: it loads the model the last round left (the
stage's start model in round 0), rank 0 collects with it (the others wait and get what it
built), and every rank trains on that (sharded under torchrun). With `resume`, a round that
finished earlier is skipped and its model is the next round's start.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.models import load_model
from textgym.stages.registry import StageContext, StageResult
from textgym.training.seeding import seed_everything


@dataclass
class Round:
    """One round in progress.

    Attributes:
        index: r, from 0.
        dir: its folder, `<run_dir>/<stage>/round_<r>/`.
        model_path: the folder of the model it starts from.
        model: that model, loaded in the run's dtype on the stage's device (a round that trains
            another model sets this to None first, to free it).
        tok: its tokenizer.
    """

    index: int
    dir: Path
    model_path: Path
    model: Any
    tok: Any


Finished = Callable[[Path], "tuple[Path, dict[str, Any] | None] | None"]
"""A round's folder → None if it is unfinished, else (the model it left, its recorded counts or None)."""


def run_rounds(
    ctx: StageContext,
    name: str,
    rounds: int,
    model_path: Path,
    *,
    finished: Finished,
    collect: Callable[[Round], Any],
    train: Callable[[Round, Any], tuple[Path, dict[str, Any]]],
) -> StageResult:
    """Run `rounds` rounds of the stage `name` from `model_path`: `collect` then `train` in each.

    Args:
        ctx: the run's context (config, folder, device, resume flag, echo).
        name: the stage (`dpo`, `rft`): the folder under the run's and the summary's key
            `<name>_rounds`.
        rounds: how many rounds.
        model_path: the model the first round starts from.
        finished: with `resume`, whether a round's folder holds a finished round (see `Finished`);
            its counts, when given, are the round's entry in the summary.
        collect: what rank 0 builds with the round's model (rollouts, pairs, a kept set); every
            rank gets its return value.
        train: trains on what `collect` returned; gives the model the round leaves and its counts.

    Returns:
        The last round's model, the stage's wall time, and the summary entries `<name>_rounds`
        (one dict of counts per round) and `models_in_memory`.
    """
    t = time.perf_counter()
    info: list[dict[str, Any]] = []
    for r in range(rounds):
        round_dir = ctx.run_dir / name / f"round_{r}"
        done = finished(round_dir) if ctx.resume else None
        if done is not None:
            ctx.echo(f"{name} round {r}: finished earlier, skipped")
            model_path, counts = done
            if counts is not None:
                info.append(counts)
            continue
        model, tok = load_model(model_path, getattr(torch, ctx.cfg.model.dtype), ctx.device)
        this = Round(r, round_dir, model_path, model, tok)
        del model, tok  # `this` holds them: `train` can let go of the model
        # Distributed: rank 0 collects with the whole model (the others wait) and every rank
        # gets what it built; the training is sharded.
        data = distributed.on_main(functools.partial(collect, this))
        model_path, counts = train(this, data)
        info.append(counts)
    summary = {f"{name}_rounds": info, "models_in_memory": ["policy"]}
    return StageResult(model_path, time.perf_counter() - t, summary)


def train_round(
    ctx: StageContext, rnd: Round, trainer_cls: Any, stage_cfg: Any, *args: Any, **kwargs: Any
) -> Path:
    """Seed round r and train `trainer_cls` on the round's model in `round_<r>/train/`; return its `final/`.

    The trainer is `trainer_cls(stage_cfg, rnd.model, rnd.tok, rnd.dir / "train", *args,
    seed=cfg.seed + r, resume=, parallel=, log_with=, **kwargs)` from the run's config, after
    seeding every rank with `cfg.seed + 100 + r` (its own share under torchrun).
    """
    cfg = ctx.cfg
    seed_everything(distributed.rank_seed(cfg.seed + 100 + rnd.index))
    trainer = trainer_cls(
        stage_cfg,
        rnd.model,
        rnd.tok,
        rnd.dir / "train",
        *args,
        seed=cfg.seed + rnd.index,
        resume=ctx.resume,
        parallel=cfg.parallel,
        log_with=cfg.log_with,
        **kwargs,
    )
    final: Path = trainer.train(ctx.echo)
    return final
