"""The `rft:` stage: rounds of sample K per prompt → keep the verified → SFT on them (RAFT / ReST-EM, STaR).

Round r, in `<run_dir>/rft/round_<r>/`:

1. sample: the latest model answers `collect.n` tasks `collect.samples` times each
   (`trajectories/`, a trajectory store);
2. filter: per prompt, the correct samples (`filter`: reward threshold, duplicates once, the best
   `max_per_prompt`; `textgym.offline.rejection.select_responses`);
3. rationalise (STaR, with `rationalize`): the prompts with no kept sample are sampled again with
   the gold answer as a hint (`rationalized/`); the samples that pass the filter are kept with
   the prompt as it was, without the hint;
4. write the kept set (`kept.jsonl`: prompt and completion messages and token ids) and the
   counts (`counts.json`);
5. SFT on the kept set (`train/`, `SFTTrainer` on explicit examples, a fresh optimizer), starting
   from the latest model (`from: previous`, RAFT) or the stage's start model (`from: start`,
   ReST-EM); `done.json` marks the round finished.

With `resume`, finished rounds are skipped and an unfinished one continues (its stored samples
are kept, its SFT resumes from its newest checkpoint). Under torchrun, rank 0 samples and
filters with the whole model and every rank trains its share of each batch (sharded).
"""

from __future__ import annotations

import functools
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.config import ConfigError, RunConfig, SFTConfig
from textgym.config.rft import RFTConfig
from textgym.models import load_model
from textgym.stages.registry import StageContext, StageResult, register_stage
from textgym.stages.rounds import Round, run_rounds, train_round
from textgym.trainers.sft import SFTExample


def preflight_rft(rc: RFTConfig) -> None:
    """Check the `rft:` stage against its env before any work.

    Raises:
        ConfigError: when the env has too few tasks for the rounds, or (with `rationalize`) gives
            no gold answer to hint with.
    """
    from textgym.envs.registry import make as make_env
    from textgym.envs.registry import task_count

    env = make_env(rc.env.id, **rc.env.kwargs)
    try:
        c = rc.collect
        last = c.start + c.n * (rc.rounds if c.fresh_tasks else 1)
        if last > task_count(env):
            raise ConfigError(
                f"rft.collect.n: {rc.env.id} has {task_count(env)} tasks; {rc.rounds} rounds of n={c.n} "
                f"from start={c.start} need {last} (or set rft.collect.fresh_tasks: false)"
            )
        if rc.rationalize is not None:
            _, info = env.reset(options={"task_index": c.start})
            if info.get("answer") in (None, ""):
                raise ConfigError(
                    f"rft.rationalize: {rc.env.id} gives no gold answer in its reset info to hint with"
                )
    finally:
        env.close()


def round_sft_config(rc: RFTConfig, kept: int) -> SFTConfig:
    """The SFT config of a round with `kept` examples: `rc.steps`, else ⌈epochs · kept / batch_size⌉ steps."""
    steps = rc.steps or max(1, math.ceil(rc.epochs * kept / rc.batch_size))
    fields = ["batch_size", "micro_batch_size", "micro_batch_tokens", "packing", "optim", "lora"]
    fields += ["log_every", "checkpoint_every", "keep_checkpoints"]
    data = rc.model_dump(include=set(fields))
    return SFTConfig.model_validate({"env": rc.env.model_dump(), "steps": steps, **data})


def record_example(record: dict[str, Any]) -> SFTExample:
    """The `SFTExample` of a kept-set record (`textgym.offline.rejection.kept_records`)."""
    return SFTExample(
        tuple(record["prompt_ids"]), tuple(record["completion_ids"]), tuple(record["completion_mask"])
    )


def _rft_round(
    ctx: StageContext, start_path: Path, rnd: Round, data: tuple[list[dict[str, Any]], dict[str, Any]]
) -> tuple[Path, dict[str, Any]]:
    """Step 5 of a round: SFT on the kept set (`data`, from `collect_round`); mark the round done.

    SFT starts from the round's model (RAFT) or the stage's start model `start_path` (ReST-EM);
    with nothing kept, the model is unchanged. `done.json` gets the counts with `sft_steps` and
    `model`.

    Returns:
        (the model the round leaves, its counts).
    """
    from textgym.trainers.sft import SFTTrainer

    cfg, rc, echo = ctx.cfg, ctx.cfg.rft, ctx.echo
    assert rc is not None
    records, counts = data
    final = rnd.model_path
    counts["sft_steps"] = 0
    if not records:
        echo(f"rft round {rnd.index}: no sample was kept; the model is unchanged")
    else:
        if rc.from_ == "start" and rnd.model_path != start_path:
            rnd.model = None  # free the round's model first
            rnd.model, rnd.tok = load_model(start_path, getattr(torch, cfg.model.dtype), ctx.device)
        sft_cfg = round_sft_config(rc, len(records))
        examples = [record_example(x) for x in records]
        final = train_round(ctx, rnd, SFTTrainer, sft_cfg, examples=examples)
        counts["sft_steps"] = sft_cfg.steps
    counts["model"] = str(final)
    if distributed.is_main():
        (rnd.dir / "done.json").write_text(json.dumps(counts, indent=2), encoding="utf-8")
    distributed.barrier()
    return final, counts


def _finished(round_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """A finished round's model and counts (from its `done.json`), or None."""
    done = round_dir / "done.json"
    if not done.is_file():
        return None
    counts = json.loads(done.read_text(encoding="utf-8"))
    return Path(counts["model"]), counts


def collect_round(
    cfg: RunConfig,
    r: int,
    round_dir: Path,
    agent: LLMAgent,
    model_path: Path,
    echo: Callable[[str], None],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Steps 1-4 of round `r`: sample, filter, rationalise, write `kept.jsonl` and `counts.json`.

    `agent` is the policy of `model_path` (recorded in the stored rows as their `policy`).

    Returns:
        (the kept set's records, in `kept.jsonl`'s order; the round's counts).
    """
    from textgym.agents.trajectory import episode_correct
    from textgym.offline import collect_rollouts, read_trajectories
    from textgym.offline.rejection import kept_records, select_responses, write_jsonl

    rc = cfg.rft
    assert rc is not None
    c, f = rc.collect, rc.filter.model_dump()
    t0 = time.perf_counter()
    collect_rollouts(
        agent,
        rc.env.id,
        round_dir / "trajectories",
        env_kwargs=rc.env.kwargs,
        n=c.n,
        samples=c.samples,
        start=c.start + (r * c.n if c.fresh_tasks else 0),
        params=SamplingParams(**c.sampling.model_dump()),
        policy=str(model_path),
        policy_version=r,
        seed=cfg.seed,
        run=cfg.name,
    )
    table = read_trajectories(round_dir / "trajectories")
    sel = select_responses(table, **f)
    records = kept_records(table, sel.rows)
    terms, rewards = table.column("reward_terms").to_pylist(), table.column("reward").to_pylist()
    correct = sum(episode_correct(json.loads(t), x) for t, x in zip(terms, rewards, strict=True))
    counts: dict[str, Any] = {
        "round": r,
        "rollouts": table.num_rows,
        "prompts": sel.prompts,
        "sample_accuracy": correct / max(table.num_rows, 1),
        "passed": sel.passed,
        "duplicates_dropped": sel.duplicates_dropped,
        "prompts_kept": sel.prompts_kept,
        "kept": len(records),
    }
    if rc.rationalize is not None:
        hinted_records, hinted_counts = _rationalize(
            cfg, r, round_dir, agent, model_path, table, sel.unsolved
        )
        records += hinted_records
        counts.update({**hinted_counts, "kept": len(records)})
    write_jsonl(records, round_dir / "kept.jsonl")
    (round_dir / "counts.json").write_text(json.dumps(counts, indent=2), encoding="utf-8")
    star = f", +{counts['rationalized']} rationalised" if rc.rationalize is not None else ""
    echo(
        f"rft round {r}: {table.num_rows} samples of {sel.prompts} prompts (accuracy "
        f"{counts['sample_accuracy']:.3f}, {time.perf_counter() - t0:.0f}s) -> kept "
        f"{len(sel.rows)} samples of {sel.prompts_kept} prompts{star}"
    )
    return records, counts


def _check_rft(cfg: RunConfig) -> None:
    assert cfg.rft is not None
    preflight_rft(cfg.rft)


@register_stage("rft", order=30, check=_check_rft)
def rft_stage(ctx: StageContext, model_path: Path) -> StageResult:
    """Run `cfg.rft.rounds` rounds of sample → filter → SFT (`run_rounds`, in `<run_dir>/rft/round_<r>/`).

    The summary gets `rft_rounds`: one dict of counts per round (`round`, `rollouts`,
    `sample_accuracy`, `kept`, `prompts_kept`, …, `sft_steps`, `model`; skipped rounds give
    the counts they recorded).
    """
    cfg, rc = ctx.cfg, ctx.cfg.rft
    assert rc is not None

    def collect(rnd: Round) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        agent = LLMAgent(rnd.model, rnd.tok, batch_size=256)
        return collect_round(cfg, rnd.index, rnd.dir, agent, rnd.model_path, ctx.echo)

    train = functools.partial(_rft_round, ctx, model_path)
    return run_rounds(ctx, "rft", rc.rounds, model_path, finished=_finished, collect=collect, train=train)


def _rationalize(
    cfg: RunConfig,
    r: int,
    round_dir: Path,
    agent: LLMAgent,
    model_path: Path,
    table: Any,
    unsolved: list[int],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """STaR's step 3: sample the unsolved prompts again, with the gold answer as a hint.

    The samples that pass the filter are kept with the prompt as it was (no hint).

    Returns:
        (the kept records, the counts `rationalize_prompts`, `rationalize_rollouts`,
        `rationalize_prompts_kept`, `rationalized`).
    """
    from textgym.offline.rejection import collect_hinted, kept_records, select_responses, task_prompts

    rc = cfg.rft
    assert rc is not None and rc.rationalize is not None
    ra, c = rc.rationalize, rc.collect
    hinted = collect_hinted(
        agent,
        rc.env.id,
        unsolved,
        round_dir / "rationalized",
        hint=ra.hint,
        env_kwargs=rc.env.kwargs,
        samples=ra.samples or c.samples,
        params=SamplingParams(**(ra.sampling or c.sampling).model_dump()),
        policy=str(model_path),
        policy_version=r,
        seed=cfg.seed,
        run=cfg.name,
    )
    hsel = select_responses(hinted, **rc.filter.model_dump())
    records = kept_records(hinted, hsel.rows, prompts=task_prompts(table))
    counts = {
        "rationalize_prompts": len(unsolved),
        "rationalize_rollouts": hinted.num_rows,
        "rationalize_prompts_kept": hsel.prompts_kept,
        "rationalized": len(hsel.rows),
    }
    return records, counts
