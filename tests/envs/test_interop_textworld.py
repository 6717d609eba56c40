"""`textgym/TextWorld-v0`: games generated locally with TextWorld (the `[interop]` extra).

Games are generated once into the default cache folder (~/.cache/textgym/textworld, about 1 s
and 400 kB a game on 2 cores), two processes at a time, so a second run only plays them.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import gymnasium as gym
import pytest
from typer.testing import CliRunner

pytest.importorskip("textworld")

import textgym  # noqa: F401 (registers the ids)
from textgym.cli import app
from textgym.envs.interop.textworld import (
    SPLIT_SEEDS,
    TextWorldEnv,
    default_cache_dir,
    game_path,
    parse_command,
)
from textgym.evaluation.envcheck import JUNK_ACTIONS

ENV_ID = "textgym/TextWorld-v0"
N = 40
DEFAULTS = {"nb_rooms": 3, "nb_objects": 6, "quest_length": 5}


def _generate(seed: int) -> str:
    return str(game_path(seed, cache_dir=default_cache_dir(), **DEFAULTS))


@pytest.fixture(scope="module")
def games() -> list[str]:
    """The first N train games with the default options, generated in two processes."""
    with ProcessPoolExecutor(max_workers=2) as pool:
        return list(pool.map(_generate, range(SPLIT_SEEDS["train"], SPLIT_SEEDS["train"] + N)))


def _eval(agent: str) -> dict:
    r = CliRunner().invoke(app, ["eval", "--agent", agent, "--env", ENV_ID, "--n", str(N), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output[r.output.index("{") :])


def test_oracle_wins_every_game_and_random_almost_none(games):
    oracle, rand = _eval("oracle"), _eval("random")
    assert oracle["accuracy"] >= 0.99 and oracle["mean_reward"] >= 0.99
    assert rand["accuracy"] < 0.10


def _without_serial(story: bytes) -> bytes:
    """A Z-machine story file with its header's serial number (bytes 0x12-0x17) blanked: Inform
    writes the compile date there (YYMMDD), so a game cached on another day differs in it alone."""
    return story[:0x12] + b"\0" * 6 + story[0x18:]


def test_generation_is_deterministic(tmp_path, games):
    again = game_path(3, cache_dir=tmp_path, **DEFAULTS).read_bytes()
    cached = Path(games[3]).read_bytes()
    assert hashlib.sha256(_without_serial(again)).digest() == hashlib.sha256(_without_serial(cached)).digest()
    assert again[0x12:0x18].isdigit()  # the serial is a date, so blanking it hides nothing else


def test_a_game_cached_on_another_day_still_counts_as_the_same(games):
    story = Path(games[3]).read_bytes()
    other_day = story[:0x12] + b"991231" + story[0x18:]
    assert other_day != story and _without_serial(other_day) == _without_serial(story)


def test_gymnasium_checker_determinism_and_junk(games):
    from gymnasium.utils.env_checker import check_env

    env = TextWorldEnv()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    a, b = gym.make(ENV_ID), gym.make(ENV_ID)
    assert a.reset(options={"task_index": 2})[0] == b.reset(options={"task_index": 2})[0]
    assert a.reset(seed=7, options={"task_index": 1})[0] == b.reset(seed=7, options={"task_index": 1})[0]
    for _, action in (*JUNK_ACTIONS, ("long", "x" * 200_000), ("newlines", "go\nnorth\n\nquit")):
        a.reset(options={"task_index": 0})
        obs, reward, terminated, _, info = a.step(action)
        assert reward == 0.0 and not terminated and info["reward/correct"] == 0.0 and obs
    a.close(), b.close(), env.close()


def test_reward_terms_every_turn_and_truncation(games):
    env = gym.make(ENV_ID, max_turns=3)
    obs, info = env.reset(options={"task_index": 0})
    assert "objective" not in obs[0]["content"] and "$$$$" not in obs[0]["content"]
    ends = []
    for _ in range(3):
        obs, _, terminated, truncated, info = env.step("look")
        assert {"reward/score", "reward/correct"} <= set(info) and info["admissible_commands"]
        ends.append((terminated, truncated))
    assert ends == [(False, False), (False, False), (False, True)]
    env.close()


def test_splits_are_disjoint_and_kwargs_are_checked():
    train, test = TextWorldEnv(split="train").tasks, TextWorldEnv(split="test").tasks
    assert len(train) == len(test) == 10_000
    assert train[len(train) - 1].metadata["seed"] < test[0].metadata["seed"]
    with pytest.raises(ValueError, match="split"):
        TextWorldEnv(split="dev")
    with pytest.raises(ValueError, match="quest_length"):
        TextWorldEnv(quest_length=0)


def test_parse_command():
    assert parse_command("Let me think.\n`Open the chest.`") == "open the chest"
    assert parse_command(r"First \boxed{go east} then \boxed{TAKE key}") == "take key"
    assert parse_command("   \n ") == ""
