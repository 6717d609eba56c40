"""GSPO, GSPO-token and CISPO: TRL 1.16 parity on identical tensors, hand values and the config's
checks; a GRPO step with each loss through the real trainer is in
tests/trainers/test_gspo_cispo_steps.py.

TRL's `GRPOTrainer._compute_loss` is called on a trainer object carrying only the attributes
it reads, with its model forward replaced by the given per-token log-probs
(`trl_fakes.trl_grpo_loss`, as in `test_trl_parity.py`), so both libraries see exactly the
same tensors. TRL 1.16 has GSPO as `importance_sampling_level="sequence"` and CISPO as
`loss_type="cispo"` (its cap is `epsilon_high` itself, textgym's is 1 + `cispo_clip_high`); it
has no GSPO-token, which equals GSPO with per-sequence advantages (Zheng et al. 2025, §4.3)
and is checked against it there, and against hand values with per-token advantages.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
from conftest import WARM_ENV as ENV
from trl_fakes import trl_grpo_loss

from textgym.algorithms.clipped_loss import clipped_policy_loss
from textgym.algorithms.policy_losses import cispo_loss, gspo_loss
from textgym.algorithms.registry import POLICY_LOSSES, PolicyLossInputs, get_policy_loss
from textgym.config import ConfigError, GRPOConfig, PPOConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


def tensors(seed, B=8, L=9, spread=0.5):
    """Log-probs, old and reference log-probs, advantages, a mask of varying lengths (a row may
    have none) and TIS-like weights. The log-ratios' scale differs per row (0 to `spread`), so
    some sequence ratios sit inside a clip range and others far outside."""
    g = torch.Generator().manual_seed(seed)
    old = -torch.rand(B, L, generator=g) * 3
    scale = torch.linspace(0.0, spread, B)[torch.randperm(B, generator=g)][:, None]
    logp = old + scale * (torch.randn(B, L, generator=g) + torch.randn(B, 1, generator=g))
    ref = old + 0.3 * torch.randn(B, L, generator=g)
    adv = torch.randn(B, generator=g)
    lengths = torch.randint(0 if seed % 2 else 1, L + 1, (B,), generator=g)
    mask = (torch.arange(L)[None] < lengths[:, None]).float()
    tis = (0.5 + torch.rand(B, L, generator=g)) * mask
    return logp, old, ref, adv, mask, tis


def assert_same(ours, ours_lp, theirs, theirs_lp, mask):
    ours.backward()
    theirs.backward()
    assert abs(float(ours.detach()) - float(theirs.detach())) < 1e-5
    assert ours_lp.grad is not None and theirs_lp.grad is not None
    assert ours_lp.grad.abs().max() > 0
    diff = float(((ours_lp.grad - theirs_lp.grad) * mask).abs().max())
    assert diff < 1e-5, f"gradients differ by {diff:.2e}"


GSPO_AGGREGATIONS = {  # TRL loss_type -> textgym aggregation
    "grpo": "seq_mean_token_mean",  # the GSPO paper's
    "dapo": "token_mean",
    "bnpo": "token_mean",
    "dr_grpo": "seq_mean_token_sum_norm",
}
GSPO_CLIPS = [(3e-4, 4e-4), (0.05, 0.08), (0.2, 0.28)]  # the paper's; clips some rows; clips few


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("clip", GSPO_CLIPS, ids=["paper", "mid", "ppo"])
@pytest.mark.parametrize("loss_type", list(GSPO_AGGREGATIONS))
@pytest.mark.parametrize("name", ["gspo", "gspo_token"])
def test_gspo_matches_trl_sequence_level(name, loss_type, clip, seed):
    eps_low, eps_high = clip
    beta = 0.04 if seed == 0 else 0.0
    # GSPO-token equals GSPO with one advantage and one weight per sequence: per-token TIS weights
    # differ along a sequence, as per-token advantages do (textgym weighs each token's term)
    tis_on = loss_type in ("grpo", "dapo") and seed == 1 and name == "gspo"
    logp, old, ref, adv, mask, tis = tensors(seed)
    max_len = 12

    ours_lp = logp.clone().requires_grad_(True)
    ours, stats = gspo_loss(
        ours_lp, old, adv, mask, clip_low=eps_low, clip_high=eps_high, token_level=name == "gspo_token",
        aggregation=GSPO_AGGREGATIONS[loss_type], ref_logprobs=ref, kl_coef=beta, norm_len=max_len,
        is_weights=tis if tis_on else None,
    )  # fmt: skip
    theirs_lp = logp.clone().requires_grad_(True)
    theirs, metrics = trl_grpo_loss(
        theirs_lp, old, ref, adv, mask, loss_type=loss_type, level="sequence", eps_low=eps_low,
        eps_high=eps_high, beta=beta, max_len=max_len, tis=tis if tis_on else None,
    )  # fmt: skip
    assert_same(ours, ours_lp, theirs, theirs_lp, mask)

    # the clip engages on some rows and not on others, in the direction the advantage favours
    log_s = ((logp - old) * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    rows = mask.sum(-1) > 0
    clipped = rows & (((log_s.exp() > 1 + eps_high) & (adv > 0)) | ((log_s.exp() < 1 - eps_low) & (adv < 0)))
    assert 0 < int(clipped.sum()) < int(rows.sum())
    # the same sequences count as clipped (TRL counts sequences, textgym policy tokens)
    lengths = mask.sum(-1)
    assert stats["clip/frac"] == pytest.approx(float(lengths[clipped].sum() / lengths.sum()), abs=1e-6)
    assert metrics["clip_ratio/region_mean"][0] == pytest.approx(float(clipped.sum()) / len(adv), abs=1e-6)
    if beta:
        assert stats["kl/ref"] == pytest.approx(metrics["kl"][0], abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("trl_cap", [1.1, 1.5, 5.0])
def test_cispo_matches_trl(trl_cap, seed):
    beta = 0.04 if seed != 1 else 0.0
    tis_on = seed == 2
    logp, old, ref, adv, mask, tis = tensors(seed, spread=1.5)
    ours_lp = logp.clone().requires_grad_(True)
    ours, stats = cispo_loss(
        ours_lp, old, adv, mask, clip_low=None, clip_high=trl_cap - 1.0, aggregation="token_mean",
        ref_logprobs=ref, kl_coef=beta, is_weights=tis if tis_on else None,
    )  # fmt: skip
    theirs_lp = logp.clone().requires_grad_(True)
    theirs, metrics = trl_grpo_loss(
        theirs_lp, old, ref, adv, mask, loss_type="cispo", level="token", eps_low=0.2, eps_high=trl_cap,
        beta=beta, max_len=12, tis=tis if tis_on else None,
    )  # fmt: skip
    assert_same(ours, ours_lp, theirs, theirs_lp, mask)
    ratio = (logp - old).exp()
    capped = (ratio > trl_cap) & (mask > 0)
    assert 0 < int(capped.sum()) < int(mask.sum())  # the cap engages on some tokens only
    assert stats["clip/frac_high"] == pytest.approx(float(capped.sum() / mask.sum()), abs=1e-6)
    # TRL's metric counts the capped tokens with a positive advantage only
    positive = capped & (adv[:, None] > 0)
    assert metrics["cispo_clip_ratio"][0] == pytest.approx(float(positive.sum() / mask.sum()), abs=1e-6)


# --- hand-computed values --------------------------------------------------------------------
def hand_gspo_batch():
    """Row 0: 2 tokens, log-ratios 0.1, 0.3 → log s = 0.2, s = e^0.2 = 1.2214 > 1.2, Â = +1: clipped.
    Row 1: 3 tokens, log-ratios −0.3, 0, 0 → log s = −0.1, s = e^−0.1 = 0.9048 in [0.8, 1.2],
    Â = −2: unclipped, each token's gradient of pg_1 = −s·Â is 2·s/3."""
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -1.5, -2.5]])
    logp = old + torch.tensor([[0.1, 0.3, 0.0], [-0.3, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    return logp, old, torch.tensor([1.0, -2.0]), mask


@pytest.mark.parametrize("token_level", [False, True])
def test_gspo_hand_values(token_level):
    s1 = math.exp(-0.1)
    pg0, pg1 = -1.2, 2 * s1  # −min(s·Â, clip(s)·Â): row 0 takes the clipped 1.2, row 1 s1·(−2)
    expected = {  # aggregation: (loss, gradient on each of row 1's tokens)
        "seq_mean_token_mean": ((pg0 + pg1) / 2, 2 * s1 / 3 / 2),
        "token_mean": ((2 * pg0 + 3 * pg1) / 5, 3 * (2 * s1 / 3) / 5),
        "seq_mean_token_sum_norm": ((2 * pg0 + 3 * pg1) / (2 * 4), 3 * (2 * s1 / 3) / (2 * 4)),
    }
    for aggregation, (value, grad) in expected.items():
        logp, old, adv, mask = hand_gspo_batch()
        logp.requires_grad_(True)
        loss, stats = gspo_loss(
            logp, old, adv, mask, clip_low=0.2, clip_high=0.2, token_level=token_level,
            aggregation=aggregation, norm_len=4,  # type: ignore[arg-type]
        )  # fmt: skip
        loss.backward()
        assert float(loss.detach()) == pytest.approx(value, abs=1e-6), aggregation
        assert logp.grad is not None
        assert torch.allclose(logp.grad[0], torch.zeros(3), atol=1e-7)  # clipped: no gradient
        assert torch.allclose(logp.grad[1], torch.full((3,), grad), atol=1e-6), aggregation
        assert stats["clip/frac_high"] == pytest.approx(2 / 5) and stats["clip/frac_low"] == 0.0
        assert stats["ratio/seq_max"] == pytest.approx(math.exp(0.2), abs=1e-6)
        assert stats["ratio/seq_min"] == pytest.approx(s1, abs=1e-6)
        assert stats["ratio/seq_mean"] == pytest.approx((2 * math.exp(0.2) + 3 * s1) / 5, abs=1e-6)


def test_gspo_token_differs_from_gspo_only_with_per_token_advantages():
    """One row, log-ratios +0.1 and −0.1 (s = 1, unclipped), advantages +1 and −1 per token.
    GSPO's term is −s·Â_t with ∂s/∂log π_t = s/2, so the row's mean −s·(Â_0 + Â_1)/2 = 0 has no
    gradient; GSPO-token's −s_t·Â_t has ∂s_t/∂log π_t = s: gradients −Â_t·s/2 = −0.5, +0.5."""
    old = torch.tensor([[-1.0, -2.0]])
    mask = torch.ones(1, 2)
    adv = torch.tensor([[1.0, -1.0]])
    grads = {}
    for token_level in (False, True):
        logp = (old + torch.tensor([[0.1, -0.1]])).requires_grad_(True)
        loss, _ = gspo_loss(logp, old, adv, mask, clip_low=0.2, clip_high=0.2, token_level=token_level)
        loss.backward()
        assert float(loss.detach()) == pytest.approx(0.0, abs=1e-7)
        grads[token_level] = logp.grad
    assert torch.allclose(grads[False], torch.zeros(1, 2), atol=1e-7)
    assert torch.allclose(grads[True], torch.tensor([[-0.5, 0.5]]), atol=1e-6)


def test_gspo_dual_clip_caps_a_negative_advantage_sequence():
    """log s = 1 (s = e ≈ 2.718), Â = −1: the surrogate's loss e·1 is capped at c·1 = 2, with no gradient."""
    old = torch.tensor([[-1.0, -2.0]])
    logp = (old + 1.0).requires_grad_(True)
    loss, stats = gspo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), clip_low=0.2, dual_clip=2.0)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(2.0) and stats["clip/frac_dual"] == 1.0
    assert logp.grad is not None and torch.equal(logp.grad, torch.zeros(1, 2))
    with pytest.raises(ValueError, match="dual_clip must be > 1"):
        gspo_loss(logp, old, torch.tensor([-1.0]), torch.ones(1, 2), dual_clip=1.0)


@pytest.mark.parametrize(("clip_low", "weights"), [(None, (1.2, 0.5, 1.0)), (0.4, (1.2, 0.6, 1.0))])
def test_cispo_hand_values(clip_low, weights):
    """Ratios 1.5, 0.5, 1.0 with ε_high^IS = 0.2 (cap 1.2) and no floor / a floor of 0.6; Â = 2;
    log π = −1, −2, −0.5. token_mean: loss = −Σ_t r̂_t·Â·log π_t / 3, gradient −r̂_t·Â/3."""
    logp = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    old = logp.detach() - torch.log(torch.tensor([[1.5, 0.5, 1.0]]))
    adv, mask = torch.tensor([2.0]), torch.ones(1, 3)
    loss, stats = cispo_loss(logp, old, adv, mask, clip_low=clip_low, clip_high=0.2)
    loss.backward()
    w = torch.tensor([weights])
    assert float(loss.detach()) == pytest.approx(float(-(w * 2.0 * logp.detach()).sum() / 3), abs=1e-6)
    assert float(loss.detach()) == pytest.approx((2.4 + 4 * weights[1] + 1.0) / 3, abs=1e-6)
    assert logp.grad is not None and torch.allclose(logp.grad, -w * 2.0 / 3, atol=1e-6)
    assert stats["clip/frac_high"] == pytest.approx(1 / 3)
    assert stats["clip/frac_low"] == pytest.approx(0.0 if clip_low is None else 1 / 3)
    assert stats["cispo/weight_mean"] == pytest.approx(sum(weights) / 3, abs=1e-6)


def test_on_policy_the_gradients_are_grpos():
    """At π_θ = π_old (one optimizer step per rollout batch) every ratio is 1: GSPO's gradient is
    GRPO's (PPO clip, per-sequence token mean) and CISPO's is GRPO's with the token mean."""
    logp, _, _, adv, mask, _ = tensors(5)
    old = logp.clone()

    def grad(fn, **kw):
        lp = logp.clone().requires_grad_(True)
        fn(lp, old, adv, mask, **kw)[0].backward()
        assert lp.grad is not None
        return lp.grad

    for aggregation in ("seq_mean_token_mean", "token_mean"):
        grpo = grad(clipped_policy_loss, aggregation=aggregation)
        assert grpo.abs().max() > 0
        assert torch.allclose(grad(gspo_loss, aggregation=aggregation) * mask, grpo, atol=1e-7)
        assert torch.allclose(grad(cispo_loss, aggregation=aggregation) * mask, grpo, atol=1e-7)


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("name", ["gspo", "gspo_token", "cispo"])
def test_micro_batches_add_up_to_the_minibatch(name, aggregation):
    """With the minibatch's `num_seqs` / `num_tokens`, two micro-batches' losses and gradients add
    up to the whole batch's (a sequence is never split across micro-batches)."""
    logp, old, ref, adv, mask, tis = tensors(3, spread=0.4)
    cfg = grpo_cfg(policy_loss=name, loss_aggregation=aggregation)
    if name != "cispo":
        cfg = grpo_cfg(policy_loss=name, loss_aggregation=aggregation, clip_low=0.05, clip_high=0.08)
    fn = get_policy_loss(name)

    def run(rows, **kw):
        lp = logp[rows].clone().requires_grad_(True)
        x = PolicyLossInputs(lp, old[rows], adv[rows], mask[rows], cfg, ref[rows], 0.05, tis[rows], **kw)
        loss, _ = fn(x)
        loss.backward()
        return float(loss.detach()), lp.grad

    whole, grad = run(torch.arange(8))
    kw = {"num_seqs": 8.0, "num_tokens": float(mask.sum())}
    a, grad_a = run(torch.arange(0, 3), **kw)
    b, grad_b = run(torch.arange(3, 8), **kw)
    assert a + b == pytest.approx(whole, abs=1e-6)
    assert torch.allclose(torch.cat([grad_a, grad_b]), grad, atol=1e-7)


# --- the config -----------------------------------------------------------------------------
def grpo_cfg(**over) -> GRPOConfig:
    base = {"env": ENV, "steps": 1, "prompts_per_step": 2, "group_size": 4, "sampling": {"max_new_tokens": 8}}
    return GRPOConfig.model_validate({**base, **over})


def test_the_losses_are_registered_and_read_their_options_from_the_config():
    assert {"ppo_clip", "gspo", "gspo_token", "cispo"} <= set(POLICY_LOSSES.names())
    logp, old, ref, adv, mask, tis = tensors(4)
    cfg = grpo_cfg(policy_loss="gspo", clip_low=0.01, clip_high=0.02, loss_aggregation="token_mean")
    x = PolicyLossInputs(logp, old, adv, mask, cfg, ref_logprobs=ref, kl_coef=0.1, is_weights=tis)
    got = get_policy_loss("gspo")(x)
    want = gspo_loss(
        logp, old, adv, mask, clip_low=0.01, clip_high=0.02, aggregation="token_mean", ref_logprobs=ref,
        kl_coef=0.1, is_weights=tis, norm_len=8,
    )  # fmt: skip
    assert torch.equal(got[0], want[0]) and got[1] == want[1]
    cfg = grpo_cfg(policy_loss="cispo", cispo_clip_low=0.5, cispo_clip_high=0.3, kl_estimator="k2")
    x = PolicyLossInputs(logp, old, adv, mask, cfg, ref_logprobs=ref, kl_coef=0.1)
    got = get_policy_loss("cispo")(x)
    want = cispo_loss(
        logp, old, adv, mask, clip_low=0.5, clip_high=0.3, aggregation="seq_mean_token_mean",
        ref_logprobs=ref, kl_coef=0.1, kl_estimator="k2", norm_len=8,
    )  # fmt: skip
    assert torch.equal(got[0], want[0]) and got[1] == want[1]


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"policy_loss": "cispo", "dual_clip": 3.0}, "dual_clip: not used by policy_loss 'cispo'"),
        ({"policy_loss": "cispo", "clip_high": 0.28}, "clip_high: not used by policy_loss 'cispo'"),
        ({"policy_loss": "gspo", "cispo_clip_high": 2.0}, "cispo_clip_high: only policy_loss 'cispo'"),
        ({"cispo_clip_low": 0.5}, "cispo_clip_low: only policy_loss 'cispo' uses it, not 'ppo_clip'"),
        ({"policy_loss": "cispo", "cispo_clip_high": -1.0}, "cispo_clip_high"),
        ({"policy_loss": "cispo", "cispo_clip_low": 1.0}, "cispo_clip_low"),
        ({"policy_loss": "gspo", "clip_low": 1.0}, "clip_low"),
    ],
)
def test_the_config_refuses_options_a_loss_would_ignore(over, message):
    with pytest.raises(ValueError, match=message):
        grpo_cfg(**over)
    with pytest.raises(ValueError, match=message):
        PPOConfig.model_validate({"env": ENV, **over})


def test_the_presets_load_and_name_the_bad_field():
    for name, loss in (("gspo", "gspo"), ("cispo", "cispo")):
        cfg = load_config(CONFIGS / f"{name}_arithmetic.yaml")
        assert cfg.grpo is not None and cfg.grpo.policy_loss == loss
        # the resolved config (as written to the run folder) validates again
        assert type(cfg).model_validate(cfg.model_dump(mode="json")) == cfg
    with pytest.raises(ConfigError, match=r"grpo: .*dual_clip: not used by policy_loss 'cispo'"):
        load_config(CONFIGS / "cispo_arithmetic.yaml", ["grpo.dual_clip=3"])
    gspo = load_config(CONFIGS / "gspo_arithmetic.yaml").grpo
    grpo = load_config(CONFIGS / "grpo_arithmetic.yaml").grpo
    assert gspo is not None and grpo is not None
    assert (gspo.clip_low, gspo.clip_high) == (3e-4, 4e-4)  # the paper's (Zheng et al. 2025, §5.1)
    loss_keys = {"policy_loss", "clip_low", "clip_high", "cispo_clip_low", "cispo_clip_high"}
    loss_keys |= {"loss_aggregation", "minibatch_size"}  # 4 minibatches: the ratio moves from the 2nd on
    for preset in ("gspo", "cispo"):
        other = load_config(CONFIGS / f"{preset}_arithmetic.yaml").grpo
        assert other is not None
        same = {k for k in GRPOConfig.model_fields if k not in loss_keys | {"optim"}}
        assert {k: getattr(other, k) for k in same} == {k: getattr(grpo, k) for k in same}
        assert other.minibatch_size == 32 and grpo.minibatch_size is None
        # CISPO has no trust region: its rate is GRPO's over the 4 optimizer steps per batch
        assert other.optim.lr == pytest.approx(grpo.optim.lr / 4 if preset == "cispo" else grpo.optim.lr)
        assert other.optim.model_copy(update={"lr": grpo.optim.lr}) == grpo.optim  # all else equal
