"""`textgym/ReasoningGym-v0`: reasoning-gym's datasets as a single-turn env (needs the interop extra)."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("reasoning_gym")

from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

import textgym  # noqa: F401  (registers the ids)
from textgym.cli import app
from textgym.envs.interop import reasoning_gym as rgenv
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted

ENV_ID = "textgym/ReasoningGym-v0"
GOLD = ("basic_arithmetic", "leg_counting", "chain_sum", "word_sorting", "spell_backward", "caesar_cipher")


@pytest.mark.parametrize("name", GOLD)
def test_oracle_solves_and_random_fails(name):
    oracle = evaluate_scripted(OracleAgent(), ENV_ID, {"dataset": name}, n=40)
    assert oracle.accuracy >= 0.99, name
    assert oracle.mean_reward >= 0.99
    rand = evaluate_scripted(RandomAgent(0), ENV_ID, {"dataset": name}, n=40)
    assert rand.accuracy < 0.10, name


def test_env_checker_and_terms():
    env = gym.make(ENV_ID, dataset="chain_sum", size=20)
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(options={"task_index": 3})
    assert obs[0]["role"] == "system" and "<answer>" in obs[0]["content"]
    assert obs[1]["role"] == "user" and info["task_id"] == "reasoning_gym/chain_sum/train/3"
    _, reward, terminated, truncated, info = env.step(f"<answer>{info['answer']}</answer>")
    assert (reward, terminated, truncated) == (1.0, True, False)
    assert info["reward/score"] == info["reward/correct"] == 1.0
    assert env.unwrapped.accuracy_term == "correct"


def test_same_seed_same_task_and_splits_differ():
    a = gym.make(ENV_ID, dataset="leg_counting", size=50, seed=7)
    b = gym.make(ENV_ID, dataset="leg_counting", size=50, seed=7)
    assert a.reset(seed=3)[0] == b.reset(seed=3)[0]
    assert a.unwrapped.tasks[5] == b.unwrapped.tasks[5]
    test = gym.make(ENV_ID, dataset="leg_counting", size=50, seed=7, split="test")
    assert test.unwrapped.tasks[5].task_id == "reasoning_gym/leg_counting/test/5"
    train_prompts = {t.prompt for t in a.unwrapped.tasks}
    assert sum(t.prompt in train_prompts for t in test.unwrapped.tasks) < 5
    assert len(a.unwrapped.tasks) == 50 and a.unwrapped.tasks[-1] == a.unwrapped.tasks[49]


def test_config_is_the_datasets_own_kwargs():
    config = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}
    env = gym.make(ENV_ID, dataset="chain_sum", size=5, config=config)
    for task in env.unwrapped.tasks:
        assert len(task.prompt.split(":")[1].split("=")[0].split()) == 3  # "a + b"


@pytest.mark.parametrize(
    "action", ["", "   ", "x" * 200_000, "<answer></answer>", "<answer>" + "9" * 5000 + "</answer>", "junk"]
)
def test_junk_actions_are_scored_not_raised(action):
    env = gym.make(ENV_ID, dataset="prime_factorization", size=5)  # its score_answer int()s the answer
    env.reset(options={"task_index": 0})
    _, reward, terminated, _, info = env.step(action)
    assert reward < 0.05 and terminated  # the dataset may give a format crumb (0.01 for an empty answer)
    assert info["reward/correct"] == 0.0 and info["reward/score"] == reward


def test_score_answer_errors_become_zero_with_a_reason():
    env = gym.make(ENV_ID, dataset="prime_factorization", size=5)
    env.reset(options={"task_index": 0})
    info = env.step("<answer>RANDOM</answer>")[4]
    assert "score_answer failed" in info["error"]


def test_a_constraint_checked_dataset_is_scored_without_an_oracle():
    env = gym.make(ENV_ID, dataset="propositional_logic", size=10)
    obs, info = env.reset(options={"task_index": 0})
    task = env.unwrapped.task
    assert info["answer"] == "" and task.solution is None and not env.unwrapped.has_gold_answer
    with pytest.raises(NotImplementedError, match="no gold answers"):
        env.unwrapped.oracle_action(obs)
    # any valid non-trivial conclusion scores 1 (reasoning-gym keeps one example in the metadata)
    reward = env.step(f"<answer>{task.metadata['example_answer']}</answer>")[1]
    assert reward == 1.0
    env.reset(options={"task_index": 0})
    assert env.step("<answer>not a formula</answer>")[1] < 1.0


def test_kwargs_are_validated():
    with pytest.raises(ValueError, match="needs dataset=NAME"):
        gym.make(ENV_ID)
    with pytest.raises(ValueError, match="Did you mean 'leg_counting'"):
        gym.make(ENV_ID, dataset="leg_countin")
    with pytest.raises(ValueError, match="split must be"):
        gym.make(ENV_ID, dataset="leg_counting", split="dev")
    with pytest.raises(ValueError, match="size must be"):
        gym.make(ENV_ID, dataset="leg_counting", size=0)
    with pytest.raises(ValueError, match="not options of"):
        gym.make(ENV_ID, dataset="chain_sum", config={"nope": 1})
    with pytest.raises(ValueError, match="pass seed= and size="):
        gym.make(ENV_ID, dataset="chain_sum", config={"seed": 1})
    with pytest.raises(ValueError, match="rejects"):
        gym.make(ENV_ID, dataset="chain_sum", config={"min_terms": 5, "max_terms": 2})


def test_constants_match_reasoning_gym():
    from reasoning_gym.utils import SYSTEM_PROMPTS

    assert SYSTEM_PROMPTS["default"] == rgenv.DEFAULT_SYSTEM_PROMPT
    names = rgenv.dataset_names()
    for name in rgenv.NO_GOLD_ANSWER:
        assert name in names
        env = gym.make(ENV_ID, dataset=name, size=3)
        assert all(t.solution is None for t in env.unwrapped.tasks)


def test_random_action_format():
    env = rgenv.ReasoningGymEnv("leg_counting", size=5)
    rng = np.random.default_rng(1)
    assert all(rgenv.extract_answer(env.random_action(rng)) for _ in range(20))


def test_cli_eval_oracle_and_random():
    runner = CliRunner()
    for agent, check in (("oracle", lambda a: a >= 0.99), ("random", lambda a: a < 0.10)):
        r = runner.invoke(
            app,
            ["eval", "--agent", agent, "--env", ENV_ID, "--env-kwargs", "dataset=leg_counting", "--n", "40",
             "--json"],
            catch_exceptions=False,
        )  # fmt: skip
        assert r.exit_code == 0, r.output
        report = json.loads(r.stdout)
        assert check(report["accuracy"]), report
