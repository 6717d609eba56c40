"""The quickstart's GRPO steps on SmolLM2-135M-Instruct: textgym against TRL's GRPOTrainer, side by side.

One run of this script measures, on this machine and in this order:

1. a GEMM probe at the model's shapes (one decoder layer's five matmuls and the LM head, at
   M = 512 and 2,048 token rows), in fp32 and in bf16: the matmul peak a step could reach;
2. textgym's GRPOTrainer on `configs/smollm2_grpo.yaml` (the README's main job), in a child
   process;
3. TRL's GRPOTrainer (1.16) on the same settings, in a child process.

Both sides train the same model (SmolLM2-135M-Instruct from its PyPI package), on the same
prompts (the tasks textgym's sampler draws at seed 0, in its order; each prompt is textgym's
text, chat template and prefilled answer stem, handed to TRL as plain text, which TRL tokenises
to the same ids: checked), with the same batch (prompts_per_step × group_size rows, one
optimizer step per batch; textgym's micro-batches are the config's, TRL's `micro_batch_size`
rows or, for a token budget, two groups' rows), sampling (temperature, top-p, new-token
budget), optimizer (AdamW at the config's learning rate with its warm-up, gradient norm clipped
at 1.0), loss (the clipped surrogate, ε = 0.2, per-sequence token mean, group-normalised
advantages), reward (the env's own `step`), no KL term and no reference model.

Per step it prints the rollout time (generation and scoring: TRL's
`_generate_and_score_completions`, textgym's `time/rollout_s`) and the update time (the rest
of the step), and each one's achieved GFLOP/s counted on the same useful work for both sides:

    rollout: 2·N·(unique prompt tokens) + 2·(N + V·H)·(generated tokens)
    update:  6·N·(unique prompt tokens + generated tokens) + 6·V·H·(generated tokens)

with N the parameters outside the embedding (the decoder's matmuls; SmolLM2 ties its head to
the embedding) and V·H the head's. Attention's score FLOPs (under 5% at these lengths) are left
out. A side that recomputes a group's prompt for each of its rows does more arithmetic than
this count, and shows a lower rate. Each side's peak RSS is its child's `ru_maxrss`.

    python bench/llm_step.py [--steps 4] [--warmup 1] [--threads 2] [--config configs/smollm2_grpo.yaml]

Steps after `--warmup` are compared (the step time is the mean; the quickstart's first steps
have the longest responses, so every step is printed). Last line:
`throughput ratio textgym/trl: X · update at Y% of matmul peak · decode at Z tokens/s`.
Appends the run to bench/results/llm_step.json (with the date, commit, CPU flags and threads);
docs/benchmarks.md renders that file.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "llm_step.json"


# ---- what both sides share ----------------------------------------------------------------------


def settings(config: Path, steps: int) -> dict[str, Any]:
    """The quickstart config's GRPO settings, the model folder and the prompts of `steps` steps.

    Returns a dict with the batch, sampling and optimizer settings, `model_dir`, `env` (id and
    kwargs), and per step the task indices and prompt token counts (`prompts`: text,
    `prompt_ids`: their ids).
    """
    import gymnasium as gym

    import textgym  # noqa: F401  (registers the envs)
    from textgym.config import load_config
    from textgym.envs.registry import task_count
    from textgym.models import load_tokenizer, resolve_model
    from textgym.training.sampler import TaskSampler

    cfg = load_config(config)
    assert cfg.grpo is not None, f"{config} has no grpo stage"
    rl = cfg.grpo
    rows = rl.prompts_per_step * rl.group_size
    model_dir = resolve_model(cfg.model.name or "smollm2-135m-instruct")
    tok = load_tokenizer(model_dir)
    env = gym.make(rl.env.id, **rl.env.kwargs)
    sampler = TaskSampler(task_count(env), cfg.seed)  # what the trainer's sampler draws
    tasks = [sampler.next(rl.prompts_per_step) for _ in range(steps)]
    texts: dict[int, str] = {}
    ids: dict[int, list[int]] = {}
    for ti in {t for step in tasks for t in step}:
        obs, info = env.reset(options={"task_index": ti})
        prefix = str(info.get("reply_prefix") or "")
        texts[ti] = str(tok.apply_chat_template(obs, add_generation_prompt=True, tokenize=False)) + prefix
        rendered = tok.apply_chat_template(obs, add_generation_prompt=True, tokenize=True, return_dict=False)
        ids[ti] = list(rendered) + tok(prefix, add_special_tokens=False)["input_ids"]  # type: ignore[arg-type]
    return {
        "config": str(config),
        "seed": cfg.seed,
        "model_dir": model_dir,
        "env": {"id": rl.env.id, "kwargs": dict(rl.env.kwargs)},
        "prompts_per_step": rl.prompts_per_step,
        "group_size": rl.group_size,
        # TRL cuts by rows only: a token budget's micro-batches (whole groups) become 2 groups' rows
        "micro_batch_size": rl.micro_batch_size or (2 * rl.group_size if rl.micro_batch_tokens else rows),
        "micro_batch_tokens": rl.micro_batch_tokens,
        "temperature": rl.sampling.temperature,
        "top_p": rl.sampling.top_p,
        "max_new_tokens": rl.sampling.max_new_tokens,
        "lr": rl.optim.lr,
        "warmup_steps": rl.optim.warmup_steps,
        "tasks": tasks,
        "texts": {str(k): v for k, v in texts.items()},
        "prompt_tokens": [sum(len(ids[t]) for t in step) for step in tasks],  # unique prompts per step
        "ids": {str(k): v for k, v in ids.items()},
    }


def model_flops(model_dir: str) -> tuple[float, float]:
    """(N, V·H): parameters outside the embedding, and the LM head's, from the model's config."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    H, inner, L, V = c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size
    kv = c.num_key_value_heads * (H // c.num_attention_heads)
    per_layer = H * H * 2 + H * kv * 2 + 3 * H * inner  # q, o; k, v; gate, up, down (norms: negligible)
    return float(L * per_layer), float(V * H)


def gemm_probe(model_dir: str, dtype_name: str, seconds: float = 0.4) -> float:
    """Achieved GFLOP/s of a forward pass's matmuls at M = 512 and 2,048 token rows.

    Each shape (q and o, k and v, gate and up, down: once per layer; the LM head once) is timed
    alone; the rate is the pass's FLOPs over the summed time of its matmuls, each counted as
    often as the pass runs it. Returns the better of the two M's: what a forward pass's matmuls
    can reach on this machine in `dtype_name`. A
    dtype this CPU has no kernels for (bf16 without AVX-512 BF16 or AMX runs at ~1 GFLOP/s) is
    measured on one small matmul only, so the probe stays short.
    """
    import torch
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(model_dir)
    H, inner, V, L = c.hidden_size, c.intermediate_size, c.vocab_size, c.num_hidden_layers
    kv = c.num_key_value_heads * (H // c.num_attention_heads)
    dtype = getattr(torch, dtype_name)
    shapes = {(H, H): 2 * L, (H, kv): 2 * L, (H, inner): 2 * L, (inner, H): L, (H, V): 1}  # (K, N): count

    def rate(M: int, K: int, N: int) -> float:
        a, b = torch.randn(M, K, dtype=dtype), torch.randn(K, N, dtype=dtype)
        a @ b
        n, t0 = 0, time.perf_counter()
        while n == 0 or time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        return (time.perf_counter() - t0) / n

    small = 2.0 * 64 * H * inner / rate(64, H, inner) / 1e9
    if small < 5.0:  # no native kernels for this dtype: the full probe would take minutes
        return small
    best = 0.0
    for M in (512, 2048):
        secs = sum(count * rate(M, K, N) for (K, N), count in shapes.items())
        best = max(best, sum(count * 2.0 * M * K * N for (K, N), count in shapes.items()) / secs / 1e9)
    return best


# ---- the two sides, each in its own process ------------------------------------------------------


def run_textgym(s: dict[str, Any], steps: int) -> list[dict[str, float]]:
    """textgym's GRPOTrainer on the config, `steps` steps: per step rollout/update seconds and tokens."""
    from textgym.config import load_config
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.seeding import seed_everything

    cfg = load_config(Path(s["config"]))
    assert cfg.grpo is not None
    rl = cfg.grpo.model_copy(update={"steps": steps})
    model, tok = load_model(s["model_dir"])
    seed_everything(cfg.seed)
    trainer = GRPOTrainer(rl, model, tok, Path(tempfile.mkdtemp()), seed=cfg.seed, log_with=())
    rows = rl.prompts_per_step * rl.group_size
    out = []
    for i in range(steps):
        assert trainer.sampler.cursor == i * rl.prompts_per_step  # the tasks `settings` drew for TRL
        t0 = time.perf_counter()
        m = trainer.train_step()
        step_s = time.perf_counter() - t0
        out.append(
            {
                "step_s": step_s,
                "rollout_s": m["time/rollout_s"],
                "update_s": step_s - m["time/rollout_s"],
                "generated_tokens": m["rollout/response_length_mean"] * rows,
                "reward": m["rollout/reward_mean"],
            }
        )
        print(f"textgym step {i + 1}: {out[-1]}", file=sys.stderr, flush=True)
    return out


def run_trl(s: dict[str, Any], steps: int) -> list[dict[str, float]]:
    """TRL's GRPOTrainer on the same prompts and settings: per step rollout/update seconds and tokens."""
    import gymnasium as gym
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    import textgym  # noqa: F401

    tok = AutoTokenizer.from_pretrained(s["model_dir"])
    order = [t for step in s["tasks"] for t in step]
    for t in order[:8]:  # TRL tokenises the text itself: it must give textgym's ids
        assert tok(s["texts"][str(t)], add_special_tokens=False)["input_ids"] == s["ids"][str(t)], t
    data = Dataset.from_list([{"prompt": s["texts"][str(t)], "task_index": t} for t in order])
    env = gym.make(s["env"]["id"], **s["env"]["kwargs"])

    def reward(completions: list[str], task_index: list[int], **_: object) -> list[float]:
        out = []
        for text, ti in zip(completions, task_index, strict=True):
            _, info = env.reset(options={"task_index": int(ti)})
            out.append(float(env.step(str(info.get("reply_prefix") or "") + text)[1]))
        return out

    class Timer(TrainerCallback):
        def __init__(self) -> None:
            self.steps: list[dict[str, float]] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.t0, self.rollout = time.perf_counter(), 0.0

        def on_step_end(self, args, state, control, **kwargs):
            step_s = time.perf_counter() - self.t0
            self.steps.append(
                {"step_s": step_s, "rollout_s": self.rollout, "update_s": step_s - self.rollout}
            )

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs and self.steps:
                rows = s["prompts_per_step"] * s["group_size"]
                self.steps[-1]["generated_tokens"] = float(logs["completions/mean_length"]) * rows
                self.steps[-1]["reward"] = float(logs.get("reward", float("nan")))
                print(f"trl step {len(self.steps)}: {self.steps[-1]}", file=sys.stderr, flush=True)

    micro = s["micro_batch_size"]
    rows = s["prompts_per_step"] * s["group_size"]
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(),
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=rows // micro,  # one generation and one optimizer step per batch
        num_generations=s["group_size"],
        max_completion_length=s["max_new_tokens"],
        temperature=s["temperature"],
        top_p=s["top_p"],
        top_k=0,
        beta=0.0,
        loss_type="grpo",  # per-sequence token mean, as textgym's seq_mean_token_mean
        scale_rewards="group",
        epsilon=0.2,
        learning_rate=s["lr"],
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=s["warmup_steps"],
        max_grad_norm=1.0,
        max_steps=steps,
        shuffle_dataset=False,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=s["seed"],
        dataloader_num_workers=0,
        disable_tqdm=True,
    )
    timer = Timer()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(s["model_dir"]),
        reward_funcs=reward,  # type: ignore[arg-type]
        args=args,
        train_dataset=data,
        processing_class=tok,
        callbacks=[timer],
    )
    trainer.remove_callback(PrinterCallback)
    generate = trainer._generate_and_score_completions

    def timed(*a: Any, **k: Any) -> Any:
        t0 = time.perf_counter()
        out = generate(*a, **k)
        timer.rollout += time.perf_counter() - t0
        return out

    trainer._generate_and_score_completions = timed  # type: ignore[method-assign]
    trainer.train()
    return timer.steps


def child(side: str, settings_file: Path, steps: int, threads: int, out: Path) -> None:
    """Run one side in this process and write its per-step rows and peak RSS to `out`."""
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(threads)
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    s = json.loads(settings_file.read_text())
    rows = run_textgym(s, steps) if side == "textgym" else run_trl(s, steps)
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.write_text(json.dumps({"steps": rows, "peak_rss_mb": rss_mb}))


# ---- the report ----------------------------------------------------------------------------------


def rates(s: dict[str, Any], side: dict[str, Any], N: float, head: float) -> None:
    """Add each step's useful GFLOP/s of rollout and update to its row (see the module docstring)."""
    for row, prompt in zip(side["steps"], s["prompt_tokens"], strict=False):
        gen = row.get("generated_tokens", float("nan"))
        row["prompt_tokens"] = prompt
        row["rollout_gflops"] = (2 * N * prompt + 2 * (N + head) * gen) / row["rollout_s"] / 1e9
        row["update_gflops"] = (6 * N * (prompt + gen) + 6 * head * gen) / row["update_s"] / 1e9


def summary(side: dict[str, Any], warmup: int, rows: int) -> dict[str, float]:
    """Mean step, rollout and update over the steps after `warmup`, and their rates."""
    timed = side["steps"][warmup:]
    mean = {
        k: sum(r[k] for r in timed) / len(timed) for k in timed[0] if isinstance(timed[0][k], float | int)
    }
    mean["sequences_per_s"] = rows / mean["step_s"]
    mean["decode_tokens_per_s"] = sum(r["generated_tokens"] for r in timed) / sum(
        r["rollout_s"] for r in timed
    )
    return mean


def render(results: list[dict[str, Any]]) -> str:
    """The markdown table of every recorded run (docs/benchmarks.md's `<!-- bench:llm_step -->`)."""
    lines = [
        "| date | commit | CPU flags | threads | side | step s | rollout s (GFLOP/s) | update s (GFLOP/s) "
        "| update % of fp32 peak | decode tokens/s | peak RSS MB | textgym/TRL |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in results:
        peak = run["peak_gflops"]["float32"]
        for name in ("textgym", "trl"):
            m = run["sides"][name]["mean"]
            ratio = f"**{run['ratio']:.2f}×**" if name == "textgym" else ""
            lines.append(
                f"| {run['date']} | {run['commit']} | {' '.join(run['machine']['flags']) or 'none'} "
                f"| {run['threads']} | {name} | {m['step_s']:.1f} | {m['rollout_s']:.1f} "
                f"({m['rollout_gflops']:.0f}) | {m['update_s']:.1f} ({m['update_gflops']:.0f}) "
                f"| {100 * m['update_gflops'] / peak:.0f}% | {m['decode_tokens_per_s']:.0f} "
                f"| {run['sides'][name]['peak_rss_mb']:,.0f} | {ratio} |"
            )
    last = results[-1]
    lines.append("")
    lines.append(
        f"Matmul peak of the latest run (GEMM probe at the model's shapes): fp32 "
        f"{last['peak_gflops']['float32']:.0f} GFLOP/s, bf16 {last['peak_gflops']['bfloat16']:.0f} GFLOP/s. "
        f"Settings: `{last['command']}`, {last['batch']}."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", type=Path, default=ROOT / "configs" / "smollm2_grpo.yaml")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--sides", nargs="+", default=["textgym", "trl"], choices=["textgym", "trl"])
    p.add_argument("--no-record", action="store_true", help="print only; leave bench/results alone")
    p.add_argument("--child", nargs=3, metavar=("SIDE", "SETTINGS", "OUT"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.steps <= a.warmup:
        p.error(f"--steps ({a.steps}) must exceed --warmup ({a.warmup})")
    if a.child:
        child(a.child[0], Path(a.child[1]), a.steps, a.threads, Path(a.child[2]))
        return
    import torch

    sys.path.insert(0, str(ROOT / "bench"))
    from learning import machine

    torch.set_num_threads(a.threads)
    work = Path(tempfile.mkdtemp(prefix="llm_step_"))
    s = settings(a.config, a.steps)
    (work / "settings.json").write_text(json.dumps(s))
    N, head = model_flops(s["model_dir"])
    peak = {d: gemm_probe(s["model_dir"], d) for d in ("float32", "bfloat16")}
    rows = s["prompts_per_step"] * s["group_size"]
    if s["micro_batch_tokens"]:
        micro = f"≤ {s['micro_batch_tokens']} tokens (TRL: {s['micro_batch_size']} rows)"
    else:
        micro = f"{s['micro_batch_size']} rows"
    batch = (
        f"{s['prompts_per_step']}×{s['group_size']} rows, micro-batches of {micro}, "
        f"T {s['temperature']}, top-p {s['top_p']}, ≤ {s['max_new_tokens']} new tokens, "
        f"{a.steps} steps of which {a.warmup} warm-up"
    )
    print(
        f"{batch} · threads {a.threads} · matmul peak fp32 {peak['float32']:.0f}, "
        f"bf16 {peak['bfloat16']:.0f} GFLOP/s"
    )
    sides: dict[str, Any] = {}
    for name in a.sides:
        out = work / f"{name}.json"
        cmd = [sys.executable, __file__, "--child", name, str(work / "settings.json"), str(out)]
        subprocess.run([*cmd, "--steps", str(a.steps), "--threads", str(a.threads)], check=True)
        side = json.loads(out.read_text())
        rates(s, side, N, head)
        side["mean"] = summary(side, a.warmup, rows)
        sides[name] = side
        for i, r in enumerate(side["steps"]):
            print(
                f"{name:8s} step {i + 1}: {r['step_s']:6.1f} s · rollout {r['rollout_s']:5.1f} s "
                f"({r['rollout_gflops']:4.0f} GFLOP/s, {r['generated_tokens']:5.0f} tokens) · update "
                f"{r['update_s']:5.1f} s ({r['update_gflops']:4.0f} GFLOP/s)"
            )
        print(f"{name:8s} peak RSS {side['peak_rss_mb']:,.0f} MB")
    if set(sides) != {"textgym", "trl"}:
        return
    tg, trl = sides["textgym"]["mean"], sides["trl"]["mean"]
    ratio = tg["sequences_per_s"] / trl["sequences_per_s"]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    record = {
        "date": datetime.date.today().isoformat(),
        "commit": commit.stdout.strip(),
        "machine": machine(),
        "threads": a.threads,
        "command": f"python bench/llm_step.py --steps {a.steps} --warmup {a.warmup} --threads {a.threads}",
        "batch": batch,
        "peak_gflops": peak,
        "sides": sides,
        "ratio": ratio,
    }
    if not a.no_record:
        history = json.loads(RESULTS.read_text()) if RESULTS.exists() else []
        RESULTS.write_text(json.dumps([*history, record], indent=1) + "\n")
    print(
        f"rollout textgym/trl {trl['rollout_s'] / tg['rollout_s']:.2f}× faster · update "
        f"{trl['update_s'] / tg['update_s']:.2f}× faster"
    )
    print(
        f"throughput ratio textgym/trl: {ratio:.2f} · update at "
        f"{100 * tg['update_gflops'] / peak['float32']:.0f}% of matmul peak · "
        f"decode at {tg['decode_tokens_per_s']:.0f} tokens/s"
    )


if __name__ == "__main__":
    main()
