"""TRL's own loss code on given tensors, for the parity tests (`from trl_fakes import ...`).

A TRL trainer is built with `object.__new__` (no model, no dataset, no `accelerate` state) and
given only the attributes its loss method reads (`trl_trainer`), with a one-process stand-in for
the `accelerate.Accelerator` (`FakeAccelerator`); the model forward is replaced by the given
per-token log-probs, so TRL and textgym see exactly the same numbers. TRL is a test-only
dependency (the `dev` extra): `trl_grpo_loss` skips the calling test without it; the parity
files skip themselves with `pytest.importorskip` on the TRL modules they use.
"""

from __future__ import annotations

import collections
import types
from typing import Any

import pytest
import torch


class FakeAccelerator:
    """One process on the CPU: gathers and reductions return their input, gradients always sync."""

    num_processes = 1
    sync_gradients = True
    device = torch.device("cpu")

    def gather(self, x: Any) -> torch.Tensor:
        return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)

    gather_for_metrics = gather

    def reduce(self, x: Any, reduction: str = "sum") -> Any:
        return x

    def unwrap_model(self, model: Any) -> Any:
        return model


def trl_trainer(cls: type, **attrs: Any) -> Any:
    """An instance of the TRL trainer class `cls` without its `__init__`, carrying `attrs` over the
    attributes every TRL loss reads: the accelerator, a model in training mode, the metric lists."""
    trainer = object.__new__(cls)
    trainer.__dict__.update(
        {
            "accelerator": FakeAccelerator(),
            "model": types.SimpleNamespace(training=True),
            "_metrics": {"train": collections.defaultdict(list), "eval": collections.defaultdict(list)},
            "_total_train_tokens": 0,
            "_tp_size": 1,
            "aux_loss_enabled": False,
            **attrs,
        }
    )
    return trainer


def trl_grpo_loss(
    logps: torch.Tensor,
    old: torch.Tensor,
    ref: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    *,
    loss_type: str,
    eps_low: float,
    eps_high: float,
    beta: float,
    max_len: int,
    level: str = "token",
    tis: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, list[float]]]:
    """TRL 1.16's `GRPOTrainer._compute_loss` on the given tensors, and the metrics it logged.

    Args:
        logps: the per-token log-probs `[B, L]` its model forward returns (the tensor to
            differentiate).
        old, ref: π_old's and the reference's per-token log-probs; `ref` is used when `beta` > 0.
        adv: one advantage per row `[B]`.
        mask: the completion mask `[B, L]`.
        loss_type, eps_low, eps_high, beta, max_len: TRL's `loss_type`, `epsilon_low`,
            `epsilon_high`, `beta` and `max_completion_length`.
        level: TRL's `importance_sampling_level` ("token", or "sequence" for GSPO).
        tis: the per-token vLLM importance weights TRL multiplies the policy term by.
    """
    trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")
    B, L = logps.shape
    trainer = trl_trainer(
        trl_grpo.GRPOTrainer,
        loss_type=loss_type,
        beta=beta,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        importance_sampling_level=level,
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=tis is not None,
        vllm_importance_sampling_correction=tis is not None,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
    )
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (logps, torch.zeros(B, L), None)
    inputs = {
        "prompt_ids": torch.zeros(B, 2, dtype=torch.long),
        "prompt_mask": torch.ones(B, 2, dtype=torch.long),
        "completion_ids": torch.zeros(B, L, dtype=torch.long),
        "completion_mask": mask.long(),
        "advantages": adv,
        "old_per_token_logps": old,
        "num_items_in_batch": mask.sum(),
    }
    if beta:
        inputs["ref_per_token_logps"] = ref
    if tis is not None:
        inputs["importance_sampling_ratio"] = tis
    return trainer._compute_loss(None, inputs), trainer._metrics["train"]
