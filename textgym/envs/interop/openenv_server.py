"""The server half of `textgym/OpenEnv-v0`: any textgym env served over OpenEnv's protocol.

`serve_openenv(env_id, env_kwargs)` (CLI: `textgym env serve-openenv ID`) wraps a textgym env
in OpenEnv's own `create_app`; what crosses the wire is described in
`textgym.envs.interop.openenv`, whose client (`OpenEnvEnv`) plays it back.
"""

from __future__ import annotations

import math
import socket
import threading
import time
import uuid
from typing import Any

import numpy as np

from textgym.envs.interop import require


def _json_safe(value: Any) -> Any:
    """`value` with everything JSON cannot carry turned into text (numpy scalars into numbers)."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return str(value)


# long: OpenEnv's three classes, defined inside so that openenv is imported only when serving
def _server_classes() -> tuple[type, type, type]:
    """OpenEnv's Action/Observation/Environment subclasses for textgym (built on first use)."""
    global _CLASSES
    if _CLASSES is not None:
        return _CLASSES
    from openenv.core.env_server.interfaces import Environment
    from openenv.core.env_server.types import Action, Observation, State
    from pydantic import Field

    class TextGymAction(Action):
        """A textgym action: the agent's reply."""

        text: str = Field(description="The agent's reply (any text; the env scores unusable replies)")

    class TextGymObservation(Observation):
        """A textgym observation: chat messages, the step's info and gymnasium's two end flags."""

        messages: list[dict[str, Any]] = Field(default_factory=list, description="Chat messages")
        info: dict[str, Any] = Field(default_factory=dict, description="reward/<name> terms and more")
        terminated: bool = Field(default=False, description="The episode ended on the env's terms")
        truncated: bool = Field(default=False, description="The episode was cut by a turn limit")

    class TextGymEnvironment(Environment):
        """One textgym env per OpenEnv session (see the module docstring for the mapping)."""

        SUPPORTS_CONCURRENT_SESSIONS = True

        def __init__(self, env_id: str, env_kwargs: dict[str, Any], expose_oracle: bool):
            super().__init__()
            from textgym.envs.registry import accuracy_term, make, task_count

            self.env_id, self.expose_oracle = env_id, expose_oracle
            self.env = make(env_id, **env_kwargs)
            self.num_tasks = task_count(self.env)
            self.accuracy_term = accuracy_term(self.env)
            self._messages: list[dict[str, Any]] = []
            self._episode_id: str | None = None
            self._task_index: int | None = None
            self._steps = 0
            self._rng = np.random.default_rng(0)

        def reset(
            self,
            seed: int | None = None,
            episode_id: str | None = None,
            task_index: int | None = None,
            **_: Any,
        ) -> Any:
            options = {"task_index": int(task_index)} if task_index is not None else None
            obs, info = self.env.reset(seed=seed, options=options)
            self._messages = [dict(m) for m in obs]
            self._episode_id = episode_id or str(uuid.uuid4())
            self._task_index = info.get("task_index", task_index)
            self._steps = 0
            self._rng = np.random.default_rng([int(seed or 0), int(task_index or 0)])
            return TextGymObservation(messages=self._messages, info=_json_safe(info), reward=0.0)

        def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Any:
            if self._episode_id is None:
                raise RuntimeError("reset the session before step")
            self._messages.append({"role": "assistant", "content": action.text})
            obs, reward, terminated, truncated, info = self.env.step(action.text)
            self._messages += [dict(m) for m in obs]
            self._steps += 1
            return TextGymObservation(
                messages=list(obs), info=_json_safe(info), reward=float(reward),
                done=bool(terminated or truncated), terminated=bool(terminated), truncated=bool(truncated),
            )  # fmt: skip

        def _scripted(self, name: str, *args: Any) -> str | None:
            try:
                return str(self.env.get_wrapper_attr(name)(*args))
            except Exception:  # no such expert, or it cannot answer now
                return None

        @property
        def state(self) -> Any:
            meta: dict[str, Any] = {
                "env_id": self.env_id, "num_tasks": self.num_tasks,
                "accuracy_term": self.accuracy_term, "task_index": self._task_index,
            }  # fmt: skip
            if self._episode_id is not None:
                if self.expose_oracle:
                    meta["oracle_action"] = self._scripted("oracle_action", list(self._messages))
                meta["random_action"] = self._scripted("random_action", self._rng)
            return State(episode_id=self._episode_id, step_count=self._steps, textgym=meta)

        def close(self) -> None:
            self.env.close()

    _CLASSES = (TextGymAction, TextGymObservation, TextGymEnvironment)
    return _CLASSES


_CLASSES: tuple[type, type, type] | None = None


def build_openenv_app(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    *,
    expose_oracle: bool = False,
    max_concurrent_envs: int = 16,
) -> Any:
    """OpenEnv's FastAPI app (`create_app`) serving `env_id`: one env per WebSocket session.

    Args:
        env_id: any id `textgym.envs.make` takes.
        env_kwargs: the env's constructor kwargs.
        expose_oracle: put the env's oracle in `state` (what `OpenEnvEnv.oracle_action` reads).
        max_concurrent_envs: sessions served at once.

    Raises:
        ImportError: without the `openenv-core` package.
        textgym.envs.registry.EnvError: when the env cannot be made (checked once here).

    Examples:
        >>> app = build_openenv_app("textgym/Wordle-v0")
        >>> sorted(r.path for r in app.routes if r.path in {"/reset", "/step", "/state", "/ws"})
        ['/reset', '/state', '/step', '/ws']
    """
    require("openenv-core", "openenv")
    from openenv.core.env_server.http_server import create_app

    action_cls, observation_cls, environment_cls = _server_classes()
    kwargs = dict(env_kwargs or {})
    environment_cls(env_id, kwargs, expose_oracle).close()  # fail here, not in every session

    def factory() -> Any:
        return environment_cls(env_id, kwargs, expose_oracle)

    return create_app(
        factory, action_cls, observation_cls, env_name=env_id.replace("/", "_"),
        max_concurrent_envs=max_concurrent_envs,
    )  # fmt: skip


_DISCONNECTS = {"WebSocketDisconnect", "ClientDisconnected"}


def _quiet_disconnects(app: Any) -> Any:
    """`app`, minus the traceback OpenEnv's `/ws` handler logs when a client closes first."""

    async def wrapped(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except Exception as e:
            if scope.get("type") == "websocket" and type(e).__name__ in _DISCONNECTS:
                return
            raise

    return wrapped


class OpenEnvServer:
    """A running `serve_openenv` server (uvicorn in a daemon thread).

    Attributes:
        url: "http://host:port" (the port chosen when 0 was asked).
    """

    def __init__(self, server: Any, thread: threading.Thread, url: str):
        self._server, self._thread, self.url = server, thread, url

    def stop(self, timeout_s: float = 10.0) -> None:
        """Ask the server to stop and wait up to `timeout_s` for it."""
        self._server.should_exit = True
        self._thread.join(timeout=timeout_s)

    def wait(self) -> None:
        """Block until the server stops (Ctrl-C stops it)."""
        try:
            while self._thread.is_alive():
                self._thread.join(timeout=0.5)
        except KeyboardInterrupt:
            self.stop()

    def __enter__(self) -> OpenEnvServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_openenv(
    env_id: str,
    env_kwargs: dict[str, Any] | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    expose_oracle: bool = False,
    max_concurrent_envs: int = 16,
    start_timeout_s: float = 30.0,
) -> OpenEnvServer:
    """Serve `env_id` over OpenEnv's protocol on `host:port` (0: a free port); return once it is up.

    Args:
        env_id: any id `textgym.envs.make` takes.
        env_kwargs: the env's constructor kwargs.
        host: the address to bind ("127.0.0.1": this machine only).
        port: the port; 0 picks a free one (read it from `.url`).
        expose_oracle: put the env's oracle in `state` (anyone who can connect can read it).
        max_concurrent_envs: sessions served at once.
        start_timeout_s: how long to wait for the server to come up.

    Returns:
        The running server (`.url`, `.stop()`, `.wait()`; a context manager).

    Raises:
        ImportError: without the `openenv-core` package.
        OSError: when the address cannot be bound.
        RuntimeError: when the server does not start within `start_timeout_s`.

    Examples:
        >>> with serve_openenv("textgym/Wordle-v0") as server:
        ...     server.url.startswith("http://127.0.0.1:")
        True
    """
    import uvicorn

    app = build_openenv_app(
        env_id, env_kwargs, expose_oracle=expose_oracle, max_concurrent_envs=max_concurrent_envs
    )
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    bound = sock.getsockname()[1]
    config = uvicorn.Config(_quiet_disconnects(app), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    thread = threading.Thread(
        target=server.run, kwargs={"sockets": [sock]}, daemon=True, name="openenv-server"
    )
    thread.start()
    deadline = time.monotonic() + start_timeout_s
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    if not server.started:
        server.should_exit = True
        raise RuntimeError(f"the OpenEnv server for {env_id} did not start on {host}:{bound}")
    shown = f"[{host}]" if ":" in host else host
    return OpenEnvServer(server, thread, f"http://{shown}:{bound}")
