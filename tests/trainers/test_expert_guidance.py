"""GRPO's expert guidance: the env's oracle episode in place of one sample of a group that failed entirely."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from pydantic import ValidationError
from test_grpo_family import fake_group

from textgym.agents.demonstrator import OracleDemonstrator
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.logprobs import sequence_logprobs
from textgym.training.seeding import seed_everything

GAME = {"id": "textgym/GuessNumber-v0", "kwargs": {"high": 20, "max_guesses": 5, "max_episode_steps": 5}}


def guided_cfg(**over):
    base = {
        "env": GAME,
        "steps": 1,
        "prompts_per_step": 2,
        "group_size": 3,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "expert_guidance": True,
    }
    base.update(over)
    return GRPOConfig.model_validate(base)


def test_a_failed_group_gets_the_experts_episode_a_group_with_a_success_does_not(tiny_model_dir, tmp_path):
    model, tok = load_model(tiny_model_dir)
    trainer = GRPOTrainer(guided_cfg(), model, tok, tmp_path)
    won = fake_group(3, [1.0, 0.0, 0.0], correct=[1, 0, 0])
    lost = fake_group(7, [0.0, 0.0, 0.0], correct=[0, 0, 0])
    for t in lost:
        t.group = 1
    sampled = won + lost
    trainer.collect = lambda n, round_index=0: list(sampled)  # type: ignore[method-assign]
    metrics: dict[str, float] = {}
    selection = trainer.sample(metrics)
    trajs = selection.trajs
    assert trajs[:5] == sampled[:5]  # the group with a success and the failed group's first two samples
    expert = trajs[5]
    env = gym.make(GAME["id"], **GAME["kwargs"])
    (reference,) = rollout(OracleDemonstrator(tok), [env], [7], SamplingParams(max_new_tokens=8))
    assert torch.equal(expert.token_ids, reference.token_ids)
    assert torch.equal(expert.loss_mask, reference.loss_mask)
    assert expert.reward == 1.0 and expert.reward_terms["reward/correct"] == 1.0
    assert (expert.group, expert.task_index) == (1, 7)
    assert selection.guided_rows.tolist() == [False] * 5 + [True]
    assert metrics["guidance/groups_frac"] == 0.5 and metrics["guidance/expert_reward_mean"] == 1.0
    assert metrics["rollout/accuracy"] == pytest.approx(1 / 6)  # the policy's own samples, not the expert's


def test_the_expert_row_starts_at_ratio_one_and_the_update_raises_its_likelihood(tiny_model_dir, tmp_path):
    """A random tiny model never wins: every group is guided; π_old of the expert rows is the
    trainer's own (`kl/old_approx` ≈ 0 at the first minibatch) and one step raises their log-likelihood."""
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = guided_cfg(optim={"lr": 1e-3, "warmup_steps": 0}, log_trajectories=False)
    trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    kept: list = []
    collect = trainer.collect

    def collect_and_keep(n, round_index=0):
        trajs = collect(n, round_index)
        kept.extend(trajs)
        return trajs

    trainer.collect = collect_and_keep  # type: ignore[method-assign]
    seen: list = []
    sample = trainer.sample

    def sample_and_keep(metrics):
        selection = sample(metrics)
        seen.extend(selection.trajs)
        return selection

    trainer.sample = sample_and_keep  # type: ignore[method-assign]
    metrics = trainer.train_step()
    assert max(t.reward for t in kept) == 0.0, "the random model won a game: pick another seed"
    assert metrics["guidance/groups_frac"] == 1.0 and metrics["guidance/expert_reward_mean"] == 1.0
    assert metrics["kl/old_approx"] == pytest.approx(0.0, abs=1e-6)
    experts = [seen[2], seen[5]]
    assert [t.reward for t in experts] == [1.0, 1.0]
    batch = RolloutBatch.from_trajectories(experts, int(tok.pad_token_id))

    def likelihood(policy):
        policy.eval()
        with torch.no_grad():
            return (sequence_logprobs(policy, batch)[0] * batch.loss_mask).sum(-1)

    before, after = likelihood(load_model(tiny_model_dir)[0]), likelihood(model)
    assert bool((after > before + 1.0).all()), (before, after)  # nats over each expert episode


class NoExpert(gym.Env):
    """A plain Gymnasium env with string observations and no `oracle_action`."""

    observation_space = gym.spaces.Text(64)
    action_space = gym.spaces.Text(64)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return "Say yes.", {}

    def step(self, action):
        return "", float(action.strip() == "yes"), True, False, {}


def test_guidance_is_refused_where_it_cannot_work(tiny_model_dir, tmp_path):
    with pytest.raises(ValidationError, match="dynamic_sampling"):
        guided_cfg(dynamic_sampling=True)
    with pytest.raises(ValidationError, match="top_k"):
        guided_cfg(sampling={"temperature": 1.0, "top_k": 5})
    model, tok = load_model(tiny_model_dir)
    gym.register(id="test/NoExpert-v0", entry_point=NoExpert)
    try:
        with pytest.raises(ValueError, match="test/NoExpert-v0 has none"):
            GRPOTrainer(guided_cfg(env={"id": "test/NoExpert-v0"}), model, tok, tmp_path)
    finally:
        gym.registry.pop("test/NoExpert-v0", None)
