"""GRPO from a low start: textgym's `configs/grpo_low_start.yaml` against TRL's GRPOTrainer, side by side.

For each init seed: the config's SFT stage builds the start (a tiny model fine-tuned until 5% of
a probe set is right, greedy), then from that one checkpoint

- textgym: the config's GRPO stage (200 steps of 64 prompts × 8 samples, four optimizer steps
  of 128 sequences per batch, dynamic sampling);
- TRL, plain: `trl.GRPOTrainer` with the quickstart's settings (300 optimizer steps, each on a
  fresh batch of 16 prompts × 8 samples), the usual way to run it;
- TRL, matched: TRL with textgym's batch shape (a generation batch of 64 prompts × 8 samples
  split into four optimizer steps of 128, `steps_per_generation=4`, 200 generation batches);
  TRL has no dynamic sampling,

all with the same prompts distribution (Arithmetic's train stream), reward (math-verify exact
match, `reward/correct`), sampling (T = 1, 10 new tokens), clip (0.2), loss aggregation
(per-sequence token mean, TRL's `loss_type="grpo"`), optimizer (AdamW, lr 3e-4, 10 warm-up
steps, cosine decay over the run's optimizer steps, gradient norm clipped at 1) and no KL
term. Every final model is evaluated the same way: greedy accuracy on the 500 held-out test
problems.

    python bench/low_start.py [--seeds 0 1 2] [--out runs/bench_low_start] [--skip-trl-matched]

Prints one table (start → after, per seed and trainer); results also go to `<out>/results.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "grpo_low_start.yaml"
ENV_KW = {"operators": "+", "digits": 2, "instruction": ""}
GROUP, MAX_NEW, LR, WARMUP = 8, 10, 3e-4, 10
PLAIN = {"prompts": 16, "minibatch": 128, "steps": 300}  # the quickstart's GRPO batch
MATCHED = {"prompts": 64, "minibatch": 128, "steps": 200}  # configs/grpo_low_start.yaml's


def textgym(*args: str) -> None:
    """Run `python -m textgym ...`, failing loudly."""
    cmd = [sys.executable, "-m", "textgym", *args]
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=True)


def held_out_accuracy(model_dir: Path, threads: int) -> float:
    """Greedy accuracy on Arithmetic's 500 held-out problems (the quickstart's evaluation)."""
    import torch

    from textgym.agents import LLMAgent, SamplingParams
    from textgym.evaluation import evaluate
    from textgym.models import load_model

    torch.set_num_threads(threads)
    model, tok = load_model(model_dir)
    res = evaluate(
        LLMAgent(model, tok, batch_size=500),
        "textgym/Arithmetic-v0",
        {**ENV_KW, "split": "test"},
        n=500,
        params=SamplingParams(temperature=0.0, max_new_tokens=MAX_NEW),
        batch_size=500,
    )
    return res.accuracy


def trl_worker(model_dir: Path, out: Path, steps: int, prompts: int, minibatch: int, seed: int) -> None:
    """Train with TRL's GRPOTrainer from `model_dir`; save the final model to `out/final`.

    `steps` generation batches of `prompts` × GROUP completions, each split into optimizer steps
    of `minibatch` completions.
    """
    import gymnasium as gym
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback
    from trl import GRPOConfig, GRPOTrainer

    import textgym  # noqa: F401  (registers the env)
    from textgym.types import Task
    from textgym.verifiers.math import MathVerifier

    tasks = gym.make("textgym/Arithmetic-v0", **ENV_KW).unwrapped.tasks
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": tasks[i].prompt}], "answer": tasks[i].answer}
            for i in range((steps + 2) * prompts)
        ]
    )
    verifier = MathVerifier()

    def correct(completions: list, answer: list[str], **_: object) -> list[float]:
        return [
            verifier(c[0]["content"], Task("t", "", a)).reward
            for c, a in zip(completions, answer, strict=True)
        ]

    per_generation = prompts * GROUP // minibatch
    args = GRPOConfig(
        output_dir=str(out / "trl"),
        per_device_train_batch_size=minibatch,
        steps_per_generation=per_generation,
        num_generations=GROUP,
        num_iterations=1,
        gradient_accumulation_steps=1,
        max_completion_length=MAX_NEW,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        loss_type="grpo",
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=LR,
        lr_scheduler_type="cosine",
        warmup_steps=WARMUP,
        max_grad_norm=1.0,
        max_steps=steps * per_generation,
        logging_steps=10,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    torch.manual_seed(seed)
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=correct,
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
    )
    trainer.remove_callback(PrinterCallback)
    trainer.train()
    trainer.save_model(str(out / "final"))


def run_trl(model_dir: Path, out: Path, shape: dict[str, int], seed: int, threads: int) -> float:
    """Run `trl_worker` in its own process with a batch `shape`; return its wall time in seconds."""
    t = time.perf_counter()
    cmd = [sys.executable, __file__, "--trl-worker", str(model_dir), str(out)]
    cmd += ["--steps", str(shape["steps"]), "--prompts", str(shape["prompts"])]
    cmd += ["--minibatch", str(shape["minibatch"]), "--seed", str(seed), "--threads", str(threads)]
    print("$ trl", " ".join(cmd[3:]), flush=True)
    subprocess.run(cmd, check=True)
    return time.perf_counter() - t


def main() -> None:
    """Run the comparison and print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", default="runs/bench_low_start")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-trl-matched", action="store_true", help="only TRL's plain settings")
    ap.add_argument("--trl-worker", nargs=2, metavar=("MODEL", "OUT"), help=argparse.SUPPRESS)
    ap.add_argument("--steps", type=int, default=300, help=argparse.SUPPRESS)
    ap.add_argument("--prompts", type=int, default=16, help=argparse.SUPPRESS)
    ap.add_argument("--minibatch", type=int, default=128, help=argparse.SUPPRESS)
    ap.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.trl_worker:
        import torch
        from transformers.utils import logging as hf_logging

        torch.set_num_threads(a.threads)
        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
        trl_worker(Path(a.trl_worker[0]), Path(a.trl_worker[1]), a.steps, a.prompts, a.minibatch, a.seed)
        return

    out = Path(a.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results_path = out / "results.json"
    results: list[dict] = json.loads(results_path.read_text()) if results_path.is_file() else []
    done = {(r["seed"], r["trainer"]) for r in results}
    for seed in a.seeds:
        name = f"seed{seed}"
        run = out / name
        # The textgym run: the config's SFT (to the low start), then its GRPO stage, evaluated before/after.
        if (seed, "textgym") not in done:
            t = time.perf_counter()
            textgym(
                "train", str(CONFIG), f"name={name}", f"out_dir={out}", f"model.init_seed={seed}",
                f"threads={a.threads}", "--resume",
            )  # fmt: skip
            summary = json.loads((run / "summary.json").read_text())
            results.append(
                {
                    "seed": seed,
                    "trainer": "textgym",
                    "start": summary["accuracy_before"],
                    "after": summary["accuracy_after"],
                    "rl_wall_s": summary["stage_times_s"].get("grpo", float("nan")),
                    "wall_s": time.perf_counter() - t,
                }
            )
            results_path.write_text(json.dumps(results, indent=2))
        start = next(r["start"] for r in results if r["seed"] == seed and r["trainer"] == "textgym")
        sft = run / "sft" / "final"
        variants = [("trl (plain)", PLAIN)]
        if not a.skip_trl_matched:
            variants.append(("trl (matched)", MATCHED))
        for label, shape in variants:
            if (seed, label) in done:
                continue
            tdir = out / f"{name}_trl_{shape['prompts']}"
            secs = run_trl(sft, tdir, shape, seed, a.threads)
            results.append(
                {
                    "seed": seed,
                    "trainer": label,
                    "start": start,
                    "after": held_out_accuracy(tdir / "final", a.threads),
                    "rl_wall_s": secs,
                }
            )
            results_path.write_text(json.dumps(results, indent=2))

    import trl

    print(f"\n{len(a.seeds)} seeds · held-out n=500, greedy · {CONFIG.name} vs TRL {trl.__version__}")
    print("| init seed | trainer | start | after | gain | RL wall s |")
    print("|---|---|---|---|---|---|")
    for r in sorted(results, key=lambda r: (r["seed"], r["trainer"])):
        gain = 100 * (r["after"] - r["start"])
        print(
            f"| {r['seed']} | {r['trainer']} | {r['start']:.3f} | {r['after']:.3f} | {gain:+.1f} | "
            f"{r['rl_wall_s']:.0f} |"
        )


if __name__ == "__main__":
    main()
