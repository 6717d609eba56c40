"""Checkpoints and final models: atomic writes, RNG states, LoRA adapters, resume.

Run directory of one stage (docs/design.md, "Run directory"):

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
import os
import random
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from textgym import distributed
from textgym.training.optim import load_optimizer
from textgym.training.seeding import seed_everything


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
    from textgym.agents.weight_sync import is_lora

    if is_lora(model):
        # A LoRA checkpoint holds the adapter only (adapter_model.safetensors, peft's names);
        # the base weights stay as they are (frozen, the start model's).
        from textgym.training.lora import adapter_state_for_model

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


def save_lora_final(stage_dir: Path, model: Any, tokenizer: PreTrainedTokenizerBase) -> Path:
    """Save a LoRA policy; return the merged folder.

    The adapter goes to `<stage_dir>/final_adapter` (peft's format), the merged model (a plain
    HF folder any loader reads) to `<stage_dir>/final`, each written atomically. Collective
    for a sharded policy: the full weights are gathered once, rank 0 writes both folders.
    """
    from textgym.agents.weight_sync import merge_state
    from textgym.training.lora import write_merged

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
