"""The `openai` generation backend: any OpenAI-compatible completions endpoint, through httpx.

Prompts go out as token ids (`prompt: [ids]`) and the sampled tokens come back as ids
(`logprobs=0, return_tokens_as_token_ids=true`, as vLLM's server and `textgym serve`
support), so nothing is re-tokenized. Requests run concurrently (asyncio, at most
`concurrency` at once), each with a timeout; 429, 5xx, timeouts and dropped connections
are retried with exponential backoff, and a 4xx is an immediate, clear error. A response's
`policy_version` (`textgym serve` reports one) is kept in `Generation.policy_version`.

Several base URLs (the rollout servers of a trainer, `rollout.servers`) spread the requests:
each request goes to the server with the fewest requests in flight from this backend (ties in
turn), and its retries go to the same server. With the same weights and a per-request `seed`
every server samples the same response, so which one answers does not change the rollout.

Every request spells out every sampling field: textgym's temperature, top_p and top_k, and
the neutral value of min_p and the repetition, presence and frequency penalties
(`SAMPLING_FIELDS_SENT`). vLLM's server fills each field a request leaves unset from the
model folder's `generation_config.json` (e.g. Qwen2.5-Instruct's top_k 20, top_p 0.8,
repetition_penalty 1.05), which would sample something other than what textgym asks and
records log-probs the trainer cannot reproduce.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import httpx
import torch

from textgym.agents.sampling import Generation, SamplingParams

SAMPLING_FIELDS_SENT = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
)
"""The sampling fields in every request: all those vLLM's server takes from a generation config."""


def sampling_body(params: SamplingParams) -> dict[str, Any]:
    """The request fields that make an OpenAI-compatible server sample exactly `params`."""
    return {
        "max_tokens": params.max_new_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "top_k": params.top_k,  # 0: off (vLLM and textgym serve)
        "min_p": 0.0,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
    }


class EndpointError(RuntimeError):
    """The endpoint refused a request (4xx) or kept failing after every retry."""


class OpenAIBackend:
    """Generate through `{base_url}/v1/completions`, or spread over several such servers.

    Args:
        base_url: e.g. "http://127.0.0.1:8000" (with or without a trailing "/v1"), or a list
            of them: each request goes to the least-loaded one (module docstring).
        model: the served model name.
        eos_ids: end-of-turn token ids (a response that stops without one gets it appended,
            so trajectories end the way the transformers backend's do; it is marked not
            sampled, `Generation.sampled`, and gets loss mask 0).
        concurrency: requests in flight at once.
        timeout_s: per-request timeout (seconds).
        max_retries: retries of a retryable failure before `EndpointError`.
        backoff_s: first retry delay; doubles each retry.
        api_key: sent as a bearer token when given.
        prompts_per_request: prompts sent together in one request by `generate` (`prompt:
            [[ids], ...]` with textgym serve's per-prompt `seeds`, so each response is what its
            own request would sample); 1: one request per prompt (any OpenAI-compatible
            server); 0: each call's prompts split evenly over the servers, one request each.
            A batched request is answered by one generation round of one policy version;
            `generate_one` (continuous rollouts) always sends one prompt.

    Raises:
        ValueError: no URL, or a negative `prompts_per_request`.
    """

    def __init__(
        self,
        base_url: str | Sequence[str],
        model: str,
        eos_ids: list[int],
        concurrency: int = 8,
        timeout_s: float = 120.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        api_key: str | None = None,
        prompts_per_request: int = 1,
    ):
        if prompts_per_request < 0:
            raise ValueError(f"prompts_per_request must be >= 0, got {prompts_per_request}")
        self.prompts_per_request = int(prompts_per_request)
        roots = [base_url] if isinstance(base_url, str) else list(base_url)
        if not roots:
            raise ValueError("base_url: give at least one URL")
        roots = [r.rstrip("/") for r in roots]
        self.urls = [(r if r.endswith("/v1") else r + "/v1") + "/completions" for r in roots]
        self.url = self.urls[0]
        self._in_flight = [0] * len(self.urls)  # requests sent to each server and not yet answered
        self._turn = 0
        self._lock = threading.Lock()
        self.model = model
        self.eos_ids = list(eos_ids)
        self.concurrency = int(concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    def _acquire(self) -> int:
        """The index of the server to send the next request to (fewest in flight, ties in turn)."""
        with self._lock:
            n = len(self.urls)
            order = [(self._turn + i) % n for i in range(n)]
            i = min(order, key=lambda j: self._in_flight[j])
            self._in_flight[i] += 1
            self._turn = (i + 1) % n
            return i

    def _release(self, i: int) -> None:
        with self._lock:
            self._in_flight[i] -= 1

    def _parse(self, choice: dict[str, Any], policy_version: int | None = None) -> Generation:
        lp = choice.get("logprobs") or {}
        tokens, values = lp.get("tokens"), lp.get("token_logprobs")
        if tokens is None or values is None:
            raise EndpointError("the endpoint returned no token logprobs; it must support logprobs=0")
        try:
            ids = [int(str(t).removeprefix("token_id:")) for t in tokens]
        except ValueError:
            raise EndpointError(
                "the endpoint returned tokens as text; it must support return_tokens_as_token_ids"
            ) from None
        # A token without a log-prob, or an end-of-turn id appended here, is context, not a
        # policy token: `sampled` False gives it loss mask 0 in the trajectory.
        sampled = [v is not None for v in values]
        logprobs = [float(v) if v is not None else 0.0 for v in values]
        reason = "length" if choice.get("finish_reason") == "length" else "stop"
        if reason == "stop" and (not ids or ids[-1] not in self.eos_ids):
            ids.append(self.eos_ids[0])
            logprobs.append(0.0)
            sampled.append(False)
        lps = torch.tensor(logprobs, dtype=torch.float32)
        return Generation(ids, lps, reason, policy_version, None if all(sampled) else sampled)  # type: ignore[arg-type]

    async def generate_one(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        prompt: list[int],
        params: SamplingParams,
        seed: int | None = None,
    ) -> Generation:
        """One response to a token-id prompt, awaited (what the continuous rollout engine sends per turn).

        Args:
            client: the `httpx.AsyncClient` to send it with (its event loop is the caller's).
            sem: bounds the requests in flight (held while this one and its retries run).
            prompt: [P] token ids.
            params: sampling parameters.
            seed: the request's `seed` field, in [0, 2**63) (a server with per-request
                generators, as `textgym serve` and vLLM's, then samples the same response for the
                same seed and prompt whatever shares its batch); None: not sent.

        Raises:
            EndpointError: on a 4xx, or when the request still fails after `max_retries` retries.
        """
        seed_field = {} if seed is None else {"seed": int(seed)}
        return (await self._request(client, sem, prompt, 1, params, seed_field))[0]

    async def _request(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        prompt: list[int] | list[list[int]],
        count: int,
        params: SamplingParams,
        seed_field: dict[str, Any],
    ) -> list[Generation]:
        """One request (`prompt`: token ids, or `count` lists of them) to the least-loaded server."""
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": prompt,
            **sampling_body(params),
            "logprobs": 0,  # the sampled tokens' log-probs, no alternatives (vLLM's semantics)
            "return_tokens_as_token_ids": True,
            **seed_field,
        }
        async with sem:
            server = self._acquire()
            try:
                return await self._send(client, self.urls[server], body, count)
            finally:
                self._release(server)

    async def _send(
        self, client: httpx.AsyncClient, url: str, body: dict[str, Any], count: int
    ) -> list[Generation]:
        """POST `body` to `url` with the retries; its `count` choices parsed, in `index` order."""
        last = ""
        for attempt in range(self.max_retries + 1):
            try:
                r = await client.post(url, json=body, headers=self.headers, timeout=self.timeout_s)
            except (httpx.TimeoutException, httpx.TransportError) as e:
                last = f"{type(e).__name__}"
            else:
                if r.status_code == 200:
                    try:
                        out = r.json()
                        choices = sorted(out["choices"], key=lambda c: int(c.get("index", 0)))
                        if len(choices) != count:
                            raise IndexError(f"{len(choices)} choices for {count} prompts")
                        return [self._parse(c, out.get("policy_version")) for c in choices]
                    except (ValueError, KeyError, IndexError) as e:
                        last = f"malformed response ({type(e).__name__}: {e})"
                elif r.status_code == 429 or r.status_code >= 500:
                    last = f"HTTP {r.status_code}"
                else:
                    raise EndpointError(f"{url} refused the request: HTTP {r.status_code}: {r.text[:300]}")
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * 2**attempt)
        raise EndpointError(f"{url} failed {self.max_retries + 1} times; last: {last}")

    async def _generate_batch(
        self,
        client: httpx.AsyncClient,
        sem: asyncio.Semaphore,
        prompts: list[list[int]],
        params: SamplingParams,
        seeds: list[int] | None,
    ) -> list[Generation]:
        """Several prompts in one request (`prompt: [[ids], ...]`, textgym's per-prompt `seeds`)."""
        seed_field = {} if seeds is None else {"seeds": [int(s) for s in seeds]}
        return await self._request(client, sem, prompts, len(prompts), params, seed_field)

    async def _all(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None
    ) -> list[Generation]:
        sem = asyncio.Semaphore(self.concurrency)
        size = self.prompts_per_request or -(-len(prompts) // len(self.urls))  # 0: an even split
        async with httpx.AsyncClient() as client:
            try:
                # A TaskGroup cancels and awaits every sibling on the first failure, so no
                # request (or retry) is still being sent after `generate` has raised.
                async with asyncio.TaskGroup() as group:
                    if size <= 1:
                        tasks = [
                            group.create_task(
                                self.generate_one(client, sem, p, params, None if seeds is None else seeds[i])
                            )
                            for i, p in enumerate(prompts)
                        ]
                    else:
                        batches = [
                            group.create_task(
                                self._generate_batch(
                                    client,
                                    sem,
                                    prompts[i : i + size],
                                    params,
                                    None if seeds is None else seeds[i : i + size],
                                )
                            )
                            for i in range(0, len(prompts), size)
                        ]
            except BaseExceptionGroup as eg:
                raise eg.exceptions[0] from None
        if size <= 1:
            return [t.result() for t in tasks]
        return [g for t in batches for g in t.result()]

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Generation]:
        """One response per token-id prompt, in order.

        Args:
            prompts: B token-id prompts.
            params: sampling parameters.
            seeds: B request seeds (each taken modulo 2**63), or None (no `seed` sent).

        Raises:
            ValueError: if `seeds` is not one per prompt.
            EndpointError: on a 4xx, or when a request still fails after `max_retries` retries
                (the first failure; the requests still in flight are cancelled first).
        """
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        seeds = None if seeds is None else [int(s) % 2**63 for s in seeds]
        return asyncio.run(self._all(prompts, params, seeds))
