"""Behaviour-unchanged check for a refactor of the trainers: metrics and final weights, bitwise.

Runs a fixed set of short training runs of the tiny model (1 thread, fixed seeds) and writes,
per run, every logged metric but the wall-clock ones (`time/*`, `throughput/*`) and a sha256
of each saved model's tensors. Run it at the commit before a change and after it, then compare:

    python tools/equivalence.py --out /tmp/eq_before            # at the old commit
    python tools/equivalence.py --out /tmp/eq_after             # at the new one
    python tools/equivalence.py --compare /tmp/eq_before /tmp/eq_after

Equal means equal bits on the same machine and torch build (floats are compared as their
`repr`, weights by hash). The runs: the four of the PolicyUpdate move (PPO with an adaptive KL
and a resume, PPO with the KL in the reward, GRPO with TIS and the KL in the loss and a resume,
plain GRPO), plus DAPO (dynamic sampling, overlong shaping), expert guidance, async RL
(max_staleness 1), PPO with a critic warm-up and online DPO: each exercises a path that a
refactor of the rollout side or of the trainer's composition can change.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

ARITH = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 1, "instruction": ""}}
GAME = {"id": "textgym/GuessNumber-v0", "kwargs": {"high": 20, "max_guesses": 5, "max_episode_steps": 5}}
BASE = {
    "env": ARITH,
    "steps": 4,
    "prompts_per_step": 4,
    "group_size": 4,
    "sampling": {"temperature": 1.0, "max_new_tokens": 8},
    "optim": {"lr": 1e-3, "warmup_steps": 1},
    "log_trajectories": False,
}
RUNS: dict[str, tuple[str, dict[str, Any], int | None]] = {
    # name: (trainer, config overrides, resume after this many steps or None)
    "ppo_adaptive_kl_resume": ("ppo", {"kl_coef": 0.05, "kl_target": 0.01, "kl_placement": "loss"}, 2),
    "ppo_kl_reward": ("ppo", {"kl_coef": 0.05, "kl_placement": "reward", "kl_estimator": "k1"}, None),
    "grpo_tis_kl_resume": ("grpo", {"kl_coef": 0.05, "rollout": {"tis": True}}, 2),
    "grpo": ("grpo", {}, None),
    "dapo": (
        "grpo",
        {
            "dynamic_sampling": True,
            "max_sampling_tries": 3,
            "clip_high": 0.28,
            "loss_aggregation": "token_mean",
            "overlong_filter": True,
            "overlong_penalty": {"max_len": 8, "cache_len": 4, "factor": 1.0},
        },
        None,
    ),
    "guidance": (
        "grpo",
        {"env": GAME, "expert_guidance": True, "group_size": 3, "prompts_per_step": 2, "steps": 3},
        None,
    ),
    "async_resume": ("grpo", {"rollout": {"max_staleness": 1}}, 2),
    "ppo_warmup": ("ppo", {"critic_warmup_steps": 1, "critic": {"epochs": 2}}, None),
    "online_dpo": ("online_dpo", {}, None),
}


def _warm_model(workdir: Path) -> Path:
    """The tiny model after 100 steps of SFT on 1-digit addition (so that rewards differ within groups)."""
    from textgym.config import SFTConfig
    from textgym.model_init import init_model
    from textgym.models import load_model
    from textgym.trainers.sft import SFTTrainer
    from textgym.training.seeding import seed_everything

    final = workdir / "warm" / "final"
    if final.exists():
        return final
    seed_everything(0)
    model, tok = load_model(init_model("tiny", workdir / "tiny", seed=0))
    sft = {"env": ARITH, "steps": 100, "batch_size": 32, "log_every": 100}
    cfg = SFTConfig.model_validate(sft | {"optim": {"lr": 3e-3, "warmup_steps": 5}})
    return SFTTrainer(cfg, model, tok, workdir / "warm").train()


def _weights_hash(folder: Path) -> dict[str, str]:
    """sha256 of every safetensors file's tensors under `folder` (names and bytes, sorted)."""
    import torch
    from safetensors.torch import load_file

    out = {}
    for f in sorted(folder.rglob("*.safetensors")):
        h = hashlib.sha256()
        tensors = load_file(f)
        for name in sorted(tensors):
            h.update(name.encode())
            h.update(tensors[name].contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        out[str(f.relative_to(folder))] = h.hexdigest()
    return out


def _trainer(kind: str, cfg: dict[str, Any], model_dir: Path, stage_dir: Path, resume: bool) -> Any:
    from textgym.config import GRPOConfig, OnlineDPOConfig, PPOConfig
    from textgym.models import load_model

    model, tok = load_model(model_dir)
    if kind == "online_dpo":
        c = {k: v for k, v in cfg.items() if k not in ("group_size", "env")}
        c |= {"env": ARITH, "samples_per_prompt": 4, "steps": 3}
        from textgym.trainers.preference.online import OnlineDPOTrainer

        dpo = OnlineDPOConfig.model_validate(c)
        return OnlineDPOTrainer(dpo, model, tok, stage_dir, seed=0, resume=resume)
    if kind == "ppo":
        from textgym.trainers.rl.ppo import PPOTrainer

        return PPOTrainer(PPOConfig.model_validate(cfg), model, tok, stage_dir, seed=0, resume=resume)
    from textgym.trainers.rl.grpo import GRPOTrainer

    return GRPOTrainer(GRPOConfig.model_validate(cfg), model, tok, stage_dir, seed=0, resume=resume)


def _clean(metrics: dict[str, Any]) -> dict[str, str]:
    return {
        k: repr(v)
        for k, v in sorted(metrics.items())
        if not k.startswith(("time/", "throughput/")) and k not in ("time", "elapsed_s", "wall_time_s")
    }


def run_all(out: Path, only: list[str] | None) -> None:
    """Run `RUNS` (or the names in `only`) into `out`: one `<name>.json` per run."""
    import torch

    from textgym.training.seeding import seed_everything

    torch.set_num_threads(1)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = _warm_model(out)
    for name, (kind, over, resume_at) in RUNS.items():
        if only and name not in only:
            continue
        cfg = json.loads(json.dumps(BASE)) | over
        stage = out / name
        seed_everything(1)
        if resume_at is not None:  # train `resume_at` steps, checkpoint, drop the trainer, resume
            first = _trainer(kind, cfg, model_dir, stage, False)
            for _ in range(resume_at):
                metrics = first.train_step()
                first.logger.log(first.step, metrics)
            first.save()
            first.logger.close()
            first.close()
            del first
            seed_everything(2)
        trainer = _trainer(kind, cfg, model_dir, stage, resume_at is not None)
        final = trainer.train()
        rows = [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines() if line]
        record = {
            "metrics": [_clean(r) for r in rows],
            "weights": _weights_hash(final),
            "critic": _weights_hash(stage / "critic") if (stage / "critic").exists() else {},
        }
        (out / f"{name}.json").write_text(json.dumps(record, indent=1))
        print(f"{name}: {len(rows)} metric rows, final weights {next(iter(record['weights'].values()))[:12]}")


def compare(a: Path, b: Path) -> int:
    """Print each run's verdict (bitwise equal or the first differences); return how many differ."""
    bad = 0
    for name in RUNS:
        fa, fb = a / f"{name}.json", b / f"{name}.json"
        if not fa.exists() or not fb.exists():
            print(f"{name}: missing in {'first' if not fa.exists() else 'second'}")
            bad += 1
            continue
        ra, rb = json.loads(fa.read_text()), json.loads(fb.read_text())
        diffs = []
        if ra["weights"] != rb["weights"]:
            diffs.append("final policy weights")
        if ra["critic"] != rb["critic"]:
            diffs.append("critic weights")
        if len(ra["metrics"]) != len(rb["metrics"]):
            diffs.append(f"metric rows {len(ra['metrics'])} vs {len(rb['metrics'])}")
        for i, (x, y) in enumerate(zip(ra["metrics"], rb["metrics"], strict=False)):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    diffs.append(f"row {i} {k}: {x.get(k)} vs {y.get(k)}")
        print(f"{name}: {'bitwise equal' if not diffs else 'DIFFERENT'}")
        for d in diffs[:12]:
            print(f"    {d}")
        bad += bool(diffs)
    return bad


def main() -> None:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path)
    p.add_argument("--only", nargs="*")
    p.add_argument("--compare", nargs=2, type=Path)
    a = p.parse_args()
    if a.compare:
        sys.exit(1 if compare(*a.compare) else 0)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    run_all(a.out, a.only)


if __name__ == "__main__":
    main()
