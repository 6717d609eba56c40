"""Modules that moved, and the error an old import path gets (a rename table, as Gymnasium keeps).

`import textgym` appends `MovedModuleFinder` to `sys.meta_path`, after every real finder. An
import of a module in `MOVED` reaches it only when no file answers to the old name, and fails
with a `ModuleNotFoundError` that names the new place, instead of a module kept alive to
re-export another's names.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.abc import MetaPathFinder
from importlib.machinery import ModuleSpec
from types import ModuleType

MOVED: dict[str, str] = {
    "textgym.suites": "textgym.evaluation.suites",
    "textgym.plotting": "textgym.evaluation.plotting",
    "textgym.store": "textgym.offline.store",
    "textgym.agents.scripted": "textgym.evaluation.scripted",
    "textgym.trainers.dpo": "textgym.trainers.preference",
    "textgym.trainers.prm_labels": "textgym.offline.prm_labels",
    "textgym.trainers.logging": "textgym.tracking",
    "textgym.trainers.common": (
        "its concern's module: textgym.trainers.seeding (seed_everything, resolve_device), "
        ".logprobs (sequence_logprobs, shared_prompt_rows), .batch (RolloutBatch, "
        "rank_micro_batches), .sampler (TaskSampler), .optim (build_optimizer, load_optimizer, "
        "save_optimizer), textgym.tracking (MetricsLogger, NullLogger, metrics_logger, "
        "progress_bar), "
        ".checkpoint (save_checkpoint, load_checkpoint, latest_checkpoint, load_weights, "
        "save_model_folder, save_final, save_lora_final) or .loop (run_loop, Trainable) "
        "(under textgym.trainers unless named)"
    ),
}
"""Old dotted module name → where its names live now."""


class MovedModuleFinder(MetaPathFinder):
    """Fails the import of a moved module with an error that names the new place."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        """Raise for a name in `MOVED`; None (not ours) for any other.

        Raises:
            ModuleNotFoundError: `fullname` is in `MOVED`; the message names the new module.
        """
        if fullname in MOVED:
            # no `name=`: `from textgym import store` would otherwise swallow it into a bare
            # "cannot import name" (importlib's `_handle_fromlist` skips a missing submodule)
            raise ModuleNotFoundError(f"{fullname} has moved to {MOVED[fullname]}")
        return None


def install() -> None:
    """Append one `MovedModuleFinder` to `sys.meta_path` (idempotent)."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
