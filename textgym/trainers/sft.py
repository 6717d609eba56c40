"""Supervised fine-tuning on an environment's gold solutions (the warm start before RL), or on given examples.

Multi-turn: `sft.trajectories` (a trajectory store, e.g. `textgym rollouts collect --agent
oracle`) or `sft.demonstrations` (the env's expert played in-line, `collect_demonstrations`)
become examples whose completion spans the whole episode after the first prompt, trained on
the assistant turns only (`store_examples`).

Each example is the env's first observation rendered by the chat template (exactly the
prompt the policy sees in rollouts) followed by the task's `solution` and the
end-of-turn token; the loss is the token-mean NLL of the solution tokens only. Given an
explicit list of `SFTExample`s (prompt token ids, completion token ids; e.g. the verified
samples of rejection-sampling fine-tuning, `textgym.stages.rft`), the trainer walks those
instead of the env's tasks, in the same seeded per-epoch permutation.
Loop: 1 draw tasks · 2 build the batch · 3 forward/backward over micro-batches ·
4 clip, step · 5 log and checkpoint · 6 with `cfg.target`, every `target.every` steps measure
greedy accuracy on a probe set and stop once it reaches `target.accuracy`.

Why a measured target: a short SFT run that stops in the middle of a phase where the model
is learning quickly (e.g. the tiny model learning to carry in 2-digit addition) hands the next
stage a start decided by float rounding — the same 250 steps gave 0.49 greedy accuracy with
AVX2 kernels and 0.09 with AVX-512 ones. Stopping on a measured accuracy makes the start a
property of the model, not of the machine.

Under torchrun every rank draws the same `batch_size` tasks and trains on its contiguous
`batch_size / ranks` of them with the model sharded (FSDP2); the token-mean's denominator is
this rank's share of the global token count, so the averaged gradient is the whole batch's.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import Trajectory, episode_correct
from textgym.algorithms.auxiliary import sft_loss
from textgym.config import ConfigError, ParallelConfig, SFTConfig
from textgym.envs.registry import make as make_text_env
from textgym.training.batch import (
    RolloutBatch,
    no_token_budget_under_torchrun,
    row_lengths,
    token_budget_micro_batches,
)
from textgym.training.checkpoint import save_checkpoint
from textgym.training.envs import make_env
from textgym.training.logprobs import sequence_logprobs
from textgym.training.loop import run_loop
from textgym.training.optim import build_optimizer
from textgym.training.placement import shard
from textgym.training.sampler import TaskSampler
from textgym.training.trainer import (
    announce_memory,
    prepare_policy,
    resume_checkpoint,
    save_final_model,
    stage_logger,
)


@dataclass(frozen=True)
class SFTExample:
    """One supervised sequence given explicitly: prompt tokens (not trained on), then completion tokens.

    Attributes:
        prompt_ids: [P] the prompt's token ids, as the policy sees it (the chat template's
            rendering with the generation prompt).
        completion_ids: [C] the completion's token ids (a sampled response with its end-of-turn
            token, or `from_text`'s tokenized text plus the end-of-turn token).
        completion_mask: [C] 1 on the tokens trained on, 0 on tokens that are context only (an
            environment's turns inside a multi-turn completion); None: all of them.
    """

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    completion_mask: tuple[int, ...] | None = None

    @classmethod
    def from_text(cls, tokenizer: PreTrainedTokenizerBase, messages: list[Any], response: str) -> SFTExample:
        """The example of (prompt messages, response text).

        The messages are rendered by the chat template with the generation prompt; the response
        is tokenized without special tokens, followed by the EOS token.
        """
        prompt = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        target = tokenizer(response, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        return cls(tuple(prompt), tuple(int(t) for t in target))  # type: ignore[arg-type]

    def trajectory(self, messages: list[Any] | None = None) -> Trajectory:
        """The example as a `Trajectory`: loss mask 0 on the prompt, `completion_mask` (or 1) after it.

        Raises:
            ValueError: if the completion is empty, trains on no token, or its mask has another length.
        """
        mask = self.completion_mask if self.completion_mask is not None else (1,) * len(self.completion_ids)
        if len(mask) != len(self.completion_ids) or not any(mask):
            raise ValueError("an SFTExample needs a non-empty completion and a mask of its length with a 1")
        ids = list(self.prompt_ids) + list(self.completion_ids)
        return Trajectory(
            token_ids=torch.tensor(ids),
            loss_mask=torch.tensor([0.0] * len(self.prompt_ids) + [float(m) for m in mask]),
            logprobs=torch.zeros(len(ids)),
            token_rewards=torch.zeros(len(ids)),
            prompt_length=len(self.prompt_ids),
            messages=list(messages or []),
            reward=0.0,
        )


class SFTTrainer:
    """Trains `model` in place on `(prompt, gold solution)` pairs of `cfg.env`, or on `examples`.

    Args:
        cfg: the SFT stage config.
        model: the model (on its device); sharded in place under torchrun.
        tokenizer: its tokenizer.
        stage_dir: where metrics and checkpoints go.
        seed: seed of task sampling.
        resume: continue from the newest checkpoint in `stage_dir`.
        parallel: sharding, mixed precision and gradient checkpointing.
        log_with: trackers beside `metrics.jsonl` ("tensorboard", "wandb", "mlflow", "trackio";
            `textgym.tracking`).
        examples: train on these instead of the env's gold solutions (walked like a finite task
            set: a seeded permutation per epoch); `cfg.env` then serves only `cfg.target`'s probe.

    Attributes:
        probe_accuracy: the last probe's greedy accuracy (None before the first probe or
            without `cfg.target`).
        target_reached: whether the probe reached `cfg.target.accuracy`.

    Raises:
        ValueError: if the environment's tasks carry no gold `solution` (without `examples`), or
            `examples` is empty.
        ConfigError: under torchrun, if `batch_size` is not a multiple of the number of ranks.
    """

    def __init__(
        self,
        cfg: SFTConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stage_dir: Path,
        *,
        seed: int = 0,
        resume: bool = False,
        parallel: ParallelConfig | None = None,
        log_with: Sequence[str] = ("tensorboard",),
        examples: Sequence[SFTExample] | None = None,
    ):
        self.cfg, self.model, self.tokenizer, self.stage_dir = cfg, model, tokenizer, Path(stage_dir)
        self.world = distributed.world()
        W, parallel = self.world.size, parallel or ParallelConfig()
        if cfg.batch_size % W:
            raise ConfigError(
                f"sft.batch_size={cfg.batch_size} must be a multiple of the number of ranks ({W})"
            )
        self.local_batch = cfg.batch_size // W
        no_token_budget_under_torchrun(cfg.micro_batch_tokens, W)
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        model = prepare_policy(
            model,
            cfg.lora,
            seed=seed,
            gradient_checkpointing=parallel.gradient_checkpointing,
            dropout_off=False,
        )
        self.model = model = shard(model, parallel, self.device)  # precision, then FSDP2 under torchrun
        env_cfg = cfg.env
        if env_cfg is None:  # `trajectories` without `env`: the store's env (the config checks one is set)
            from textgym.offline.store import store_env

            env_cfg = store_env(cfg.trajectories)  # type: ignore[arg-type]
        self.env_cfg = env_cfg
        self.env = make_text_env(env_cfg.id, **env_cfg.kwargs)
        tasks = self.env.tasks
        if examples is None and cfg.demonstrations is not None:
            store = self.stage_dir / "demonstrations"
            distributed.on_main(lambda: collect_demonstrations(cfg, tokenizer, store))
            examples = store_examples(store, cfg.min_reward)
        elif examples is None and cfg.trajectories is not None:
            examples = store_examples(cfg.trajectories, cfg.min_reward)
        self.examples = None if examples is None else list(examples)
        if self.examples is not None:
            if not self.examples:
                raise ValueError("SFTTrainer got an empty list of examples")
        elif getattr(tasks[0], "solution", None) is None:
            raise ValueError(f"{env_cfg.id} tasks have no gold solutions to fine-tune on")
        self.sampler = TaskSampler(len(tasks) if self.examples is None else len(self.examples), seed)
        self.probe_indices = probe_indices(len(tasks), cfg.target.n, seed) if cfg.target else []
        self.probe_accuracy: float | None = None
        self.target_reached = False
        self.micro_batch_size = cfg.micro_batch_size or self.local_batch
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim, cfg.steps)
        self.memory = distributed.memory_report({"policy": (model, self.optimizer)})
        self.step = 0
        state = resume_checkpoint(self.stage_dir, resume, model, self.optimizer, self.scheduler)
        if state is not None:
            self.step, self.sampler.cursor = int(state["step"]), int(state["cursor"])
        self.logger = stage_logger(self.stage_dir, state, log_with, cfg)

    def example(self, index: int) -> Trajectory:
        """The supervised sequence of task `index`: prompt (mask 0) + solution + end-of-turn (mask 1).

        With `examples`, the sequence of `examples[index]` instead.
        """
        if self.examples is not None:
            return self.examples[index].trajectory()
        obs, _ = self.env.reset(options={"task_index": index})
        task = self.env.unwrapped.task  # type: ignore[attr-defined]
        return SFTExample.from_text(self.tokenizer, obs, task.solution).trajectory(list(obs))

    def train_step(self) -> dict[str, float]:
        """One optimizer step on `batch_size` examples; returns its metrics."""
        t0 = time.perf_counter()
        # 1-2. Draw tasks (the same on every rank), keep this rank's slice, build the padded batch.
        tasks = self.sampler.next(self.cfg.batch_size)
        first = self.world.rank * self.local_batch
        batch = RolloutBatch.from_trajectories(
            [self.example(i) for i in tasks[first : first + self.local_batch]],
            int(self.tokenizer.pad_token_id),  # type: ignore[arg-type]
        ).to(self.device)
        local_tokens = float(batch.loss_mask.sum())
        num_tokens = distributed.share(local_tokens)  # the global count / ranks (FSDP averages)
        # 3. Forward/backward with gradient accumulation (token-mean over the whole batch).
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        micros = self._micro_batches(batch)
        for j, rows in enumerate(micros):
            distributed.set_requires_gradient_sync(self.model, j == len(micros) - 1)
            sub = batch.select(rows)
            logprobs, _ = sequence_logprobs(self.model, sub, packed=self.cfg.packing)
            loss, _ = sft_loss(logprobs, sub.loss_mask, num_tokens=num_tokens)
            loss.backward()
            total += float(loss.detach())
        # 4. Clip and step.
        metrics: dict[str, float] = {"loss/sft": total}
        if self.cfg.optim.max_grad_norm is not None:
            metrics["grad_norm"] = distributed.grad_norm(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
            )
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        dt = time.perf_counter() - t0
        metrics.update(
            {
                "lr": float(self.scheduler.get_last_lr()[0]),
                "time/step_s": dt,
                "throughput/tokens_per_s": local_tokens / dt,
            }
        )
        return distributed.reduce_metrics(metrics)

    def _micro_batches(self, batch: RolloutBatch) -> list[list[int]]:
        """Rows of `batch` per forward pass: `micro_batch_size` at a time, or token budgets."""
        rows = list(range(len(batch)))
        if self.cfg.micro_batch_tokens is None:
            m = self.micro_batch_size
            return [rows[i : i + m] for i in range(0, len(rows), m)]
        prompt, response = row_lengths(batch)
        return token_budget_micro_batches(
            prompt, response, rows, self.cfg.micro_batch_tokens, self.cfg.packing
        )

    def probe(self) -> float:
        """Greedy accuracy on the probe tasks (`cfg.target`); rank 0 measures, every rank gets it.

        Generation draws no random numbers (greedy), so probing does not change the training run.
        """
        target = self.cfg.target
        assert target is not None

        def measure() -> float:
            agent = LLMAgent(self.model, self.tokenizer, batch_size=min(len(self.probe_indices), 256))
            envs = [make_env(self.env_cfg) for _ in self.probe_indices]
            try:
                params = SamplingParams(temperature=0.0, max_new_tokens=target.max_new_tokens)
                trajs = rollout(agent, envs, self.probe_indices, params, env_id=self.env_cfg.id)
            finally:
                for e in envs:
                    e.close()
            return sum(episode_correct(t.reward_terms, t.reward) for t in trajs) / len(trajs)

        with torch.no_grad(), distributed.full_params(self.model):
            return float(distributed.on_main(measure))

    def _after_step(self, step: int, metrics: dict[str, float]) -> None:
        """6. Probe every `target.every` steps; record whether the target is reached."""
        target = self.cfg.target
        if target is None or step % target.every:
            return
        self.probe_accuracy = self.probe()
        self.target_reached = self.probe_accuracy >= target.accuracy
        metrics["probe/accuracy"] = self.probe_accuracy

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.stage_dir,
            self.step,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            {"cursor": self.sampler.cursor},
            keep=self.cfg.keep_checkpoints,
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run until `cfg.steps` (5. log and checkpoint on the way); return the saved final model folder."""
        cfg = self.cfg
        announce_memory("sft", self.memory, self.stage_dir, echo)

        def describe(m: dict[str, float]) -> str:
            probe = f"  probe accuracy {m['probe/accuracy']:.3f}" if "probe/accuracy" in m else ""
            return f"loss {m['loss/sft']:.4f}{probe}  {m['time/step_s']:.2f}s/step"

        run_loop(
            self.train_step,
            self.save,
            self.logger,
            start=self.step,
            name="sft",
            steps=cfg.steps,
            log_every=cfg.log_every,
            checkpoint_every=cfg.checkpoint_every,
            echo=echo,
            lines=10,
            describe=describe,
            after_step=self._after_step,
            stop=lambda: self.target_reached,
        )
        if cfg.target is not None:
            outcome = {
                "steps": self.step,
                "target_accuracy": cfg.target.accuracy,
                "probe_accuracy": self.probe_accuracy,
                "probe_n": len(self.probe_indices),
                "target_reached": self.target_reached,
            }
            if distributed.is_main():
                (self.stage_dir / "target.json").write_text(json.dumps(outcome, indent=2), encoding="utf-8")
            if echo is not None and distributed.is_main():
                verdict = "reached" if self.target_reached else "NOT reached"
                echo(
                    f"sft: target accuracy {cfg.target.accuracy} {verdict} after {self.step} steps "
                    f"(probe accuracy {self.probe_accuracy}, n={len(self.probe_indices)})"
                )
            if cfg.target.required and not self.target_reached:
                raise SFTTargetNotReachedError(
                    f"sft.target: probe accuracy {self.probe_accuracy} < {cfg.target.accuracy} after the "
                    f"whole budget of {cfg.steps} steps (the last checkpoint is in {self.stage_dir})"
                )
        return save_final_model(self.stage_dir, self.model, self.tokenizer, lora=cfg.lora is not None)


def store_examples(store: str | Path, min_reward: float | None = None) -> list[SFTExample]:
    """The episodes of a trajectory store as SFT examples (multi-turn ones included).

    Each episode's first prompt (`prompt_length` tokens) is the example's prompt; everything
    after it is the completion, trained on where the store's `loss_mask` is 1 (the policy's
    tokens: every assistant turn) and context only where it is 0 (tool and environment turns).
    Episodes below `min_reward`, and episodes with no policy token, are left out.

    Raises:
        FileNotFoundError: if `store` holds no trajectory shard.
        ValueError: if no episode is left to train on.
    """
    from textgym.offline.store import read_trajectories, shard_paths

    if not shard_paths(store):
        raise FileNotFoundError(f"sft.trajectories: no trajectory shard (shard-*.parquet) in {str(store)!r}")
    t = read_trajectories(store, ["token_ids", "loss_mask", "prompt_length", "reward"])
    out = []
    cols = (t.column(c).to_pylist() for c in ("token_ids", "loss_mask", "prompt_length", "reward"))
    for ids, mask, p, reward in zip(*cols, strict=True):
        if (min_reward is not None and reward < min_reward) or not any(mask[p:]):
            continue
        out.append(SFTExample(tuple(ids[:p]), tuple(ids[p:]), tuple(int(m) for m in mask[p:])))
    if not out:
        kept = "" if min_reward is None else f" with reward >= {min_reward}"
        raise ValueError(
            f"{str(store)!r}: no episode{kept} has a policy token to train on ({t.num_rows} episodes)"
        )
    return out


def collect_demonstrations(cfg: SFTConfig, tokenizer: PreTrainedTokenizerBase, store: Path) -> Path:
    """Play `cfg.demonstrations.n` episodes of `cfg.env` with its oracle into the store `store`.

    The episodes are `OracleDemonstrator` rollouts (the env's `oracle_action` in `tokenizer`'s
    tokens; `source` "demonstration", `policy` "oracle"). Tasks already in `store` are not
    played again, so a resumed stage reuses what it collected.

    Raises:
        ValueError: if the env has fewer tasks than `start + n`, or cannot be written in
            `tokenizer`'s tokens; AttributeError: if it has no `oracle_action`.
    """
    from textgym.agents.demonstrator import OracleDemonstrator
    from textgym.offline.pairs import collect_rollouts

    demos = cfg.demonstrations
    assert demos is not None and cfg.env is not None  # the config's check: demonstrations need an env
    demonstrator = OracleDemonstrator(
        tokenizer, noise=demos.noise, seed=demos.seed, tool_free=demos.tool_free
    )
    collect_rollouts(
        demonstrator, cfg.env.id, store, env_kwargs=cfg.env.kwargs, n=demos.n,
        start=demos.start, params=SamplingParams(temperature=0.0), policy="oracle", source="demonstration",
    )  # fmt: skip
    return store


class SFTTargetNotReachedError(RuntimeError):
    """`sft.target.required` is set and the step budget ended below the target accuracy."""


def probe_indices(n_tasks: int, n: int, seed: int) -> list[int]:
    """Task indices of the SFT probe set (`SFTTargetConfig`).

    An unbounded stream (`n_tasks >= 2**62`, walked 0, 1, 2, … by `TaskSampler`) gives the
    tasks at 2**40 … 2**40+n−1, which training never reaches; a finite set gives a random
    subset of `min(n, n_tasks)` tasks seeded by `seed`, sorted.
    """
    if n_tasks >= 2**62:
        return list(range(2**40, 2**40 + n))
    rng = np.random.default_rng([seed, 0x5F7])
    return sorted(int(i) for i in rng.choice(n_tasks, size=min(n, n_tasks), replace=False))
