"""What every trainer shares: the logprob forward, task sampling, optimizer, metrics and checkpoints.

Run directory of one stage (DESIGN.md, "Run directory"):

    <stage_dir>/config.yaml        the resolved stage config
    <stage_dir>/metrics.jsonl      one JSON object per logged step
    <stage_dir>/tb/                TensorBoard events
    <stage_dir>/checkpoints/step_<N>/  model (safetensors) + tokenizer, optimizer.pt,
                                   scheduler.pt, state.json (step, data cursor), rng.pt
    <stage_dir>/final/             the trained model as a plain HF folder

Checkpoints are written to a temporary folder and renamed into place, so a killed
run never leaves a half-written checkpoint.

Under torchrun (`textgym.distributed`) the same functions are collective: every rank calls
them, the full (unsharded) model and optimizer states are gathered to rank 0, and rank 0
alone writes, in exactly the single-process format; loading broadcasts rank 0's copy and
shards it. `rng.pt` then also holds every rank's RNG states (`"ranks"`), restored rank by
rank when the world size is unchanged.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.config import OptimConfig
from textgym.trainers.batch import RolloutBatch
from textgym.trainers.losses import entropy_from_logits


def seed_everything(seed: int) -> None:
    """Seed Python's, numpy's and torch's global RNGs."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def resolve_device(device: str) -> torch.device:
    """Map "auto" to cuda when available, else cpu; pass other strings through."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def shared_prompt_rows(
    batch: RolloutBatch, even_if_unique: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Find rows whose prompt columns can be computed once: `(first_rows, inverse)` or None.

    `first_rows[k]` is the first row of the k-th distinct group and `inverse[i]` the group
    position of row i, so `x[first_rows][inverse]` rebuilds a per-row tensor. None when no
    group repeats (unless `even_if_unique`), a row is ungrouped (-1), or rows of one group
    differ in their prompt.
    """
    if batch.groups.numel() == 0 or bool((batch.groups < 0).any()):
        return None
    uniq, inverse = torch.unique(batch.groups, return_inverse=True)
    if len(uniq) == len(batch) and not even_if_unique:
        return None
    rows = torch.arange(len(batch), device=inverse.device)
    first = torch.full((len(uniq),), len(batch), dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    P = batch.prompt_width
    if not torch.equal(batch.input_ids[first][inverse][:, :P], batch.input_ids[:, :P]):
        return None
    return first, inverse


def sequence_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    entropy_grad: bool = False,
    split_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens of `batch` under `model`.

    Only the response positions' logits are materialised (`logits_to_keep`), and
    log-softmax is computed as `gather(logits) − logsumexp(logits)` to avoid a second
    [B, L, V] tensor.

    With `share_prompts`, rows of one group (the G samples of a task, identical prompt
    columns) run their prompt through the model once: the prompt's KV cache is computed
    for each distinct prompt and gathered to every row of its group, then only the
    response columns are run. The result is the same function of the parameters (its
    gradient sums over the group through the shared cache), with about
    `(num_groups·P + B·L) / (B·(P + L))` of the tokens. Under gradient checkpointing (in
    training mode) HF drops the KV cache, so prompts are not shared then.

    A sharded model (FSDP) must make the same forward calls on every rank; a rank's
    micro-batch may hold repeated groups while another's does not, so `split_prompt` runs
    the prompt/response pair of calls even when no prompt repeats.

    Args:
        model: a causal LM.
        batch: the padded batch (`RolloutBatch` layout: prompt width P, response width L).
        temperature: logits are divided by it (the sampling temperature; 0 is treated as 1).
        with_entropy: also return the per-token entropy (no grad unless `entropy_grad`).
        share_prompts: compute each group's prompt once when the batch allows it.
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus).
        split_prompt: with `share_prompts`, always run prompt and response as two calls.

    Returns:
        logprobs [B, L] (0 where the batch has padding — mask it), entropy [B, L] or None.
    """
    P, L = batch.prompt_width, batch.loss_mask.shape[1]
    checkpointing = model.training and bool(getattr(model, "is_gradient_checkpointing", False))
    shared = shared_prompt_rows(batch, split_prompt) if share_prompts and not checkpointing else None
    if shared is None:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=L + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1]  # [B, L, V]: position P-1+t predicts token P+t
    else:
        first, inverse = shared
        prompt = model(
            input_ids=batch.input_ids[first, :P],
            attention_mask=batch.attention_mask[first, :P],
            position_ids=batch.position_ids[first, :P],
            logits_to_keep=1,
            use_cache=True,
        )
        cache = prompt.past_key_values
        cache.batch_select_indices(inverse)  # [groups, ...] -> [B, ...], differentiable gather
        response = model(
            input_ids=batch.input_ids[:, P:],
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids[:, P:],
            past_key_values=cache,
            use_cache=True,
        )
        logits = torch.cat([prompt.logits[inverse], response.logits[:, :-1]], dim=1)  # [B, L, V]
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, P:]  # [B, L]
    logprobs = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy and entropy_grad:
        entropy = entropy_from_logits(logits)
    elif with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logprobs, entropy


def rank_micro_batches(rows: list[int], micro_batch_size: int) -> list[tuple[list[int], bool]]:
    """This rank's contiguous slice of a global batch `rows`, cut into micro-batches.

    The slice is rank r's `rows[r·s : (r+1)·s]` with `s = ceil(len(rows) / ranks)`, so the
    slices concatenated in rank order are `rows` (what `distributed.all_gather_list` rebuilds).
    A rank that needs fewer micro-batches than the fullest one (a ragged batch; possibly none
    at all) gets filler micro-batches `([rows[0]], True)` to run with weight 0, so that every
    rank makes the same forward and backward calls, as a sharded model requires. One process:
    all of `rows`, never a filler.

    Args:
        rows: the global batch (example indices), the same list on every rank; not empty.
        micro_batch_size: examples per forward pass.

    Returns:
        `(indices, is_filler)` pairs, the same number on every rank.
    """
    w = distributed.world()
    per = -(-len(rows) // w.size)
    mine = rows[w.rank * per : (w.rank + 1) * per]
    out = [(mine[i : i + micro_batch_size], False) for i in range(0, len(mine), micro_batch_size)]
    fullest = -(-per // micro_batch_size)
    out += [([rows[0]], True)] * (fullest - len(out))
    return out


class TaskSampler:
    """Deterministic stream of task indices with a resumable cursor.

    Finite task sets are walked in a fresh permutation per epoch (seeded by
    `(seed, epoch)`); an unbounded stream (`n >= 2**62`, e.g. generated Arithmetic)
    is walked in order 0, 1, 2, ...

    Attributes:
        cursor: number of indices handed out so far (the data cursor saved in checkpoints).
    """

    def __init__(self, n: int, seed: int):
        if n < 1:
            raise ValueError("cannot sample from an empty task set")
        self.n, self.seed, self.cursor = n, seed, 0
        self._perm: np.ndarray | None = None
        self._perm_epoch = -1

    def next(self, k: int) -> list[int]:
        """Return the next `k` task indices."""
        out = []
        for _ in range(k):
            if self.n >= 2**62:
                out.append(self.cursor)
            else:
                epoch, pos = divmod(self.cursor, self.n)
                if epoch != self._perm_epoch:
                    self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.n)
                    self._perm_epoch = epoch
                assert self._perm is not None
                out.append(int(self._perm[pos]))
            self.cursor += 1
        return out


def build_optimizer(
    model: torch.nn.Module, cfg: OptimConfig, total_steps: int
) -> tuple[torch.optim.Optimizer, LambdaLR]:
    """AdamW (Loshchilov & Hutter 2019) with linear warm-up then constant / cosine / linear decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay)

    def factor(step: int) -> float:
        if cfg.warmup_steps and step < cfg.warmup_steps:
            return (step + 1) / cfg.warmup_steps
        if cfg.schedule == "constant":
            return 1.0
        span = max(1, total_steps - cfg.warmup_steps)
        progress = min(1.0, (step - cfg.warmup_steps) / span)
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if cfg.schedule == "cosine" else 1 - progress
        return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * shape

    return opt, LambdaLR(opt, factor)


class MetricsLogger:
    """Append metrics to `metrics.jsonl` and TensorBoard; on resume, drop records past the checkpoint.

    Keys are slash-namespaced (`rollout/reward_mean`, `loss/policy`, `time/step_s`).
    """

    def __init__(self, stage_dir: Path, resume_step: int | None = None):
        self.path = stage_dir / "metrics.jsonl"
        if resume_step is not None and self.path.exists():
            kept = [
                line
                for line in self.path.read_text(encoding="utf-8").splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= resume_step
            ]
            self.path.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(
            log_dir=str(stage_dir / "tb"), purge_step=None if resume_step is None else resume_step + 1
        )

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one record (`{"step": step, **metrics}`)."""
        record = {"step": step, "time": time.time(), **{k: float(v) for k, v in metrics.items()}}
        with self.path.open("a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        for k, v in metrics.items():
            self.tb.add_scalar(k, float(v), step)
        self.tb.flush()

    def close(self) -> None:
        """Close the TensorBoard writer."""
        self.tb.close()


class NullLogger:
    """The metrics logger of ranks other than 0: drops everything."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Do nothing."""

    def close(self) -> None:
        """Do nothing."""


def metrics_logger(stage_dir: Path, resume_step: int | None = None) -> MetricsLogger | NullLogger:
    """A `MetricsLogger` on rank 0, a `NullLogger` elsewhere (rank 0 alone writes the run directory)."""
    return MetricsLogger(stage_dir, resume_step) if distributed.is_main() else NullLogger()


def _rng_state() -> dict[str, Any]:
    return {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def _all_rng_states() -> dict[str, Any]:
    """rng.pt's content: rank 0's states, plus every rank's under "ranks" when distributed."""
    if distributed.world().size == 1:
        return _rng_state()
    states = distributed.gather_list([_rng_state()])
    return {**states[0], "ranks": states} if states else {}


def _restore_rng_states(state: dict[str, Any]) -> None:
    """Set this rank's RNGs from rng.pt.

    Its own states when the world size is unchanged; otherwise rank 0's, re-seeded on the
    other ranks by `distributed.rank_seed`.
    """
    w = distributed.world()
    ranks = state.get("ranks")
    if ranks is not None and len(ranks) == w.size:
        _set_rng_state(ranks[w.rank])
        return
    _set_rng_state(state)
    if w.rank > 0:
        seed_everything(distributed.rank_seed(int(torch.randint(0, 2**31, (1,)))))


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def save_model_folder(folder: Path, model: torch.nn.Module, tokenizer: Any = None) -> None:
    """Write `model` (and `tokenizer`) as a Hugging Face folder.

    Collective for a sharded model (every rank calls it; the full weights are gathered and
    rank 0 writes them); the folder is the one `save_pretrained` writes for the plain model.
    """
    state = distributed.model_state(model) if distributed.is_sharded(model) else None
    if not distributed.is_main():
        return
    if state is not None:
        model.save_pretrained(folder, state_dict=state)  # type: ignore[operator]
    else:
        model.save_pretrained(folder)  # type: ignore[operator]
    if tokenizer is not None:
        tokenizer.save_pretrained(folder)


def save_checkpoint(
    stage_dir: Path,
    step: int,
    model: torch.nn.Module,
    tokenizer: PreTrainedTokenizerBase,
    optimizer: torch.optim.Optimizer,
    scheduler: LambdaLR,
    state: dict[str, Any],
    keep: int = 2,
    extra: Callable[[Path], None] | None = None,
) -> Path:
    """Write `checkpoints/step_<step>/` atomically (temp folder, fsync, rename) and prune old ones.

    `model` is a Hugging Face model, or a module with a `save_pretrained(folder, state_dict=None)`
    that writes `*.safetensors` files keyed as its own state dict (the reward model's
    `RewardNet`), so that `load_checkpoint` can read them back.
    `state` is JSON-serialisable trainer state (the data cursor, counters); `extra(folder)`
    may write more files into the checkpoint before it is renamed into place (PPO's critic).
    Distributed: every rank calls this (and `extra`, which must itself be collective); rank 0
    writes; every rank returns after the checkpoint is in place.
    """
    main = distributed.is_main()
    root = stage_dir / "checkpoints"
    final = root / f"step_{step}"
    tmp = root / distributed.broadcast_object(f".tmp_step_{step}_{os.getpid()}")
    if main:
        root.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
    save_model_folder(tmp, model, tokenizer)
    optim_state = distributed.optimizer_state(model, optimizer)
    rng = _all_rng_states()
    if main:
        torch.save(optim_state, tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        torch.save(rng, tmp / "rng.pt")
        (tmp / "state.json").write_text(json.dumps({"step": step, **state}), encoding="utf-8")
    if extra is not None:
        extra(tmp)
    if main:
        for f in tmp.rglob("*"):
            if f.is_file():
                with f.open("rb") as fh:
                    os.fsync(fh.fileno())
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        for old in sorted(root.glob("step_*"), key=lambda p: int(p.name.split("_")[1]))[:-keep]:
            shutil.rmtree(old)
    distributed.barrier()
    return final


def latest_checkpoint(stage_dir: Path) -> Path | None:
    """Return the newest complete `checkpoints/step_<N>/`, or None."""
    root = stage_dir / "checkpoints"
    if not root.is_dir():
        return None
    done = [p for p in root.glob("step_*") if (p / "state.json").is_file()]
    return max(done, key=lambda p: int(p.name.split("_")[1])) if done else None


def load_weights(folder: Path, model: torch.nn.Module) -> None:
    """Load the `*.safetensors` weights of `folder` into `model` in place (tied lm_head allowed).

    Raises:
        RuntimeError: if a parameter is missing or unexpected.
    """
    from safetensors.torch import load_file

    sharded = distributed.is_sharded(model)
    weights: dict[str, torch.Tensor] = {}
    if distributed.is_main() or not sharded:  # a sharded model takes rank 0's copy
        for f in sorted(folder.glob("*.safetensors")):
            weights.update(load_file(str(f)))
    from textgym.trainers.lora import is_lora

    if is_lora(model):
        # A LoRA checkpoint holds the adapter only (adapter_model.safetensors, peft's names);
        # the base weights stay as they are (frozen, the start model's).
        from textgym.trainers.lora import adapter_state_for_model

        if not (folder / "adapter_config.json").is_file():
            raise RuntimeError(
                f"checkpoint {folder} has no LoRA adapter (adapter_config.json) for a LoRA policy"
            )
        adapters = adapter_state_for_model(model, weights)
        keys = set(distributed.broadcast_object(sorted(adapters) if distributed.is_main() else []))
        expected = {k for k in model.state_dict() if ".lora_" in k}
        if keys != expected:
            raise RuntimeError(
                f"checkpoint {folder} does not match the adapters: missing {sorted(expected - keys)}, "
                f"unexpected {sorted(keys - expected)}"
            )
        distributed.load_model_state(model, adapters)
        return
    missing, unexpected = distributed.load_model_state(model, weights)
    tied = {k for k in missing if "lm_head" in k}
    if set(missing) - tied or unexpected:
        raise RuntimeError(
            f"checkpoint {folder} does not match the model: missing {missing}, unexpected {unexpected}"
        )
    if tied and isinstance(model, PreTrainedModel) and not sharded:  # sharded: one shared parameter
        model.tie_weights()


def load_checkpoint(
    ckpt: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: LambdaLR
) -> dict[str, Any]:
    """Restore model weights, optimizer, scheduler and RNG states from `ckpt`; return its state.json.

    Distributed: collective; a checkpoint written by any number of ranks loads on any number.

    Raises:
        RuntimeError: if the checkpoint's weights do not match `model`'s parameters.
    """
    load_weights(ckpt, model)
    load_optimizer(ckpt / "optimizer.pt", model, optimizer)
    scheduler.load_state_dict(torch.load(ckpt / "scheduler.pt", weights_only=False))
    _restore_rng_states(torch.load(ckpt / "rng.pt", weights_only=False))
    return dict(json.loads((ckpt / "state.json").read_text(encoding="utf-8")))


def load_optimizer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load an `optimizer.pt` (single-process format) into `optimizer`; collective when `model` is sharded."""
    need = distributed.is_main() or not distributed.is_sharded(model)
    state = torch.load(path, weights_only=False) if need else {}
    distributed.load_optimizer_state(model, optimizer, state)


def save_optimizer(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write `optimizer`'s state to `path` in the single-process format (collective when sharded)."""
    state = distributed.optimizer_state(model, optimizer)
    if distributed.is_main():
        torch.save(state, path)


def save_lora_final(stage_dir: Path, model: Any, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save a LoRA policy; return the merged folder.

    The adapter goes to `<stage_dir>/final_adapter` (peft's format), the merged model (a plain
    HF folder any loader reads) to `<stage_dir>/final`, each written atomically. Collective
    for a sharded policy: the full weights are gathered once, rank 0 writes both folders.
    """
    from textgym.trainers.lora import merge_state, write_merged

    state = distributed.model_state(model) if distributed.is_sharded(model) else None
    pid = distributed.broadcast_object(os.getpid())
    if distributed.is_main():
        full = state if state is not None else model.state_dict()

        def adapter(d: Path) -> None:
            if state is not None:
                model.save_pretrained(d, state_dict=state)
            else:
                model.save_pretrained(d)
            tokenizer.save_pretrained(d)

        for name, write in (
            ("final_adapter", adapter),
            ("final", lambda d: write_merged(model, merge_state(model, full), tokenizer, d)),
        ):
            tmp = stage_dir / f".tmp_{name}_{pid}"
            if tmp.exists():
                shutil.rmtree(tmp)
            write(tmp)
            if (stage_dir / name).exists():
                shutil.rmtree(stage_dir / name)
            os.replace(tmp, stage_dir / name)
    distributed.barrier()
    return stage_dir / "final"


def save_final(stage_dir: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save the trained model as a plain HF folder at `<stage_dir>/final` (atomically; collective)."""
    final = stage_dir / "final"
    tmp = stage_dir / distributed.broadcast_object(f".tmp_final_{os.getpid()}")
    if distributed.is_main() and tmp.exists():
        shutil.rmtree(tmp)
    save_model_folder(tmp, model, tokenizer)
    if distributed.is_main():
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    distributed.barrier()
    return final


class Trainable(Protocol):
    """What `run_loop` needs of a trainer."""

    step: int

    @property
    def logger(self) -> MetricsLogger | NullLogger:
        """Where metrics go."""
        ...

    def train_step(self) -> dict[str, float]:
        """Do one iteration and return its metrics."""
        ...

    def save(self) -> Path:
        """Checkpoint the current step."""
        ...


def run_loop(
    trainer: Trainable,
    *,
    name: str,
    steps: int,
    log_every: int,
    checkpoint_every: int,
    describe: Callable[[dict[str, float]], str],
    echo: Callable[[str], None] | None = None,
    after_step: Callable[[dict[str, float]], None] | None = None,
    lines: int = 20,
    stop: Callable[[], bool] | None = None,
) -> None:
    """Call `trainer.train_step()` until `steps`, logging, checkpointing and reporting progress.

    Metrics are logged every `log_every` steps and at the last; a checkpoint is written
    every `checkpoint_every` steps (0: only at the end) and always at the end. About
    `lines` progress lines (`describe(metrics)`) go above a live progress bar on a
    terminal, or through `echo` otherwise. `after_step(metrics)` may add metrics (e.g. a
    periodic evaluation) before they are logged. `stop()`, asked after each step (after
    `after_step`), ends the loop early: that step is logged, reported and checkpointed as the
    last. Distributed, every rank runs the loop (the steps and checkpoints are collective) and
    rank 0 alone logs and reports; `stop()` must give the same answer on every rank.
    """
    if not distributed.is_main():
        echo = None
    bar = progress_bar(steps, trainer.step, name, disable=not distributed.is_main())
    write = (lambda line: bar.write(line)) if not bar.disable and echo is not None else echo
    every = max(1, steps // lines)
    try:
        while trainer.step < steps:
            metrics = trainer.train_step()
            if after_step is not None:
                after_step(metrics)
            last = trainer.step == steps or (stop is not None and stop())
            if trainer.step % log_every == 0 or last:
                trainer.logger.log(trainer.step, metrics)
            if checkpoint_every and trainer.step % checkpoint_every == 0:
                trainer.save()
            bar.update(1)
            if write is not None and (trainer.step % every == 0 or last):
                write(f"{name} step {trainer.step}/{steps}  {describe(metrics)}")
            if last:
                break
        if not checkpoint_every or trainer.step % checkpoint_every:
            trainer.save()
    finally:
        bar.close()
        trainer.logger.close()


def progress_bar(total: int, initial: int, desc: str, disable: bool = False) -> Any:
    """A tqdm bar on stderr (disabled when asked, or off a terminal unless TEXTGYM_PROGRESS is set)."""
    from tqdm.auto import tqdm

    disable = disable or not (sys.stderr.isatty() or os.environ.get("TEXTGYM_PROGRESS"))
    return tqdm(total=total, initial=initial, desc=desc, disable=disable, dynamic_ncols=True)
