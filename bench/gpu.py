"""GPU figures: update-step throughput and MFU, and peak memory of PPO vs GRPO vs LoRA.

For a locally built Qwen2-config model (default the `0.5b-v152k` preset: the Qwen2.5-0.5B
shape with its 151,936-id vocabulary, random init; `--preset 0.5b` keeps textgym's 1,024-id
one), each measurement runs in its own subprocess so
peak-memory counters start clean:

- `train`: the policy-gradient update step of the trainers (`sequence_logprobs` over a
  batch of `--batch` rows × (`--prompt-len` + `--response-len`) tokens, the clipped
  surrogate, backward, AdamW), bf16 autocast over fp32 master weights on CUDA (fp32 on
  CPU), `--steps` timed steps after `--warmup`. Tokens/s counts every token the forward
  sees (prompt + response). MFU = achieved FLOP/s / `--peak-tflops`, with PaLM's count
  (Chowdhery et al. 2022, arXiv:2204.02311, appendix B): 6·N + 12·n_layer·d_model·T
  training FLOPs per token, N all parameters (tied embeddings once: the LM head's matmul
  is real work, the lookup is not), T the sequence length; the reference's forward adds a
  third of that. Causal masking is not discounted.
- `memory`: peak memory of one update with the models a trainer holds: GRPO (policy +
  frozen reference), PPO (policy, reference, critic, frozen reward model), LoRA GRPO
  (policy with adapters; the reference is the same module with adapters off).
  `torch.cuda.max_memory_allocated` on CUDA, peak RSS on CPU.

Rollout throughput (transformers vs vLLM) is `bench/rollout.py --presets 0.5b --dtype
bfloat16`. On a CPU, `python bench/gpu.py --device cpu --preset tiny` checks the script runs
(its MFU means nothing there).

    python bench/gpu.py [--preset 0.5b-v152k] [--device cuda] [--batch 16] [--prompt-len 256]
                        [--response-len 768] [--steps 5] [--warmup 2] [--peak-tflops 989]
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


def synthetic_batch(B: int, P: int, L: int, vocab: int, device: str = "cpu"):
    """A RolloutBatch of random token ids (every row full length)."""
    import torch

    from textgym.training.batch import RolloutBatch

    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, vocab, (B, P + L), generator=g)
    return RolloutBatch(
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        position_ids=torch.arange(P + L).expand(B, -1).contiguous(),
        prompt_width=P,
        loss_mask=torch.ones(B, L),
        old_logprobs=torch.zeros(B, L),
        token_rewards=torch.zeros(B, L),
        rewards=torch.zeros(B),
        groups=torch.arange(B) // 4,
    ).to(device)


def _peak_mb(device: str) -> float:
    import resource

    import torch

    if device.startswith("cuda"):
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(args: argparse.Namespace) -> dict[str, float | str]:
    """Run one measurement (`args.what`) and return its figures."""
    import contextlib
    import copy

    import torch

    from textgym.algorithms.clipped_loss import clipped_policy_loss
    from textgym.config import LoraSettings
    from textgym.models import load_model
    from textgym.training.logprobs import sequence_logprobs
    from textgym.training.lora import apply_lora, reference_of

    dev = args.device
    cuda = dev.startswith("cuda")
    policy, _ = load_model(args.model, device=dev)
    if args.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
        policy.config.use_cache = False
    cfg = policy.config
    B, P, L = args.batch, args.prompt_len, args.response_len
    batch = synthetic_batch(B, P, L, cfg.vocab_size, dev)
    reference = critic = reward_model = None
    if args.what in ("memory-grpo", "memory-ppo", "train"):
        reference = copy.deepcopy(policy).eval().requires_grad_(False)
    if args.what == "memory-ppo":
        from textgym.trainers.rl.critic import build_critic, sequence_values

        critic = build_critic(policy)
        reward_model = copy.deepcopy(critic).eval().requires_grad_(False)
    if args.what == "memory-lora":
        policy = apply_lora(policy, LoraSettings(r=args.rank, alpha=2 * args.rank))
    trained = [p for p in policy.parameters() if p.requires_grad]
    if critic is not None:
        trained += list(critic.parameters())
    opt = torch.optim.AdamW(trained, lr=1e-6, fused=cuda)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16) if cuda else contextlib.nullcontext()

    def step() -> None:
        with autocast:
            with torch.no_grad():
                if reference is not None:
                    ref = sequence_logprobs(reference, batch, share_prompts=False)[0]
                else:
                    with reference_of(policy) as r:
                        ref = sequence_logprobs(r, batch, share_prompts=False)[0]
                if reward_model is not None:
                    sequence_values(reward_model, batch)
            logp = sequence_logprobs(policy, batch, share_prompts=False)[0]
            adv = torch.ones_like(logp)
            loss, _ = clipped_policy_loss(
                logp.float(),
                logp.detach().float(),
                adv,
                batch.loss_mask,
                ref_logprobs=ref.float(),
                kl_coef=0.05,
            )
            if critic is not None:
                values = sequence_values(critic, batch)[:, :L]
                loss = loss + ((values.float() - 1.0) ** 2 * batch.loss_mask).mean()
        opt.zero_grad(set_to_none=False)
        loss.backward()
        opt.step()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    if args.what != "train":
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        step()
        sync()
        return {"what": args.what, "peak_mb": _peak_mb(dev), "trainable": sum(p.numel() for p in trained)}
    for _ in range(args.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    secs = (time.perf_counter() - t0) / args.steps
    # The update is a policy forward+backward (6N per token) plus a reference forward (2N).
    n_layer, d = cfg.num_hidden_layers, cfg.hidden_size
    n = sum(p.numel() for p in policy.parameters())
    T = P + L
    per_token_train = 6 * n + 12 * n_layer * d * T
    per_token_ref = (6 * n + 12 * n_layer * d * T) / 3
    tokens = B * T
    flops = tokens * (per_token_train + per_token_ref) / secs
    return {
        "what": "train",
        "params": n,
        "tokens_per_s": tokens / secs,
        "step_s": secs,
        "tflops": flops / 1e12,
        "mfu": flops / (args.peak_tflops * 1e12),
        "peak_mb": _peak_mb(dev),
    }


def main() -> None:
    """Build the model once, run each measurement in a subprocess, print the figures."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="0.5b-v152k")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--response-len", type=int, default=768)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak (H100/H200 SXM: 989)")
    ap.add_argument("--gradient-checkpointing", action="store_true")
    ap.add_argument("--what", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.what is not None:
        print(json.dumps(child(args)))
        return
    import torch

    from textgym.model_init import init_model

    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"cpu ({os.cpu_count()} cores)"
    print(
        f"{args.preset} on {name}: batch {args.batch} x ({args.prompt_len} + {args.response_len}) tokens, "
        f"{'bf16 autocast' if args.device.startswith('cuda') else 'fp32'}"
    )
    with tempfile.TemporaryDirectory() as d:
        model = init_model(args.preset, Path(d) / args.preset)
        for what in ("train", "memory-grpo", "memory-ppo", "memory-lora"):
            cmd = [sys.executable, __file__, "--what", what, "--model", str(model)]
            for k in ("preset", "device", "batch", "prompt_len", "response_len", "steps", "warmup", "rank",
                      "peak_tflops"):  # fmt: skip
                cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
            if args.gradient_checkpointing:
                cmd.append("--gradient-checkpointing")
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            r = json.loads(out.strip().splitlines()[-1])
            if what == "train":
                print(
                    f"update step: {r['tokens_per_s']:,.0f} tokens/s, {r['step_s']:.2f} s/step, "
                    f"{r['tflops']:.3g} TFLOP/s, MFU {100 * r['mfu']:.1f}% "
                    f"({r['params'] / 1e6:.0f}M parameters)"
                )
            else:
                print(f"{what:12} peak {r['peak_mb']:9.0f} MB  trainable {r['trainable']:,}")


if __name__ == "__main__":
    main()
