"""GRPO in one file: the whole algorithm, top to bottom, on textgym's environments and losses.

    python examples/minimal_grpo.py --steps 20
    python examples/minimal_grpo.py --model runs/quickstart/sft/final --steps 100

This is the loop `textgym.trainers.rl.grpo.GRPOTrainer` runs with its default options
(`advantage_estimator: grpo`, `scale_rewards: group`, `loss_aggregation: seq_mean_token_mean`,
`kl_coef: 0`, one epoch, one minibatch), without checkpoints, resuming, LoRA, several
processes, vLLM or the DAPO options; `tests/test_examples.py` checks that the first step's loss
is the trainer's. One iteration (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1):

1. draw `prompts_per_step` tasks from the environment;
2. sample `group_size` responses to each with the current policy, recording each sampled
   token's log-probability (π_old) — textgym's `rollout` runs the episodes and the env's
   verifier scores them;
3. advantage of response i of group g: Â_i = (r_i − mean(r_g)) / (std(r_g) + 1e-4), the same
   for every token of the response;
4. loss: PPO's clipped surrogate −min(ρ·Â, clip(ρ, 1−ε, 1+ε)·Â) per response token, with
   ρ = π_θ / π_old, averaged over each response's tokens, then over the responses;
5. one AdamW step with the gradient clipped to `max_grad_norm`.

With a freshly initialised model (the default builds textgym's `tiny` preset, ~1.8 M
parameters, in a temporary folder) every reward is 0 and nothing is learned; start from a
model that sometimes answers right (the quickstart's SFT stage writes one to
`runs/quickstart/sft/final`) to watch the reward climb.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import gymnasium as gym
import torch

import textgym.envs  # noqa: F401  (registers the textgym/... environment ids)
from textgym.agents import LLMAgent, SamplingParams, Trajectory, rollout
from textgym.algorithms.advantages import group_advantages
from textgym.algorithms.clipped_loss import clipped_policy_loss
from textgym.model_init import init_model
from textgym.models import load_model


@dataclass
class Args:
    """The run's settings; every field is also a command-line flag (`--prompts-per-step 8`)."""

    env_id: str = "textgym/Arithmetic-v0"
    """A registered textgym environment."""
    env_kwargs: dict[str, Any] = field(
        default_factory=lambda: {"operators": "+", "digits": 2, "instruction": ""}
    )
    """Keyword arguments of `gym.make(env_id, ...)` (a JSON object on the command line)."""
    model: str | None = None
    """A local Hugging Face model folder; None builds the `tiny` preset in a temporary folder."""
    seed: int = 0
    """Seeds torch (the initial weights of a built model, and sampling)."""
    threads: int = 2
    """torch's CPU threads."""
    steps: int = 10
    """Iterations (one rollout batch and one optimizer step each)."""
    prompts_per_step: int = 4
    """Tasks per iteration."""
    group_size: int = 8
    """G: responses sampled per task."""
    temperature: float = 1.0
    """Sampling temperature (the log-probabilities of the loss use the same one)."""
    max_new_tokens: int = 10
    """Response budget, in tokens."""
    lr: float = 3e-4
    """AdamW's learning rate (constant)."""
    clip_eps: float = 0.2
    """ε of the clipped ratio."""
    max_grad_norm: float = 1.0
    """The gradient's global norm is clipped to this."""
    out: str | None = None
    """When set, one JSON line of metrics per step goes to `<out>/metrics.jsonl`."""


def parse_args(argv: list[str] | None = None) -> Args:
    """Build `Args` from the command line: one `--flag` per field, JSON for `--env-kwargs`."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for f in dataclasses.fields(Args):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = {"int": int, "float": float}.get(str(f.type), json.loads if "dict" in str(f.type) else str)
        parser.add_argument("--" + f.name.replace("_", "-"), type=kind, default=default)
    return Args(**vars(parser.parse_args(argv)))


# --- the batch: trajectories padded into tensors -------------------------------------------


def pad_batch(trajectories: list[Trajectory], pad_id: int) -> dict[str, torch.Tensor]:
    """Left-pad the prompts to one width P and right-pad the responses to one width L.

    Every response then starts at column P, so the logits at columns P−1 … P+L−2 predict
    the L response columns. Rows are the trajectories in order (group g is rows g·G … g·G+G−1).

    Returns:
        `input_ids`, `attention_mask`, `position_ids` [B, P+L]; `loss_mask` (1.0 on tokens the
        policy sampled) and `old_logprobs` (their sampling log-probabilities) [B, L];
        `rewards` [B].
    """
    P = max(t.prompt_length for t in trajectories)
    L = max(len(t.token_ids) - t.prompt_length for t in trajectories)
    B = len(trajectories)
    input_ids = torch.full((B, P + L), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + L), dtype=torch.long)
    loss_mask, old_logprobs = torch.zeros((B, L)), torch.zeros((B, L))
    for i, t in enumerate(trajectories):
        p, n = t.prompt_length, len(t.token_ids) - t.prompt_length
        input_ids[i, P - p : P + n] = t.token_ids
        attention_mask[i, P - p : P + n] = 1
        loss_mask[i, :n] = t.loss_mask[p:]
        old_logprobs[i, :n] = t.logprobs[p:]
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),  # positions skip the padding
        "loss_mask": loss_mask,
        "old_logprobs": old_logprobs,
        "rewards": torch.tensor([t.reward for t in trajectories], dtype=torch.float32),
    }


def response_logprobs(model: Any, batch: dict[str, torch.Tensor], temperature: float) -> torch.Tensor:
    """[B, L] log π_θ(token) of every response column (garbage on padding: mask it)."""
    L = batch["loss_mask"].shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        logits_to_keep=L + 1,  # only the logits that predict response tokens (plus the last)
        use_cache=False,
    )
    logits = out.logits[:, :-1].float()  # [B, L, V]: position P−1+t predicts token P+t
    if temperature and temperature != 1.0:
        logits = logits / temperature  # the distribution that was sampled from
    targets = batch["input_ids"][:, -L:]
    return logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)


# --- the GRPO loss of one batch (what the test compares with GRPOTrainer) --------------------


def grpo_loss_for_batch(
    model: Any, trajectories: list[Trajectory], pad_id: int, args: Args
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's loss on one rollout batch (`prompts_per_step × group_size` trajectories, grouped).

    Args:
        model: the policy (its parameters get the gradient of the returned loss).
        trajectories: grouped contiguously, as `textgym.agents.rollout` returns them.
        pad_id: the tokenizer's pad id.
        args: reads `group_size`, `clip_eps` and `temperature`.

    Returns:
        The scalar loss and detached stats (`loss/policy`, `clip/frac`, `adv/std`, ...).
    """
    batch = pad_batch(trajectories, pad_id)
    # 3. group-relative advantages, one per response: [B]
    advantages, stats = group_advantages(batch["rewards"], args.group_size, scale="group")
    # 4. the clipped surrogate, averaged per response then over responses
    logprobs = response_logprobs(model, batch, args.temperature)
    loss, loss_stats = clipped_policy_loss(
        logprobs,
        batch["old_logprobs"],
        advantages,
        batch["loss_mask"],
        clip_low=args.clip_eps,
        clip_high=args.clip_eps,
        aggregation="seq_mean_token_mean",
    )
    return loss, {**stats, **loss_stats}


# --- the training loop ----------------------------------------------------------------------


def train(args: Args) -> list[dict[str, float]]:
    """Run `args.steps` GRPO iterations; return each step's metrics (also printed)."""
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    model_dir = args.model or init_model("tiny", Path(tempfile.mkdtemp()) / "tiny", seed=args.seed)
    model, tokenizer = load_model(model_dir)
    pad_id = int(tokenizer.pad_token_id)
    B = args.prompts_per_step * args.group_size
    envs = [gym.make(args.env_id, **args.env_kwargs) for _ in range(B)]  # one per episode
    agent = LLMAgent(model, tokenizer, batch_size=B)
    sampling = SamplingParams(temperature=args.temperature, max_new_tokens=args.max_new_tokens)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    n_tasks = len(envs[0].unwrapped.tasks)  # type: ignore[attr-defined]
    out = Path(args.out) if args.out else None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
    history = []
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        # 1. the step's tasks: the env's task list in order
        tasks = [(step - 1) * args.prompts_per_step + i for i in range(args.prompts_per_step)]
        tasks = [i % n_tasks for i in tasks]
        # 2. G samples of each task, scored by the env's verifier (no gradient while sampling)
        model.eval()
        with torch.no_grad():
            trajectories = rollout(agent, envs, tasks, sampling, group_size=args.group_size)
        # 3-4. advantages and loss
        model.train()
        loss, stats = grpo_loss_for_batch(model, trajectories, pad_id, args)
        # 5. one optimizer step
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()

        rewards = torch.tensor([t.reward for t in trajectories])
        metrics = {
            "step": step,
            "rollout/reward_mean": float(rewards.mean()),
            "rollout/response_length_mean": sum(t.response_length for t in trajectories) / B,
            "loss/total": float(loss.detach()),
            "grad_norm": float(grad_norm),
            "time/step_s": time.perf_counter() - t0,
            **stats,
        }
        history.append(metrics)
        print(
            f"step {step:4d}  reward {metrics['rollout/reward_mean']:.3f}  loss {metrics['loss/total']:+.4f}"
            f"  clip {metrics['clip/frac']:.3f}  {metrics['time/step_s']:.2f}s"
        )
        if out is not None:
            with (out / "metrics.jsonl").open("a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
    for env in envs:
        env.close()
    return history


if __name__ == "__main__":
    train(parse_args())
