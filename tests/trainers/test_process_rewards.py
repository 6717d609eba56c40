"""Process rewards in the RL loop: step rewards placed on tokens, the reward source, GRPO's process
estimator (DeepSeekMath §4.1.3) and PPO's GAE over step rewards."""

from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch
from conftest import ScriptedBackend

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams, Trajectory
from textgym.agents.rollout import rollout
from textgym.algorithms.advantages import group_advantages, process_advantages
from textgym.algorithms.registry import AdvantageInputs, get_advantage
from textgym.envs.base import SingleTurnEnv
from textgym.models import load_tokenizer
from textgym.training.batch import RolloutBatch
from textgym.types import Task
from textgym.verifiers.base import Rubric, RubricTerm, Score
from textgym.verifiers.steps import step_token_indices

WORKED = {"split": "test", "operators": "+*", "digits": 1, "n_terms": 3, "worked_steps": True}
WORKED["instruction"] = ""


def test_step_rewards_sit_on_the_token_holding_each_steps_last_character(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    gold = "6*3=18\n2+18=20\n\\boxed{20}"  # task 2 of WORKED is 2+6*3
    slip = "6*3=18\n2+18=21\n\\boxed{21}"
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, [gold, slip]))
    envs = [gym.make("textgym/Arithmetic-v0", **WORKED) for _ in range(2)]
    trajs = rollout(agent, envs, [2], SamplingParams(temperature=1.0), group_size=2)
    for t, text, expected in zip(trajs, [gold, slip], [[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]], strict=True):
        # independent of the decoding bisection: the fast tokenizer's own character offsets
        enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ends = [len(line) for line in ["6*3=18", "6*3=18\n2+18=2x", text]]
        holders = [next(j for j, (a, b) in enumerate(enc["offset_mapping"]) if a <= e - 1 < b) for e in ends]
        first = t.prompt_length
        assert t.step_mask[first:].nonzero().flatten().tolist() == holders
        assert t.step_rewards[first:][holders].tolist() == expected
        assert float(t.step_rewards.sum()) == sum(expected)
        assert t.step_mask[:first].sum() == 0 and t.step_rewards[:first].sum() == 0
        # the outcome stays on the last token (the end-of-turn id), apart from the steps
        assert t.token_rewards.nonzero().flatten().tolist() in ([len(t.token_ids) - 1], [])
        assert float(t.token_rewards[-1]) == expected[-1] == t.reward
        assert t.token_ids[first + holders[-1]].item() != tok.eos_token_id


def test_a_step_ending_inside_a_token_puts_its_reward_on_that_token():
    pieces = {1: "12*3=3", 2: "6\n5", 3: "+36=4", 4: "1\n\\boxed{41}", 5: "é"}
    decode = lambda ids: "".join(pieces[i] for i in ids)  # noqa: E731
    # steps end at 7 ("...36"), 15 ("...41"), 26 ("...}"); token 2 holds "6" and the next step's "5"
    assert step_token_indices(decode, [1, 2, 3, 4], [7, 15, 26]) == [1, 3, 3]
    assert step_token_indices(decode, [1, 2, 3, 4, 5], [27]) == [4]
    assert step_token_indices(decode, [1, 2], [0, 99]) == [0, 1]  # clamped to the text
    assert step_token_indices(decode, [], [3]) == []


class _StepsWithoutEnds(SingleTurnEnv):
    def __init__(self):
        super().__init__([Task("t/0", "Say hi.")], Rubric([RubricTerm("correct", lambda c, t: Score(1.0))]))

    def respond(self, action):
        obs, reward, terminated, info = super().respond(action)
        info["step_rewards"] = [1.0]
        return obs, reward, terminated, info


def test_an_env_giving_step_rewards_without_their_ends_is_named(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, ["hi"]))
    with pytest.raises(ValueError, match=r"my-env: info\['step_rewards'\] needs info\['step_ends'\]"):
        rollout(agent, [_StepsWithoutEnds()], [0], SamplingParams(), env_id="my-env")


def _batch(rows):
    """A single-turn batch: each row (response length, {col: step reward}, outcome), prompt of 2 tokens."""
    trajs = []
    for n, steps, outcome in rows:
        T = 2 + n
        step_rewards, step_mask, token_rewards = torch.zeros(T), torch.zeros(T), torch.zeros(T)
        for col, r in steps.items():
            step_rewards[2 + col], step_mask[2 + col] = r, 1.0
        token_rewards[-1] = outcome
        trajs.append(
            Trajectory(
                token_ids=torch.arange(5, 5 + T),
                loss_mask=torch.tensor([0.0, 0.0] + [1.0] * n),
                logprobs=torch.zeros(T),
                token_rewards=token_rewards,
                prompt_length=2,
                messages=[],
                reward=outcome,
                step_rewards=step_rewards,
                step_mask=step_mask,
            )
        )
    return trajs, RolloutBatch.from_trajectories(trajs, 0)


def test_the_reward_source_chooses_what_the_trainer_sees():
    _, batch = _batch([(4, {1: 0.5, 3: 1.0}, 1.0), (3, {0: 0.0}, 0.0)])
    out = batch.with_reward_source("outcome")
    assert torch.equal(out.token_rewards, batch.token_rewards) and torch.equal(out.rewards, batch.rewards)
    assert out.step_mask.tolist() == [[0, 0, 0, 1], [0, 0, 1, 0]]  # the turn ends
    out = batch.with_reward_source("steps", 0.5)
    assert out.token_rewards.tolist() == [[0, 0.25, 0, 0.5], [0, 0, 0, 0]]
    assert out.rewards.tolist() == [0.75, 0.0]
    assert out.step_mask.tolist() == [[0, 1, 0, 1], [1, 0, 0, 0]]  # the step ends
    out = batch.with_reward_source("both", 1.0)
    assert out.token_rewards.tolist() == [[0, 0.5, 0, 2.0], [0, 0, 0, 0]]
    assert out.rewards.tolist() == [2.5, 0.0]
    assert out.step_mask.tolist() == [[0, 1, 0, 1], [1, 0, 1, 0]]  # a token ending both is one event
    sub = out.select([1])
    assert sub.step_mask.tolist() == [[1, 0, 1]] and sub.token_rewards.shape == (1, 3)
    with pytest.raises(ValueError, match="reward source"):
        batch.with_reward_source("final")


def test_process_advantages_by_hand():
    """G = 2: R = {1, 1, 0, 1}, mean 0.75, unbiased std 0.5; a second group's equal rewards give 0."""
    rewards = torch.tensor([[0, 1, 0, 1], [0, 0, 0, 1], [0, 1, 0, 1], [0, 1, 0, 1.0]])
    events = torch.tensor([[0, 1, 0, 1], [0, 1, 0, 1], [0, 1, 0, 1], [0, 1, 0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 0.0]])
    adv, stats = process_advantages(rewards, events, mask, group_size=2)
    s = 0.5 + 1e-4
    hi, lo = 0.25 / s, -0.75 / s
    expected = torch.tensor(
        [[2 * hi, 2 * hi, hi, hi], [lo + hi, lo + hi, hi, hi], [0, 0, 0, 0], [0, 0, 0, 0.0]]
    )
    torch.testing.assert_close(adv, expected, rtol=0, atol=1e-6)
    assert stats["rollout/zero_std_frac"] == 0.5 and stats["rollout/events_per_seq"] == 2.0
    # "none" only centres; "batch" divides by the std of every event reward of the batch
    adv, _ = process_advantages(rewards, events, mask, group_size=2, scale="none")
    torch.testing.assert_close(adv[1], torch.tensor([-0.5, -0.5, 0.25, 0.25]), rtol=0, atol=1e-6)
    adv, _ = process_advantages(rewards, events, mask, group_size=2, scale="batch")
    batch_std = torch.tensor([1, 1, 0, 1, 1, 1, 1, 1.0]).std()
    torch.testing.assert_close(adv[1, 0], (-0.5) / (batch_std + 1e-4), rtol=0, atol=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_process_advantages_match_a_python_loop(seed):
    g = torch.Generator().manual_seed(seed)
    G, n_groups, L = 4, 3, 7
    B = G * n_groups
    rewards = torch.randn(B, L, generator=g)
    events = (torch.rand(B, L, generator=g) > 0.6).float()
    mask = (torch.rand(B, L, generator=g) > 0.2).float()
    adv, _ = process_advantages(rewards, events, mask, group_size=G)
    for k in range(n_groups):
        rows = range(k * G, (k + 1) * G)
        R = [float(rewards[i, t]) for i in rows for t in range(L) if events[i, t]]
        mean = sum(R) / len(R)
        std = math.sqrt(sum((r - mean) ** 2 for r in R) / (len(R) - 1)) if len(R) > 1 else 0.0
        for i in rows:
            for t in range(L):
                later = [float(rewards[i, s]) for s in range(t, L) if events[i, s]]
                want = sum((r - mean) / (std + 1e-4) for r in later) if std > 0 else 0.0
                assert float(adv[i, t]) == pytest.approx(want * float(mask[i, t]), abs=1e-5)


def test_grpo_process_on_the_outcome_alone_is_grpo():
    """One reward event per sample (the outcome on the last token): every token gets GRPO's advantage."""
    torch.manual_seed(0)
    outcome = (torch.rand(8) > 0.5).float()
    outcome[:2] = torch.tensor([1.0, 0.0])  # the first group is not all equal
    _, batch = _batch([(3 + i % 3, {}, float(outcome[i])) for i in range(8)])
    out = batch.with_reward_source("outcome")
    x = AdvantageInputs(out.rewards, out.token_rewards, out.loss_mask, group_size=4, step_mask=out.step_mask)
    adv, _ = get_advantage("grpo_process")(x)
    grpo, _ = group_advantages(out.rewards, 4)
    torch.testing.assert_close(adv, grpo[:, None] * out.loss_mask, rtol=0, atol=1e-6)
    with pytest.raises(ValueError, match="step_mask"):
        get_advantage("grpo_process")(AdvantageInputs(out.rewards, out.token_rewards, out.loss_mask, 4))


def test_ppo_gae_runs_over_step_rewards(tiny_model_dir, tmp_path):
    """The critic says V ≡ 0.25; γ = 1, λ = 0.9; r = [0, 0.5, 0, 1 + 1] (steps at 1 and 3, outcome 1)."""
    from textgym.config import PPOConfig
    from textgym.models import load_model
    from textgym.trainers.rl.ppo import PPOTrainer

    model, tok = load_model(tiny_model_dir)
    cfg = PPOConfig.model_validate(
        {
            "env": {"id": "textgym/Arithmetic-v0", "kwargs": WORKED},
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 1,
            "kl_coef": 0.0,
            "lam": 0.9,
            "whiten_advantages": False,
            "reward_source": "both",
        }
    )
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    with torch.no_grad():
        trainer.critic.model.score.bias.fill_(0.25)
    trajs, batch = _batch([(4, {1: 0.5, 3: 1.0}, 1.0), (4, {}, 0.0)])
    adv = trainer.advantages(batch.with_reward_source("both"), trajs, None, {})
    d3, d1 = 2.0 - 0.25, 0.5  # δ_3 = r_3 + 0 − V, δ_1 = r_1 + V − V; δ_0 = δ_2 = 0
    a3 = d3
    a2 = 0.9 * a3
    a1 = d1 + 0.9 * a2
    a0 = 0.9 * a1
    torch.testing.assert_close(adv[0], torch.tensor([a0, a1, a2, a3]), rtol=0, atol=1e-5)
    # outcome only: the steps are not seen
    adv = trainer.advantages(batch.with_reward_source("outcome"), trajs, None, {})
    torch.testing.assert_close(adv[0], torch.tensor([0.9**3, 0.9**2, 0.9, 1.0]) * 0.75, rtol=0, atol=1e-5)
    trainer.close()


@pytest.mark.parametrize("algo", ["ppo", "grpo"])
def test_a_training_step_on_worked_steps_consumes_the_step_rewards(tiny_model_dir, tmp_path, algo):
    from textgym.config import GRPOConfig, PPOConfig
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.trainers.rl.ppo import PPOTrainer

    model, tok = load_model(tiny_model_dir)
    base = {
        "env": {"id": "textgym/Arithmetic-v0", "kwargs": {**WORKED, "split": "train"}},
        "steps": 1,
        "prompts_per_step": 2,
        "group_size": 2,
        "sampling": {"temperature": 1.0, "max_new_tokens": 12},
        "reward_source": "steps",
        "step_reward_weight": 0.5,
    }
    if algo == "ppo":
        trainer = PPOTrainer(PPOConfig.model_validate(base), model, tok, tmp_path)
    else:
        cfg = GRPOConfig.model_validate({**base, "advantage_estimator": "grpo_process"})
        trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    metrics = trainer.train_step()
    assert math.isfinite(metrics["loss/policy"]) and "rollout/steps_mean" in metrics
    if algo == "grpo":
        assert metrics["rollout/events_per_seq"] > 0  # a random model's lines are steps too
    trainer.close()


def test_grpo_process_refuses_a_kl_in_the_reward():
    from textgym.config import ConfigError, load_config

    with pytest.raises(ConfigError, match="kl_placement: loss"):
        load_config(
            None,
            [
                "grpo.advantage_estimator=grpo_process",
                "grpo.kl_placement=reward",
                "grpo.kl_coef=0.1",
                "grpo.kl_estimator=k1",
            ],  # k1: the one estimator the reward may hold (k3 is refused anyway)
            name="x",
            model={"init_preset": "tiny"},
            grpo={"env": {"id": "textgym/Arithmetic-v0"}},
        )
