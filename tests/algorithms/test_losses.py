from __future__ import annotations

import itertools
import math
import statistics

import pytest
import torch

from textgym.algorithms.advantages import group_advantages, token_level_rewards
from textgym.algorithms.aggregate import aggregate
from textgym.algorithms.auxiliary import entropy_from_logits, sft_loss
from textgym.algorithms.clipped_loss import clipped_policy_loss
from textgym.algorithms.correction import rollout_correction
from textgym.algorithms.kl import kl_estimate
from textgym.evaluation import pass_at_k

TOL = 1e-6


# --- hand-computed values ------------------------------------------------------------------------


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv, stats = group_advantages(rewards, 4, "group", eps=0.0)
    s = math.sqrt(1 / 3)  # unbiased std of [1, 0, 0, 1]
    expected = [0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s, 0, 0, 0, 0]
    assert adv.tolist() == pytest.approx(expected, abs=TOL)
    assert stats["rollout/zero_std_frac"] == 0.5
    adv, _ = group_advantages(rewards, 4, "none")
    assert adv.tolist() == pytest.approx([0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0], abs=TOL)
    adv, _ = group_advantages(rewards, 4, "batch", eps=0.0)
    batch_std = statistics.stdev(rewards.tolist())  # 0.4629100...
    assert adv.tolist() == pytest.approx(
        [0.5 / batch_std, -0.5 / batch_std, -0.5 / batch_std, 0.5 / batch_std, 0, 0, 0, 0], abs=TOL
    )
    with pytest.raises(ValueError, match="multiple"):
        group_advantages(torch.ones(6), 4)


def test_aggregation_hand_computed():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 9.0, 9.0]])
    m = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert float(aggregate(x, m, "token_mean")) == pytest.approx(10 / 4, abs=TOL)
    assert float(aggregate(x, m, "seq_mean_token_mean")) == pytest.approx((2 + 4) / 2, abs=TOL)
    assert float(aggregate(x, m, "seq_mean_token_sum_norm", norm_len=5)) == pytest.approx(
        10 / (2 * 5), abs=TOL
    )
    with pytest.raises(ValueError):
        aggregate(x, m, "sum")  # type: ignore[arg-type]


def test_kl_estimators_hand_computed():
    lp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    # log_ratio = log(ref/p) = log 0.5
    assert float(kl_estimate(lp, ref, "k1")) == pytest.approx(math.log(2), abs=TOL)
    assert float(kl_estimate(lp, ref, "k2")) == pytest.approx(0.5 * math.log(2) ** 2, abs=TOL)
    assert float(kl_estimate(lp, ref, "k3")) == pytest.approx(0.5 - 1 + math.log(2), abs=TOL)
    assert float(kl_estimate(lp, lp, "k3")) == 0.0


def test_k3_is_an_unbiased_estimate_of_kl():
    # Exact expectation over a 4-way categorical: E_p[k1] = E_p[k3] = KL(p || q).
    p = torch.tensor([0.1, 0.2, 0.3, 0.4])
    q = torch.tensor([0.25, 0.25, 0.25, 0.25])
    kl = float((p * (p / q).log()).sum())
    for est in ("k1", "k3"):
        assert float((p * kl_estimate(p.log(), q.log(), est)).sum()) == pytest.approx(kl, abs=TOL)


def test_k3_keeps_its_gradient_far_from_the_reference():
    # log_ratio = log π_ref − log π_θ: π_θ ≫ π_ref (−30, −25), normal (0.5, −0.5), beyond the cap (25, 30)
    x = torch.tensor([-30.0, -25.0, -0.5, 0.5, 25.0, 30.0])
    lp = torch.zeros(6, requires_grad=True)
    est = kl_estimate(lp, x, "k3")
    est.sum().backward()
    c = 20.0  # K3_CAP: above it k3 continues as e^c·(1 + x − c) − 1 − x
    want = [math.exp(v) - 1 - v if v <= c else math.exp(c) * (1 + v - c) - 1 - v for v in x.tolist()]
    assert est.detach().tolist() == pytest.approx(want, rel=1e-6)
    # d k3 / d log π_θ = −(e^x − 1) below the cap, −(e^c − 1) above it: never 0 off x = 0
    grad = [-(math.exp(min(v, c)) - 1) for v in x.tolist()]
    assert lp.grad.tolist() == pytest.approx(grad, rel=1e-6)
    assert lp.grad[0] == pytest.approx(1.0, abs=1e-9) and lp.grad[1] == pytest.approx(1.0, abs=1e-9)
    # far beyond float32's exp overflow: finite, with the capped gradient
    lp2 = torch.zeros(1, requires_grad=True)
    kl_estimate(lp2, torch.tensor([200.0]), "k3").sum().backward()
    assert math.isfinite(float(lp2.grad[0]))
    assert float(lp2.grad[0]) == pytest.approx(-(math.exp(c) - 1), rel=1e-6)


def test_the_ratio_exp_cannot_overflow_into_nan():
    # Token 0 has log ρ = 100 (e^100 = inf in float32) and Â = 0; token 1 is normal (ρ = 1.1, Â = 1).
    lp = torch.tensor([[100.0, math.log(1.1)]], requires_grad=True)
    old, mask = torch.zeros(1, 2), torch.ones(1, 2)
    loss, stats = clipped_policy_loss(lp, old, torch.tensor([[0.0, 1.0]]), mask)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(-1.1 / 2, abs=TOL)  # the normal token exactly as before
    assert lp.grad[0].tolist() == pytest.approx([0.0, -1.1 / 2], abs=TOL)
    assert all(math.isfinite(v) for v in stats.values())
    assert stats["ratio/max"] == pytest.approx(math.exp(20.0), rel=1e-6)
    # Â < 0 there: the unclipped branch ρ·Â is taken at ρ = e^20, finite, no gradient
    lp.grad = None
    loss, _ = clipped_policy_loss(lp, old, torch.tensor([[-1.0, 1.0]]), mask)
    loss.backward()
    assert float(loss.detach()) == pytest.approx((math.exp(20.0) - 1.1) / 2, rel=1e-6)
    assert lp.grad[0].tolist() == pytest.approx([0.0, -1.1 / 2], abs=TOL)


def test_k3_metrics_are_never_negative():
    # Log-ratios below half an ulp of 1 (2^-24): exp(x) rounds to 1, so the naive
    # exp(x) − 1 − x is −x < 0 in float32, while k3 ≈ x²/2 ≥ 0.
    tiny = torch.tensor([[3e-8, 5e-8, 1e-8]])
    naive = tiny.exp() - 1 - tiny
    assert bool((naive < 0).all())  # what the metrics computed before
    mask = torch.ones(1, 3)
    old = torch.full((1, 3), -1e-3)  # float32 resolves 1e-8 steps at this magnitude
    lp = old + tiny  # log π_θ − log π_old = tiny
    ref = lp + tiny  # log π_ref − log π_θ = tiny
    _, stats = clipped_policy_loss(
        lp, old, torch.zeros(1), mask, ref_logprobs=ref, kl_coef=0.1, kl_estimator="k3"
    )
    _, corr = rollout_correction(lp, old, mask)
    _, in_reward = token_level_rewards(torch.zeros(1, 3), mask, lp, ref, kl_coef=0.1, estimator="k3")
    for value in (stats["kl/old_approx"], stats["kl/ref"], corr["mismatch/k3"], in_reward["kl/ref"]):
        assert 0.0 <= value <= 1e-14


@pytest.mark.parametrize(
    ("adv", "clip_high", "loss", "frac_low", "frac_high"),
    [
        (1.0, 0.2, -(1.2 + 0.5) / 2, 0.0, 0.5),  # ratio 1.5 clipped at 1.2; 0.5 kept
        (-1.0, 0.2, (1.5 + 0.8) / 2, 0.5, 0.0),  # ratio 0.5 clipped at 0.8; 1.5 kept (pessimistic)
        (1.0, 0.28, -(1.28 + 0.5) / 2, 0.0, 0.5),  # clip-higher
    ],
)
def test_clipped_policy_loss_hand_computed(adv, clip_high, loss, frac_low, frac_high):
    logprobs = torch.tensor([[math.log(1.5), math.log(0.5)]], requires_grad=True)
    old = torch.zeros(1, 2)
    got, stats = clipped_policy_loss(
        logprobs, old, torch.tensor([adv]), torch.ones(1, 2), clip_low=0.2, clip_high=clip_high
    )
    assert float(got.detach()) == pytest.approx(loss, abs=TOL)
    assert stats["clip/frac_low"] == frac_low and stats["clip/frac_high"] == frac_high
    assert stats["ratio/max"] == pytest.approx(1.5, abs=TOL)
    got.backward()
    # clipped tokens carry no gradient; an unclipped token's gradient is -A·ratio/num_tokens
    g = logprobs.grad[0].tolist()
    unclipped = 1 if adv > 0 else 0
    assert g[1 - unclipped] == 0.0
    assert g[unclipped] == pytest.approx(-adv * [1.5, 0.5][unclipped] / 2, abs=TOL)


def test_kl_term_in_loss_hand_computed():
    lp = torch.tensor([[math.log(0.5)]])
    ref = torch.tensor([[math.log(0.25)]])
    loss, stats = clipped_policy_loss(
        lp, lp.clone(), torch.tensor([0.0]), torch.ones(1, 1), ref_logprobs=ref, kl_coef=0.1
    )
    assert float(loss) == pytest.approx(0.1 * (0.5 - 1 + math.log(2)), abs=TOL)
    assert stats["kl/ref"] == pytest.approx(0.5 - 1 + math.log(2), abs=TOL)
    with pytest.raises(ValueError, match="ref_logprobs"):
        clipped_policy_loss(lp, lp, torch.tensor([0.0]), torch.ones(1, 1), kl_coef=0.1)


def test_rollout_correction_hand_computed():
    # log π_old − log π_rollout = [ln 3, ln 0.5, 0 | ln 1.5, (masked)]
    trainer = torch.tensor([[math.log(0.6), math.log(0.1), -1.0], [math.log(0.3), -5.0, 0.0]])
    rollout = torch.tensor([[math.log(0.2), math.log(0.2), -1.0], [math.log(0.2), -1.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    w, stats = rollout_correction(trainer, rollout, mask, cap=2.0)
    torch.testing.assert_close(w, torch.tensor([[2.0, 0.5, 1.0], [1.5, 0.0, 0.0]]), atol=TOL, rtol=0)
    logs = [math.log(3), math.log(0.5), 0.0, math.log(1.5)]
    assert stats["mismatch/kl"] == pytest.approx(-sum(logs) / 4, abs=TOL)
    k3 = sum(math.exp(x) - 1 - x for x in logs) / 4
    assert stats["mismatch/k3"] == pytest.approx(k3, abs=TOL)
    assert stats["mismatch/ratio_max"] == pytest.approx(3.0, abs=1e-5)
    assert stats["mismatch/ratio_min"] == pytest.approx(0.5, abs=1e-6)
    assert stats["mismatch/abs_diff_max"] == pytest.approx(math.log(3), abs=1e-6)
    assert stats["mismatch/tis_clip_frac"] == pytest.approx(0.25)
    w, stats = rollout_correction(trainer, rollout, mask, cap=None)
    assert w.tolist() == [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]] and stats["mismatch/tis_clip_frac"] == 0.0
    # the decoupled objective's behaviour weight (AReaL eq. 5): the token above the cap is dropped
    w, stats = rollout_correction(trainer, rollout, mask, cap=2.0, drop_above_cap=True)
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.5, 1.0], [1.5, 0.0, 0.0]]), atol=TOL, rtol=0)
    assert stats["mismatch/tis_clip_frac"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="shapes differ"):
        rollout_correction(trainer, rollout[:, :2], mask)
    with pytest.raises(ValueError, match="cap must be > 0"):
        rollout_correction(trainer, rollout, mask, cap=0.0)


def test_importance_weights_scale_each_tokens_policy_gradient():
    torch.manual_seed(0)
    lp = torch.randn(2, 4, requires_grad=True)
    old = lp.detach() + 0.05 * torch.randn(2, 4)
    adv = torch.tensor([1.0, -0.5])
    mask = torch.ones(2, 4)
    w = torch.tensor([[2.0, 1.0, 0.5, 0.0], [1.0, 1.5, 2.0, 0.25]])
    loss_w, _ = clipped_policy_loss(lp, old, adv, mask, aggregation="token_mean", is_weights=w)
    (g_w,) = torch.autograd.grad(loss_w, lp)
    # The per-token gradient of a token mean is that token's own term's: weighting scales it.
    per_tok = []
    for b in range(2):
        for t in range(4):
            m = torch.zeros(2, 4)
            m[b, t] = 1.0
            loss_t, _ = clipped_policy_loss(lp, old, adv, m, aggregation="token_mean")
            per_tok.append(torch.autograd.grad(loss_t, lp)[0][b, t] / 8)
    expected = torch.stack(per_tok).view(2, 4) * w
    torch.testing.assert_close(g_w, expected, atol=1e-7, rtol=0)


def test_entropy_and_sft_loss_hand_computed():
    assert float(entropy_from_logits(torch.zeros(4))) == pytest.approx(math.log(4), abs=TOL)
    lp = torch.tensor([[math.log(0.5), math.log(0.25)], [math.log(0.125), 0.0]])
    loss, _ = sft_loss(lp, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))
    assert float(loss) == pytest.approx((math.log(2) + math.log(4) + math.log(8)) / 3, abs=TOL)


def test_pass_at_k_hand_computed_and_by_enumeration():
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - 3 / 10, abs=TOL)
    assert pass_at_k(5, 0, 3) == 0.0 and pass_at_k(5, 4, 2) == 1.0
    for n, c, k in [(6, 2, 3), (7, 3, 1), (8, 1, 4)]:
        outcomes = [1] * c + [0] * (n - c)
        subsets = list(itertools.combinations(range(n), k))
        frac = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
        assert pass_at_k(n, c, k) == pytest.approx(frac, abs=TOL)
    with pytest.raises(ValueError):
        pass_at_k(3, 4, 1)


# --- vectorised versions against plain loops -----------------------------------------------------


def _loop_policy_loss(lp, old, adv, mask, cl, ch, mode, beta, ref, norm_len):
    B, L = len(lp), len(lp[0])
    per_seq, total, ntok = [], 0.0, 0.0
    for i in range(B):
        s, n = 0.0, 0.0
        for t in range(L):
            if mask[i][t] == 0:
                continue
            r = math.exp(lp[i][t] - old[i][t])
            term = -min(r * adv[i], min(max(r, 1 - cl), 1 + ch) * adv[i])
            if beta:
                x = ref[i][t] - lp[i][t]
                term += beta * (math.exp(x) - 1 - x)
            s += term
            n += 1
        per_seq.append(s / max(n, 1))
        total += s
        ntok += n
    if mode == "token_mean":
        return total / ntok
    if mode == "seq_mean_token_mean":
        return sum(per_seq) / B
    return total / (B * norm_len)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("beta", [0.0, 0.05])
def test_clipped_policy_loss_matches_loop(mode, beta):
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        B, L = 6, 9
        lp = -torch.rand(B, L, generator=g, dtype=torch.float64) * 3
        old = lp + 0.3 * torch.randn(B, L, generator=g, dtype=torch.float64)
        ref = lp + 0.3 * torch.randn(B, L, generator=g, dtype=torch.float64)
        adv = torch.randn(B, generator=g, dtype=torch.float64)
        lengths = torch.randint(1, L + 1, (B,), generator=g)
        mask = (torch.arange(L)[None] < lengths[:, None]).double()
        mask[0, 0] = 0.0  # an environment token inside a sequence
        got, _ = clipped_policy_loss(
            lp,
            old,
            adv,
            mask,
            clip_low=0.2,
            clip_high=0.28,
            aggregation=mode,
            ref_logprobs=ref,
            kl_coef=beta,
            norm_len=12,
        )
        want = _loop_policy_loss(
            lp.tolist(), old.tolist(), adv.tolist(), mask.tolist(), 0.2, 0.28, mode, beta, ref.tolist(), 12
        )
        assert float(got) == pytest.approx(want, abs=TOL)


def test_group_advantages_match_loop():
    g = torch.Generator().manual_seed(1)
    rewards = torch.randint(0, 3, (40,), generator=g).double() / 2
    adv, _ = group_advantages(rewards, 5, "group", eps=1e-4)
    for k in range(8):
        grp = rewards[k * 5 : (k + 1) * 5].tolist()
        mu, sd = statistics.mean(grp), statistics.stdev(grp)
        for j, r in enumerate(grp):
            want = 0.0 if sd == 0 else (r - mu) / (sd + 1e-4)
            assert float(adv[k * 5 + j]) == pytest.approx(want, abs=TOL)


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_micro_batches_with_global_normalisers_sum_to_the_full_loss(mode):
    g = torch.Generator().manual_seed(2)
    B, L = 8, 7
    lp = -torch.rand(B, L, generator=g, dtype=torch.float64)
    old = lp + 0.1 * torch.randn(B, L, generator=g, dtype=torch.float64)
    adv = torch.randn(B, generator=g, dtype=torch.float64)
    mask = (torch.rand(B, L, generator=g) > 0.3).double()
    full, _ = clipped_policy_loss(lp, old, adv, mask, aggregation=mode)
    parts = sum(
        float(
            clipped_policy_loss(
                lp[i : i + 2],
                old[i : i + 2],
                adv[i : i + 2],
                mask[i : i + 2],
                aggregation=mode,
                num_seqs=B,
                num_tokens=float(mask.sum()),
                norm_len=L,
            )[0]
        )
        for i in range(0, B, 2)
    )
    assert parts == pytest.approx(float(full), abs=1e-12)
