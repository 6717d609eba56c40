"""The HumanEval / MBPP environments, single-turn and with feedback, run in the real sandbox."""

from __future__ import annotations

import gymnasium as gym
import pytest
from conftest import FIRST_TEST_ONLY

import textgym  # noqa: F401
from textgym import sandbox

pytestmark = pytest.mark.sandbox  # every code env runs its tests in the sandbox


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    sandbox.close_all()


def test_single_turn_env_and_info():
    env = gym.make("textgym/MBPP-v0")
    obs, info = env.reset(options={"task_index": 0})
    task = env.unwrapped.tasks[0]
    assert info["task_id"] == task.task_id and task.metadata["tests"][0] in obs[0]["content"]
    _, reward, terminated, truncated, info = env.step(task.solution)
    assert reward == 1.0 and terminated and not truncated and info["reward/correct"] == 1.0
    env.reset(options={"task_index": 0})
    _, reward, terminated, _, info = env.step("```python\ndef nope(): pass\n```")
    assert reward == 0.0 and terminated and "NameError" in info["error"]


def test_feedback_env_returns_the_failing_test_and_lets_the_agent_retry():
    env = gym.make("textgym/HumanEvalFeedback-v0")
    obs, _ = env.reset(options={"task_index": 0})
    task = env.unwrapped.tasks[0]
    obs, r1, term, trunc, info = env.step(
        "```python\ndef has_close_elements(numbers, threshold):\n    return None\n```"
    )
    assert r1 == 0.0 and not term and not trunc
    assert obs[0]["role"] == "user" and "check(has_close_elements)" in obs[0]["content"]
    assert "AssertionError" in obs[0]["content"]
    obs, r2, term, trunc, info = env.step(task.solution)
    assert r2 == 1.0 and term and obs == [] and info["reward/correct"] == 1.0 and info["attempt_score"] == 1.0


def test_feedback_rewards_telescope_to_the_final_attempt_and_timelimit_truncates():
    env = gym.make("textgym/MBPPFeedback-v0", mode="fraction")
    task_index = next(i for i, t in enumerate(env.unwrapped.tasks) if t.task_id == "mbpp/2")
    env.reset(options={"task_index": task_index})
    good = env.unwrapped.tasks[task_index].solution
    rewards, scores = [], []
    for action in (good, "", "```python\ndef similar_elements(a, b):\n    return None\n```"):
        if rewards and not scores[-1] < 1.0:
            break
        _, r, term, _, info = env.step(action)
        rewards.append(r)
        scores.append(info["attempt_score"])
    assert scores == [1.0] and rewards == [1.0] and term  # solved at once: terminated
    env.reset(options={"task_index": task_index})
    outcomes = [env.step(a) for a in (FIRST_TEST_ONLY, "", FIRST_TEST_ONLY)]
    scores = [o[4]["attempt_score"] for o in outcomes]
    third = 1 / len(env.unwrapped.tasks[task_index].metadata["tests"])  # the shown assert of 3 + generated
    assert scores == pytest.approx([third, 0.0, third])
    assert [o[1] for o in outcomes] == pytest.approx([third, -third, third])
    assert [o[4]["reward/correct"] for o in outcomes] == [o[1] for o in outcomes]
    assert sum(o[1] for o in outcomes) == pytest.approx(scores[-1])  # return = final attempt's score
    assert outcomes[1][4]["error"] == "empty action" and not outcomes[1][2]
    assert outcomes[-1][3] and not outcomes[-1][2]  # cut by TimeLimit(3): truncated, not terminated
