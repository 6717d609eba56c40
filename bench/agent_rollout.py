"""Multi-turn rollout throughput: continuous rollouts against lockstep, side by side.

One model, one multi-turn env, the same tasks, seeds and episode count for both engines.

- By default the model is a randomly initialised textgym preset (built here from its config)
  and the env `textgym/Wordle-v0` (six guesses) with `step_latency_s` adding a uniform random
  100–400 ms to every step: a stand-in for a sandbox run, a tool or a game server. The random
  model never guesses the word, so every episode runs its six turns in both engines.
- Under RL load with real tools: `--model` a trained agent (e.g. `runs/agent_toolmath/grpo/final`
  from `textgym train configs/agent_toolmath.yaml`), `--env textgym/ToolMath-v0` with
  `--env-kwargs` naming its tools (the calculator, or the `python` tool run in the process
  sandbox) and `--latency 0 0` (no added delay: the tools' own time), `--episodes 64`.

Each repeat runs lockstep
(`textgym.agents.rollout`) and continuous (`textgym.agents.continuous`) rollouts of the same
episodes, in alternating order, after one untimed warm-up of each; per engine it reports the
median episodes/s, the generation-idle fraction (share of the wall time with no `generate`
call running) and the env-step share (`RolloutStats.env_s` over the wall time: in lockstep, the
share of the wall time spent waiting on env steps and tools; in a continuous rollout the env
steps' summed own times, which overlap generation and each other, so it may exceed 100%), the
tool calls per episode, and checks that both engines produced the same token ids.

Both engines step envs in threads, one per episode (`TEXTGYM_STEP_THREADS` is set to the
episode count for lockstep), so lockstep waits for its slowest step each turn, not for a
queue of steps. torch runs on `--threads` threads (default 1: on a shared 2-core machine two
intra-op threads contend with other processes and slow generation down several-fold).

    python bench/agent_rollout.py [--preset tiny | --model DIR] [--env ID] [--env-kwargs K=V ...]
                                  [--episodes 16] [--latency 0.1 0.4] [--max-new-tokens 8]
                                  [--max-turns 6] [--repeats 3] [--threads 1]
                                  [--backend transformers|vllm] [--window 0]

Last line: `rollout throughput ratio async/lockstep: X.XX` (continuous episodes/s over lockstep's).

What bounds the ratio: continuous rollouts hide env latency behind generation, so they gain at
most 1 / (1 − lockstep's generation-idle fraction), and lose a little to smaller, more padded
`generate` calls. Here each turn re-prefills the episode's whole history (no KV cache across
turns), so generation costs grow with tokens rather than per call, and the gain needs steps
about as slow as a turn's generation: with 50–200 ms steps (`--latency 0.05 0.2`) the ratio on
the shared 2-core CPU was 1.04 to 1.22 (16 episodes) and 1.34 (8); see docs/agents.md.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import tempfile
import time
from pathlib import Path

import yaml


def parse() -> argparse.Namespace:
    """The command line (see the module docstring)."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--preset", default="tiny", help="model preset (textgym.models.PRESETS)")
    ap.add_argument("--model", default=None, help="a Hugging Face model folder instead of a random preset")
    ap.add_argument("--env", default="textgym/Wordle-v0", help="a multi-turn env id")
    ap.add_argument(
        "--env-kwargs", nargs="*", default=[], metavar="K=V", help="env kwargs, values read as YAML"
    )
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--latency", type=float, nargs=2, default=[0.1, 0.4], help="step latency range, s")
    ap.add_argument("--max-new-tokens", type=int, default=8)
    ap.add_argument("--max-turns", type=int, default=6)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--window", type=float, default=0.0, help="continuous: batch_window_s (transformers)")
    ap.add_argument(
        "--backend", default="transformers", choices=["transformers", "vllm"], help="in-process generation"
    )
    return ap.parse_args()


def main() -> None:
    """Run both engines `--repeats` times and print the comparison."""
    args = parse()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ["TEXTGYM_STEP_THREADS"] = str(args.episodes)  # read when textgym.agents.rollout is imported
    import torch

    from textgym.agents import LLMAgent, SamplingParams, rollout
    from textgym.agents.continuous import rollout_continuous
    from textgym.agents.rollout import RolloutStats
    from textgym.agents.sampling import derive_seed
    from textgym.envs import make
    from textgym.model_init import init_model

    torch.set_num_threads(args.threads)
    n = args.episodes
    env_kwargs = {k: yaml.safe_load(v) for k, _, v in (kv.partition("=") for kv in args.env_kwargs)}
    if any(args.latency):
        env_kwargs["step_latency_s"] = list(args.latency)
    with tempfile.TemporaryDirectory(prefix="textgym-bench-rollout-") as tmp:
        folder = Path(args.model) if args.model else init_model(args.preset, Path(tmp) / args.preset, seed=0)
        if args.backend == "vllm":  # continuous: the engine stepped, each turn joining the running batch
            agent = LLMAgent.from_pretrained(folder, backend="vllm", vllm_kwargs={"dtype": "float32"})
        else:
            agent = LLMAgent.from_pretrained(folder, batch_size=max(n, 1))
        envs = [make(args.env, **env_kwargs) for _ in range(n)]
        tasks, seeds = list(range(n)), [derive_seed(0, e) for e in range(n)]
        params = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
        continuous = functools.partial(rollout_continuous, batch_window_s=args.window)
        engines = {"lockstep": rollout, "continuous": continuous}
        latency = f"U[{args.latency[0]:g}, {args.latency[1]:g}] s" if any(args.latency) else "none"
        print(
            f"model {args.model or args.preset} | env {args.env} {env_kwargs} | {n} episodes, "
            f"<= {args.max_turns} turns | "
            f"added step latency {latency} | max_new_tokens "
            f"{args.max_new_tokens} | {args.backend} | window {args.window:g} s | "
            f"torch threads {args.threads} | cpus {os.cpu_count()}"
        )
        for fn in engines.values():  # warm-up (untimed): allocator, kernels, tokenizer caches
            fn(agent, envs[:2], tasks[:2], params, max_turns=2, seeds=seeds[:2], env_id=args.env)
        results: dict[str, list[RolloutStats]] = {name: [] for name in engines}
        ids: dict[str, list[list[int]]] = {}
        t0 = time.perf_counter()
        for r in range(args.repeats):
            order = list(engines) if r % 2 == 0 else list(engines)[::-1]
            for name in order:
                stats = RolloutStats()
                trajs = engines[name](
                    agent,
                    envs,
                    tasks,
                    params,
                    max_turns=args.max_turns,
                    seeds=seeds,
                    env_id=args.env,
                    stats=stats,
                )
                results[name].append(stats)
                ids[name] = [t.token_ids.tolist() for t in trajs]
                turns = sum(sum(m["role"] == "assistant" for m in t.messages) for t in trajs)
                calls = sum(t.counts.get("tool_calls", 0) for t in trajs) / n
                solved = sum(t.reward > 0 for t in trajs) / n
                print(
                    f"  repeat {r + 1} {name:10s} {stats.wall_s:6.2f} s  "
                    f"{stats.episodes_per_s:6.2f} episodes/s  "
                    f"generation idle {stats.idle_fraction:5.1%}  "
                    f"env steps {stats.env_s / stats.wall_s:5.1%}  "
                    f"{stats.generate_calls:3d} generate calls, "
                    f"{stats.generated_rows / max(stats.generate_calls, 1):5.1f} rows/call  ({turns} turns, "
                    f"{calls:.2f} tool calls/episode, reward > 0 in {solved:.0%})"
                )
        same = sum(a == b for a, b in zip(ids["lockstep"], ids["continuous"], strict=True))
        print(
            f"same token ids in both engines: {same}/{n} episodes; "
            f"benchmark took {time.perf_counter() - t0:.0f} s"
        )
    rate = {name: statistics.median(s.episodes_per_s for s in results[name]) for name in engines}
    for name in engines:
        idle = statistics.median(s.idle_fraction for s in results[name])
        env_share = statistics.median(s.env_s / s.wall_s for s in results[name])
        print(
            f"{name:10s} median {rate[name]:6.2f} episodes/s, generation-idle fraction {idle:.1%}, "
            f"env steps {env_share:.1%} of wall"
        )
    if args.backend == "vllm":
        agent.backend.close()
    print(f"rollout throughput ratio async/lockstep: {rate['continuous'] / rate['lockstep']:.2f}")


if __name__ == "__main__":
    main()
