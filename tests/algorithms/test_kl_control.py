"""The KL controller owns β, the KL an iteration measured, and its checkpoint state."""

from __future__ import annotations

import pytest

from textgym.algorithms.kl_control import AdaptiveKLController, FixedKLController


def test_an_adaptive_beta_moves_once_per_commit_from_what_was_measured():
    kl = AdaptiveKLController(0.1, target=1.0, horizon=100)
    kl.commit()  # nothing measured: β stays
    assert kl.value == 0.1
    kl.measure(2.0, 10)  # e = clip(2/1 - 1, ±0.2) = 0.2; β·(1 + 0.2·10/100)
    assert kl.value == 0.1  # β of this iteration is still the old one until the update is done
    kl.commit()
    assert kl.value == pytest.approx(0.1 * 1.02, rel=1e-12) and kl.measured is None
    kl.commit()  # the measurement is used once
    assert kl.value == pytest.approx(0.102, rel=1e-12)


def test_beta_stays_while_the_policy_takes_no_step():
    """A critic's warm-up: the policy's KL to the reference is 0 there and would drive β down."""
    kl = AdaptiveKLController(0.1, target=1.0, horizon=100)
    kl.measure(0.0, 10)
    kl.commit(policy_moved=False)
    assert kl.value == 0.1 and kl.measured is None


def test_checkpoint_state_holds_an_adaptive_beta_and_nothing_for_a_fixed_one():
    moved = AdaptiveKLController(0.1, target=1.0, horizon=100)
    moved.measure(0.5, 100)
    moved.commit()
    resumed = AdaptiveKLController(0.1, target=1.0, horizon=100)
    resumed.load_checkpoint_state({"step": 3, "cursor": 8} | moved.checkpoint_state())
    assert resumed.value == moved.value == pytest.approx(0.1 * 0.8)
    fixed = FixedKLController(0.05)
    fixed.measure(9.0, 10)
    fixed.commit()
    assert fixed.value == 0.05 and fixed.checkpoint_state() == {}
    fixed.load_checkpoint_state({"step": 3})  # a checkpoint without β leaves the config's
    assert fixed.value == 0.05
