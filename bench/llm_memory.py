"""Where the memory of a GRPO step on a real LLM goes: peak RSS of each phase, side by side.

Runs `configs/smollm2_grpo.yaml`'s GRPO (SmolLM2-135M-Instruct, 8 prompts × 8 samples, 64
new tokens, full fine-tuning, AdamW, fp32, no reference since β = 0) for `--steps` steps in a
child process per variant, and reads the process's resident set from /proc/self/status
around each phase of `OnPolicyTrainer.train_step` (the peak is reset before each phase by
writing 5 to /proc/self/clear_refs, Linux ≥ 4.0):

    rollout        generation of the 64 responses (KV cache, logits of the sampled tokens)
    old_logprobs   π_old recomputed (skipped: the sampler's log-probs are the trainer's)
    update         forward and backward per micro-batch, clipping, AdamW's step

Variants (`--variants`, default all): `micro16` is the config as it was measured first
(micro-batches of 16 rows); `micro4` the config's micro-batches of 4 rows; `micro4_mmap` the
same with glibc's mmap threshold pinned at 1 MiB (`MALLOC_MMAP_THRESHOLD_`); `lora16` LoRA
adapters (r = 16, α = 32, every linear layer) instead of full fine-tuning; `micro4_ckpt`,
`micro2_ckpt` and `lora16_ckpt` the same with gradient checkpointing
(`parallel.gradient_checkpointing`: each layer's activations recomputed in the backward pass);
`micro2` micro-batches of 2 rows. All run on the
current code, which frees the gradients before each rollout and trims the heap after each
step (`textgym.training.loop.release_free_heap`).

Accounting for a 134.5M-parameter model in fp32 (538 MB per copy): weights 538 MB, gradients
538 MB (during the update only), AdamW's two moments 1,076 MB, the Python process with torch
and transformers imported ~425 MB; the rest is activations (micro-batch rows × ~124 tokens ×
30 layers) and the rollout's KV cache.

    python bench/llm_memory.py [--steps 2] [--variants micro16 micro4 ...] [--threads 2]

Prints each variant's peak RSS ratio to `micro16`'s. Writes bench/results/llm_memory.json,
keeping the variants not re-run (each row carries its date, CPU flags and threads).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VARIANTS: dict[str, dict] = {
    "micro16": {"micro": 16},
    "micro4": {"micro": 4},
    # glibc's mmap threshold pinned (it otherwise rises with each freed block up to 32 MiB, after
    # which freed tensors stay in the heap): every block of 1 MiB or more is its own mapping,
    # handed back to the OS when freed
    "micro4_mmap": {"micro": 4, "env": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)}},
    # LoRA r=16 on every linear layer: AdamW's moments and the gradients cover the adapters only
    "lora16": {"micro": 4, "lora": {"r": 16, "alpha": 32}},
    # activations recomputed in the backward pass (one more forward per micro-batch): only each
    # layer's input is kept through the forward
    "micro4_ckpt": {"micro": 4, "checkpointing": True},
    "micro2": {"micro": 2},
    "micro2_ckpt": {"micro": 2, "checkpointing": True},
    "lora16_ckpt": {"micro": 4, "lora": {"r": 16, "alpha": 32}, "checkpointing": True},
}


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def child(variant: str, steps: int, threads: int) -> dict:
    """One variant in this process: per-phase peaks (MB) of each step."""
    import functools
    import tempfile

    import torch

    torch.set_num_threads(threads)
    base = _status_mb("VmRSS")
    from textgym.config import load_config
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.loop import release_free_heap
    from textgym.training.seeding import seed_everything

    imported = _status_mb("VmRSS")
    cfg = load_config(ROOT / "configs/smollm2_grpo.yaml")
    assert cfg.grpo is not None
    spec = VARIANTS[variant]
    update: dict = {"steps": steps, "micro_batch_size": spec["micro"], "micro_batch_tokens": None}
    if "lora" in spec:
        from textgym.config.base import LoraSettings

        update["lora"] = LoraSettings(**spec["lora"])
    rl = cfg.grpo.model_copy(update=update)
    model, tok = load_model(cfg.model.name or "smollm2-135m-instruct")
    seed_everything(0)
    from textgym.config.base import ParallelConfig

    parallel = ParallelConfig(gradient_checkpointing=spec.get("checkpointing", False))
    trainer = GRPOTrainer(rl, model, tok, Path(tempfile.mkdtemp()), seed=0, log_with=(), parallel=parallel)
    phases: list[dict[str, float]] = []

    def watch(obj: object, name: str, label: str) -> None:
        f = getattr(obj, name)

        @functools.wraps(f)
        def g(*a, **k):
            before = _status_mb("VmRSS")
            _reset_peak()
            out = f(*a, **k)
            phases[-1][label] = _status_mb("VmHWM")
            phases[-1][label + "_before"] = before
            return out

        setattr(obj, name, g)

    watch(trainer, "sample", "rollout")
    watch(trainer.updater, "recompute_old_logprobs", "old_logprobs")
    watch(trainer, "update", "update")
    times = []
    for _ in range(steps):
        phases.append({})
        t0 = time.perf_counter()
        trainer.train_step()
        release_free_heap()
        times.append(time.perf_counter() - t0)
        phases[-1]["after_step"] = _status_mb("VmRSS")
    return {
        "micro_batch_size": spec["micro"],
        "env": spec.get("env", {}),
        "lora": spec.get("lora"),
        "gradient_checkpointing": spec.get("checkpointing", False),
        "rss_start_mb": base,
        "rss_imported_mb": imported,
        "steps": phases,
        "peak_mb": max(v for p in phases for k, v in p.items() if not k.endswith("_before")),
        "step_s": times,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    ap.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    ap.add_argument("--out", type=Path, default=ROOT / "bench/results/llm_memory.json")
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.steps, args.threads)))
        return
    rows = {}
    for name in args.variants:  # one after another: two at once would share the cores and the RAM
        cmd = [sys.executable, __file__, "--child", name, "--steps", str(args.steps)]
        cmd += ["--threads", str(args.threads)]
        env = {**os.environ, **VARIANTS[name].get("env", {})}
        out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT, env=env).stdout
        rows[name] = json.loads(out.strip().splitlines()[-1])
        r = rows[name]
        print(f"{name}: peak RSS {r['peak_mb']:.0f} MB, step times {[round(t) for t in r['step_s']]} s")
        for i, p in enumerate(r["steps"]):
            print(
                f"  step {i}: rollout {p['rollout']:.0f}  update {p['update']:.0f}  "
                f"(update started at {p['update_before']:.0f})  after the step {p['after_step']:.0f} MB"
            )
    flags = sorted({f for f in Path("/proc/cpuinfo").read_text().split() if f.startswith(("avx", "amx"))})
    record = {
        "date": time.strftime("%Y-%m-%d"),
        "cpu": platform.processor() or platform.machine(),
        "cpu_flags": flags,
        "threads": args.threads,
        "aten_cpu_capability": os.environ.get("ATEN_CPU_CAPABILITY", "own"),
        "variants": rows,
    }
    if args.out.exists():  # keep the variants not re-run now, with their own date and machine
        old = json.loads(args.out.read_text())
        kept = {k: {**v, **{f: old[f] for f in ("date", "cpu_flags", "threads") if f not in v}}
                for k, v in old.get("variants", {}).items() if k not in rows}  # fmt: skip
        record["variants"] = {**kept, **rows}
    for r in rows.values():
        r.update(date=record["date"], cpu_flags=flags, threads=args.threads)
    args.out.write_text(json.dumps(record, indent=1) + "\n")
    every = record["variants"]
    if "micro16" in every:
        for name in rows:
            if name != "micro16":
                ratio = rows[name]["peak_mb"] / every["micro16"]["peak_mb"]
                print(f"peak RSS ratio {name}/micro16: {ratio:.2f}")


if __name__ == "__main__":
    main()
