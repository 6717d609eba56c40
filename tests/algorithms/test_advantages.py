"""Advantage estimators, GAE, KL placement and the new loss options against hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch

from textgym.algorithms.advantages import (
    discounted_returns,
    explained_variance,
    gae,
    overlong_penalty,
    rloo_advantages,
    token_level_rewards,
    turn_end_value_targets,
    whiten,
)
from textgym.algorithms.auxiliary import value_loss
from textgym.algorithms.clipped_loss import clipped_policy_loss
from textgym.algorithms.kl import kl_estimate
from textgym.algorithms.kl_control import AdaptiveKLController, FixedKLController

TOL = 1e-6


def test_rloo_is_leave_one_out():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])
    adv, stats = rloo_advantages(r, 4)
    # group 1: baselines (0+0+1)/3, (1+0+1)/3, ... ; group 2: all equal -> 0
    expected = [1 - 1 / 3, 0 - 2 / 3, 0 - 2 / 3, 1 - 1 / 3, 0, 0, 0, 0]
    assert torch.allclose(adv, torch.tensor(expected), atol=TOL)
    assert stats["rollout/zero_std_frac"] == 0.5
    with pytest.raises(ValueError, match="group_size >= 2"):
        rloo_advantages(r, 1)


def test_token_level_rewards_fold_k1_into_every_token():
    token_rewards = torch.tensor([[0.0, 0.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    logp = torch.tensor([[-1.0, -2.0, -0.5, -9.0]])
    ref = torch.tensor([[-1.5, -1.0, -0.5, -1.0]])
    r, stats = token_level_rewards(token_rewards, mask, logp, ref, kl_coef=0.1, estimator="k1")
    # k1 = logp - ref = [0.5, -1.0, 0.0]; r = R - 0.1*k1
    assert torch.allclose(r, torch.tensor([[-0.05, 0.1, 1.0, 0.0]]), atol=TOL)
    assert stats["kl/ref_seq"] == pytest.approx(-0.5, abs=TOL)
    assert stats["reward/kl_penalty"] == pytest.approx(0.05, abs=TOL)
    plain, none = token_level_rewards(token_rewards, mask)
    assert torch.equal(plain, token_rewards * mask) and none == {}
    with pytest.raises(ValueError, match="needs logprobs"):
        token_level_rewards(token_rewards, mask, kl_coef=0.1)


def test_whiten_and_returns_by_hand():
    x = torch.tensor([[1.0, 2.0, 100.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    w = whiten(x, mask, eps=0.0)
    # masked entries 1, 2, 3: mean 2, unbiased std 1
    assert torch.allclose(w, torch.tensor([[-1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]), atol=TOL)
    r = torch.tensor([[0.0, 0.0, 1.0, 0.0, 2.0]])
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0, 1.0]])  # column 3 is an environment token
    g = discounted_returns(r, m, gamma=0.5)
    # policy steps: r = 0, 0, 1, 2 -> returns 0.5+... : G3=2, G2=1+1=2, G1=0+1=1, G0=0.5
    assert torch.allclose(g, torch.tensor([[0.5, 1.0, 2.0, 0.0, 2.0]]), atol=TOL)


def gae_loop(rewards, values, mask, gamma, lam, bootstrap):
    """GAE over each row's policy tokens, written the plain way (a list per row)."""
    B, L = rewards.shape
    adv = torch.zeros(B, L, dtype=torch.float64)
    for i in range(B):
        steps = [t for t in range(L) if mask[i, t] > 0]
        a_next, v_next = 0.0, float(bootstrap[i])
        for t in reversed(steps):
            delta = float(rewards[i, t]) + gamma * v_next - float(values[i, t])
            a_next = delta + gamma * lam * a_next
            v_next = float(values[i, t])
            adv[i, t] = a_next
    return adv


@pytest.mark.parametrize("seed", range(5))
def test_vectorised_gae_matches_a_python_loop(seed):
    g = torch.Generator().manual_seed(seed)
    B, L = 7, 13
    rewards = torch.randn(B, L, generator=g)
    values = torch.randn(B, L, generator=g)
    # multi-turn masks: policy turns separated by environment tokens, right padding, an empty row
    mask = (torch.rand(B, L, generator=g) > 0.3).float()
    lengths = torch.randint(1, L + 1, (B,), generator=g)
    mask = mask * (torch.arange(L)[None] < lengths[:, None]).float()
    mask[0] = 0.0
    rewards = rewards * mask
    truncated = torch.rand(B, generator=g) > 0.5
    bootstrap = torch.where(truncated, torch.randn(B, generator=g), torch.zeros(B))
    gamma, lam = 0.97, 0.9
    adv, returns = gae(rewards, values, mask, gamma=gamma, lam=lam, bootstrap=bootstrap)
    ref = gae_loop(rewards, values, mask, gamma, lam, bootstrap)
    assert torch.allclose(adv.double(), ref, atol=1e-5)
    assert torch.allclose(returns.double(), (ref + values.double()) * mask.double(), atol=1e-5)
    assert torch.all(adv[mask == 0] == 0)


def test_gae_by_hand_with_truncation():
    rewards = torch.tensor([[0.0, 0.0, 1.0]])
    values = torch.tensor([[0.5, 0.25, 0.75]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    # steps: (r=0, V=0.5), (r=1, V=0.75), then bootstrap V=2 (truncated), γ=1, λ=0.5
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5, bootstrap=torch.tensor([2.0]))
    d1 = 1.0 + 2.0 - 0.75
    d0 = 0.0 + 0.75 - 0.5
    assert torch.allclose(adv, torch.tensor([[d0 + 0.5 * d1, 0.0, d1]]), atol=TOL)
    assert torch.allclose(ret, torch.tensor([[d0 + 0.5 * d1 + 0.5, 0.0, d1 + 0.75]]), atol=TOL)
    # terminated: no bootstrap
    adv_t, _ = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert float(adv_t[0, 2]) == pytest.approx(1.0 - 0.75, abs=TOL)


def test_turn_end_value_targets_by_hand_and_by_loop():
    # row 0: turn 1 = cols 0-1, env 2-3, turn 2 = cols 4-5, padding 6; row 1: one turn (no mid-episode end);
    # row 2: three turns, ends at cols 2 and 5 (each followed by env tokens, then policy tokens)
    mask = torch.tensor(
        [
            [1, 1, 0, 0, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0, 0, 0, 0],
            [1, 1, 0, 1, 1, 0, 0, 1, 0],
        ],
        dtype=torch.float32,
    )
    returns = torch.arange(1.0, 28.0).view(3, 9) * mask
    ends, targets = turn_end_value_targets(mask, returns)
    want_ends = torch.zeros(3, 9)
    want_ends[0, 2] = want_ends[2, 2] = want_ends[2, 5] = 1.0
    assert torch.equal(ends, want_ends)
    assert (
        targets[0, 2] == returns[0, 4] and targets[2, 2] == returns[2, 3] and targets[2, 5] == returns[2, 7]
    )
    assert float(targets.abs().sum()) == float(returns[0, 4] + returns[2, 3] + returns[2, 7])
    torch.manual_seed(0)  # against a plain loop on random masks
    mask = (torch.rand(6, 12) > 0.4).float()
    returns = torch.randn(6, 12) * mask
    ends, targets = turn_end_value_targets(mask, returns)
    for i in range(6):
        for t in range(12):
            later = [u for u in range(t + 1, 12) if mask[i, u] > 0]
            is_end = t > 0 and mask[i, t] == 0 and mask[i, t - 1] == 1 and bool(later)
            assert ends[i, t] == float(is_end)
            assert targets[i, t] == (returns[i, later[0]] if is_end else 0.0)


def test_overlong_penalty_is_dapo_eq_13():
    lengths = torch.tensor([10, 12, 14, 16, 20])
    pen = overlong_penalty(lengths, max_len=16, cache_len=4)
    assert torch.allclose(pen, torch.tensor([0.0, 0.0, -0.5, -1.0, -1.0]), atol=TOL)
    with pytest.raises(ValueError, match="cache_len"):
        overlong_penalty(lengths, 4, 8)


def test_dual_clip_caps_negative_advantage_losses():
    logp = torch.tensor([[math.log(5.0), math.log(1.5), math.log(0.5)]], requires_grad=True)
    old = torch.zeros(1, 3)
    adv = torch.tensor([[-1.0, -1.0, 2.0]])
    mask = torch.ones(1, 3)
    loss, stats = clipped_policy_loss(
        logp, old, adv, mask, clip_low=0.2, clip_high=0.2, aggregation="token_mean", dual_clip=3.0
    )
    # token 0: ratio 5, A=-1: standard loss max(5, 1.2)*1 = 5, dual clip caps at 3
    # token 1: ratio 1.5, A=-1: max(1.5, 1.2) = 1.5 (< 3, unchanged)
    # token 2: ratio 0.5, A=2: -min(1.0, 0.8*2=1.6) = -1.0
    assert float(loss.detach()) == pytest.approx((3.0 + 1.5 - 1.0) / 3, abs=TOL)
    assert stats["clip/frac_dual"] == pytest.approx(1 / 3, abs=TOL)
    loss.backward()
    assert logp.grad is not None and float(logp.grad[0, 0]) == 0.0  # the capped token has no gradient
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(logp, old, adv, mask, dual_clip=1.0)


def test_value_loss_clipped_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.5]])
    old = torch.tensor([[0.5, 0.0, 0.5]])
    returns = torch.tensor([[2.0, 1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, stats = value_loss(values, old, returns, mask, clip_range=0.2)
    # token 0: (1-2)^2 = 1 ; clipped V = 0.7 -> (0.7-2)^2 = 1.69 -> max 1.69
    # token 1: (0-1)^2 = 1 ; clipped = 0 -> 1
    assert float(loss) == pytest.approx(0.5 * (1.69 + 1.0) / 2, abs=TOL)
    assert stats["value/clip_frac"] == pytest.approx(0.5, abs=TOL)
    plain, _ = value_loss(values, old, returns, mask, clip_range=None)
    assert float(plain) == pytest.approx(0.5 * (1.0 + 1.0) / 2, abs=TOL)


def test_adaptive_kl_controller_by_hand():
    ctl = AdaptiveKLController(0.1, target=6.0, horizon=10000)
    ctl.update(current_kl=9.0, n_steps=256)  # error clip(0.5) = 0.2
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 256 / 10000), abs=1e-12)
    ctl.update(current_kl=5.4, n_steps=1000)  # error -0.1
    assert ctl.value == pytest.approx(0.1 * (1 + 0.2 * 0.0256) * (1 - 0.1 * 0.1), abs=1e-12)
    fixed = FixedKLController(0.05)
    fixed.update(100.0, 1000)
    assert fixed.value == 0.05
    with pytest.raises(ValueError):
        AdaptiveKLController(0.1, target=0.0, horizon=1)


def test_explained_variance():
    returns = torch.tensor([[1.0, 2.0, 3.0, 4.0]])
    mask = torch.ones(1, 4)
    assert explained_variance(returns, returns, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(returns, 2.5), returns, mask) == pytest.approx(0.0, abs=TOL)
    noisy = returns + torch.tensor([[0.5, -0.5, 0.5, -0.5]])
    # Var[R] = 5/3, Var[R - V] = 1/3 -> 0.8
    assert explained_variance(noisy, returns, mask) == pytest.approx(0.8, abs=TOL)


# --- KL placement: what the gradient of each estimator × placement is, exactly --------------


def _exact_expected_gradient(estimator: str, placement: str) -> tuple[torch.Tensor, torch.Tensor]:
    """E_{x~π}[gradient] of a KL penalty for a 5-way categorical π_θ, computed by enumeration.

    In the loss: E_π[∇_θ k(x)] with k evaluated at π_θ. In the reward: the score-function
    gradient E_π[k(x) ∇_θ log π_θ(x)] of E_π[k] with k held fixed (no gradient through k).
    Returns (that gradient, θ).
    """
    torch.manual_seed(0)
    theta = torch.randn(5, requires_grad=True)
    ref = torch.log_softmax(torch.randn(5), -1)
    logp = torch.log_softmax(theta, -1)
    probs = logp.exp().detach()
    k = kl_estimate(logp, ref, estimator)  # [5]: the estimate at each outcome x
    # in the loss: Σ_x π(x)·∇k(x), π as sampling weights; in the reward: REINFORCE with reward −β·k
    objective = (probs * k).sum() if placement == "loss" else (probs * k.detach() * logp).sum()
    (grad,) = torch.autograd.grad(objective, theta)
    return grad, theta


def _true_kl_gradient(theta: torch.Tensor, reverse: bool = True) -> torch.Tensor:
    torch.manual_seed(0)
    torch.randn(5)
    ref = torch.log_softmax(torch.randn(5), -1)
    t = theta.detach().clone().requires_grad_(True)
    logp = torch.log_softmax(t, -1)
    kl = (logp.exp() * (logp - ref)).sum() if reverse else (ref.exp() * (ref - logp)).sum()
    (g,) = torch.autograd.grad(kl, t)
    return g


def test_k1_in_the_reward_is_the_kl_gradient_and_k1_in_the_loss_is_zero():
    g_reward, theta = _exact_expected_gradient("k1", "reward")
    assert torch.allclose(g_reward, _true_kl_gradient(theta), atol=1e-6)
    g_loss, _ = _exact_expected_gradient("k1", "loss")
    assert torch.allclose(g_loss, torch.zeros(5), atol=1e-6)


def test_k2_in_the_loss_is_the_reverse_kl_gradient_and_k3_the_forward_one():
    g2, theta = _exact_expected_gradient("k2", "loss")
    assert torch.allclose(g2, _true_kl_gradient(theta), atol=1e-6)
    g3, _ = _exact_expected_gradient("k3", "loss")
    assert torch.allclose(g3, _true_kl_gradient(theta, reverse=False), atol=1e-6)
    assert not torch.allclose(g3, _true_kl_gradient(theta), atol=1e-3)


def test_k3_in_the_reward_is_biased():
    g, theta = _exact_expected_gradient("k3", "reward")
    assert not torch.allclose(g, _true_kl_gradient(theta), atol=1e-3)
