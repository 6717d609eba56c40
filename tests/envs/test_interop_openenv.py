"""`textgym/OpenEnv-v0` and `serve_openenv`: a textgym env served with OpenEnv's protocol and played back.

The server runs in a thread on 127.0.0.1 (a free port); the client is OpenEnv's own
`GenericEnvClient` over its WebSocket protocol.
"""

from __future__ import annotations

import socket
import time
import warnings

import gymnasium as gym
import pytest
from conftest import free_port

pytest.importorskip("openenv")

import textgym  # noqa: F401 (registers the ids)
from textgym.envs.interop.openenv import OpenEnvEnv
from textgym.envs.interop.openenv_server import serve_openenv
from textgym.evaluation.envcheck import JUNK_ACTIONS
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted

ENV_ID = "textgym/OpenEnv-v0"


@pytest.fixture(scope="module")
def wordle_url():
    with serve_openenv("textgym/Wordle-v0", expose_oracle=True) as server:
        yield server.url


def test_wordle_round_trip_keeps_the_oracle_and_random_bounds(wordle_url):
    oracle = evaluate_scripted(OracleAgent(), ENV_ID, {"base_url": wordle_url}, n=20)
    rand = evaluate_scripted(RandomAgent(), ENV_ID, {"base_url": wordle_url}, n=20)
    assert oracle.accuracy == 1.0
    assert rand.accuracy < 0.10
    # Wordle's turn limit (TimeLimit on the server) comes back as `truncated`
    assert all(e["turns"] == 6 for e in rand.episodes if not e["correct"])


def test_served_env_poses_the_same_tasks_and_terms(wordle_url):
    local, remote = gym.make("textgym/Wordle-v0"), gym.make(ENV_ID, base_url=wordle_url)
    assert len(remote.unwrapped.tasks) == len(local.unwrapped.tasks)
    for i in (0, 5):
        assert remote.reset(options={"task_index": i})[0] == local.reset(options={"task_index": i})[0]
        a = remote.step(r"\boxed{crane}")
        b = local.step(r"\boxed{crane}")
        assert a[0] == b[0] and a[1:4] == b[1:4] and a[4]["reward/correct"] == b[4]["reward/correct"] == 0.0
    remote.close(), local.close()


def test_gymnasium_checker_determinism_and_junk(wordle_url):
    from gymnasium.utils.env_checker import check_env

    env = OpenEnvEnv(base_url=wordle_url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        check_env(env, skip_render_check=True)
    env.close()
    a, b = gym.make(ENV_ID, base_url=wordle_url), gym.make(ENV_ID, base_url=wordle_url)
    assert a.reset(seed=123)[0] == b.reset(seed=123)[0]
    for _, action in (*JUNK_ACTIONS, ("long", "x" * 200_000), ("not text", 42)):
        a.reset(options={"task_index": 0})
        _, reward, terminated, _, info = a.step(action)
        assert reward == 0.0 and not terminated and info["reward/correct"] == 0.0
    a.close(), b.close()


def test_no_base_url_is_a_clear_error_naming_it():
    with pytest.raises(ValueError, match="needs base_url"):
        gym.make(ENV_ID)


def test_a_dead_server_is_a_clear_error_naming_the_url():
    port = free_port()  # nothing listens there now
    url = f"http://127.0.0.1:{port}"
    start = time.monotonic()
    with pytest.raises(ConnectionError, match=f"127.0.0.1:{port}"):
        gym.make(ENV_ID, base_url=url, timeout_s=2)
    # a server that accepts the connection but never answers: the timeout, not a hang
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}"
    with pytest.raises(ConnectionError, match=url.removeprefix("http://")):
        OpenEnvEnv(base_url=url, timeout_s=1)
    silent.close()
    assert time.monotonic() - start < 10
    with pytest.raises(ValueError, match="base_url"):
        OpenEnvEnv(base_url="127.0.0.1:8000")


def test_a_server_exposes_no_oracle_unless_asked():
    with serve_openenv("textgym/Wordle-v0") as server:
        env = OpenEnvEnv(base_url=server.url)
        env.reset(options={"task_index": 0})
        with pytest.raises(NotImplementedError, match="no oracle"):
            env.oracle_action([])
        env.close()


def test_the_cli_command_serves(monkeypatch):
    from textgym.cli import openenv as cli

    served = {}

    class Fake:
        url = "http://127.0.0.1:1"

        def wait(self):
            served["waited"] = True

    def fake_serve(env_id, env_kwargs, host, port, **kw):
        served.update(env_id=env_id, env_kwargs=env_kwargs, host=host, port=port, **kw)
        return Fake()

    monkeypatch.setattr("textgym.envs.interop.openenv_server.serve_openenv", fake_serve)
    cli.serve_openenv_cmd("textgym/Wordle-v0", ["system_prompt=Be brief."], "127.0.0.1", 0, True)
    assert served == {
        "env_id": "textgym/Wordle-v0", "env_kwargs": {"system_prompt": "Be brief."}, "host": "127.0.0.1",
        "port": 0, "expose_oracle": True, "waited": True,
    }  # fmt: skip
    from typer.testing import CliRunner

    from textgym.cli import app

    result = CliRunner().invoke(app, ["env", "serve-openenv", "textgym/Wordle-v0", "--port", "0"])
    assert result.exit_code == 0, result.output
    assert served["expose_oracle"] is False  # the oracle is opt-in (`--oracle`)
