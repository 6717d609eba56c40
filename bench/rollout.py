"""Rollout generation throughput: the vLLM backend against the transformers backend, side by side.

Both backends load the same model folder (a randomly initialised textgym preset, or with
`--models` a real one: a folder or a packaged model such as smollm2-135m-instruct; float32)
and sample responses to the same token-id prompts (Arithmetic tasks rendered by the chat
template, `--groups` tasks × `--group-size` samples each, as a GRPO step asks for), at
temperature 1 with the same response budget. A random model rarely samples its EOS token,
so nearly every response runs to `--max-new-tokens` on both; a real model stops at its EOS,
at lengths that differ between the backends' samples (its rate is tokens generated over
time). Each backend gets one untimed warm-up call, then `--repeats` timed calls; tokens/s is
generated tokens over the median wall time. vLLM runs with torch.compile (its default;
`--eager` turns it off, as the trainer's engine does for a faster start).

    python bench/rollout.py [--presets tiny small | --models smollm2-135m-instruct]
                            [--groups 16] [--group-size 8]
                            [--max-new-tokens 128] [--repeats 3] [--threads 2] [--eager]
                            [--device cpu] [--dtype float32]

Last line per preset: `tokens/s ratio vllm/transformers (<preset>): X.XX`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import gymnasium as gym
import torch


def prompts_for(agent, n: int) -> list[list[int]]:
    """Token ids of the first `n` Arithmetic training prompts."""
    env = gym.make("textgym/Arithmetic-v0", operators="+", digits=2)
    out = []
    for i in range(n):
        messages, _ = env.reset(options={"task_index": i})
        out.append(agent.encode_prompt(messages))
    env.close()
    return out


def timed(backend, prompts: list[list[int]], params, repeats: int) -> tuple[float, int]:
    """(median seconds per call, generated tokens of the last call) after one warm-up call."""
    backend.generate(prompts, params)
    times, tokens = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        gens = backend.generate(prompts, params)
        times.append(time.perf_counter() - t)
        tokens = sum(len(g.token_ids) for g in gens)
    return statistics.median(times), tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--presets", nargs="+", default=["tiny", "small"])
    ap.add_argument("--models", nargs="+", default=[], help="folders or packaged model names, not presets")
    ap.add_argument("--groups", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eager", action="store_true", help="vLLM without torch.compile")
    ap.add_argument("--device", default="cpu", help="where the transformers backend runs (cuda on a GPU)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    import textgym  # noqa: F401
    from textgym.agents import LLMAgent, SamplingParams
    from textgym.model_init import init_model
    from textgym.models import count_parameters, load_model, resolve_model

    params = SamplingParams(temperature=1.0, max_new_tokens=args.max_new_tokens)
    print(
        f"{args.groups} prompts x {args.group_size} samples, up to {args.max_new_tokens} new tokens, "
        f"T=1, {args.dtype}, {args.device}, {args.threads} threads, median of {args.repeats}, "
        f"vLLM {'eager' if args.eager else 'compiled'}"
    )
    with tempfile.TemporaryDirectory() as tmp:
        todo = [(m, Path(resolve_model(m, progress=True))) for m in args.models] or [
            (p, init_model(p, Path(tmp) / p, seed=0)) for p in args.presets
        ]
        for preset, path in todo:
            model, tok = load_model(path, dtype=getattr(torch, args.dtype), device=args.device)
            hf = LLMAgent(model, tok, batch_size=args.groups * args.group_size)
            prompts = [p for p in prompts_for(hf, args.groups) for _ in range(args.group_size)]
            hf_s, hf_tok = timed(hf.backend, prompts, params, args.repeats)
            vl = LLMAgent.from_pretrained(
                path, backend="vllm", vllm_kwargs={"dtype": args.dtype, "enforce_eager": args.eager}
            )
            vl_s, vl_tok = timed(vl.backend, prompts, params, args.repeats)
            vl.backend.close()
            n = count_parameters(model)
            hf_rate, vl_rate = hf_tok / hf_s, vl_tok / vl_s
            print(f"{preset} ({n / 1e6:.1f}M parameters)")
            print(f"  transformers  {hf_s:7.2f} s  {hf_tok:6d} tokens  {hf_rate:8.0f} tokens/s")
            print(f"  vllm          {vl_s:7.2f} s  {vl_tok:6d} tokens  {vl_rate:8.0f} tokens/s")
            print(f"tokens/s ratio vllm/transformers ({preset}): {vl_rate / hf_rate:.2f}")


if __name__ == "__main__":
    main()
