"""One GRPO update of the `small` preset in fp32 and in bf16 autocast (`parallel.mixed_precision`).

A locally built `small` model (512 hidden, 6 layers, 1,024-id vocabulary, ~20 M parameters,
random init, fp32 weights; `textgym.model_init.init_model`) and its frozen reference (β = 0.04,
k3 in the loss); one group of `--rows` sequences (`--prompt-len` shared prompt tokens +
`--response-len` response tokens, token ids drawn once with seed 0, no padding), fixed
group-normalised advantages, micro-batches of `--micro-batch` rows, AdamW. Each precision runs
in its own fresh subprocess (`MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0`, so that
freed blocks go back to the system): per step, π_old is filled by the trainer's own log-prob
pass (untimed), VmHWM is reset, then `GRPOTrainer.update` is timed. "peak MB" is the highest
VmHWM of the updates minus the resident memory after `import torch, transformers, textgym`
(weights, reference, gradients, AdamW state and the update's activations). Time: the median of
`--steps` updates (the first included: AdamW's state is allocated there). The dtype column is
what the policy's first MLP down-projection computed in.

    python bench/precision.py [--steps 3] [--threads 2] [--rows 8] [--prompt-len 128] [--response-len 384]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _status_mb(key: str) -> float:
    """VmRSS or VmHWM of this process from /proc/self/status, in MB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def child(args: argparse.Namespace) -> None:
    """Build the trainer at `args.precision`, run `args.steps` timed updates, print one JSON line."""
    import torch
    import transformers  # noqa: F401

    import textgym  # noqa: F401

    torch.set_num_threads(args.threads)
    base = _status_mb("VmRSS")
    from textgym.config import GRPOConfig, ParallelConfig
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.batch import RolloutBatch

    B, P, L = args.rows, args.prompt_len, args.response_len
    policy, tok = load_model(args.model)
    with torch.no_grad():
        for p in policy.parameters():
            p.data = p.data.clone()  # anonymous memory, not the mmap'd safetensors pages
    seen: set[str] = set()
    layer = policy.model.layers[0].mlp.down_proj
    layer.register_forward_hook(lambda m, i, o: seen.add(str(o.dtype).removeprefix("torch.")))
    cfg = GRPOConfig.model_validate(
        {
            "env": {"id": "textgym/Arithmetic-v0"},
            "steps": 1000,
            "prompts_per_step": 1,
            "group_size": B,
            "sampling": {"max_new_tokens": L},
            "micro_batch_size": args.micro_batch,
            "kl_coef": 0.04,
            "kl_estimator": "k3",
            "kl_placement": "loss",
            "optim": {"lr": 1e-5, "max_grad_norm": 1.0},
        }
    )
    parallel = ParallelConfig(mixed_precision=args.precision)
    trainer = GRPOTrainer(cfg, policy, tok, Path(args.work) / args.precision, parallel=parallel, log_with=())
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, tok.vocab_size, (1, P), generator=g).expand(B, -1)
    ids = torch.cat([prompt, torch.randint(3, tok.vocab_size, (B, L), generator=g)], dim=1)
    batch = RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(P + L).expand(B, -1).contiguous(),
        prompt_width=P,
        loss_mask=torch.ones(B, L),
        old_logprobs=torch.zeros(B, L),
        token_rewards=torch.zeros(B, L),
        rewards=torch.zeros(B),
        groups=torch.zeros(B, dtype=torch.long),
    )
    adv = torch.randn(B, generator=g)
    adv = (adv - adv.mean()) / adv.std()
    times, peaks, losses = [], [], []
    for _ in range(args.steps):
        batch.old_logprobs = trainer.updater.trainer_logprobs(batch)
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        t = time.perf_counter()
        m = trainer.update(batch, adv)
        times.append(time.perf_counter() - t)
        peaks.append(_status_mb("VmHWM") - base)
        losses.append(m["loss/total"])
    state = {str(v.dtype) for s in trainer.optimizer.state.values() for v in s.values() if torch.is_tensor(v)}
    print(
        json.dumps(
            {
                "precision": args.precision,
                "update_s": statistics.median(times),
                "peak_mb": max(peaks),
                "loss": losses[0],
                "computed_in": sorted(seen),
                "params": sorted({str(p.dtype).removeprefix("torch.") for p in policy.parameters()}),
                "adam_state": sorted(s.removeprefix("torch.") for s in state),
            }
        )
    )


def main() -> None:
    """Build the model once, run one child per precision, print the table."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--response-len", type=int, default=384)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--precision", choices=["fp32", "bf16"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.precision is not None:
        child(args)
        return
    from textgym.model_init import init_model

    with tempfile.TemporaryDirectory(prefix="textgym-precision-") as work:
        model = init_model("small", Path(work) / "small", seed=0)
        env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
        rows = []
        for precision in ("fp32", "bf16"):
            cmd = [sys.executable, __file__, "--precision", precision, "--model", str(model), "--work", work]
            for flag in ("steps", "threads", "rows", "prompt_len", "response_len", "micro_batch"):
                cmd += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
            out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
            rows.append(json.loads(out.strip().splitlines()[-1]))
    tokens = args.rows * (args.prompt_len + args.response_len)
    print(
        f"GRPO update, small preset, {args.rows} x ({args.prompt_len} + {args.response_len}) tokens, "
        f"micro-batch {args.micro_batch}, {args.threads} threads, median of {args.steps}"
    )
    print(
        f"{'precision':10}{'update s':>10}{'tokens/s':>10}{'peak MB':>10}{'loss':>12}"
        "  computed in / params / AdamW"
    )
    for r in rows:
        print(
            f"{r['precision']:10}{r['update_s']:>10.2f}{tokens / r['update_s']:>10.0f}{r['peak_mb']:>10.0f}"
            f"{r['loss']:>12.6f}  {','.join(r['computed_in'])} / {','.join(r['params'])} / "
            f"{','.join(r['adam_state'])}"
        )
    print(
        f"bf16/fp32 update time: {rows[1]['update_s'] / rows[0]['update_s']:.2f}, "
        f"peak memory: {rows[1]['peak_mb'] / rows[0]['peak_mb']:.2f}"
    )


if __name__ == "__main__":
    main()
