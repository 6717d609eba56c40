"""A process reward model (PRM) trained on Monte-Carlo step labels, and the verifier that scores with it.

The model is `AutoModelForTokenClassification` with one label, initialised from a causal LM folder
(the policy's body; the scalar head is new): the machinery of the Bradley–Terry reward model
(`textgym.trainers.reward.bradley_terry`) with a head read at every step instead of once. Its input is
`chat_template(prompt) + response` (`textgym.verifiers.prm.encode_steps`); the head's logit z at
the token holding step k's last character is trained towards the step's label y_k ∈ [0, 1]
(`prm.target`: Math-Shepherd's soft or hard estimation, `textgym.offline.prm_labels`) with binary
cross-entropy, `−[y log σ(z) + (1 − y) log(1 − σ(z))]` (Wang et al. 2023, arXiv:2312.08935, eq. 3;
Lightman et al. 2023, arXiv:2305.20050), averaged over the step tokens of the batch. Every other
token is out of the loss (`step_bce`).

Loop (`PRMTrainer`): 1 draw the step's answers (epoch e's order is a permutation seeded by
`seed + e`) · 2 one forward pass per micro-batch · 3 BCE at the step tokens, divided by the
batch's step count (so micro-batching leaves the gradient unchanged) · 4 clip, step · 5 log
(`<out>/metrics.jsonl`) and after each epoch the held-out step accuracy. The held-out answers
are those of `eval_fraction` of the tasks. Step accuracy: the share of held-out steps where
σ(z) ≥ 0.5 agrees with label ≥ 0.5 (against the MC labels, and against the env's own step checker
when the labels carry it, `env_step_rewards`). One process (no torchrun, no resume).

`PRMVerifier` (`textgym.verifiers.prm`) scores with a trained model; `ProcessRewardWrapper`
(`textgym.envs.process_reward`) puts its step scores into any env's `info["step_rewards"]`.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForTokenClassification, AutoTokenizer

from textgym.config import PRMConfig
from textgym.tracking import metrics_logger
from textgym.training.checkpoint import save_model_folder
from textgym.training.optim import build_optimizer
from textgym.verifiers.prm import encode_steps
from textgym.verifiers.reward_model import pad_rows

__all__ = ["PRMTrainer", "read_labels", "step_bce", "train_prm"]

_STEP_HEAD: dict[str, Any] = {"id2label": {0: "step"}, "label2id": {"step": 0}, "classifier_dropout": 0.0}


def read_labels(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a labels file (`textgym prm label`; JSON lines).

    Raises:
        FileNotFoundError: when it does not exist.
    """
    text = Path(path).read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def step_bce(
    logits: torch.Tensor,
    positions: Sequence[Sequence[int]],
    targets: torch.Tensor,
    num_steps: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Binary cross-entropy of the head's logits at the step tokens only (Math-Shepherd eq. 3).

    `L = (1/N) Σ_{(i, t) step tokens} BCE(z_{i,t}, y)`; no other token's logit is in the loss, so
    its gradient there is 0.

    Args:
        logits: [n, T] per-token logits of the n rows.
        positions: per row, the indices of its step tokens (Σ lengths = S).
        targets: [S] the labels in [0, 1], in the order of `positions`.
        num_steps: N, the denominator (default S; the batch's step count across micro-batches).

    Returns:
        The loss (scalar) and stats `loss/prm` (its value), `prm/accuracy` (share of steps with
        σ(z) ≥ 0.5 agreeing with y ≥ 0.5).
    """
    rows = torch.tensor(
        [i for i, p in enumerate(positions) for _ in p], dtype=torch.long, device=logits.device
    )
    cols = torch.tensor([j for p in positions for j in p], dtype=torch.long, device=logits.device)
    z = logits[rows, cols].float()
    y = targets.to(z.device).float()
    total = torch.nn.functional.binary_cross_entropy_with_logits(z, y, reduction="sum")
    n = float(num_steps if num_steps is not None else max(len(y), 1))
    loss = total / n
    hits = ((z >= 0) == (y >= 0.5)).float().sum()
    return loss, {"loss/prm": float(loss.detach()), "prm/accuracy": float(hits) / max(len(y), 1)}


class PRMTrainer:
    """Trains a PRM on a labels file's rows (one process).

    Args:
        rows: the labels (`read_labels`); answers without a step are skipped.
        model_dir: the causal LM folder the PRM starts from.
        out: the output folder: the PRM (a Hugging Face folder), `textgym.json`, `metrics.jsonl`, `tb/`.
        cfg: target, epochs, batch sizes, optimizer, split, seed, default aggregate.
        device: "cpu" or "cuda[:N]".
        log_with: trackers beside `metrics.jsonl` (`textgym.tracking`).

    Raises:
        ValueError: if no training answer has a step.
    """

    def __init__(
        self,
        rows: list[dict[str, Any]],
        model_dir: str | Path,
        out: str | Path,
        cfg: PRMConfig | None = None,
        *,
        device: str = "cpu",
        log_with: Sequence[str] = ("tensorboard",),
    ):
        self.t0 = time.perf_counter()
        self.cfg = cfg = cfg or PRMConfig()
        self.out, self.device = Path(out), torch.device(device)
        torch.manual_seed(cfg.seed)  # the new head's initialisation
        self.tokenizer = tok = AutoTokenizer.from_pretrained(model_dir)
        config = AutoConfig.from_pretrained(model_dir, num_labels=1)
        for key, value in _STEP_HEAD.items():  # set after loading: `from_pretrained` drops unknown kwargs
            setattr(config, key, value)
        self.model = AutoModelForTokenClassification.from_pretrained(
            model_dir, config=config, dtype=torch.float32
        ).to(self.device)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)  # type: ignore[arg-type]
        self.model.config.pad_token_id = self.pad_id
        rows = [r for r in rows if r["step_ends"]]
        self.ids, self.positions, self.targets, self.gold = [], [], [], []
        for r in rows:
            ids, pos = encode_steps(tok, r["messages"], r["response"], r["step_ends"])
            self.ids.append(ids)
            self.positions.append(pos)
            self.targets.append([float(y) for y in r[cfg.target]])
            self.gold.append(r.get("env_step_rewards"))
        tasks = sorted({int(r["task_index"]) for r in rows})
        random.Random(cfg.seed).shuffle(tasks)
        held = set(tasks[: round(cfg.eval_fraction * len(tasks))])
        self.train_idx = [i for i, r in enumerate(rows) if int(r["task_index"]) not in held]
        self.test_idx = [i for i, r in enumerate(rows) if int(r["task_index"]) in held]
        if not self.train_idx:
            raise ValueError("no training answer with a step")
        self.steps_per_epoch = -(-len(self.train_idx) // cfg.batch_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.optim, self.total_steps)
        self.step = 0
        self.out.mkdir(parents=True, exist_ok=True)
        (self.out / "metrics.jsonl").unlink(missing_ok=True)
        self.logger = metrics_logger(self.out, resume_step=None, log_with=log_with, config=cfg)
        self.figures: dict[str, Any] = {}

    def _logits(self, idx: list[int]) -> torch.Tensor:
        """[k, T] per-token logits of answers `idx` (right-padded)."""
        ids, mask = pad_rows([self.ids[i] for i in idx], self.pad_id)
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device))
        return out.logits[..., 0]

    def _targets(self, idx: list[int]) -> torch.Tensor:
        return torch.tensor([y for i in idx for y in self.targets[i]], dtype=torch.float32)

    @torch.no_grad()
    def evaluate(self, idx: list[int] | None = None) -> dict[str, float]:
        """Figures of answers `idx` (default: the held-out ones): loss and step accuracies.

        `loss` (mean BCE per step), `step_accuracy` against the training target,
        `gold_step_accuracy` against the env's step checker (NaN without one).
        """
        idx = self.test_idx if idx is None else idx
        if not idx:
            return {"loss": float("nan"), "step_accuracy": float("nan"), "gold_step_accuracy": float("nan")}
        self.model.eval()
        bs = self.cfg.micro_batch_size or self.cfg.batch_size
        n = sum(len(self.positions[i]) for i in idx)
        loss, hits, gold_hits, gold_n = 0.0, 0.0, 0, 0
        for c in range(0, len(idx), bs):
            part = idx[c : c + bs]
            logits = self._logits(part)
            pos = [self.positions[i] for i in part]
            lo, st = step_bce(logits, pos, self._targets(part), num_steps=n)
            loss += float(lo)
            hits += st["prm/accuracy"] * sum(len(p) for p in pos)
            z = logits[
                torch.tensor([r for r, p in enumerate(pos) for _ in p], dtype=torch.long),
                torch.tensor([j for p in pos for j in p], dtype=torch.long),
            ].tolist()
            flat_gold = [g for i in part for g in (self.gold[i] or [None] * len(self.positions[i]))]
            for zi, g in zip(z, flat_gold, strict=True):
                if g is not None:
                    gold_hits += int((zi >= 0) == (g >= 0.5))
                    gold_n += 1
        return {
            "loss": loss,
            "step_accuracy": hits / max(n, 1),
            "gold_step_accuracy": gold_hits / gold_n if gold_n else float("nan"),
        }

    def train_step(self) -> dict[str, float]:
        """One optimizer step on the next `batch_size` answers; returns its metrics (before the step)."""
        t0, cfg = time.perf_counter(), self.cfg
        epoch, pos = divmod(self.step, self.steps_per_epoch)
        g = torch.Generator().manual_seed(cfg.seed + epoch)
        order = [self.train_idx[i] for i in torch.randperm(len(self.train_idx), generator=g).tolist()]
        idx = order[pos * cfg.batch_size : (pos + 1) * cfg.batch_size]
        n = sum(len(self.positions[i]) for i in idx)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        sums = {"loss/prm": 0.0, "prm/accuracy": 0.0}
        mb = cfg.micro_batch_size or cfg.batch_size
        for c in range(0, len(idx), mb):
            part = idx[c : c + mb]
            loss, st = step_bce(self._logits(part), [self.positions[i] for i in part], self._targets(part), n)
            loss.backward()
            sums["loss/prm"] += st["loss/prm"]
            sums["prm/accuracy"] += st["prm/accuracy"] * sum(len(self.positions[i]) for i in part) / max(n, 1)
        metrics = dict(sums)
        if cfg.optim.max_grad_norm is not None:
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.optim.max_grad_norm)
            metrics["grad_norm"] = float(gn)
        self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        metrics["lr"] = float(self.scheduler.get_last_lr()[0])
        metrics["time/step_s"] = time.perf_counter() - t0
        return metrics

    def train(self, echo: Callable[[str], None] | None = None) -> Path:
        """Train for `epochs`, save the PRM to `out` and return it; figures in `.figures` (`train_prm`'s)."""
        cfg = self.cfg
        before = self.evaluate()
        after, loss = before, float("nan")
        try:
            while self.step < self.total_steps:
                metrics = self.train_step()
                loss = metrics["loss/prm"]
                if self.step % self.steps_per_epoch == 0:
                    after = self.evaluate()
                    metrics.update({f"eval/{k}": v for k, v in after.items()})
                    if echo is not None:
                        echo(
                            f"prm epoch {self.step // self.steps_per_epoch}/{cfg.epochs}  loss {loss:.4f}  "
                            f"held-out step accuracy {after['step_accuracy']:.3f} "
                            f"(vs the env's checker {after['gold_step_accuracy']:.3f})"
                        )
                self.logger.log(self.step, metrics)
        finally:
            self.logger.close()
        train_labels = [y for i in self.train_idx for y in self.targets[i]]
        majority = float(sum(y >= 0.5 for y in train_labels) >= len(train_labels) / 2)
        test_labels = [y for i in self.test_idx for y in self.targets[i]]
        result = {
            "role": "process_reward_model",
            "target": cfg.target,
            "aggregate": cfg.aggregate,
            "train_answers": len(self.train_idx),
            "heldout_answers": len(self.test_idx),
            "train_steps": len(train_labels),
            "heldout_steps": len(test_labels),
            "heldout_step_accuracy_before": before["step_accuracy"],
            "heldout_step_accuracy": after["step_accuracy"],
            "heldout_gold_step_accuracy_before": before["gold_step_accuracy"],
            "heldout_gold_step_accuracy": after["gold_step_accuracy"],
            "heldout_majority_baseline": sum((y >= 0.5) == majority for y in test_labels)
            / max(len(test_labels), 1),
            "heldout_loss": after["loss"],
            "train_loss": loss,
            "steps": self.step,
            "wall_time_s": time.perf_counter() - self.t0,
        }
        save_model_folder(self.out, self.model, self.tokenizer)
        (self.out / "textgym.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
        self.figures = result
        return self.out


def train_prm(
    rows: list[dict[str, Any]],
    model_dir: str | Path,
    out: str | Path,
    cfg: PRMConfig | None = None,
    echo: Callable[[str], None] | None = None,
    *,
    device: str = "cpu",
    log_with: Sequence[str] = ("tensorboard",),
) -> dict[str, Any]:
    """Train a PRM on labelled answers (`read_labels`) from `model_dir`; save it to `out`.

    Returns:
        Figures: train/held-out answer and step counts, held-out step accuracy before and after
        training (against the MC labels and, when present, the env's step checker), the held-out
        accuracy of always predicting the training labels' majority class, losses, steps, wall
        seconds. Also written to `out/textgym.json`.

    Raises:
        ValueError: if no training answer has a step.
    """
    trainer = PRMTrainer(rows, model_dir, out, cfg, device=device, log_with=log_with)
    trainer.train(echo)
    return trainer.figures
