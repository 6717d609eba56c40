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
    "textgym.agents.rollout_servers": "textgym.training.sources.servers",
    "textgym.suites": "textgym.evaluation.suites",
    "textgym.plotting": "textgym.evaluation.plotting",
    "textgym.store": "textgym.offline.store",
    "textgym.agents.scripted": "textgym.evaluation.scripted",
    "textgym.trainers.dpo": "textgym.trainers.preference.offline",
    "textgym.trainers.prm_labels": "textgym.offline.prm_labels",
    "textgym.trainers.logging": "textgym.tracking",
    "textgym.trainers.common": (
        "its concern's module: textgym.training.seeding (seed_everything, resolve_device), "
        ".logprobs (sequence_logprobs, shared_prompt_rows), .batch (RolloutBatch, "
        "rank_micro_batches), .sampler (TaskSampler), .optim (build_optimizer, load_optimizer, "
        "save_optimizer), textgym.tracking (MetricsLogger, NullLogger, metrics_logger, "
        "progress_bar), "
        ".checkpoint (save_checkpoint, load_checkpoint, latest_checkpoint, load_weights, "
        "save_model_folder, save_final, save_lora_final) or .loop (run_loop, Trainable) "
        "(under textgym.training unless named)"
    ),
    # the trainers/ folder split into algorithms/ (pure maths), training/ (machinery) and
    # trainers/ (one class per family), 2026-11-27
    "textgym.trainers.losses": (
        "textgym.algorithms: .aggregate (aggregate, Aggregation), .kl (kl_estimate, k3, "
        "KLEstimator), .auxiliary (entropy_from_logits, sft_loss, value_loss), .correction "
        "(rollout_correction); the clipped policy loss to textgym.algorithms.clipped_loss"
    ),
    "textgym.trainers.advantages": "textgym.algorithms.advantages",
    "textgym.trainers.registry": "textgym.algorithms.registry",
    "textgym.trainers.clipped_loss": "textgym.algorithms.clipped_loss",
    "textgym.trainers.policy_losses": "textgym.algorithms.policy_losses",
    "textgym.trainers.preference_losses": "textgym.algorithms.preference_losses",
    "textgym.trainers.kl_control": "textgym.algorithms.kl_control",
    "textgym.trainers.batch": "textgym.training.batch",
    "textgym.trainers.logprobs": "textgym.training.logprobs",
    "textgym.trainers.checkpoint": "textgym.training.checkpoint",
    "textgym.trainers.optim": "textgym.training.optim",
    "textgym.trainers.precision": "textgym.training.precision",
    "textgym.trainers.lora": "textgym.training.lora",
    "textgym.trainers.placement": "textgym.training.placement",
    "textgym.trainers.sampler": "textgym.training.sampler",
    "textgym.trainers.seeding": "textgym.training.seeding",
    "textgym.trainers.loop": "textgym.training.loop",
    "textgym.trainers.env_factory": "textgym.training.envs",
    "textgym.trainers.rollouts": "textgym.training.rollout_metrics",
    "textgym.trainers.judge_reward": "textgym.training.judge_reward",
    "textgym.trainers.engine": "textgym.training.sources.vllm_engine",
    "textgym.trainers.remote_rollouts": "textgym.training.sources.remote",
    "textgym.trainers.async_rollouts": "textgym.training.sources.async_producer",
    "textgym.trainers.on_policy": "textgym.trainers.rl.on_policy",
    "textgym.trainers.update": "textgym.trainers.rl.update",
    "textgym.trainers.grpo": "textgym.trainers.rl.grpo",
    "textgym.trainers.ppo": "textgym.trainers.rl.ppo (its critic: textgym.trainers.rl.critic)",
    "textgym.trainers.online_dpo": "textgym.trainers.preference.online",
    "textgym.trainers.online_dpo_pairs": "textgym.trainers.preference.online_pairs",
    "textgym.trainers.reward_model": "textgym.trainers.reward.bradley_terry",
    "textgym.trainers.reward_model_forward": "textgym.trainers.reward.bradley_terry_forward",
    "textgym.trainers.prm": "textgym.trainers.reward.prm",
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
