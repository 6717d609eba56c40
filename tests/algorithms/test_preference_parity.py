"""Parity with TRL: on identical log-prob tensors, textgym's DPO, IPO, KTO, SimPO and ORPO losses
equal what TRL 1.16's trainers compute for the matching loss types, to 1e-5.

TRL's loss methods are called on trainer objects carrying only the attributes they read
(`trl_fakes.trl_trainer`), with a stand-in model whose forward returns the given per-token
log-probs, so both libraries see exactly the same numbers. TRL is a test-only dependency (the
`dev` extra).
"""

from __future__ import annotations

import types

import pytest
import torch
from trl_fakes import trl_trainer

from textgym.algorithms.preference_losses import dpo_loss, ipo_loss, kto_loss, orpo_loss, simpo_loss

trl_dpo = pytest.importorskip("trl.trainer.dpo_trainer")
trl_kto = pytest.importorskip("trl.trainer.kto_trainer")
trl_cpo = pytest.importorskip("trl.experimental.cpo.cpo_trainer")
trl_orpo = pytest.importorskip("trl.experimental.orpo.orpo_trainer")

TOL = 1e-5


def _outputs(per_token: torch.Tensor) -> types.SimpleNamespace:
    n, L = per_token.shape
    return types.SimpleNamespace(
        log_probs=per_token,
        entropy=torch.zeros(n, L),
        mean_logits=torch.zeros(n, L),
        is_top1=torch.zeros(n, L, dtype=torch.bool),
        aux_loss=torch.zeros(()),
    )


def _pairs(seed: int, B: int = 6, L: int = 7):
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(2 * B, L, generator=g) < 0.8).float()
    mask[:, 0] = 1.0
    per_token = -torch.rand(2 * B, L, generator=g) * 2.0 * mask
    ref = -torch.rand(2 * B, generator=g) * 5.0 - 1.0
    return per_token, mask, ref


def trl_dpo_loss(per_token, mask, ref, *, loss_type, beta):
    n, L = per_token.shape
    trainer = trl_trainer(
        trl_dpo.DPOTrainer,
        loss_types=[loss_type],
        loss_weights=[1.0],
        beta=beta,
        label_smoothing=0.0,
        f_divergence_type="reverse_kl",
        ld_alpha=None,
        precompute_ref_logps=True,
        use_weighting=False,
    )
    completion_mask = torch.cat([torch.zeros(n, 1), mask], dim=1).long()
    inputs = {
        "input_ids": torch.zeros(n, L + 1, dtype=torch.long),
        "attention_mask": torch.ones(n, L + 1, dtype=torch.long),
        "completion_mask": completion_mask,
        "ref_chosen_logps": ref[: n // 2],
        "ref_rejected_logps": ref[n // 2 :],
    }
    return trainer._compute_loss(lambda **kw: _outputs(per_token), inputs, return_outputs=False)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("beta", [0.1, 0.5])
def test_dpo_and_ipo_match_trl(seed, beta):
    per_token, mask, ref = _pairs(seed)
    B = per_token.shape[0] // 2
    logps = per_token.sum(1)
    lengths = mask.sum(1)
    ours, _ = dpo_loss(logps[:B], logps[B:], ref[:B], ref[B:], beta=beta)
    theirs = trl_dpo_loss(per_token, mask, ref, loss_type="sigmoid", beta=beta)
    assert abs(float(ours.mean()) - float(theirs)) < TOL
    ours, _ = ipo_loss(logps[:B], logps[B:], ref[:B], ref[B:], lengths[:B], lengths[B:], beta=beta)
    theirs = trl_dpo_loss(per_token, mask, ref, loss_type="ipo", beta=beta)
    assert abs(float(ours.mean()) - float(theirs)) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kto_matches_trl(seed):
    per_token, mask, ref = _pairs(seed, B=5)
    n, L = per_token.shape
    g = torch.Generator().manual_seed(seed + 10)
    labels = torch.rand(n, generator=g) < 0.5
    labels[0], labels[1] = True, False
    kl_logps = -torch.rand(n, generator=g) * 4.0
    ref_kl_logps = kl_logps - 0.3 * torch.rand(n, generator=g)  # KL estimate > 0
    beta, wd, wu = 0.2, 1.0, 1.33
    trainer = trl_trainer(
        trl_kto.KTOTrainer,
        loss_type="kto",
        beta=beta,
        desirable_weight=wd,
        undesirable_weight=wu,
        calculate_KL=True,
        precompute_ref_logps=True,
    )
    trainer._compute_kl_logps = lambda model, batch: kl_logps
    inputs = {
        "input_ids": torch.zeros(n, L + 1, dtype=torch.long),
        "attention_mask": torch.ones(n, L + 1, dtype=torch.long),
        "completion_mask": torch.cat([torch.zeros(n, 1), mask], dim=1).long(),
        "label": labels,
        "ref_logps": ref,
        "ref_KL_logps": ref_kl_logps,
    }
    theirs = trainer._compute_loss(lambda **kw: _outputs(per_token), inputs, return_outputs=False)
    ours, stats = kto_loss(
        per_token.sum(1),
        ref,
        labels,
        kl_logps,
        ref_kl_logps,
        beta=beta,
        desirable_weight=wd,
        undesirable_weight=wu,
    )
    assert abs(float(ours.mean()) - float(theirs)) < TOL
    assert abs(stats["kl"] - trainer._metrics["train"]["kl"][-1]) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_simpo_and_orpo_match_trl(seed):
    per_token, mask, _ = _pairs(seed)
    B = per_token.shape[0] // 2
    avg = per_token.sum(1) / mask.sum(1)
    cpo = trl_trainer(
        trl_cpo.CPOTrainer, loss_type="simpo", beta=2.5, simpo_gamma=1.2, label_smoothing=0.0, alpha=0.0
    )
    theirs, _, _ = cpo.cpo_loss(avg[:B], avg[B:])
    ours, _ = simpo_loss(avg[:B], avg[B:], beta=2.5, gamma=1.2)
    torch.testing.assert_close(ours, theirs, atol=TOL, rtol=0)
    orpo = trl_trainer(trl_orpo.ORPOTrainer, beta=0.1)
    ratio_term, _, _, _, _ = orpo.odds_ratio_loss(avg[:B], avg[B:])
    nll = -avg[:B]
    ours, _ = orpo_loss(avg[:B], avg[B:], nll, lam=0.1)
    # TRL's ORPO loss is NLL − mean(λ·log σ(log odds)); its odds_ratio_loss returns λ·log σ(·).
    torch.testing.assert_close(ours, nll - ratio_term, atol=TOL, rtol=0)
