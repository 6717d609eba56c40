"""Parity with TRL: on identical tensors, textgym's GRPO / DAPO / Dr. GRPO loss equals what
TRL's `GRPOTrainer._compute_loss` computes for the matching `loss_type` (value and gradient).

TRL is a test-only dependency (the `dev` extra). Its loss method is called on a trainer
object that carries only the attributes the method reads, with the per-token log-probs
injected in place of its model forward, so both libraries see exactly the same tensors.
"""

from __future__ import annotations

import types

import pytest
import torch

from textgym.algorithms.clipped_loss import clipped_policy_loss

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")


class _Accelerator:
    num_processes = 1
    sync_gradients = True

    def gather(self, x):
        return x

    gather_for_metrics = gather

    def reduce(self, x, reduction="sum"):
        return x


def trl_loss(per_token_logps, old, ref, adv, mask, *, loss_type, eps_low, eps_high, beta, max_len):
    """TRL's loss on the given tensors (its model forward replaced by `per_token_logps`)."""
    trainer = object.__new__(trl_grpo.GRPOTrainer)
    B, L = per_token_logps.shape
    trainer.__dict__.update(
        loss_type=loss_type,
        beta=beta,
        epsilon_low=eps_low,
        epsilon_high=eps_high,
        importance_sampling_level="token",
        top_entropy_quantile=1.0,
        off_policy_mask_threshold=None,
        use_vllm=False,
        aux_loss_enabled=False,
        _entropy_bonus_enabled=False,
        current_gradient_accumulation_steps=1,
        max_completion_length=max_len,
        accelerator=_Accelerator(),
        args=types.SimpleNamespace(delta=None, use_bias_correction_kl=False, steps_per_generation=1),
        model=types.SimpleNamespace(training=True),
        _metrics={"train": __import__("collections").defaultdict(list)},
    )
    trainer._get_per_token_logps_and_entropies = lambda *a, **k: (per_token_logps, torch.zeros(B, L), None)
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
    return trainer._compute_loss(None, inputs)


CASES = {
    # loss_type: (textgym aggregation, eps_low, eps_high, beta)
    "grpo": ("seq_mean_token_mean", 0.2, 0.2, 0.04),
    "dapo": ("token_mean", 0.2, 0.28, 0.0),
    "dr_grpo": ("seq_mean_token_sum_norm", 0.2, 0.2, 0.0),
    "bnpo": ("token_mean", 0.2, 0.2, 0.04),
}


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("loss_type", list(CASES))
def test_loss_and_gradient_match_trl(loss_type, seed):
    aggregation, eps_low, eps_high, beta = CASES[loss_type]
    g = torch.Generator().manual_seed(seed)
    B, L, max_len = 6, 9, 12
    old = -torch.rand(B, L, generator=g) * 3
    logp0 = old + 0.4 * torch.randn(B, L, generator=g)  # ratios well outside [0.8, 1.28]
    ref = old + 0.3 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]).float()

    ours_lp = logp0.clone().requires_grad_(True)
    ours, _ = clipped_policy_loss(
        ours_lp,
        old,
        adv,
        mask,
        clip_low=eps_low,
        clip_high=eps_high,
        aggregation=aggregation,  # type: ignore[arg-type]
        ref_logprobs=ref if beta else None,
        kl_coef=beta,
        kl_estimator="k3",
        norm_len=max_len,
    )
    ours.backward()

    theirs_lp = logp0.clone().requires_grad_(True)
    theirs = trl_loss(
        theirs_lp, old, ref, adv, mask, loss_type=loss_type, eps_low=eps_low, eps_high=eps_high, beta=beta,
        max_len=max_len,
    )  # fmt: skip
    theirs.backward()

    assert abs(float(ours.detach()) - float(theirs.detach())) < 1e-5
    assert ours_lp.grad is not None and theirs_lp.grad is not None
    assert torch.allclose(ours_lp.grad * mask, theirs_lp.grad * mask, atol=1e-5)
    # the case exercises clipping on both sides
    ratio = (logp0 - old).exp()
    assert bool(((ratio > 1 + eps_high) & (mask > 0)).any())
    assert bool(((ratio < 1 - eps_low) & (mask > 0)).any())
