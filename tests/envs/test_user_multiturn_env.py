"""A user's multi-turn env (plain Gymnasium, string observations, its own `oracle_action`, from
its own module by `module:Id-v0`) through the stock commands: `env check`, `eval --agent
oracle`, `rollouts collect --agent oracle`, then one `textgym train` config with SFT on the
collected demonstrations and GRPO (issue 34, item 6)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gymnasium as gym
import pytest
import yaml
from typer.testing import CliRunner

from textgym.cli import app
from textgym.envs import registry

runner = CliRunner()

# Guess a number from 1 to 16 in 5 tries; the env says "higher" or "lower". Only gymnasium and
# the standard library: no textgym import. The oracle bisects the interval it has narrowed.
USER_MODULE = '''
import re
import string

import gymnasium as gym


class GuessEnv(gym.Env):
    """Find the hidden number from 1 to `high`; after each wrong guess, higher or lower."""

    metadata = {"render_modes": []}

    def __init__(self, high: int = 16):
        self.observation_space = gym.spaces.Text(max_length=300, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=300, charset=string.printable)
        self.high = high

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.target = int(self.np_random.integers(1, self.high + 1))
        self.lo, self.hi = 1, self.high
        return f"I picked a number from 1 to {self.high}. Guess it: reply with the number alone.", {}

    def step(self, action):
        found = re.search(r"-?[0-9]{1,6}", str(action))
        if found is None:
            return "Reply with a number.", 0.0, False, False, {"is_success": False}
        guess = int(found.group())
        if guess == self.target:
            return "Correct!", 1.0, True, False, {"is_success": True}
        if guess < self.target:
            self.lo = max(self.lo, guess + 1)
            return f"{guess} is too low: higher.", 0.0, False, False, {"is_success": False}
        self.hi = min(self.hi, guess - 1)
        return f"{guess} is too high: lower.", 0.0, False, False, {"is_success": False}

    def oracle_action(self, messages):
        return str((self.lo + self.hi) // 2)

    def random_action(self, rng):
        return str(int(rng.integers(1, self.high + 1)))


gym.register(id="user/Guess-v0", entry_point=GuessEnv, max_episode_steps=5)
'''
ENV = "userenvs:user/Guess-v0"


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A folder holding `userenvs.py`, made the current directory (as a user runs textgym from it)."""
    (tmp_path / "userenvs.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(registry.IMPORTS_ENV_VAR, "")
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("userenvs", None)
    gym.registry.pop("user/Guess-v0", None)


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_a_users_multi_turn_env_goes_from_check_to_grpo(user_dir: Path, tiny_model_dir: Path) -> None:
    from textgym.offline.store import read_trajectories

    r = invoke("env", "check", ENV)
    assert r.exit_code == 0, r.output
    for name in ("make", "gymnasium", "determinism", "oracle", "random", "accuracy"):
        assert f"ok    {name}:" in r.output, (name, r.output)
    # the oracle bisects: it always finds the number within the 5 turns, mostly in more than one
    r = invoke("eval", "--agent", "oracle", "--env", ENV, "--n", "16", "--json", "--show", "16")
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["accuracy"] == 1.0
    turns = [sum(m["role"] == "assistant" for m in e["messages"]) for e in out["episodes"]]
    assert max(turns) >= 4 and sum(turns) / len(turns) > 2
    # demonstrations in the model's tokens: several turns each, env turns never trained on
    store = user_dir / "demos"
    r = invoke("rollouts", "collect", "--agent", "oracle", "--model", tiny_model_dir, "--env", ENV,
               "--out", store, "--n", "24", "--batch-size", "8")  # fmt: skip
    assert r.exit_code == 0, r.output
    rows = read_trajectories(store)
    assert rows.num_rows == 24 and set(rows.column("reward").to_pylist()) == {1.0}
    from textgym.models import load_tokenizer

    tok = load_tokenizer(tiny_model_dir)
    multi = 0
    for ids, mask, messages in zip(rows.column("token_ids").to_pylist(), rows.column("loss_mask").to_pylist(),
                                   rows.column("messages").to_pylist(), strict=True):  # fmt: skip
        said = [m["content"] for m in json.loads(messages) if m["role"] == "assistant"]
        trained = tok.decode([t for t, k in zip(ids, mask, strict=True) if k], skip_special_tokens=True)
        assert trained == "".join(said)  # exactly the assistant turns carry loss
        multi += len(said) > 1
    assert multi >= 12
    # one config: SFT on the store, then GRPO on the same env, evaluated before and after
    config = {
        "name": "guess", "out_dir": str(user_dir / "runs"), "threads": 1,
        "model": {"path": str(tiny_model_dir)},
        "sft": {"env": {"id": ENV}, "trajectories": str(store), "min_reward": 1.0, "steps": 4,
                "batch_size": 8},
        "grpo": {"env": {"id": ENV}, "steps": 2, "prompts_per_step": 2, "group_size": 2,
                 "sampling": {"temperature": 1.0, "max_new_tokens": 6}},
        "eval": {"env": {"id": ENV}, "n": 4, "sampling": {"temperature": 0.0, "max_new_tokens": 6}},
    }  # fmt: skip
    (user_dir / "guess.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    r = invoke("train", user_dir / "guess.yaml")
    assert r.exit_code == 0, r.output
    summary = json.loads((user_dir / "runs" / "guess" / "summary.json").read_text())
    assert set(summary["stage_times_s"]) == {"sft", "grpo"} and summary["n_eval"] == 4
    lines = (user_dir / "runs" / "guess" / "grpo" / "metrics.jsonl").read_text().splitlines()
    metrics = [json.loads(x) for x in lines]
    assert len(metrics) == 2 and all(m["rollout/turns_mean"] >= 1 for m in metrics)
    assert all("rollout/truncated_time_limit_frac" in m for m in metrics)
