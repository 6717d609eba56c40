"""`textgym/OpenEnv-v0`: any OpenEnv server as a textgym env, and any textgym env as an OpenEnv server.

The client (`OpenEnvEnv`) holds one session on an OpenEnv server through OpenEnv's own
`GenericEnvClient` (the WebSocket `/ws` protocol: `reset`, `step`, `state` messages).
`serve_openenv` (CLI: `textgym env serve-openenv ID`) serves a textgym env with OpenEnv's
`create_app`, so every OpenEnv client can play it. Needs the `openenv-core` package
(`pip install 'textgym[interop]'`).

What crosses the wire for a textgym server:

- `reset` with `{"seed": i, "task_index": i}`: `env.reset(seed=i, options={"task_index": i})`,
  task *i*.
- `step` with `{"text": reply}`: `env.step(reply)`.
- the observation's fields: `messages` (chat messages), `info` (the `reward/<name>` terms,
  `task_id`, ...), `terminated` and `truncated`; OpenEnv's `done` is either of them.
- `state`: `episode_id`, `step_count`, and `textgym`: `env_id`, `num_tasks`, `accuracy_term`,
  `task_index`, `oracle_action` (the env's oracle on the session's transcript; absent when
  served with `expose_oracle=False`) and `random_action` (the env's, drawn on the server).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, SupportsFloat

import numpy as np

from textgym.envs.base import LazyTasks, TextEnv
from textgym.envs.interop import require
from textgym.types import Message, Task

DEFAULT_TIMEOUT_S = 30.0
"""Seconds the client waits to connect, and for each answer, before it raises."""
DEFAULT_NUM_TASKS = 1_000_000
"""Tasks (reset seeds 0..N−1) of a server that does not say how many it has."""
ACTION_FIELD = "text"
"""The action field of a textgym server: `{"text": reply}`."""
_RANDOM_WORDS = ("hello", "look", "42", "yes", "north", "take", "the", "open", "1", "answer")


def _http_url(base_url: str) -> str:
    url = base_url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[5:]
    if url.startswith("wss://"):
        return "https://" + url[6:]
    return url


class _RemoteTasks(LazyTasks):
    """Task *i* of a server: `task_id` "openenv/<i>" (the server poses it at reset)."""

    def __init__(self, n: int):
        self.n = int(n)

    def __len__(self) -> int:
        return self.n

    def task(self, index: int) -> Task:
        """Task `index` (see the class docstring)."""
        return Task(task_id=f"openenv/{index}", prompt="", metadata={"seed": index})


# ============================================================================ the client
class OpenEnvEnv(TextEnv):
    r"""A session on an OpenEnv server, played as a multi-turn textgym env.

    ## Description
    Task *i* is the server's `reset(seed=i)` (a textgym server also gets `task_index=i`). The
    client connects when made, reads the server's `state` (a textgym server says its task count,
    accuracy term and env id there) and its action schema (`GET /schema`).

    ## Action Space
    `UnicodeText`: the reply, sent as `{action_field: reply}`. Empty, over-long or non-text
    replies are sent as "" so the server's env scores them (Wordle: a lost guess).

    ## Observation Space
    `ChatMessages`: a textgym server's `messages`; for other servers one user message with the
    observation's text field (or all its fields as JSON).

    ## Rewards
    A textgym server's `reward/<name>` terms, unchanged. For other servers: `reward/reward` (the
    server's reward) and `reward/correct`, 1.0 on the step that ends an episode whose return
    reaches `success_reward`.

    ## Episode End
    Terminates when the server says `done` (a textgym server's `truncated` is kept as
    `truncated`); truncated after `max_turns` steps.

    ## Scripted agents
    `oracle_action` reads the oracle from a textgym server's `state` (served with its oracle
    exposed); other servers have none (`NotImplementedError`). `random_action` is the server's
    random action when it offers one, else random words.

    Args:
        base_url: the server, "http://host:port" (or "ws://...").
        num_tasks: the task count (default: what the server says, else 1,000,000 seeds).
        action_field: the action's text field (default: "text" on a textgym server, else the
            one string field of the server's action schema).
        success_reward: the return that counts as solved on servers without a `reward/correct`.
        max_turns: steps before truncation (default 64).
        timeout_s: seconds to wait for the connection and for each answer (default 30).
        **kwargs: `TextEnv`'s (`system_prompt`, `max_action_chars`, `render_mode`).

    Raises:
        ImportError: without the `openenv-core` package.
        ValueError: without a `base_url` (the message names it), on one that is not http(s)://
            or ws(s)://, or an action field that cannot be found.
        ConnectionError: when no OpenEnv server answers at `base_url` within `timeout_s` (the
            message names the URL); also from `reset`/`step` when the connection is lost.

    ## Version History
    - v0: initial version (openenv-core 0.3).

    Examples:
        Serve Wordle as an OpenEnv server and play it back through the protocol:

        >>> import gymnasium as gym
        >>> import textgym
        >>> from textgym.envs.interop.openenv_server import serve_openenv
        >>> server = serve_openenv("textgym/Wordle-v0", expose_oracle=True)   # the oracle on request
        >>> env = gym.make("textgym/OpenEnv-v0", base_url=server.url)
        >>> wordle = gym.make("textgym/Wordle-v0")
        >>> env.unwrapped.remote_env_id, len(env.unwrapped.tasks) == len(wordle.unwrapped.tasks)
        ('textgym/Wordle-v0', True)
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> obs[0]["content"][:16]
        "Let's play Wordl"
        >>> obs, reward, terminated, truncated, info = env.step(r"\boxed{crane}")
        >>> print(obs[0]["content"])
        crane: - - Y - -
        5 guesses left.
        >>> env.get_wrapper_attr("oracle_action")([])
        '\\boxed{about}'
        >>> env.step(r"\boxed{about}")[1:3]
        (1.0, True)
        >>> env.close(); server.stop()
    """

    def __init__(
        self,
        *,
        base_url: str | None = None,
        num_tasks: int | None = None,
        action_field: str | None = None,
        success_reward: float = 1.0,
        max_turns: int = 64,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        **kwargs: Any,
    ):
        if base_url is None:
            raise ValueError(
                "textgym/OpenEnv-v0 needs base_url, the OpenEnv server to play (e.g. "
                "gym.make('textgym/OpenEnv-v0', base_url='http://127.0.0.1:8000'), or "
                "--env-kwargs base_url=... on the CLI); `textgym env serve-openenv ID` serves one"
            )
        require("openenv-core", "openenv")
        if not isinstance(base_url, str) or not base_url.startswith(
            ("http://", "https://", "ws://", "wss://")
        ):
            raise ValueError(f"base_url must start with http://, https://, ws:// or wss://, got {base_url!r}")
        if max_turns < 1 or timeout_s <= 0:
            raise ValueError(f"max_turns must be >= 1 and timeout_s > 0, got {max_turns}, {timeout_s}")
        from openenv.core.generic_client import GenericEnvClient

        self.base_url = base_url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.max_turns = int(max_turns)
        self.success_reward = float(success_reward)
        self._client = GenericEnvClient(
            base_url=self.base_url, connect_timeout_s=self.timeout_s, message_timeout_s=self.timeout_s
        ).sync()
        try:
            self._call("connect", self._client.connect)
            state = self._call("state", self._client.state)
        except BaseException:
            self._client.close()
            raise
        meta = state.get("textgym") if isinstance(state, dict) else None
        self.remote: dict[str, Any] = dict(meta) if isinstance(meta, dict) else {}
        self.remote_env_id: str | None = self.remote.get("env_id")
        n = num_tasks if num_tasks is not None else int(self.remote.get("num_tasks") or DEFAULT_NUM_TASKS)
        if n < 1:
            raise ValueError(f"num_tasks must be >= 1, got {n}")
        self.accuracy_term = str(self.remote.get("accuracy_term") or "correct")
        self.action_field = action_field or (ACTION_FIELD if self.remote else self._schema_action_field())
        super().__init__(_RemoteTasks(n), **kwargs)
        self._turns = 0
        self._return = 0.0
        self._truncated = False

    # -- the wire ----------------------------------------------------------------------
    def _call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Run one client call; connection failures and timeouts become a ConnectionError naming the URL."""
        try:
            return fn(*args, **kwargs)
        except RuntimeError as e:
            if str(e).startswith("Server error"):
                raise
            raise ConnectionError(f"OpenEnv server at {self.base_url}: {what} failed: {e}") from e
        except (OSError, TimeoutError, ConnectionError) as e:
            raise ConnectionError(
                f"no answer from the OpenEnv server at {self.base_url} ({what}, "
                f"timeout {self.timeout_s:g}s): {type(e).__name__}: {e}"
            ) from e
        except Exception as e:  # websockets' ConnectionClosed and the like
            if type(e).__module__.startswith("websockets"):
                raise ConnectionError(
                    f"lost the connection to the OpenEnv server at {self.base_url} ({what}): {e!r}"
                ) from e
            raise

    def _schema_action_field(self) -> str:
        import httpx

        try:
            schema = httpx.get(f"{_http_url(self.base_url)}/schema", timeout=self.timeout_s).json()
        except (httpx.HTTPError, ValueError) as e:
            raise ValueError(
                f"could not read the action schema at {self.base_url}/schema ({e}); pass action_field="
            ) from e
        props = (schema.get("action") or {}).get("properties") or {}
        strings = [k for k, v in props.items() if k != "metadata" and v.get("type") == "string"]
        if len(strings) != 1:
            raise ValueError(
                f"the action schema of {self.base_url} has string fields {strings}; pass action_field= "
                "to say which one carries the reply"
            )
        return strings[0]

    def _messages(self, observation: dict[str, Any]) -> list[Message]:
        messages = observation.get("messages")
        if isinstance(messages, list) and all(isinstance(m, dict) and "content" in m for m in messages):
            return [{"role": str(m.get("role", "user")), "content": str(m["content"])} for m in messages]
        texts = [v for v in observation.values() if isinstance(v, str)]
        text = texts[0] if len(texts) == 1 else json.dumps(observation, default=str)
        return [{"role": "user", "content": text}] if text else []

    # -- TextEnv hooks -----------------------------------------------------------------
    def initial_messages(self, task: Task) -> list[Message]:
        """Reset the server's session on task *i* (`seed=i`, and `task_index=i`): its first observation.

        Raises:
            RuntimeError: when the server refuses the reset (its error message).
            ConnectionError: when the server does not answer.
        """
        index = int(task.metadata["seed"])
        result = self._call("reset", self._client.reset, seed=index, task_index=index)
        self._turns, self._return, self._truncated = 0, 0.0, False
        return self._messages(result.observation or {})

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Send the reply; map the answer to textgym's 4-tuple (see the class docstring)."""
        try:
            result = self._call("step", self._client.step, {self.action_field: action})
        except RuntimeError as e:  # the server refused this action: say so, the episode goes on
            return (
                [{"role": "user", "content": f"The server refused the action: {e}"}],
                0.0,
                False,
                {"error": str(e), f"reward/{self.accuracy_term}": 0.0},
            )
        observation = result.observation or {}
        reward = float(result.reward or 0.0)
        self._return += reward
        remote_info = observation.get("info")
        info: dict[str, Any] = dict(remote_info) if isinstance(remote_info, dict) else {}
        terminated = bool(observation.get("terminated", result.done))
        self._truncated = bool(observation.get("truncated", False))
        if not any(k.startswith("reward/") for k in info):
            solved = bool(result.done) and self._return >= self.success_reward
            info["reward/reward"] = reward
            info["reward/correct"] = 1.0 if solved else 0.0
        info.pop("task_id", None), info.pop("task_index", None), info.pop("answer", None)
        return self._messages(observation), reward, terminated, info

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Send "" in place of an unusable reply, so the server's env scores it; `info["error"]` says why."""
        obs, reward, terminated, info = self.respond("")
        info["error"] = reason
        return obs, reward, terminated, info

    # -- gymnasium API -----------------------------------------------------------------
    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Play one reply on the server.

        Raises:
            RuntimeError: if called before `reset()` or after the episode terminated.
            ConnectionError: when the server does not answer within `timeout_s`.
        """
        obs, reward, terminated, _, info = super().step(action)
        self._turns += 1
        truncated = not terminated and (self._truncated or self._turns >= self.max_turns)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Close the session (the server keeps running)."""
        client = getattr(self, "_client", None)
        if client is not None:
            with contextlib.suppress(Exception):  # best effort: the server may be gone
                client.close()
            self._client = None
        super().close()

    # -- scripted experts --------------------------------------------------------------
    def _remote_state(self) -> dict[str, Any]:
        state = self._call("state", self._client.state)
        meta = state.get("textgym") if isinstance(state, dict) else None
        return meta if isinstance(meta, dict) else {}

    def oracle_action(self, messages: list[Message]) -> str:
        """The served env's oracle, read from the server's `state`.

        Raises:
            RuntimeError: before `reset()`.
            NotImplementedError: when the server exposes no oracle (not a textgym server, or
                served with `expose_oracle=False`).
        """
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        oracle = self._remote_state().get("oracle_action")
        if oracle is None:
            raise NotImplementedError(f"the OpenEnv server at {self.base_url} exposes no oracle")
        return str(oracle)

    def random_action(self, rng: np.random.Generator) -> str:
        """The server's random action (a textgym env's `random_action`), else two random words."""
        if self.remote and self.task is not None:
            remote = self._remote_state().get("random_action")
            if remote is not None:
                return str(remote)
        return " ".join(_RANDOM_WORDS[int(i)] for i in rng.integers(len(_RANDOM_WORDS), size=2))


__all__ = ["OpenEnvEnv"]
