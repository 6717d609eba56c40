"""A Bradley–Terry reward model trained on preference pairs, and the verifier that scores with it.

The model is `AutoModelForSequenceClassification` with one label, initialised from a causal
LM folder (the policy's backbone; the scalar head is new), scoring the last non-padding
token of `prompt + response`. The loss on a pair is `−log σ(r(x, y_w) − r(x, y_l))`
(Bradley & Terry 1952; Ouyang et al. 2022, arXiv:2203.02155, eq. 1), averaged over pairs.
A held-out share of the prompts measures pairwise accuracy (the share of held-out pairs
with r(y_w) > r(y_l)).

Loop (`RewardModelTrainer`): 1 draw the step's pairs (epoch e's order is a permutation seeded
by `seed + e`) · 2 one forward pass over chosen and rejected per micro-batch · 3 the
Bradley–Terry loss (+ α·NLL of the chosen responses, GRM's regulariser), accumulated over
micro-batches · 4 clip, step · 5 log (`<out>/metrics.jsonl`), checkpoint, and after each epoch
the held-out accuracy. Micro-batches hold `micro_batch_size` pairs, or with `micro_batch_tokens`
(one process) pairs of similar lengths up to a token budget; with `packing` each micro-batch
runs as one padding-free packed row (`reward_model_forward`). Neither changes the gradient.

Under torchrun (`textgym rm train` launched by `torchrun --nproc-per-node N -m textgym`) the
trained module (`RewardNet`) is sharded with FSDP2 and each step's pairs are split into
contiguous per-rank slices (`rank_micro_batches`: a rank with fewer micro-batches runs weight-0
fillers, so all make the same forward calls). Each rank's loss is its sum over pairs divided by
the step's pair count (the NLL: by the step's response-token count), times the number of
ranks that FSDP averages over, so the gradient is the one-process gradient of the whole step.
The held-out pairs are scored the same way, one slice per rank, and the verdicts gathered.
Rank 0 alone writes the output folder, which is the same as a one-process run's.

`RewardModelVerifier` (`textgym.verifiers.reward_model`) scores completions with a trained
model; `RewardModelWrapper` (`textgym.envs.reward_model`) puts it into any single- or
multi-turn env, so PPO trains against the learned reward while the env's own verifier terms
(`reward/correct`, ...) stay in `info` as the true measure.
"""

from __future__ import annotations

import json
import math
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from textgym import distributed
from textgym.config import ParallelConfig, RewardModelConfig
from textgym.trainers.reward.bradley_terry_forward import (
    RewardNet,
    _lm_positions,
    _output_embeddings,
    nll_targets,
    pack_sequences,
    packed_nll_targets,
)
from textgym.training.batch import (
    no_token_budget_under_torchrun,
    rank_micro_batches,
    token_budget_micro_batches,
)
from textgym.training.checkpoint import save_checkpoint
from textgym.training.optim import build_optimizer
from textgym.training.placement import shard
from textgym.training.precision import compute_autocast
from textgym.training.trainer import announce_memory, resume_checkpoint, stage_logger
from textgym.verifiers.reward_model import pad_rows

__all__ = [
    "RewardModelTrainer",
    "split_by_prompt",
    "train_reward_model",
]

_pad = pad_rows  # the old private name (tests)

EVAL_PAIRS = 32
"""Held-out pairs per forward pass when neither `micro_batch_size` nor `micro_batch_tokens` is set."""


def split_by_prompt(pairs: pa.Table, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held-out), all pairs of one prompt on the same side."""
    prompts = [tuple(p) for p in pairs.column("prompt_ids").to_pylist()]
    distinct = sorted(set(prompts))
    random.Random(seed).shuffle(distinct)
    held = set(distinct[: round(eval_fraction * len(distinct))])
    train = [i for i, p in enumerate(prompts) if p not in held]
    test = [i for i, p in enumerate(prompts) if p in held]
    return train, test


class RewardModelTrainer:
    """Trains a Bradley–Terry reward model on pairs: one process, or sharded over torchrun's ranks.

    Args:
        pairs: `textgym.offline.PAIR_SCHEMA` rows (the same table on every rank).
        model_dir: the causal LM folder the reward model starts from.
        out: the output folder: the reward model (a Hugging Face folder), `textgym.json`,
            `memory.json`, `metrics.jsonl`, `tb/`, and `checkpoints/` with `checkpoint_every`.
            Without `resume`, the `checkpoints/`, `metrics.jsonl` and `tb/` of an earlier run
            there are removed first.
        cfg: epochs, batch sizes, optimizer, regulariser, seed, checkpoints.
        device: "auto", "cpu" or "cuda[:N]" (under NCCL every rank uses its own GPU).
        parallel: bf16 compute (`mixed_precision`; `trainers.precision`), TF32 and gradient checkpointing.
        resume: continue from the newest checkpoint in `out/checkpoints` (none: start afresh).
        log_with: trackers beside `metrics.jsonl` ("tensorboard", "wandb", "mlflow", "trackio";
            `textgym.tracking`).

    Raises:
        ValueError: if there are no training pairs, or `lm_coef > 0` with an untied model
            folder that has no `lm_head.weight`.
    """

    def __init__(
        self,
        pairs: pa.Table,
        model_dir: str | Path,
        out: str | Path,
        cfg: RewardModelConfig | None = None,
        *,
        device: str = "auto",
        parallel: ParallelConfig | None = None,
        resume: bool = False,
        log_with: Sequence[str] = ("tensorboard",),
    ):
        self.t0 = time.perf_counter()
        self.cfg = cfg = cfg or RewardModelConfig()
        self.out, self.world = Path(out), distributed.world()
        self.device = distributed.device(device)
        parallel = parallel or ParallelConfig()
        torch.manual_seed(cfg.seed)  # the new score head: the same initialisation on every rank
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        rm = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
        tok = self.tokenizer
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)  # type: ignore[arg-type]
        rm.config.pad_token_id = self.pad_id
        cols = {
            c: pairs.column(c).to_pylist()
            for c in ("prompt_ids", "chosen_ids", "rejected_ids", "chosen_mask")
        }
        self.chosen = [p + c for p, c in zip(cols["prompt_ids"], cols["chosen_ids"], strict=True)]
        self.rejected = [p + r for p, r in zip(cols["prompt_ids"], cols["rejected_ids"], strict=True)]
        self.starts = [len(p) for p in cols["prompt_ids"]]
        self.chosen_mask = cols["chosen_mask"]
        self.lm_tokens = [
            len(_lm_positions(*x)) for x in zip(self.chosen, self.starts, self.chosen_mask, strict=True)
        ]
        self.train_idx, self.test_idx = split_by_prompt(pairs, cfg.eval_fraction, cfg.seed)
        if not self.train_idx:
            raise ValueError("no training pairs")
        if parallel.gradient_checkpointing:
            rm.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        rm.to(self.device)  # type: ignore[arg-type]
        head = _output_embeddings(model_dir, rm).to(self.device) if cfg.lm_coef > 0 else None
        self.net: RewardNet = shard(RewardNet(rm, head), parallel, self.device)  # precision, FSDP2
        self.steps_per_epoch = math.ceil(len(self.train_idx) / cfg.batch_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.micro_batch_size = cfg.micro_batch_size or cfg.batch_size
        no_token_budget_under_torchrun(cfg.micro_batch_tokens, self.world.size)
        self.optimizer, self.scheduler = build_optimizer(self.net, cfg.optim, self.total_steps)
        self.memory = distributed.memory_report({"reward_model": (self.net, self.optimizer)})
        self.step, self.before, self.train_loss = 0, float("nan"), float("nan")
        self.resumed = False
        state = resume_checkpoint(self.out, resume, self.net, self.optimizer, self.scheduler)
        distributed.on_main(lambda: self._prepare_out(clear=state is None))  # a fresh start
        if state is not None:
            self.step, self.resumed = int(state["step"]), True
            self.before, self.train_loss = float(state["heldout_accuracy_before"]), float(state["train_loss"])
        self.logger = stage_logger(self.out, state, log_with, cfg)
        self.figures: dict[str, Any] = {}

    def _prepare_out(self, clear: bool) -> None:
        """Create `out`; on a fresh start remove an earlier run's checkpoints and metrics there."""
        self.out.mkdir(parents=True, exist_ok=True)
        if clear:
            for name in ("checkpoints", "tb"):
                shutil.rmtree(self.out / name, ignore_errors=True)
            (self.out / "metrics.jsonl").unlink(missing_ok=True)

    def _order(self, epoch: int) -> list[int]:
        """Epoch `epoch`'s order of the training pairs: a permutation seeded by `seed + epoch`."""
        g = torch.Generator().manual_seed(self.cfg.seed + epoch)
        return [self.train_idx[i] for i in torch.randperm(len(self.train_idx), generator=g).tolist()]

    def _micro_batches(self, rows: list[int], per_pass: int) -> list[tuple[list[int], bool]]:
        """This rank's slice of the pairs `rows` in micro-batches of `per_pass`, with fillers.

        With `micro_batch_tokens` (one process), pairs of similar lengths share a micro-batch
        of at most that many tokens instead: a pair is two sequences, so it counts as its prompt
        and its longer response against half the budget (as in `trainers.preference`).
        """
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            return rank_micro_batches(rows, per_pass)
        prompt = self.starts
        pairs = zip(self.chosen, self.rejected, prompt, strict=True)
        response = [max(len(c), len(r)) - p for c, r, p in pairs]
        cut = token_budget_micro_batches(prompt, response, rows, max(budget // 2, 1), self.cfg.packing)
        return [(m, False) for m in cut]

    def _forward(
        self, idx: list[int], with_nll: bool
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Rewards [k] of the chosen and [k] of the rejected responses of pairs `idx`, and the NLL sum.

        One forward pass over the 2k sequences (chosen first): right-padded, or with `packing`
        one padding-free packed row (`reward_model_forward.pack_sequences`).
        """
        chosen = [self.chosen[i] for i in idx]
        rows = chosen + [self.rejected[i] for i in idx]
        with_nll = with_nll and self.net.regularised
        lm = ([self.starts[i] for i in idx], [self.chosen_mask[i] for i in idx])
        dev = self.device
        if self.cfg.packing:
            ids, positions, last = pack_sequences(rows)
            targets = packed_nll_targets(chosen, *lm, ids.shape[1]).to(dev) if with_nll else None
            with compute_autocast(self.net):
                rewards, nll = self.net(ids.to(dev), None, targets, positions.to(dev), last.to(dev))
        else:
            ids, mask = pad_rows(rows, self.pad_id)
            targets = nll_targets(chosen, *lm, ids.shape[1]).to(dev) if with_nll else None
            with compute_autocast(self.net):
                rewards, nll = self.net(ids.to(dev), mask.to(dev), targets)
        return rewards[: len(idx)], rewards[len(idx) :], nll

    @torch.no_grad()
    def heldout_accuracy(self) -> float:
        """Share of held-out pairs with r(chosen) > r(rejected) (NaN when none are held out).

        Collective under torchrun: each rank scores its slice of the held-out pairs (same
        number of forward calls everywhere) and the verdicts are gathered in order. With
        `micro_batch_tokens` the pairs are scored in length order; the share does not depend on it.
        """
        if not self.test_idx:
            return float("nan")
        self.net.eval()
        wins: list[bool] = []
        for idx, filler in self._micro_batches(self.test_idx, self.cfg.micro_batch_size or EVAL_PAIRS):
            rc, rr, _ = self._forward(idx, with_nll=False)
            if not filler:
                wins += (rc > rr).tolist()
        everyone = distributed.all_gather_list(wins)
        return sum(everyone) / len(everyone)

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next `batch_size` pairs; returns its metrics (the same on every rank).

        Metrics: `loss/rm` (the minimised loss), `loss/bt`, `loss/lm` (token-mean NLL, with the
        regulariser), `rewards/accuracy` and `rewards/margin` (training pairs, before the
        step), pre-clip `grad_norm`, `lr`, `time/step_s`.
        """
        t0, cfg = time.perf_counter(), self.cfg
        epoch, pos = divmod(self.step, self.steps_per_epoch)
        idx = self._order(epoch)[pos * cfg.batch_size : (pos + 1) * cfg.batch_size]
        tokens = max(1, sum(self.lm_tokens[i] for i in idx))  # the step's NLL denominator
        W = self.world.size  # FSDP averages the ranks' gradients: each rank's loss is scaled by W
        self.net.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = dict.fromkeys(["loss/bt", "rewards/accuracy", "rewards/margin"], 0.0)
        if self.net.regularised:
            sums["loss/lm"] = 0.0
        micros = self._micro_batches(idx, self.micro_batch_size)
        for j, (sub, filler) in enumerate(micros):
            distributed.set_requires_gradient_sync(self.net, j == len(micros) - 1)
            rc, rr, nll = self._forward(sub, with_nll=True)
            bt = -torch.nn.functional.logsigmoid(rc - rr).sum() / len(idx)
            lm = nll / tokens if nll is not None else None
            loss = bt if lm is None else bt + cfg.lm_coef * lm
            (loss * (0.0 if filler else W)).backward()
            if filler:
                continue
            margin = (rc - rr).detach()
            sums["loss/bt"] += float(bt.detach())
            sums["rewards/accuracy"] += float((margin > 0).sum()) / len(idx)
            sums["rewards/margin"] += float(margin.sum()) / len(idx)
            if lm is not None:
                sums["loss/lm"] += float(lm.detach())
        metrics = distributed.reduce_metrics(sums, ops=dict.fromkeys(sums, "sum"))  # parts of global means
        metrics["loss/rm"] = metrics["loss/bt"] + cfg.lm_coef * metrics.get("loss/lm", 0.0)
        if cfg.optim.max_grad_norm is not None:
            metrics["grad_norm"] = distributed.grad_norm(
                torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.optim.max_grad_norm)
            )
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        self.train_loss = metrics["loss/rm"]
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["time/step_s"] = distributed.reduce_metrics({"time/step_s": time.perf_counter() - t0})[
            "time/step_s"
        ]
        return metrics

    def save(self) -> Path:
        """Checkpoint the current step to `out/checkpoints/step_<N>/` (collective; rank 0 writes).

        The model folder there is the reward model's (plus `lm_head.safetensors` for an untied
        regulariser head); optimizer, scheduler, RNG states and `state.json` as every trainer's.
        """
        state = {"cursor": self.step, "heldout_accuracy_before": self.before, "train_loss": self.train_loss}
        return save_checkpoint(
            self.out,
            self.step,
            self.net,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            state,
            keep=self.cfg.keep_checkpoints,
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Train for `epochs`, save the reward model to `out` and return it; figures in `.figures`.

        The figures are `train_reward_model`'s (also in `out/textgym.json`).
        """
        cfg = self.cfg
        echo = echo if distributed.is_main() else None
        announce_memory("rm", self.memory, self.out, echo)
        if not self.resumed:
            self.before = self.heldout_accuracy()
        after: float | None = None
        try:
            while self.step < self.total_steps:
                metrics = self.train_step()
                if self.step % self.steps_per_epoch == 0:  # an epoch ends
                    after = metrics["eval/heldout_accuracy"] = self.heldout_accuracy()
                    if echo is not None:
                        echo(
                            f"rm epoch {self.step // self.steps_per_epoch}/{cfg.epochs}  "
                            f"loss {metrics['loss/rm']:.4f}  held-out accuracy {after:.3f}"
                        )
                self.logger.log(self.step, metrics)
                if cfg.checkpoint_every and self.step % cfg.checkpoint_every == 0:
                    self.save()
        finally:
            self.logger.close()
        result = {
            "role": "reward_model",
            "train_pairs": len(self.train_idx),
            "heldout_pairs": len(self.test_idx),
            "heldout_accuracy_before": self.before,
            "heldout_accuracy": self.heldout_accuracy() if after is None else after,
            "train_loss": self.train_loss,
            "steps": self.step,
            "wall_time_s": time.perf_counter() - self.t0,
        }
        if self.world.size > 1:
            result["ranks"] = self.world.size
        self._save_final(result)
        self.figures = result
        return self.out

    def _save_final(self, result: dict[str, Any]) -> None:
        """Write the reward model (full state dict, no LM head), tokenizer and `textgym.json` (collective)."""
        state = distributed.model_state(self.net)  # gathered to rank 0 when sharded
        if distributed.is_main():
            state = {k: v for k, v in state.items() if k != "lm_head.weight"}
            self.net.hf.save_pretrained(self.out, state_dict=state)
            self.tokenizer.save_pretrained(self.out)
            (self.out / "textgym.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        distributed.barrier()


def train_reward_model(
    pairs: pa.Table,
    model_dir: str | Path,
    out: str | Path,
    cfg: RewardModelConfig | None = None,
    echo: Callable[[str], None] | None = None,
    *,
    device: str = "auto",
    parallel: ParallelConfig | None = None,
    resume: bool = False,
    log_with: Sequence[str] = ("tensorboard",),
) -> dict[str, Any]:
    """Train a reward model on `pairs` (`textgym.offline.PAIR_SCHEMA`) from `model_dir`; save it to `out`.

    Under torchrun (after `distributed.init`) every rank calls this with the same arguments;
    the model is sharded and rank 0 alone writes and echoes. See `RewardModelTrainer` for
    the arguments.

    Returns:
        Figures: train/held-out pair counts, held-out pairwise accuracy before and after
        training, final train loss, steps, wall seconds (and `ranks` when more than one).
        Also written to `out/textgym.json`. The same on every rank.

    Raises:
        ValueError: if there are no training pairs (or no LM head for `lm_coef > 0`).
    """
    trainer = RewardModelTrainer(
        pairs, model_dir, out, cfg, device=device, parallel=parallel, resume=resume, log_with=log_with
    )
    trainer.train(echo)
    return trainer.figures
