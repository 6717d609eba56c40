"""Continuous rollouts: each episode advances on its own, generation overlapping env steps.

`rollout_continuous` takes `rollout`'s arguments and returns the same `Trajectory` records
in the same order (the per-episode bookkeeping is `textgym.agents.rollout`'s, shared). What
differs is the schedule. In lockstep every turn waits for the slowest env step of the batch
before anything generates again; here a turn is submitted to the generation backend as soon
as its episode's env step returns, and env steps run in a thread pool while other episodes
generate:

- in-process backends (`TransformersBackend`, anything with
  `generate(prompts, params[, seeds])`): a continuous batcher. Whenever the generator is free
  it takes every turn waiting (up to `max_batch`) and runs one batched `generate` call in the
  calling thread (so the caller's `torch.no_grad`, autocast and FSDP contexts apply, as in
  lockstep); turns whose env step returns meanwhile wait for the next call. It batches by
  calls, not by decoding steps: a row that joins does so at the next `generate` call.
- `VLLMBackend` (anything with `add_request` / `step`): vLLM's engine driven step by step in
  the calling thread, which is what its async engine does in its own loop: each turn is added
  as a request the moment its env step returns and joins the running batch at the next
  engine step (token-level continuous batching); each finished request posts its turn.
- `OpenAIBackend`: one concurrent HTTP request per episode turn (`httpx.AsyncClient` on an
  event loop in a helper thread, at most the backend's `concurrency` in flight); the server
  (`textgym serve`, vLLM's) batches what arrives.

Seeds: turn k of episode e is sampled with `derive_seed(seeds[e], k)`, as in lockstep, and
with per-row seeds (`SeededSample`) a row's tokens do not depend on what shares its
batch: for the same seeds and a deterministic backend the two engines give the same token
ids and masks, and log-probs equal up to the float rounding that a different batch
(padding) brings (~1e-6). Without seeds, each episode draws its seed from torch's global
RNG (`torch.randint`), so `torch.manual_seed` still makes a continuous rollout repeatable,
though not equal to a lockstep one.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Literal

import gymnasium as gym
import torch

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.openai_backend import OpenAIBackend
from textgym.agents.rollout import (
    RolloutStats,
    _Episode,
    _record_turn,
    _start_episodes,
    _to_trajectory,
    check_first_prompts,
    context_limit,
    reply_text,
    rollout,
)
from textgym.agents.sampling import Generation, SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory

RolloutMode = Literal["lockstep", "continuous"]
"""How a rollout schedules its episodes: all turns in step (`rollout`) or each on its own."""

MAX_STEP_THREADS = 64
"""Default cap on the continuous engine's env-step threads (one per episode up to this)."""

_Event = tuple[str, _Episode, Any]
"""("gen", episode, Generation) | ("step", episode, (Generation, text, step Future))
| ("error", episode, exception)."""


def rollout_fn(mode: RolloutMode, batch_window_s: float = 0.0) -> Callable[..., list[Trajectory]]:
    """The rollout engine of `mode`: `rollout` ("lockstep") or `rollout_continuous` ("continuous").

    `batch_window_s` is passed to `rollout_continuous` (lockstep has no window).

    Raises:
        ValueError: on another mode.
    """
    if mode == "lockstep":
        return rollout
    if mode == "continuous":
        if batch_window_s == 0:
            return rollout_continuous
        return functools.partial(rollout_continuous, batch_window_s=batch_window_s)
    raise ValueError(f"unknown rollout mode {mode!r}; choose 'lockstep' or 'continuous'")


# long: one scheduler loop (submit, wait, step, finish) whose state is shared by its threads
def rollout_continuous(
    agent: LLMAgent,
    envs: Sequence[gym.Env],
    task_indices: list[int],
    params: SamplingParams,
    *,
    group_size: int = 1,
    max_turns: int = 16,
    env_id: str = "",
    seeds: list[int] | None = None,
    stats: RolloutStats | None = None,
    max_batch: int | None = None,
    step_threads: int | None = None,
    batch_window_s: float = 0.0,
    max_context_tokens: int | None = None,
) -> list[Trajectory]:
    """Run `group_size` episodes of each task, each advancing on its own; return their trajectories.

    Same arguments and result as `textgym.agents.rollout.rollout` (see there), plus:

    Args:
        agent: the policy (any backend; see the module docstring for how each is driven).
        envs: at least `len(task_indices) * group_size` envs; episode e steps `envs[e]`, in a
            thread of its own (envs must not share mutable state across instances).
        task_indices: tasks to pose.
        params: sampling parameters for every turn.
        group_size: samples per task.
        max_turns: cap on agent turns per episode (then truncated).
        env_id: recorded in each trajectory.
        seeds: one per episode; None draws them from torch's global RNG (see the module docstring).
        stats: filled in with the timing (`RolloutStats`: generation busy time, calls, rows).
        max_batch: prompts per `generate` call at most (in-process backends); None: every turn waiting.
        step_threads: env steps running at once; None: one per episode, at most `MAX_STEP_THREADS`.
        batch_window_s: in-process batcher only: seconds a `generate` call may wait, once a
            turn is ready, for env steps still running to return their turns too (fewer,
            fuller calls; 0: generate whatever is ready at once). The wait ends early when
            every episode not yet finished is ready, or `max_batch` turns are.
        max_context_tokens: the context window episodes stay within (see `rollout`).

    Returns:
        `len(task_indices) * group_size` trajectories in `rollout`'s order (row g*G + j: sample j of task g).

    Raises:
        ValueError: if there are fewer envs than episodes, `seeds` is not one per episode, or
            `max_batch` / `step_threads` is below 1, or the agent is an `OracleDemonstrator`
            (demonstrations run through `rollout`).
        Exception: the first exception an env step raised, unchanged in type (an `EnvError`
            for envs built by `textgym.envs.make`), with a note naming the episode, task and
            turn; the steps still running are waited for first, so no env is stepped after
            this returns. A generation error (e.g. `EndpointError`) propagates the same way.
    """
    if (max_batch is not None and max_batch < 1) or (step_threads is not None and step_threads < 1):
        raise ValueError(f"max_batch and step_threads must be >= 1, got {max_batch} and {step_threads}")
    if not batch_window_s >= 0:
        raise ValueError(f"batch_window_s must be >= 0, got {batch_window_s}")
    if hasattr(agent, "demonstrate"):
        raise ValueError("an OracleDemonstrator plays in lockstep: use textgym.agents.rollout.rollout")
    start = time.perf_counter()
    limit = context_limit(agent, max_context_tokens)
    episodes = _start_episodes(agent, envs, task_indices, group_size, seeds)
    check_first_prompts(episodes, limit, params.max_new_tokens, env_id)
    room = None if limit is None else limit - params.max_new_tokens
    own_seeds = seeds if seeds is not None else torch.randint(0, 2**62, (len(episodes),)).tolist()
    for ep, s in zip(episodes, own_seeds, strict=True):
        ep.seed = int(s)
    position = {id(ep): e for e, ep in enumerate(episodes)}
    stats = stats if stats is not None else RolloutStats()
    events: queue.Queue[_Event] = queue.Queue()
    eos_ids = list(agent.backend.eos_ids)
    threads = step_threads or max(1, min(len(episodes), MAX_STEP_THREADS))
    pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="env-step-continuous")
    generator: _BatchGenerator | _EndpointGenerator | _EngineGenerator
    if isinstance(agent.backend, OpenAIBackend):
        generator = _EndpointGenerator(agent.backend, params, events, stats)
    elif hasattr(agent.backend, "add_request") and hasattr(agent.backend, "step"):
        generator = _EngineGenerator(agent.backend, params, events, stats)
    else:
        generator = _BatchGenerator(agent.backend, params, events, stats, max_batch)
    window = batch_window_s if isinstance(generator, _BatchGenerator) else 0.0
    full = max_batch or len(episodes)
    try:
        ready, remaining, stepping = list(episodes), len(episodes), 0
        opened: float | None = None  # when the batching window opened (the first turn ready)
        while remaining:
            wait: float | None = None  # seconds to wait for events; None: block, 0: do not
            if ready:
                now = time.perf_counter()
                opened = now if opened is None else opened
                left = opened + window - now
                if left > 0 and stepping > 0 and len(ready) < full:
                    wait = left  # hold the call: steps still running may add their turns
                else:
                    ready, opened = generator.submit(ready), None
            busy = generator.pump()  # the engine's next step, when it has requests running
            if wait is None and (ready or busy):
                wait = 0.0
            for kind, ep, payload in _drain(events, wait):
                if kind == "gen":
                    stepping += 1
                    _step_later(pool, events, ep, payload, reply_text(ep, agent.decode(payload.token_ids)))
                elif kind == "step":
                    stepping -= 1
                    gen, text, future = payload
                    error = future.exception()
                    if error is not None:
                        error.add_note(
                            f"in a continuous rollout of {env_id or 'the env'}: episode "
                            f"{position[id(ep)]} (task_index={ep.task_index}), turn {ep.turns}"
                        )
                        raise error
                    step, seconds = future.result()
                    stats.env_s += seconds
                    _record_turn(
                        ep, agent, gen, text, step, env_id=env_id, max_turns=max_turns, eos_ids=eos_ids,
                        room=room,
                    )  # fmt: skip
                    if ep.done:
                        remaining -= 1
                    else:
                        ready.append(ep)
                else:
                    raise payload
    finally:
        generator.close()
        pool.shutdown(wait=True, cancel_futures=True)
    stats.finish(len(episodes), time.perf_counter() - start)
    return [_to_trajectory(ep, env_id) for ep in episodes]


def _step_later(
    pool: ThreadPoolExecutor, events: queue.Queue[_Event], ep: _Episode, gen: Generation, text: str
) -> None:
    """Step `ep`'s env with `text` in `pool`; its future is posted as a "step" event once done.

    The future's result is the step's result and its duration in seconds.
    """

    def timed_step() -> tuple[Any, float]:
        t0 = time.perf_counter()
        out = ep.env.step(text)
        return out, time.perf_counter() - t0

    future = pool.submit(timed_step)

    def done(f: Future[Any]) -> None:
        events.put(("step", ep, (gen, text, f)))

    future.add_done_callback(done)


def _drain(events: queue.Queue[_Event], wait: float | None) -> list[_Event]:
    """Every event waiting, after waiting up to `wait` seconds for a first one (None: as long as it takes)."""
    out: list[_Event] = []
    if wait is None:
        out.append(events.get())
    elif wait > 0:
        try:
            out.append(events.get(timeout=wait))
        except queue.Empty:
            return out
    while True:
        try:
            out.append(events.get_nowait())
        except queue.Empty:
            return out


class _BatchGenerator:
    """In-process generation in the calling thread: one batched call over the turns waiting."""

    def __init__(
        self,
        backend: Any,
        params: SamplingParams,
        events: queue.Queue[_Event],
        stats: RolloutStats,
        max_batch: int | None,
    ):
        self.backend, self.params, self.events, self.stats = backend, params, events, stats
        self.max_batch = max_batch
        self.takes_seeds = "seeds" in inspect.signature(backend.generate).parameters

    def submit(self, ready: list[_Episode]) -> list[_Episode]:
        """Generate the next turn of (up to `max_batch` of) `ready`; post a "gen" event per episode.

        Returns the episodes left waiting.
        """
        n = len(ready) if self.max_batch is None else self.max_batch
        batch, rest = ready[:n], ready[n:]
        prompts = [list(ep.token_ids) for ep in batch]
        t0 = time.perf_counter()
        if self.takes_seeds:
            seeds = [derive_seed(ep.seed or 0, ep.turns) for ep in batch]
            gens = self.backend.generate(prompts, self.params, seeds=seeds)
        else:
            gens = self.backend.generate(prompts, self.params)
        self.stats.add_generate(time.perf_counter() - t0, len(prompts))
        for ep, gen in zip(batch, gens, strict=True):
            self.events.put(("gen", ep, gen))
        return rest

    def pump(self) -> bool:
        """Nothing to advance: `submit` generated the whole turn."""
        return False

    def close(self) -> None:
        """Nothing to release."""


class _EngineGenerator:
    """An engine driven step by step (vLLM's `LLMEngine`): requests join the running batch."""

    def __init__(
        self, backend: Any, params: SamplingParams, events: queue.Queue[_Event], stats: RolloutStats
    ):
        self.backend, self.params, self.events, self.stats = backend, params, events, stats
        self.running: dict[str, _Episode] = {}

    def submit(self, ready: list[_Episode]) -> list[_Episode]:
        """Add the next turn of every episode in `ready` to the engine (run by `pump`). Returns []."""
        for ep in ready:
            seed = derive_seed(ep.seed or 0, ep.turns)
            self.running[self.backend.add_request(list(ep.token_ids), self.params, seed)] = ep
            self.stats.add_generate(0.0, 1)
        return []

    def pump(self) -> bool:
        """One engine step if requests are running; each finished one posts a "gen" event.

        Returns whether a step ran (False: nothing running, the caller may block on its events).
        """
        if not self.running:
            return False
        t0 = time.perf_counter()
        for rid, gen in self.backend.step():
            self.events.put(("gen", self.running.pop(rid), gen))
        self.stats.generate_s += time.perf_counter() - t0
        return True

    def close(self) -> None:
        """Abort the requests still running (after an error), so the engine holds none."""
        self.backend.abort(list(self.running))
        self.running.clear()


class _EndpointGenerator:
    """One concurrent request per turn to an OpenAI-compatible endpoint, from a helper thread's event loop."""

    def __init__(
        self, backend: OpenAIBackend, params: SamplingParams, events: queue.Queue[_Event], stats: RolloutStats
    ):
        self.backend, self.params, self.events, self.stats = backend, params, events, stats
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="textgym-rollout-http", daemon=True)
        self.thread.start()
        self.lock = threading.Lock()
        self.in_flight, self.busy_since = 0, 0.0
        self.futures: list[Future[None]] = []
        self.client, self.sem = asyncio.run_coroutine_threadsafe(self._open(), self.loop).result()

    async def _open(self) -> tuple[Any, asyncio.Semaphore]:
        import httpx

        return httpx.AsyncClient(), asyncio.Semaphore(self.backend.concurrency)

    def submit(self, ready: list[_Episode]) -> list[_Episode]:
        """Send the next turn of every episode in `ready`; each answer posts a "gen" event. Returns []."""
        for ep in ready:
            seed = derive_seed(ep.seed or 0, ep.turns) % 2**63
            coro = self._one(ep, list(ep.token_ids), seed)
            self.futures.append(asyncio.run_coroutine_threadsafe(coro, self.loop))
        return []

    async def _one(self, ep: _Episode, prompt: list[int], seed: int) -> None:
        self._count(+1)
        try:
            gen: Generation = await self.backend.generate_one(
                self.client, self.sem, prompt, self.params, seed
            )
        except Exception as e:
            self.events.put(("error", ep, e))
        else:
            self.events.put(("gen", ep, gen))
        finally:
            self._count(-1)

    def pump(self) -> bool:
        """Nothing to advance: the event loop's thread sends and receives."""
        return False

    def _count(self, delta: int) -> None:
        """Track requests in flight; the time with at least one counts as generation time."""
        with self.lock:
            now = time.perf_counter()
            if delta > 0 and self.in_flight == 0:
                self.busy_since = now
            self.in_flight += delta
            if delta > 0:
                self.stats.add_generate(0.0, 1)
            elif self.in_flight == 0:
                self.stats.generate_s += now - self.busy_since

    def close(self) -> None:
        """Cancel the requests still in flight, close the client, stop the loop and its thread."""
        for f in self.futures:
            f.cancel()

        async def shutdown() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await self.client.aclose()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop).result()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()
