"""`StepLatencyWrapper`: make every `step` of an env take longer, by a fixed or random delay.

A stand-in for env steps that wait on something slow (a sandbox run, a web page, a judge, a
game server): it is how `bench/agent_rollout.py` compares lockstep and continuous rollouts.
Any env built by `textgym.envs.make` takes it as the kwarg `step_latency_s` (so a config's
`env.kwargs.step_latency_s: [0.05, 0.2]` works for every id).
"""

from __future__ import annotations

import random
import time
from typing import Any, SupportsFloat

import gymnasium as gym


def check_latency(latency_s: float | tuple[float, float] | list[float]) -> tuple[float, float]:
    """`latency_s` as a `(low, high)` range in seconds (a number: `(x, x)`).

    Raises:
        ValueError: a negative bound, `low > high`, or not one number or two.
    """
    if isinstance(latency_s, int | float):
        low = high = float(latency_s)
    elif isinstance(latency_s, list | tuple) and len(latency_s) == 2:
        low, high = float(latency_s[0]), float(latency_s[1])
    else:
        raise ValueError(f"step_latency_s must be seconds or [low, high] seconds, got {latency_s!r}")
    if low < 0 or high < low:
        raise ValueError(f"step_latency_s needs 0 <= low <= high, got {latency_s!r}")
    return low, high


class StepLatencyWrapper(gym.Wrapper):
    """Sleep before each `step` returns: `latency_s` seconds, or uniform in `[low, high]`.

    Description:
        The wrapped env's step runs first, then the thread sleeps (no CPU used), so the step's
        result is unchanged and only its duration grows. Resets are not delayed.

    Delays:
        A random delay of step k of an episode is drawn from a generator seeded by
        `(seed, task index, k)` (task index: `reset(options={"task_index": i})`, else the reset
        seed, else 0): the same task's episode meets the same delays in every run and whatever
        the rollout engine, so engines compare on equal terms. The delays do not touch the
        env's own `np_random`.

    Args:
        env: any env.
        latency_s: seconds per step, or `(low, high)` seconds for a uniform random delay.
        seed: mixed into each draw (two wrappers with different seeds draw different delays).

    Raises:
        ValueError: see `check_latency`.

    Examples:
        >>> import textgym.envs
        >>> env = textgym.envs.make("textgym/Wordle-v0", step_latency_s=[0.01, 0.02])
        >>> _ = env.reset(options={"task_index": 0})
        >>> t = time.perf_counter()
        >>> _ = env.step("crane")
        >>> time.perf_counter() - t >= 0.01
        True
    """

    def __init__(self, env: gym.Env, latency_s: float | tuple[float, float] | list[float], seed: int = 0):
        super().__init__(env)
        self.low, self.high = check_latency(latency_s)
        self.seed = int(seed)
        self._task = 0
        self._steps = 0
        self.slept_s = 0.0
        """Total delay added so far, seconds."""

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        """Reset the wrapped env (not delayed) and restart the episode's delay sequence."""
        index = (options or {}).get("task_index", seed)
        self._task = int(index) if isinstance(index, int) else 0
        self._steps = 0
        return self.env.reset(seed=seed, options=options)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the wrapped env, then sleep this step's delay; return the env's result unchanged."""
        out = self.env.step(action)
        delay = self.low
        if self.high > self.low:
            delay = random.Random(f"{self.seed}/{self._task}/{self._steps}").uniform(self.low, self.high)
        self._steps += 1
        time.sleep(delay)
        self.slept_s += delay
        return out
