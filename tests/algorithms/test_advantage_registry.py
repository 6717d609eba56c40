"""Advantage estimators are looked up by name: the built-ins, and one a user registers."""

from __future__ import annotations

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.algorithms.advantages import (
    discounted_returns,
    group_advantages,
    rloo_advantages,
    whiten,
)
from textgym.algorithms.registry import (
    ADVANTAGES,
    AdvantageInputs,
    UnknownNameError,
    get_advantage,
    register_advantage,
)
from textgym.config import ConfigError, GRPOConfig, RunConfig
from textgym.models import load_model
from textgym.pipeline import preflight
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.seeding import seed_everything


@pytest.fixture
def unregister():
    names: list[str] = []
    yield names
    for name in names:
        ADVANTAGES.unregister(name)


def inputs(G=4, n_groups=3, L=5):
    torch.manual_seed(0)
    rewards = torch.rand(G * n_groups)
    mask = (torch.rand(G * n_groups, L) > 0.3).float()
    token_rewards = torch.zeros(G * n_groups, L)
    token_rewards[:, -1] = rewards
    return AdvantageInputs(rewards=rewards, token_rewards=token_rewards, mask=mask, group_size=G)


def test_the_built_in_estimators_are_registered_by_their_config_names():
    assert {"grpo", "rloo", "reinforce_pp"} <= set(ADVANTAGES.names())


def test_the_registered_built_ins_compute_what_the_pure_functions_do():
    x = inputs()
    assert torch.equal(get_advantage("grpo")(x)[0], group_advantages(x.rewards, x.group_size)[0])
    assert torch.equal(get_advantage("rloo")(x)[0], rloo_advantages(x.rewards, x.group_size)[0])
    expected = whiten(discounted_returns(x.token_rewards, x.mask, gamma=1.0), x.mask)
    assert torch.equal(get_advantage("reinforce_pp")(x)[0], expected)


def test_an_unknown_estimator_name_lists_the_registered_ones():
    with pytest.raises(
        UnknownNameError, match=r"unknown advantage estimator 'no_such_estimator'; registered: .*grpo"
    ):
        get_advantage("no_such_estimator")


def test_a_name_cannot_be_registered_twice_unless_replaced(unregister):
    unregister.append("twice")

    @register_advantage("twice")
    def first(x):
        return x.rewards, {}

    def second(x):
        return x.rewards, {}

    with pytest.raises(ValueError, match="already registered"):
        register_advantage("twice")(second)
    assert get_advantage("twice") is first
    register_advantage("twice", replace=True)(second)
    assert get_advantage("twice") is second


def test_a_user_registered_estimator_is_used_by_a_grpo_step(warm_model_dir, tmp_path, unregister):
    unregister.append("test_sign")
    calls: list[AdvantageInputs] = []

    @register_advantage("test_sign")
    def sign_of_centred_reward(x: AdvantageInputs):
        calls.append(x)
        adv = torch.sign(x.rewards - x.rewards.mean())
        return adv, {"adv/test_sign_positive": float((adv > 0).float().mean())}

    assert "test_sign" in ADVANTAGES and "test_sign" in ADVANTAGES.names()
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    cfg = GRPOConfig.model_validate(
        {"env": ENV, "steps": 1, "prompts_per_step": 4, "group_size": 4, "sampling": {"max_new_tokens": 8}}
    )
    cfg = cfg.model_copy(update={"advantage_estimator": "test_sign"})
    metrics = GRPOTrainer(cfg, model, tok, tmp_path).train_step()
    assert len(calls) == 1
    (x,) = calls
    assert x.rewards.shape == (16,) and x.group_size == 4 and x.mask.shape[0] == 16
    assert "adv/test_sign_positive" in metrics
    assert metrics["adv/test_sign_positive"] == pytest.approx(
        float((torch.sign(x.rewards - x.rewards.mean()) > 0).float().mean())
    )


def run_config(estimator: str) -> RunConfig:
    return RunConfig.model_validate(
        {
            "name": "t",
            "model": {"init_preset": "tiny"},
            "grpo": {"env": ENV, "advantage_estimator": estimator},
        }
    )


def test_the_config_checks_the_estimator_name_against_the_registry_before_work(unregister):
    with pytest.raises(
        ConfigError,
        match=r"grpo\.advantage_estimator: unknown advantage estimator 'test_late'; registered: .*rloo",
    ):
        preflight(run_config("test_late"))
    unregister.append("test_late")
    register_advantage("test_late")(lambda x: (x.rewards - x.rewards.mean(), {}))
    preflight(run_config("test_late"))  # a user's estimator, registered before the run starts, is accepted
