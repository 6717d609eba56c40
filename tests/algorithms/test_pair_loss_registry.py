"""The pair losses by name: each registered name is its function, with one call site per trainer."""

from __future__ import annotations

import pytest
import torch

from textgym.algorithms.preference_losses import (
    PAIR_LOSSES,
    PairLossInputs,
    dpo_loss,
    ipo_loss,
    orpo_loss,
    pair_loss,
    register_pair_loss,
    simpo_loss,
)
from textgym.algorithms.registry import UnknownNameError


def inputs(with_reference: bool = True) -> PairLossInputs:
    g = torch.Generator().manual_seed(0)
    lp = -torch.rand(2, 5, generator=g) * 20 - 1
    ref = -torch.rand(2, 5, generator=g) * 20 - 1
    lengths = torch.tensor([[3, 7, 1, 12, 5], [4, 2, 9, 6, 8]])
    return PairLossInputs(
        chosen_logps=lp[0], rejected_logps=lp[1], chosen_lengths=lengths[0], rejected_lengths=lengths[1],
        ref_chosen_logps=ref[0] if with_reference else None,
        ref_rejected_logps=ref[1] if with_reference else None,
        beta=0.3, label_smoothing=0.1, simpo_gamma=0.7, orpo_lambda=0.2,
    )  # fmt: skip


def test_each_registered_pair_loss_is_its_papers_function():
    x = inputs()
    avg_c, avg_r = x.chosen_logps / x.chosen_lengths, x.rejected_logps / x.rejected_lengths
    expected = {
        "dpo": dpo_loss(x.chosen_logps, x.rejected_logps, x.ref_chosen_logps, x.ref_rejected_logps,
                        beta=0.3, label_smoothing=0.1),
        "ipo": ipo_loss(x.chosen_logps, x.rejected_logps, x.ref_chosen_logps, x.ref_rejected_logps,
                        x.chosen_lengths, x.rejected_lengths, beta=0.3),
        "simpo": simpo_loss(avg_c, avg_r, beta=0.3, gamma=0.7, label_smoothing=0.1),
        "orpo": orpo_loss(avg_c, avg_r, -avg_c, lam=0.2),
    }  # fmt: skip
    assert PAIR_LOSSES.names() == sorted(expected)
    for name, (losses, stats) in expected.items():
        got, got_stats = pair_loss(name, x)
        torch.testing.assert_close(got, losses, rtol=0, atol=0)
        assert got_stats == stats
    # the four differ: a registry that mapped every name to one function would fail above
    assert len({tuple(v[0].tolist()) for v in expected.values()}) == 4


def test_a_reference_loss_without_reference_and_an_unknown_name_are_refused():
    with pytest.raises(ValueError, match="reference"):
        pair_loss("dpo", inputs(with_reference=False))
    with pytest.raises(
        KeyError, match=r"^loss: unknown pair loss 'kto'; registered: dpo, ipo, orpo, simpo \("
    ) as e:
        pair_loss("kto", inputs())
    assert isinstance(e.value, UnknownNameError)
    with pytest.raises(ValueError, match="already registered"):
        register_pair_loss("dpo")(lambda x: (x.chosen_logps, {}))
    pair_loss("simpo", inputs(with_reference=False))  # reference-free: fine
