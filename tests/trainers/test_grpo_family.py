"""The GRPO family as trainers (DAPO, Dr. GRPO, RLOO, REINFORCE++) and DAPO's dynamic sampling, on a real
tiny model."""

from __future__ import annotations

import math

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.agents import Trajectory
from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer, group_accuracy
from textgym.training.seeding import seed_everything

SAMPLING = {"temperature": 1.0, "max_new_tokens": 8}


SIGNAL_SEED = 1
"""Seed of the tests that need a step with a learning signal: at T = 1 the warm model is right on
~8 % of its samples, so a step of 4 prompts x 4 samples has all-equal rewards in every group (no
gradient) about once in four seeds; whether seed s does depends on the sampler's RNG stream
(inverse-CDF draws since 2026-11-23), not on the maths under test."""


def grpo_cfg(**over):
    base = {"env": ENV, "steps": 1, "prompts_per_step": 4, "group_size": 4, "sampling": SAMPLING}
    base.update(over)
    return GRPOConfig.model_validate(base)


@pytest.mark.parametrize(
    "over",
    [
        {"advantage_estimator": "rloo"},
        {
            "advantage_estimator": "reinforce_pp",
            "kl_coef": 0.01,
            "kl_placement": "reward",
            "kl_estimator": "k1",
        },
        {"scale_rewards": "none", "loss_aggregation": "seq_mean_token_sum_norm"},
        {"kl_coef": 0.05, "kl_placement": "reward", "kl_estimator": "k1", "dual_clip": 3.0},
        {"entropy_coef": 0.01, "overlong_penalty": {"max_len": 8, "cache_len": 4}, "overlong_filter": True},
    ],
    ids=["rloo", "reinforce_pp", "drgrpo", "kl_reward_dual_clip", "entropy_overlong"],
)
def test_grpo_family_steps(warm_model_dir, tmp_path, over):
    seed_everything(SIGNAL_SEED)
    model, tok = load_model(warm_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    metrics = GRPOTrainer(grpo_cfg(**over), model, tok, tmp_path).train_step()
    assert math.isfinite(metrics["loss/total"]) and math.isfinite(metrics["grad_norm"])
    assert any(not torch.equal(v, before[k]) for k, v in model.state_dict().items())
    if "overlong_penalty" in over:
        assert "rollout/overlong_mean" in metrics and metrics["rollout/overlong_mean"] <= 0
        assert "rollout/overlong_masked" in metrics and "loss/entropy_bonus" in metrics
    if over.get("kl_placement") == "reward":
        # Measured on the rollout, before updating: policy == reference, so only float32 rounding is left.
        # The sampler's log-probs (KV-cached decode) and the reference's (one full forward) agree to 1e-4
        # a token (tests/agents); their signed differences average out over the batch's tokens, and
        # 1e-5 bounds the mean (measured 1.5e-6 on the warmed model's tasks).
        assert metrics["kl/ref"] == pytest.approx(0.0, abs=1e-5)


def test_dynamic_sampling_keeps_only_informative_groups(warm_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    trainer = GRPOTrainer(grpo_cfg(dynamic_sampling=True, max_sampling_tries=3), model, tok, tmp_path)
    metrics: dict[str, float] = {}
    selection = trainer.sample(metrics)
    trajs = selection.trajs
    assert len(trajs) == 16 and 1 <= metrics["sampling/rounds"] <= 3
    groups = [trajs[i : i + 4] for i in range(0, 16, 4)]
    constant = sum(len(set(group_accuracy(g))) == 1 for g in groups)
    assert constant == metrics["sampling/filled_groups"]  # only filler groups are uninformative
    assert [t.group for t in trajs] == [i // 4 for i in range(16)]
    for g in groups:
        assert len({t.task_index for t in g}) == 1


def fake_group(task, rewards, correct=None, overlong=None, prompt_len=4, response_len=3):
    """A group of synthetic trajectories of task `task`: its rewards, `reward/correct` and overlong terms."""
    out = []
    for j, r in enumerate(rewards):
        terms = {}
        if correct is not None:
            terms["reward/correct"] = float(correct[j])
        if overlong is not None:
            terms["reward/overlong"] = float(overlong[j])
            r += overlong[j]
        n = prompt_len + response_len
        ids = torch.arange(20 + 7 * task + j, 20 + 7 * task + j + n) % 300 + 10
        mask = torch.tensor([0.0] * prompt_len + [1.0] * response_len)
        rewards_t = torch.zeros(n)
        rewards_t[-1] = r
        out.append(
            Trajectory(token_ids=ids, loss_mask=mask, logprobs=-6.0 * mask, token_rewards=rewards_t,
                       prompt_length=prompt_len, messages=[], reward=float(r), reward_terms=terms,
                       task_index=task, group=0)
        )  # fmt: skip
    if prompt_len:  # the G samples of a task share its prompt
        for t in out[1:]:
            t.token_ids[:prompt_len] = out[0].token_ids[:prompt_len]
    return out


def test_dynamic_sampling_filters_on_accuracy_not_on_the_shaped_reward(tiny_model_dir, tmp_path):
    """DAPO eq. 11: a group all correct (or all wrong) is dropped even when the overlong penalty
    makes its rewards differ; without a `reward/correct` term, the reward without the penalty decides."""
    model, tok = load_model(tiny_model_dir)
    cfg = grpo_cfg(prompts_per_step=2, group_size=2, dynamic_sampling=True, max_sampling_tries=2)
    trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    rounds = [
        [
            *fake_group(0, [1.0, 1.0], correct=[1, 1], overlong=[0.0, -0.5]),  # all correct: dropped
            *fake_group(1, [1.0, 0.0], correct=[1, 0]),  # kept
        ],
        [
            *fake_group(
                2, [0.3, 0.3], overlong=[-0.2, 0.0]
            ),  # no correct term, same unshaped reward: dropped
            *fake_group(3, [0.2, 0.7]),  # kept
        ],
    ]
    trainer.collect = lambda n, round_index=0: rounds[round_index]  # type: ignore[method-assign]
    metrics: dict[str, float] = {}
    selection = trainer.sample(metrics)
    trajs = selection.trajs
    assert [t.task_index for t in trajs] == [1, 1, 3, 3]
    assert metrics["sampling/rounds"] == 2 and metrics["sampling/dropped_groups"] == 2
    assert metrics["sampling/filled_groups"] == 0 and selection.loss_rows.tolist() == [True] * 4


@pytest.mark.parametrize("aggregation", ["seq_mean_token_mean", "token_mean", "seq_mean_token_sum_norm"])
def test_dynamic_sampling_fillers_do_not_dilute_the_loss(tiny_model_dir, tmp_path, aggregation):
    """A batch [informative group, filler group] gives the gradient of the informative group alone."""
    grads = []
    for dynamic in (True, False):
        seed_everything(0)
        model, tok = load_model(tiny_model_dir)
        over = {"dynamic_sampling": True, "max_sampling_tries": 2} if dynamic else {}
        cfg = grpo_cfg(
            prompts_per_step=2 if dynamic else 1,
            group_size=2,
            loss_aggregation=aggregation,
            clip_low=0.99,
            clip_high=100.0,  # no clipping: every token has a gradient
            optim={"lr": 1e-3, "max_grad_norm": None},
            **over,
        )
        trainer = GRPOTrainer(cfg, model, tok, tmp_path / str(dynamic))
        informative = fake_group(1, [1.0, 0.0], correct=[1, 0])
        if dynamic:  # round 1: [filler A, informative B]; round 2: two more constant groups
            rounds = [
                [*fake_group(0, [1.0, 1.0], correct=[1, 1], prompt_len=6, response_len=5), *informative],
                [*fake_group(2, [0.0, 0.0], correct=[0, 0]), *fake_group(3, [1.0, 1.0], correct=[1, 1])],
            ]
            trainer.collect = lambda n, round_index=0, r=rounds: r[round_index]  # type: ignore[misc]
        else:  # the informative group alone
            trainer.collect = lambda n, round_index=0, g=informative: g  # type: ignore[misc]
        metrics = trainer.train_step()
        assert metrics.get("sampling/filled_groups", 1) == 1
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        selection = trainer.selection
    assert grads[1].abs().max() > 0
    # The two batches are padded to other shapes, so the sums round differently (element-wise up
    # to 1.7e-7 with the portable kernels); a filler that diluted the loss would halve the gradient.
    rel = float((grads[0] - grads[1]).norm() / grads[1].norm())
    assert rel < 1e-5, rel
    assert selection is None  # the last trainer had no dynamic sampling: no selection at all
