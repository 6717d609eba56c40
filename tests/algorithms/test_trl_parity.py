"""Parity with TRL: on identical tensors, textgym's GRPO / DAPO / Dr. GRPO loss equals what
TRL's `GRPOTrainer._compute_loss` computes for the matching `loss_type` (value and gradient).

TRL is a test-only dependency (the `dev` extra). Its loss method is called on a trainer
object that carries only the attributes the method reads, with the per-token log-probs
injected in place of its model forward (`trl_fakes.trl_grpo_loss`), so both libraries see
exactly the same tensors.
"""

from __future__ import annotations

import pytest
import torch
from trl_fakes import trl_grpo_loss

from textgym.algorithms.clipped_loss import clipped_policy_loss

pytest.importorskip("trl.trainer.grpo_trainer")

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
    theirs, _ = trl_grpo_loss(
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
