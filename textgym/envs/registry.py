"""Environments from anywhere, by id: the user's module, an installed package, or textgym's own.

Every command, config and library entry point of textgym builds its envs with `make(env_id,
**kwargs)`, which accepts:

- a registered id (`textgym/Arithmetic-v0`, or any id a module registered with `gymnasium.register`);
- gymnasium's `module:EnvId-vN` syntax: `module` is imported first (from the current directory
  too, as `python -m` would), and its import registers the id;
- ids registered by an installed package under the `textgym.envs` entry-point group
  (`[project.entry-points."textgym.envs"] myenvs = "myenvs"` in its `pyproject.toml`): the
  module, or the `module:function` it names (called with no arguments), is loaded the first
  time textgym looks an id up, so the package's envs appear by themselves;
- modules named in a config's `imports: [...]` or on the command line
  (`textgym --import myenvs eval ...`, or `TEXTGYM_IMPORTS=myenvs,other`): `import_modules`.

The env is wrapped in `TextGymAdapter`, so an env written to the plain Gymnasium standard works
too: a string observation becomes one user message, a Gymnasium `info["is_success"]` becomes the
`reward/correct` term that accuracy reads, an env without a `tasks` sequence poses task *i* as
`reset(seed=i)`, and an exception inside the env is re-raised as an `EnvError` naming the env id,
the task index and the action.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable, Sequence
from typing import Any, SupportsFloat

import gymnasium as gym

from textgym.types import Message

ENTRY_POINT_GROUP = "textgym.envs"
"""The entry-point group an installed package registers its envs under."""

UNBOUNDED_TASKS = 2**62
"""Task count of an env without a `tasks` sequence or `num_tasks`: task *i* is `reset(seed=i)`.
`TaskSampler` walks such a stream in order 0, 1, 2, ..."""

IMPORTS_ENV_VAR = "TEXTGYM_IMPORTS"
"""Comma-separated modules imported before any id is looked up (the `--import` option sets it,
so that torchrun ranks and worker processes import them too)."""

_entry_points_loaded = False


def _is_gymnasiums_own(spec: Any) -> bool:
    """Whether an id is one gymnasium registers itself (classic control, toy text, MuJoCo, shims)."""
    entry = spec.entry_point
    module = entry.partition(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "")
    return str(module).startswith("gymnasium.")


class UnknownEnvError(ValueError):
    """An environment id that no imported module registered; the message lists the ids and the closest."""


class EnvError(RuntimeError):
    """An exception raised inside an environment's `reset` or `step`, with the env id, task and action."""


def import_modules(modules: Iterable[str]) -> None:
    """Import each module (its import registers envs); the current directory is on the path.

    Raises:
        ImportError: naming the module that could not be imported and why.
    """
    for name in modules:
        name = name.strip()
        if not name:
            continue
        try:
            _import(name)
        except ImportError as e:
            raise ImportError(
                f"cannot import {name!r} to register its environments: {e} "
                f"(run from the folder that holds it, or add that folder to PYTHONPATH)"
            ) from e


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as e:
        cwd = os.getcwd()
        # The module itself (not one of its imports) is missing and the cwd is not on the path yet:
        # look there too, as `python -m` and uvicorn do.
        if cwd in sys.path or "" in sys.path or e.name is None or not name.startswith(e.name):
            raise
        sys.path.insert(0, cwd)
        return importlib.import_module(name)


def load_entry_points() -> list[str]:
    """Load the `textgym.envs` entry points of installed packages (once per process).

    Also imports the modules listed in `$TEXTGYM_IMPORTS`. Returns the entry points' names.

    Raises:
        ImportError: an entry point or listed module that cannot be loaded (named in the message).
    """
    global _entry_points_loaded
    names: list[str] = []
    if os.environ.get(IMPORTS_ENV_VAR):
        import_modules(os.environ[IMPORTS_ENV_VAR].split(","))
    if _entry_points_loaded:
        return names
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        try:
            obj = ep.load()
        except Exception as e:
            raise ImportError(
                f"entry point {ep.name} = {ep.value!r} ({ENTRY_POINT_GROUP}) failed: {e}"
            ) from e
        if callable(obj):
            obj()
        names.append(ep.name)
    return names


def split_id(env_id: str) -> tuple[str | None, str]:
    """`"mod.sub:ns/Name-v0"` -> `("mod.sub", "ns/Name-v0")`; an id without a module -> `(None, id)`."""
    if ":" in env_id:
        module, _, name = env_id.partition(":")
        return module, name
    return None, env_id


def env_ids(include_gymnasium: bool = False) -> list[str]:
    """Every registered id, sorted (gymnasium's own classic-control and toy ids only when asked)."""
    load_entry_points()
    return sorted(k for k, spec in gym.registry.items() if include_gymnasium or not _is_gymnasiums_own(spec))


def ensure_registered(env_id: str) -> str:
    """Import what `env_id` needs and check that it is registered; return `env_id` unchanged.

    Raises:
        UnknownEnvError: the id is not registered; the message lists the registered ids and
            suggests the closest ones.
        ImportError: the `module:` part of the id cannot be imported.
    """
    if not isinstance(env_id, str) or not env_id.strip():
        raise UnknownEnvError(f"an environment id must be a non-empty string, got {env_id!r}")
    load_entry_points()
    module, name = split_id(env_id)
    if module is not None:
        import_modules([module])
    if name in gym.registry:
        return env_id
    known = env_ids()
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    where = (
        f"importing {module!r} did not register it"
        if module
        else "no imported module registered it (use 'module:Name-v0', `imports:` in the config, "
        "or `textgym --import MODULE`)"
    )
    raise UnknownEnvError(f"unknown environment {env_id!r}: {where}.{hint} Registered: {', '.join(known)}")


def make(
    env_id: str, step_latency_s: float | tuple[float, float] | list[float] | None = None, **kwargs: Any
) -> TextGymAdapter:
    """`gymnasium.make(env_id, **kwargs)` for any id (see the module docstring), wrapped in `TextGymAdapter`.

    `step_latency_s` (seconds, or `[low, high]` for a uniform random delay) makes every step
    that much slower (`textgym.envs.latency.StepLatencyWrapper`): a stand-in for slow env steps,
    e.g. to measure continuous rollouts (`bench/agent_rollout.py`). None or 0: no delay.

    Raises:
        UnknownEnvError: an unregistered id (the message suggests the closest).
        ImportError: the id's module cannot be imported.
        TypeError, ValueError: kwargs the env rejects (from its constructor), or a bad `step_latency_s`.

    Examples:
        >>> import textgym.envs
        >>> env = textgym.envs.make("textgym/Wordle-v0")
        >>> env.reset(options={"task_index": 0})[0][0]["role"]
        'user'
        >>> textgym.envs.make("textgym/Wordel-v0")
        Traceback (most recent call last):
        ...
        textgym.envs.registry.UnknownEnvError: unknown environment 'textgym/Wordel-v0': ... Did you mean ...
    """
    ensure_registered(env_id)
    env = gym.make(env_id, **kwargs)
    if step_latency_s:
        from textgym.envs.latency import StepLatencyWrapper

        env = StepLatencyWrapper(env, step_latency_s)
    return TextGymAdapter(env, env_id=env_id)


def task_count(env: gym.Env) -> int:
    """How many tasks `env` poses: `len(tasks)`, else `num_tasks`, else `UNBOUNDED_TASKS`."""
    try:
        tasks = env.get_wrapper_attr("tasks")
    except AttributeError:
        tasks = None
    if tasks is not None:
        return len(tasks)
    try:
        return int(env.get_wrapper_attr("num_tasks"))
    except AttributeError:
        return UNBOUNDED_TASKS


def accuracy_term(env: gym.Env) -> str:
    """The reward term that defines accuracy: the env's `accuracy_term` attribute, default `"correct"`."""
    try:
        return str(env.get_wrapper_attr("accuracy_term"))
    except AttributeError:
        return "correct"


def as_messages(observation: Any, env_id: str = "") -> list[Message]:
    """An observation as chat messages: a string is one user message; a list of messages is kept.

    Raises:
        TypeError: any other observation (named with the env id).
    """
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}] if observation else []
    if isinstance(observation, Sequence) and all(
        isinstance(m, dict) and "role" in m and "content" in m for m in observation
    ):
        return list(observation)  # type: ignore[arg-type]
    raise TypeError(
        f"{env_id or 'the environment'} returned an observation of type {type(observation).__name__}; "
        "textgym needs a string (one user message) or a list of {'role', 'content'} messages"
    )


class TextGymAdapter(gym.Wrapper):
    """What textgym needs of any text env, added around it: chat observations, tasks, accuracy, errors.

    - Observations: a string becomes `[{"role": "user", "content": obs}]` (the empty string: no
      message); a list of chat messages is passed through.
    - Tasks: `reset(options={"task_index": i})` is passed on to an env that has a `tasks`
      sequence (textgym's `TextEnv`); any other env gets `reset(seed=i)` (seed wins when given).
      `tasks` reads the env's own, else `range(num_tasks)` or `range(UNBOUNDED_TASKS)`.
    - Accuracy: `info["reward/correct"]` is what accuracy reads. An env whose `accuracy_term`
      is another name has that term copied there; an env with neither but Gymnasium's
      `info["is_success"]` has it copied there (as 0.0/1.0).
    - Errors: an exception inside `reset` or `step` becomes an `EnvError` naming the env id, the
      task index and (for `step`) the action, chained to the original.

    Args:
        env: the env built by `gymnasium.make` (any wrappers included).
        env_id: the id it was made from (for messages).

    Examples:
        A plain Gymnasium env with string observations and `is_success`:

        >>> import string
        >>> import gymnasium as gym
        >>> class Echo(gym.Env):
        ...     observation_space = action_space = gym.spaces.Text(50, charset=string.printable)
        ...     def reset(self, *, seed=None, options=None):
        ...         super().reset(seed=seed)
        ...         self.word = ["red", "blue"][int(self.np_random.integers(2))]
        ...         return f"Say {self.word}.", {}
        ...     def step(self, action):
        ...         ok = action == self.word
        ...         return "done", float(ok), True, False, {"is_success": ok}
        >>> env = TextGymAdapter(Echo(), "demo/Echo-v0")
        >>> obs, info = env.reset(options={"task_index": 1})   # task 1 is reset(seed=1)
        >>> obs
        [{'role': 'user', 'content': 'Say red.'}]
        >>> env.step("red")[4]["reward/correct"]
        1.0
    """

    def __init__(self, env: gym.Env, env_id: str = ""):
        super().__init__(env)
        self.env_id = env_id or (env.spec.id if env.spec else type(env.unwrapped).__name__)
        self._task_index: int | None = None
        self._has_tasks = getattr(env.unwrapped, "tasks", None) is not None
        self._accuracy_term = accuracy_term(env)

    @property
    def tasks(self) -> Sequence[Any]:
        """The env's task sequence, or `range(task count)` for an env posing task *i* as `reset(seed=i)`."""
        tasks = getattr(self.env.unwrapped, "tasks", None)
        return tasks if tasks is not None else range(task_count(self.env))

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset on `options["task_index"]` (see the class docstring); the observation as messages.

        Raises:
            ValueError: from the env, unchanged (a task index out of range, an unknown option).
            EnvError: any other exception the env raised (chained).
        """
        options = dict(options or {})
        self._task_index = options.get("task_index")
        try:
            if self._has_tasks or "task_index" not in options:
                obs, info = self.env.reset(seed=seed, options=options or None)
            else:
                index = options.pop("task_index")
                obs, info = self.env.reset(seed=index if seed is None else seed, options=options or None)
                info = {"task_index": index, **info}
        except ValueError:
            raise  # the env's own check of the task index or options: it names what was wrong
        except Exception as e:
            raise EnvError(f"{self.env_id}: reset(task_index={self._task_index}) raised {e!r}") from e
        if self._task_index is None:
            self._task_index = info.get("task_index")
        return as_messages(obs, self.env_id), info

    def step(self, action: Any) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; the observation as messages and the accuracy term under `reward/correct`.

        Raises:
            EnvError: the env raised (its exception chained), or returned an unusable observation.
        """
        try:
            obs, reward, terminated, truncated, info = self.env.step(action)
            messages = as_messages(obs, self.env_id)
        except Exception as e:
            shown = repr(action)
            shown = shown if len(shown) <= 300 else shown[:300] + "...'"
            raise EnvError(
                f"{self.env_id}: step raised {e!r} on task_index={self._task_index}, action={shown}"
            ) from e
        term = self._accuracy_term
        if term != "correct" and f"reward/{term}" in info:
            info = {**info, "reward/correct": float(info[f"reward/{term}"])}
        elif "reward/correct" not in info and "is_success" in info:
            info = {**info, "reward/correct": float(bool(info["is_success"]))}
        return messages, reward, bool(terminated), bool(truncated), info
