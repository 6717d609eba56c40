"""Offline preference optimisation on pairs from logged rollouts: DPO, IPO, KTO, SimPO, ORPO.

Loop: 0 (DPO, IPO, KTO) compute the start model's log-probabilities of every response once
and cache them (`reference_logps.pt`, with `reference_logps.json` holding the fingerprint of
the examples and the start model they were computed for: a run that finds a cache with
another fingerprint recomputes it), so no reference model stays in memory · 1 draw a
minibatch of pairs (shuffled each epoch) · 2 one forward pass over chosen and rejected
(each pair's shared prompt is computed once) · 3 the loss (`textgym.algorithms.preference_losses`),
accumulated over micro-batches · 4 clip, step · 5 log and checkpoint. Metrics: `loss/<name>`,
`rewards/chosen`, `rewards/rejected`, `rewards/margin`, `rewards/accuracy` (preference
accuracy of the implicit rewards), `kl` (KTO's reference point z₀, from a no-grad pass over
the whole step's mismatched pairs before its gradient passes, so it does not depend on the
micro-batch size or the number of ranks).

Under torchrun the model is sharded (FSDP2) and each step's examples are split into
contiguous per-rank slices; a rank whose slice needs fewer micro-batches than another's runs
weight-0 filler micro-batches, so that every rank makes the same forward calls. The loss is
each rank's sum divided by the step's global example count (times the ranks, which FSDP
averages over), so the gradient is the one-process gradient of the whole step. The
reference log-probs are computed the same way, one slice per rank, and gathered.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.preference_losses import PairLossInputs, kto_loss, pair_loss
from textgym.config import ParallelConfig, PreferenceConfig
from textgym.training.batch import (
    RolloutBatch,
    no_token_budget_under_torchrun,
    rank_micro_batches,
    token_budget_micro_batches,
)
from textgym.training.checkpoint import save_checkpoint
from textgym.training.logprobs import sequence_logprobs
from textgym.training.loop import run_loop
from textgym.training.optim import build_optimizer
from textgym.training.placement import shard
from textgym.training.trainer import (
    announce_memory,
    prepare_policy,
    resume_checkpoint,
    save_final_model,
    stage_logger,
)


def _traj(prompt: list[int], response: list[int], mask: list[int], group: int) -> Trajectory:
    ids = list(prompt) + list(response)
    return Trajectory(
        token_ids=torch.tensor(ids),
        loss_mask=torch.tensor([0.0] * len(prompt) + [float(m) for m in mask]),
        logprobs=torch.zeros(len(ids)),
        token_rewards=torch.zeros(len(ids)),
        prompt_length=len(prompt),
        messages=[],
        reward=0.0,
        group=group,
    )


def reference_fingerprint(examples: list[tuple[Any, ...]], kto: bool, model: torch.nn.Module) -> str:
    """SHA-256 of what the cached reference log-probs are a function of.

    The examples (prompt and response token ids and masks, in order: KTO's mismatched pairs
    follow that order; KTO's labels), and the start model: its config (without the folder
    path) and every tensor of its state dict (name, dtype, shape and bytes). A cache whose
    fingerprint differs was computed for other pairs or another model and is recomputed.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"kto": kto, "examples": examples}).encode())
    config = getattr(model, "config", None)
    if config is not None:
        cfg = {
            k: v for k, v in config.to_dict().items() if k not in ("_name_or_path", "transformers_version")
        }
        h.update(json.dumps(cfg, sort_keys=True, default=str).encode())
    for name, t in sorted(model.state_dict().items()):
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _examples(pairs: pa.Table | None, unpaired: pa.Table | None, kto: bool) -> list[tuple[Any, ...]]:
    """The training examples: pairs, or for KTO unpaired rows.

    A pair is (prompt, chosen, chosen_mask, rejected, rejected_mask); an unpaired row is
    (prompt, completion, completion_mask, desirable).

    Raises:
        ValueError: no pair (or, for KTO, fewer than 2 unpaired rows) to train on.
    """
    if kto:
        if unpaired is None or unpaired.num_rows < 2:
            raise ValueError("KTO needs at least 2 unpaired examples")
        u = {c: unpaired.column(c).to_pylist() for c in unpaired.column_names}
        return [
            (p, c, m, bool(d))
            for p, c, m, d in zip(
                u["prompt_ids"], u["completion_ids"], u["completion_mask"], u["desirable"], strict=True
            )
        ]
    if pairs is None or pairs.num_rows == 0:
        raise ValueError("no preference pairs to train on (did any prompt's rewards differ by the margin?)")
    p = {c: pairs.column(c).to_pylist() for c in pairs.column_names}
    columns = ("prompt_ids", "chosen_ids", "chosen_mask", "rejected_ids", "rejected_mask")
    return list(zip(*(p[c] for c in columns), strict=True))


class PreferenceTrainer:
    """Trains `model` in place on preference pairs (or KTO's unpaired examples).

    Args:
        cfg: the stage config (`loss`, β and friends, batch sizes, optimizer).
        model: the policy (its start weights are the reference).
        tokenizer: its tokenizer (pad id).
        stage_dir: metrics, checkpoints, the cached reference log-probs and `final/`.
        pairs: `textgym.offline.PAIR_SCHEMA` rows (every loss but KTO).
        unpaired: `textgym.offline.UNPAIRED_SCHEMA` rows (KTO).
        seed: seed of the shuffling.
        resume: continue from the newest checkpoint in `stage_dir`.
        parallel: sharding, mixed precision and gradient checkpointing under torchrun.
        log_with: trackers beside `metrics.jsonl` ("tensorboard", "wandb", "mlflow", "trackio";
            `textgym.tracking`).

    Raises:
        ValueError: if there is nothing to train on (no pairs; for KTO, no examples).
    """

    def __init__(
        self,
        cfg: PreferenceConfig,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        stage_dir: Path,
        pairs: pa.Table | None = None,
        unpaired: pa.Table | None = None,
        *,
        seed: int = 0,
        resume: bool = False,
        parallel: ParallelConfig | None = None,
        log_with: Sequence[str] = ("tensorboard",),
    ):
        self.cfg, self.model, self.tokenizer, self.stage_dir = cfg, model, tokenizer, Path(stage_dir)
        self.world = distributed.world()
        self.stage_dir.mkdir(parents=True, exist_ok=True)
        self.device = next(model.parameters()).device
        self.pad_id = int(tokenizer.pad_token_id)  # type: ignore[arg-type]
        self.kto = cfg.loss == "kto"
        self.examples = _examples(pairs, unpaired, self.kto)
        self.n = len(self.examples)
        self.steps_per_epoch = math.ceil(self.n / cfg.batch_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.micro_batch_size = cfg.micro_batch_size or cfg.batch_size
        no_token_budget_under_torchrun(cfg.micro_batch_tokens, self.world.size)
        self.seed = seed
        parallel = parallel or ParallelConfig()
        # Of the start model (before adapters or sharding) and the examples: what the cache is of.
        fingerprint = reference_fingerprint(self.examples, self.kto, model) if cfg.uses_reference else ""
        # LoRA's B = 0 at the start: the reference log-probs computed below are the base model's.
        # The implicit reward compares π (train mode) with π_ref (the same start weights, no
        # grad): without dropout they agree at step 0.
        model = prepare_policy(
            model, cfg.lora, seed=seed, gradient_checkpointing=parallel.gradient_checkpointing
        )
        self.model = model = shard(model, parallel, self.device)  # precision, then FSDP2 under torchrun
        self.split = distributed.is_sharded(model)  # every rank makes the same forward calls
        self.optimizer, self.scheduler = build_optimizer(model, cfg.optim, self.total_steps)
        self.memory = distributed.memory_report({"policy": (model, self.optimizer)})
        self.step = 0
        self.reference: dict[str, torch.Tensor] = {}
        ref_path = self.stage_dir / "reference_logps.pt"
        fp_path = self.stage_dir / "reference_logps.json"
        if cfg.uses_reference:
            cached = fp_path.is_file() and ref_path.is_file()
            if cached and json.loads(fp_path.read_text(encoding="utf-8")).get("fingerprint") == fingerprint:
                self.reference = torch.load(ref_path)
            else:  # none yet, or the cache of other examples or another start model: recompute
                self.reference = self._reference_logps()
                if distributed.is_main():
                    fp_path.unlink(missing_ok=True)  # no fingerprint beside a half-written cache
                    tmp = ref_path.with_suffix(".pt.tmp")
                    torch.save(self.reference, tmp)
                    tmp.replace(ref_path)
                    fp_path.write_text(json.dumps({"fingerprint": fingerprint}), encoding="utf-8")
        state = resume_checkpoint(self.stage_dir, resume, model, self.optimizer, self.scheduler)
        if state is not None:
            self.step = int(state["step"])
        self.logger = stage_logger(self.stage_dir, state, log_with, cfg)

    # --- sequences and log-probs -------------------------------------------------------
    def _sequences(self, idx: list[int]) -> list[Trajectory]:
        """Rows to score for `idx`: pairs → [chosen…, rejected…]; KTO → [completion…, mismatched…]."""
        if self.kto:
            return self._kto_own(idx) + self._kto_mismatched(idx)
        chosen = [
            _traj(self.examples[i][0], self.examples[i][1], self.examples[i][2], k) for k, i in enumerate(idx)
        ]
        rejected = [
            _traj(self.examples[i][0], self.examples[i][3], self.examples[i][4], k) for k, i in enumerate(idx)
        ]
        return chosen + rejected

    def _kto_own(self, idx: list[int]) -> list[Trajectory]:
        """KTO: each example's prompt with its own completion."""
        ex = self.examples
        return [_traj(ex[i][0], ex[i][1], ex[i][2], k) for k, i in enumerate(idx)]

    def _kto_mismatched(self, idx: list[int]) -> list[Trajectory]:
        """KTO's reference point: each prompt with the next example's completion (Ethayarajh et al. §4.2).

        Same group number as the prompt's own row, so when both are scored together (the
        reference log-probs) the shared prompt is computed once.
        """
        ex, n = self.examples, self.n
        return [_traj(ex[i][0], ex[(i + 1) % n][1], ex[(i + 1) % n][2], k) for k, i in enumerate(idx)]

    @torch.no_grad()
    def _kto_reference_point(self, idx: list[int]) -> torch.Tensor:
        """KTO's z₀ over the whole optimizer batch `idx`: every micro-batch, and every rank's slice.

        A no-grad pass over the mismatched pairs under the current policy (in the same mode
        as the loss's forward), before any gradient of the step: Σ (log π − log π_ref) and the
        count are summed over micro-batches and ranks, so z₀ = max(0, mean) is the whole
        batch's (as TRL's `gather_for_metrics` of the KL over processes, and over the
        accumulated micro-batches too) and the gradient does not depend on `micro_batch_size`.
        """
        sums = torch.zeros(2, dtype=torch.float64)
        for sub, filler in self._micro_batches(idx):
            lp, _ = self._logps(self._kto_mismatched(sub))  # fillers run too: same calls on every rank
            if filler:
                continue
            ref = self.reference["second"][torch.tensor(sub)]
            sums += torch.stack([(lp.cpu().double() - ref.double()).sum(), torch.tensor(float(len(sub)))])
        sums = distributed.all_reduce_sum(sums.to(self.device)).cpu()
        return (sums[0] / sums[1].clamp(min=1.0)).clamp(min=0).float()

    def _logps(self, trajs: list[Trajectory]) -> tuple[torch.Tensor, torch.Tensor]:
        """(summed response log-probs [n], response token counts [n]) under the current model."""
        batch = RolloutBatch.from_trajectories(trajs, self.pad_id).to(self.device)
        per_token, _ = sequence_logprobs(self.model, batch, split_prompt=self.split, packed=self.cfg.packing)
        mask = batch.loss_mask
        return (per_token * mask).sum(-1), mask.sum(-1)

    def _micro_batches(self, rows: list[int]) -> list[tuple[list[int], bool]]:
        """This rank's slice of `rows` in micro-batches, with fillers (`common.rank_micro_batches`).

        With `micro_batch_tokens` (one process), examples of similar lengths share a
        micro-batch of at most that many tokens: each example counts as its prompt and its
        longer response, twice (two rows are scored per example: chosen and rejected, or
        KTO's own and mismatched completion), so the budget is halved per example.
        """
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            return rank_micro_batches(rows, self.micro_batch_size)
        ex = self.examples
        prompt = [len(e[0]) for e in ex]
        response = [len(e[1]) if self.kto else max(len(e[1]), len(e[3])) for e in ex]
        cut = token_budget_micro_batches(prompt, response, rows, max(budget // 2, 1), self.cfg.packing)
        return [(m, False) for m in cut]

    @torch.no_grad()
    def _reference_logps(self) -> dict[str, torch.Tensor]:
        """The start model's summed log-probs of every response (and KTO's mismatched ones), once.

        Distributed: each rank scores its slice of the examples and the slices are gathered.
        """
        was = self.model.training
        self.model.eval()
        parts: dict[str, list[torch.Tensor]] = defaultdict(list)
        order: list[int] = []
        try:
            for idx, filler in self._micro_batches(list(range(self.n))):
                lp, _ = self._logps(self._sequences(idx))
                if filler:
                    continue
                a, b = lp[: len(idx)], lp[len(idx) :]
                parts["first"].append(a.cpu())
                parts["second"].append(b.cpu())
                order += idx
        finally:
            self.model.train(was)
        # Token-budget micro-batches are sorted by length: put the rows back in example order.
        back = torch.argsort(torch.tensor(order, dtype=torch.long))
        local = {k: torch.cat(parts[k])[back] if parts[k] else torch.zeros(0) for k in ("first", "second")}
        return {k: torch.cat(distributed.all_gather_list([v])) for k, v in local.items()}

    # --- the step ----------------------------------------------------------------------
    def _order(self, epoch: int) -> list[int]:
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n, generator=g).tolist()

    def _loss(self, idx: list[int], z0: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, float]]:
        """Per-example losses of the micro-batch `idx` and its stats; `z0`: KTO's reference point."""
        cfg = self.cfg
        if self.kto:  # z₀ comes from the whole batch (`_kto_reference_point`): only own rows here
            lp, lengths = self._logps(self._kto_own(idx))
            ref = self.reference["first"][torch.tensor(idx)].to(self.device)
            desirable = torch.tensor([self.examples[i][3] for i in idx], device=self.device)
            return kto_loss(
                lp,
                ref,
                desirable,
                z0=z0,
                beta=cfg.beta,
                desirable_weight=cfg.desirable_weight,
                undesirable_weight=cfg.undesirable_weight,
            )
        lp, lengths = self._logps(self._sequences(idx))
        k, rows = len(idx), torch.tensor(idx)
        return pair_loss(
            cfg.loss,
            PairLossInputs(
                chosen_logps=lp[:k],
                rejected_logps=lp[k:],
                chosen_lengths=lengths[:k],
                rejected_lengths=lengths[k:],
                ref_chosen_logps=self.reference["first"][rows].to(self.device) if self.reference else None,
                ref_rejected_logps=self.reference["second"][rows].to(self.device) if self.reference else None,
                beta=cfg.beta,
                label_smoothing=cfg.label_smoothing,
                simpo_gamma=cfg.simpo_gamma,
                orpo_lambda=cfg.orpo_lambda,
            ),
        )

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next `batch_size` examples; returns its metrics."""
        t0 = time.perf_counter()
        epoch, pos = divmod(self.step, self.steps_per_epoch)
        order = self._order(epoch)
        idx = order[pos * self.cfg.batch_size : (pos + 1) * self.cfg.batch_size]
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums: dict[str, float] = defaultdict(float)
        total = 0.0
        micros = self._micro_batches(idx)
        z0 = self._kto_reference_point(idx) if self.kto else None
        W = self.world.size  # FSDP averages the ranks' gradients: each rank's loss is scaled by W
        for j, (sub, filler) in enumerate(micros):
            distributed.set_requires_gradient_sync(self.model, j == len(micros) - 1)
            losses, stats = self._loss(sub, z0)
            loss = losses.sum() / len(idx) * (0.0 if filler else W)
            loss.backward()
            if filler:
                continue
            total += float(loss.detach()) / W
            for k, v in stats.items():
                sums[k] += v * len(sub) / len(idx)
        name = f"loss/{self.cfg.loss}"
        metrics: dict[str, float] = {name: total, **sums}
        metrics = distributed.reduce_metrics(
            metrics, ops={k: "sum" for k in metrics}
        )  # parts of global means
        if self.cfg.optim.max_grad_norm is not None:
            metrics["grad_norm"] = distributed.grad_norm(
                torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.optim.max_grad_norm)
            )
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["time/step_s"] = distributed.reduce_metrics({"time/step_s": time.perf_counter() - t0})[
            "time/step_s"
        ]
        return metrics

    def save(self) -> Path:
        """Checkpoint the current step."""
        return save_checkpoint(
            self.stage_dir,
            self.step,
            self.model,
            self.tokenizer,
            self.optimizer,
            self.scheduler,
            {"cursor": self.step},
            keep=self.cfg.keep_checkpoints,
        )

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Run `epochs` passes over the examples; return the saved final model folder."""
        name = self.cfg.loss

        def describe(m: dict[str, float]) -> str:
            acc = f"  pref-acc {m['rewards/accuracy']:.2f}" if "rewards/accuracy" in m else ""
            return f"loss {m[f'loss/{name}']:.4f}{acc}  {m['time/step_s']:.2f}s/step"

        announce_memory(name, self.memory, self.stage_dir, echo)
        run_loop(
            self.train_step,
            self.save,
            self.logger,
            start=self.step,
            name=name,
            steps=self.total_steps,
            log_every=self.cfg.log_every,
            checkpoint_every=self.cfg.checkpoint_every,
            echo=echo,
            lines=10,
            describe=describe,
        )
        return save_final_model(self.stage_dir, self.model, self.tokenizer, lora=self.cfg.lora is not None)
