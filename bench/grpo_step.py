"""GRPO step throughput: textgym's GRPOTrainer against TRL's GRPOTrainer, side by side in one process.

Both train the same tiny Qwen2 model (warm-started by a short SFT so rewards vary) on the
same Arithmetic prompts with the same batch (16 prompts × 8 samples), completion budget,
sampling, optimizer, loss aggregation (per-sequence token mean, "grpo"), no KL term and
the same reward function (textgym's math verifier). Each trainer runs `--warmup` steps
untimed, then `--steps` timed steps; the median step time is compared.

    python bench/grpo_step.py [--model DIR] [--steps 10] [--warmup 2] [--threads 2]

Last line: `throughput ratio textgym/trl: X.XX` (sequences per second, textgym over TRL).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch

PROMPTS, GROUP, MAX_NEW, LR = 16, 8, 10, 3e-4
ENV_KW = {"operators": "+", "digits": 2, "instruction": ""}


def warm_model(out: Path) -> Path:
    """Tiny model + 60 SFT steps: the format is learnt and some sums are right."""
    from textgym.config import SFTConfig
    from textgym.model_init import init_model
    from textgym.models import load_model
    from textgym.trainers.sft import SFTTrainer
    from textgym.training.seeding import seed_everything

    seed_everything(0)
    init_model("tiny", out / "init")
    model, tok = load_model(out / "init")
    cfg = SFTConfig.model_validate(
        {
            "env": {"id": "textgym/Arithmetic-v0", "kwargs": ENV_KW},
            "steps": 150,
            "batch_size": 64,
            "optim": {"lr": 2e-3, "warmup_steps": 20},
            "log_every": 1000,
        }
    )
    return SFTTrainer(cfg, model, tok, out / "sft").train()


def bench_textgym(model_dir: Path, steps: int, warmup: int, work: Path) -> tuple[list[float], float]:
    from textgym.config import GRPOConfig
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.seeding import seed_everything

    seed_everything(0)
    model, tok = load_model(model_dir)
    cfg = GRPOConfig.model_validate(
        {
            "env": {"id": "textgym/Arithmetic-v0", "kwargs": ENV_KW},
            "steps": steps + warmup,
            "prompts_per_step": PROMPTS,
            "group_size": GROUP,
            "sampling": {"temperature": 1.0, "max_new_tokens": MAX_NEW},
            "optim": {"lr": LR, "max_grad_norm": 1.0},
            "loss_aggregation": "seq_mean_token_mean",
        }
    )
    trainer = GRPOTrainer(cfg, model, tok, work / "textgym")
    times, rewards = [], []
    for i in range(steps + warmup):
        t = time.perf_counter()
        m = trainer.train_step()
        if i >= warmup:
            times.append(time.perf_counter() - t)
            rewards.append(m["rollout/reward_mean"])
    return times, statistics.mean(rewards)


def bench_trl(model_dir: Path, steps: int, warmup: int, work: Path) -> tuple[list[float], float]:
    import gymnasium as gym
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from textgym.types import Task
    from textgym.verifiers.math import MathVerifier

    env = gym.make("textgym/Arithmetic-v0", **ENV_KW)
    tasks = env.unwrapped.tasks
    n = (steps + warmup + 2) * PROMPTS
    data = Dataset.from_list(
        [
            {"prompt": [{"role": "user", "content": tasks[i].prompt}], "answer": tasks[i].answer}
            for i in range(n)
        ]
    )
    verifier = MathVerifier()

    def correct(completions: list, answer: list[str], **_: object) -> list[float]:
        return [
            verifier(c[0]["content"], Task("t", "", a)).reward
            for c, a in zip(completions, answer, strict=True)
        ]

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.rewards: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.t = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            self.times.append(time.perf_counter() - self.t)

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    args = GRPOConfig(
        output_dir=str(work / "trl"),
        per_device_train_batch_size=PROMPTS * GROUP,
        num_generations=GROUP,
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
        lr_scheduler_type="constant",
        warmup_steps=0,
        max_grad_norm=1.0,
        max_steps=steps + warmup,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=0,
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(model_dir),
        reward_funcs=correct,
        args=args,
        train_dataset=data,
        processing_class=AutoTokenizer.from_pretrained(model_dir),
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)  # metrics reach `timer` through on_log; no console dump
    trainer.train()
    return timer.times[warmup:], statistics.mean(timer.rewards[warmup:]) if timer.rewards else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, help="HF model folder (default: build a warm tiny model)")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    import trl

    import textgym

    work = Path(tempfile.mkdtemp(prefix="grpo_bench_"))
    try:
        model_dir = a.model or warm_model(work)
        print(f"model {model_dir} · batch {PROMPTS}×{GROUP} · max_new_tokens {MAX_NEW} · threads {a.threads}")
        print(f"textgym {textgym.__version__} · trl {trl.__version__} · torch {torch.__version__}")
        tg, tg_r = bench_textgym(model_dir, a.steps, a.warmup, work)
        tr, tr_r = bench_trl(model_dir, a.steps, a.warmup, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    seqs = PROMPTS * GROUP
    for name, t, r in (("textgym", tg, tg_r), ("trl", tr, tr_r)):
        med = statistics.median(t)
        print(
            f"{name:8s} median step {med:.3f}s · {seqs / med:7.1f} sequences/s"
            f" · mean reward {r:.3f} · n={len(t)}"
        )
    print(f"throughput ratio textgym/trl: {statistics.median(tr) / statistics.median(tg):.2f}")


if __name__ == "__main__":
    main()
