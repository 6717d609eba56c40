"""`textgym/TextArena-v0`: TextArena's single-player games as a multi-turn env (needs the interop extra)."""

from __future__ import annotations

import random

import gymnasium as gym
import pytest

pytest.importorskip("textarena")

from gymnasium.utils.env_checker import check_env

import textgym  # noqa: F401  (registers the ids)
from textgym.envs.interop import textarena as taenv
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted

ENV_ID = "textgym/TextArena-v0"
ORACLE = (
    "GuessTheNumber-v0",
    "GuessTheNumber-v0-hardcore",
    "TowerOfHanoi-v0",
    "TowerOfHanoi-v0-medium",
    "Mastermind-v0",
)
NO_ORACLE = ("Minesweeper-v0-small", "FrozenLake-v0", "2048-v0-ultra-easy", "Sudoku-v0-very-easy")


@pytest.mark.parametrize("game", ORACLE)
def test_oracle_wins_and_random_loses(game):
    assert evaluate_scripted(OracleAgent(), ENV_ID, {"game": game}, n=40).accuracy >= 0.99
    assert evaluate_scripted(RandomAgent(0), ENV_ID, {"game": game}, n=40).accuracy < 0.10


@pytest.mark.parametrize("game", NO_ORACLE)
def test_games_without_an_oracle_play_and_say_so(game):
    env = gym.make(ENV_ID, game=game)
    obs, _ = env.reset(options={"task_index": 0})
    assert obs[0]["role"] == "user" and obs[0]["content"]
    with pytest.raises(NotImplementedError, match="no scripted expert"):
        env.unwrapped.oracle_action(obs)
    rand = evaluate_scripted(RandomAgent(0), ENV_ID, {"game": game}, n=5)
    assert rand.accuracy < 1.0


def test_env_checker_terms_and_end_of_game_reward():
    env = gym.make(ENV_ID, game="TowerOfHanoi-v0")
    check_env(env.unwrapped, skip_render_check=True)
    obs, info = env.reset(options={"task_index": 2})
    assert info["task_id"] == "textarena/TowerOfHanoi-v0/train/2"
    rewards, terms = [], []
    for _ in range(7):
        obs, reward, terminated, truncated, info = env.step(env.unwrapped.oracle_action(obs))
        rewards.append(reward)
        terms.append((info["reward/score"], info["reward/correct"]))
    assert terminated and not truncated
    assert rewards == [0.0] * 6 + [1.0] and terms[-1] == (1.0, 1.0) and terms[0] == (0.0, 0.0)


def test_same_seed_same_game_and_global_random_untouched():
    a, b = gym.make(ENV_ID, game="Mastermind-v0"), gym.make(ENV_ID, game="Mastermind-v0")
    random.seed(123)
    expected = random.random()
    random.seed(123)
    a.reset(options={"task_index": 4})
    b.reset(options={"task_index": 4})
    assert a.unwrapped.oracle_action([]) == b.unwrapped.oracle_action([])
    assert random.random() == expected
    codes = set()
    for i in range(5):
        a.reset(options={"task_index": i})
        codes.add(a.unwrapped.oracle_action([]))
    assert len(codes) > 1
    test = gym.make(ENV_ID, game="Mastermind-v0", split="test")
    assert test.unwrapped.tasks[4].metadata["seed"] != a.unwrapped.tasks[4].metadata["seed"]


JUNK = ["", "   ", "x" * 200_000, "no brackets here", "[[[", "[99999999999999999999]"]


@pytest.mark.parametrize("action", JUNK)
def test_junk_actions_are_scored_not_raised(action):
    env = gym.make(ENV_ID, game="GuessTheNumber-v0")
    env.reset(options={"task_index": 0})
    obs, _, terminated, _, _ = env.step(action)
    assert not terminated and "invalid" in obs[0]["content"].lower()
    obs, reward, terminated, _, info = env.step(action)  # the second invalid move in a row ends it
    assert terminated and info["reward/correct"] == 0.0 and reward < 1.0


def test_max_turns_truncates():
    env = gym.make(ENV_ID, game="TowerOfHanoi-v0-medium", max_turns=3)
    env.reset(options={"task_index": 0})
    moves = ["[A B]", "[A C]", "[B C]"]
    results = [env.step(m) for m in moves]
    assert [r[3] for r in results] == [False, False, True] and not results[-1][2]
    with pytest.raises(RuntimeError):
        env.step("[A B]")


def test_kwargs_are_validated():
    with pytest.raises(ValueError, match="needs game=NAME"):
        gym.make(ENV_ID)
    with pytest.raises(ValueError, match="Did you mean 'GuessTheNumber-v0'"):
        gym.make(ENV_ID, game="GuessTheNumbr-v0")
    with pytest.raises(ValueError, match="OpenRouter"):
        gym.make(ENV_ID, game="TwentyQuestions-v0")
    with pytest.raises(ValueError, match="NLTK"):
        gym.make(ENV_ID, game="Wordle-v0")
    with pytest.raises(ValueError, match="multi-player"):
        gym.make(ENV_ID, game="TicTacToe-v0")
    with pytest.raises(ValueError, match="does not import"):
        gym.make(ENV_ID, game="Klondike-v0")
    with pytest.raises(ValueError, match="split must be"):
        gym.make(ENV_ID, game="GuessTheNumber-v0", split="dev")
    with pytest.raises(ValueError, match="max_turns"):
        gym.make(ENV_ID, game="GuessTheNumber-v0", max_turns=0)
    assert gym.make(ENV_ID, game="TowerOfHanoi-v0-extreme").unwrapped.max_turns == 254


def test_game_lists_are_textarenas():
    from textarena.envs.registration import ENV_REGISTRY

    for game in taenv.OFFLINE_GAMES + tuple(taenv.NEEDS_DOWNLOAD_OR_KEY) + taenv.BROKEN_GAMES:
        assert game in ENV_REGISTRY and f"{game}-raw" in ENV_REGISTRY, game
