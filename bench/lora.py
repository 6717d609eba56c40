"""Memory of a GRPO update with LoRA adapters against full fine-tuning, side by side.

Each mode runs in its own fresh subprocess (so one's allocations cannot hide the other's) on
the same locally built Qwen2-config model (a textgym preset, float32, random init):

- `full`: the policy trains every weight; the reference is a frozen deep copy (β > 0), and
  AdamW keeps two fp32 moments per weight.
- `lora`: the policy gets LoRA adapters (`textgym.training.lora.apply_lora`, r and α as
  given, all linear layers); the reference is the same module with adapters disabled.

Each process builds its models and optimizer, then runs `--steps` GRPO-style updates on a
synthetic batch (`--batch` rows, `--prompt-len` + `--response-len` tokens): reference
log-probs without gradient, policy log-probs with gradient, the clipped surrogate plus β·k3,
backward, AdamW step. It reports the peak resident memory during the updates (VmHWM, reset
after the models are built, so loading's transient copies do not count) minus the resident
memory after `import torch, transformers` (the interpreter's share), the bytes of weights,
gradients and optimizer state it holds, and the median update time.

Peak RSS measures live tensors only if (1) the weights sit in anonymous memory: safetensors
maps the weight file, and its pages count in RSS only once touched, so the child copies
every parameter after loading; and (2) freed memory goes back to the system: glibc's malloc
keeps freed heap blocks below its mmap threshold (which grows up to 32 MiB as blocks are
freed) for reuse, so its peak also counts memory that is free but retained and depends on
how allocation sizes interleave. On the `small` preset LoRA's peak RSS was 1.19x full
fine-tuning's with glibc's settings (0.65x with the setting below), although the tensors
autograd saved for backward were fewer bytes (544 vs 597 MB, counted with
`saved_tensors_hooks`). By default
(`--malloc mmap`) the children therefore run with
`MALLOC_MMAP_THRESHOLD_=65536 MALLOC_TRIM_THRESHOLD_=0`: every block of 64 KiB or more is
its own mapping, returned on free, and the peak follows the live bytes; `--malloc default`
measures with glibc's own settings (what a plain run gets).

    python bench/lora.py [--preset small] [--rank 16] [--batch 16] [--prompt-len 32]
                         [--response-len 96] [--steps 3] [--threads 2] [--malloc mmap]

Last line: `peak memory ratio lora/full (<preset>): X.XX`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def _status_mb(key: str) -> float:
    """A size from /proc/self/status in MB (VmRSS: resident now; VmHWM: peak since the last reset)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0: write 5 to /proc/self/clear_refs)."""
    Path("/proc/self/clear_refs").write_text("5")


def child(args: argparse.Namespace) -> None:
    """Run one mode and print its figures as one JSON line."""
    import copy

    import torch
    import transformers  # noqa: F401  (its import is part of the baseline, not of the models)
    from gpu import synthetic_batch  # bench/gpu.py, beside this script

    from textgym.algorithms.clipped_loss import clipped_policy_loss
    from textgym.config import LoraSettings
    from textgym.models import load_model
    from textgym.training.logprobs import sequence_logprobs
    from textgym.training.lora import apply_lora, reference_of

    torch.set_num_threads(args.threads)
    base_mb = _status_mb("VmRSS")
    policy, _ = load_model(args.model)
    with torch.no_grad():  # weights in anonymous memory, not pages of the mmap'd file (see above)
        for param in policy.parameters():
            param.data = param.data.clone()
    if args.mode == "full":
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    else:
        policy = apply_lora(policy, LoraSettings(r=args.rank, alpha=2 * args.rank))
        reference = None
    params = [p for p in policy.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)
    B, P, L = args.batch, args.prompt_len, args.response_len
    batch = synthetic_batch(B, P, L, policy.config.vocab_size)
    g = torch.Generator().manual_seed(1)
    advantages = torch.randn(B, generator=g)[:, None].expand(B, L)
    _reset_peak()  # loading's transient copies are not the update's memory
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        with torch.no_grad():
            if reference is not None:
                ref = sequence_logprobs(reference, batch, share_prompts=False)[0]
            else:
                with reference_of(policy) as r:
                    ref = sequence_logprobs(r, batch, share_prompts=False)[0]
        logp = sequence_logprobs(policy, batch, share_prompts=False)[0]
        loss, _ = clipped_policy_loss(
            logp,
            logp.detach(),
            advantages,
            batch.loss_mask,
            ref_logprobs=ref,
            kl_coef=0.05,
            kl_estimator="k3",
        )
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)

    def nbytes(ts):
        return sum(t.numel() * t.element_size() for t in ts)

    weights = nbytes(policy.parameters()) + (nbytes(reference.parameters()) if reference is not None else 0)
    grads = nbytes(p.grad for p in params if p.grad is not None)
    state = nbytes(v for s in opt.state.values() for v in s.values() if torch.is_tensor(v))
    out = {
        "mode": args.mode,
        "peak_mb": _status_mb("VmHWM") - base_mb,
        "weights_mb": weights / 2**20,
        "grads_mb": grads / 2**20,
        "optimizer_mb": state / 2**20,
        "trainable": sum(p.numel() for p in params),
        "update_s": sorted(times)[len(times) // 2],
    }
    print(json.dumps(out))


def main() -> None:
    """Build the model once, run both modes in subprocesses, print the table and the ratio."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--response-len", type=int, default=96)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--malloc",
        choices=["mmap", "default"],
        default="mmap",
        help="mmap: blocks >= 64 KiB go back to the system on free (peak RSS = live bytes); default: glibc's",
    )
    ap.add_argument("--mode", choices=["full", "lora"], help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mode is not None:
        child(args)
        return
    from textgym.model_init import init_model

    with tempfile.TemporaryDirectory() as d:
        model = init_model(args.preset, Path(d) / args.preset)
        rows = {}
        for mode in ("full", "lora"):
            cmd = [sys.executable, __file__, "--mode", mode, "--model", str(model)]
            for k in ("preset", "rank", "batch", "prompt_len", "response_len", "steps", "threads"):
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            env = dict(os.environ)
            if args.malloc == "mmap":
                env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
            rows[mode] = json.loads(out.strip().splitlines()[-1])
    print(
        f"preset {args.preset}, batch {args.batch} x ({args.prompt_len} + {args.response_len}) tokens, "
        f"r={args.rank}, malloc {args.malloc}"
    )
    print(
        f"{'mode':6} {'trainable':>11} {'weights MB':>11} {'grads MB':>9} {'Adam MB':>8} "
        f"{'peak MB':>8} {'update s':>9}"
    )
    for r in rows.values():
        print(
            f"{r['mode']:6} {r['trainable']:>11,} {r['weights_mb']:>11.1f} {r['grads_mb']:>9.1f} "
            f"{r['optimizer_mb']:>8.1f} {r['peak_mb']:>8.1f} {r['update_s']:>9.2f}"
        )
    ratio = rows["lora"]["peak_mb"] / rows["full"]["peak_mb"]
    print(f"peak memory ratio lora/full ({args.preset}): {ratio:.2f}")


if __name__ == "__main__":
    main()
