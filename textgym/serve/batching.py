"""The request queue of `textgym serve`: one worker thread that batches what is waiting.

Every request becomes a `Job` (its prompts, one per choice, already tokenized) in a bounded
queue; a full queue is HTTP 503. The worker takes the oldest job, then every other job
waiting (up to `max_batch` prompts), groups them by sampling distribution (temperature,
top_p, top_k) and runs one `backend.generate` call per group, with the group's largest
`max_tokens`; each response is then cut to its own request's budget. With per-row seeds
(`SeededSample` on the transformers backend, a per-request seed on vLLM) a response
depends only on its seed and prompt, not on what shares its batch, so the cut is exact.
Requests that arrive while a batch runs wait for the next one (batching by rounds, not
token-level continuous batching; see docs/evaluation.md).

A round runs holding `Batcher.lock`, and every response records the `policy_version` it was
generated with. A weight sync (`textgym.serve.weights`) takes the same lock while it loads
new weights, so generation pauses while they are loaded (requests wait in the queue) and no
round mixes two versions.
"""

from __future__ import annotations

import queue
import secrets
import threading
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import torch

from textgym.agents.sampling import SamplingParams, truncate_logits


@dataclass
class Result:
    """One generated response.

    Attributes:
        token_ids: [N] sampled ids (ending with the end-of-turn id when `finish_reason == "stop"`).
        logprobs: [N] natural-log probability of each sampled id (the sampled distribution).
        finish_reason: "stop" (end-of-turn sampled) or "length" (budget reached).
        top: `[N][k]`: the k most likely `(id, logprob)` at each position, or None when not asked.
        policy_version: the version of the weights that generated it (`Batcher.policy_version`).
    """

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    top: list[list[tuple[int, float]]] | None = None
    policy_version: int = 0


@dataclass
class Job:
    """One request's work: a prompt per response, how to sample, and where the answer goes.

    Attributes:
        prompts: token ids of each response's prompt (a request with n choices repeats its prompt n times).
        params: the sampling parameters (`max_new_tokens` is this request's budget).
        seeds: one per prompt; None draws a fresh random seed.
        top_logprobs: alternatives to report per position (0: none).
        future: resolved with `list[Result]` (one per prompt, in order) or the exception.
    """

    prompts: list[list[int]]
    params: SamplingParams
    seeds: list[int | None]
    top_logprobs: int = 0
    future: Future[list[Result]] = field(default_factory=Future)


class QueueFullError(RuntimeError):
    """The request queue holds `max_queue` requests already (answered as HTTP 503)."""


@torch.no_grad()
def top_logprobs(
    model: Any, prompts: list[list[int]], responses: list[list[int]], params: SamplingParams, k: int
) -> list[list[list[tuple[int, float]]]]:
    """The k most likely tokens at each response position, under the distribution sampled from.

    Teacher-forced forward passes over right-padded batches of up to 64 responses:
    `log_softmax` of the logits divided by the temperature (T = 1 when greedy, as the
    recorded log-probs are), after top-k / top-p when on.

    Args:
        model: the causal LM that generated the responses.
        prompts: [B] prompt token ids.
        responses: [B] generated ids (N_b each).
        params: the sampling parameters the responses were drawn with.
        k: alternatives per position (>= 1).

    Returns:
        `[B][N_b][k]` `(token id, logprob)`, most likely first.
    """
    device = next(model.parameters()).device
    out: list[list[list[tuple[int, float]]]] = [[] for _ in prompts]
    rows = [b for b, r in enumerate(responses) if r]
    for start in range(0, len(rows), 64):  # right-padded batches: positions stay 0..n-1 per row
        chunk = rows[start : start + 64]
        seqs = [prompts[b] + responses[b][:-1] for b in chunk]
        width = max(len(x) for x in seqs)
        ids = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
        mask = torch.zeros(len(seqs), width, dtype=torch.long, device=device)
        for i, x in enumerate(seqs):
            ids[i, : len(x)] = torch.tensor(x, device=device)
            mask[i, : len(x)] = 1
        all_logits = model(input_ids=ids, attention_mask=mask).logits
        for i, b in enumerate(chunk):
            p, r = prompts[b], responses[b]
            logits = all_logits[i, len(p) - 1 : len(p) - 1 + len(r)].float()  # [N, V]
            if params.temperature > 0:
                logits = logits / params.temperature
                logits = truncate_logits(logits, params.top_k, params.top_p)
            values, idx = torch.log_softmax(logits, dim=-1).topk(min(k, logits.shape[-1]), dim=-1)
            pairs = zip(idx.cpu(), values.cpu(), strict=True)
            out[b] = [list(zip(t.tolist(), v.tolist(), strict=True)) for t, v in pairs]
    return out


class Batcher:
    """A bounded request queue drained by one worker thread that batches waiting requests.

    Args:
        backend: `TransformersBackend` or `VLLMBackend` (anything with
            `generate(prompts, params, seeds=...) -> list[Generation]`).
        max_queue: requests that may wait (not counting the batch running); more is `QueueFullError`.
        max_batch: prompts per round at most (a job is never split).
        model: the transformers model, for `top_logprobs` (None: alternatives not available).

    Attributes:
        lock: held while a round generates; a weight sync holds it to pause generation.
        policy_version: the version of the weights being served (0: the model folder's), set
            by a weight sync; recorded in every `Result`.
    """

    def __init__(self, backend: Any, max_queue: int = 256, max_batch: int = 256, model: Any = None):
        if max_queue < 1 or max_batch < 1:
            raise ValueError("max_queue and max_batch must be >= 1")
        self.backend = backend
        self.model = model
        self.max_batch = max_batch
        self.queue: queue.Queue[Job | None] = queue.Queue(maxsize=max_queue)
        self.rounds = 0  # batches run (one or more generate calls each)
        self.lock = threading.Lock()
        self.policy_version = 0
        self.thread = threading.Thread(target=self._run, name="textgym-serve-batcher", daemon=True)
        self.thread.start()

    def submit(self, job: Job) -> Future[list[Result]]:
        """Queue `job` and return its future.

        Raises:
            QueueFullError: when `max_queue` requests are already waiting.
        """
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            raise QueueFullError(f"{self.queue.maxsize} requests are already waiting; retry later") from None
        return job.future

    def close(self) -> None:
        """Stop the worker after the jobs already queued (blocks until it has finished)."""
        self.queue.put(None)
        self.thread.join()

    def _run(self) -> None:
        while True:
            first = self.queue.get()
            if first is None:
                return
            jobs, size = [first], len(first.prompts)
            stop = False
            while size < self.max_batch:
                try:
                    nxt = self.queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                jobs.append(nxt)
                size += len(nxt.prompts)
            self.rounds += 1
            groups: dict[tuple[float, float, int], list[Job]] = {}
            for j in jobs:
                key = (j.params.temperature, j.params.top_p, j.params.top_k)
                groups.setdefault(key, []).append(j)
            with self.lock:  # a weight sync waits for the round, and the round for a sync
                for group in groups.values():
                    try:
                        results = self._generate(group)
                    except Exception as e:  # handed to each request of the group
                        for j in group:
                            j.future.set_exception(e)
                        continue
                    for j, r in zip(group, results, strict=True):
                        j.future.set_result(r)
            if stop:
                return

    def _generate(self, jobs: list[Job]) -> list[list[Result]]:
        """One `generate` call for jobs of one sampling distribution; each cut to its budget."""
        base = jobs[0].params
        budget = max(j.params.max_new_tokens for j in jobs)
        params = SamplingParams(base.temperature, base.top_p, base.top_k, budget)
        prompts = [p for j in jobs for p in j.prompts]
        seeds = [s if s is not None else secrets.randbits(63) for j in jobs for s in j.seeds]
        gens = self.backend.generate(prompts, params, seeds=seeds)
        out: list[list[Result]] = []
        i = 0
        for j in jobs:
            rs = []
            for _ in j.prompts:
                g = gens[i]
                i += 1
                ids, lps, reason = list(g.token_ids), g.logprobs.tolist(), g.finish_reason
                if len(ids) > j.params.max_new_tokens:
                    ids, lps, reason = (
                        ids[: j.params.max_new_tokens],
                        lps[: j.params.max_new_tokens],
                        "length",
                    )
                rs.append(Result(ids, lps, reason, policy_version=self.policy_version))
            if j.top_logprobs > 0 and self.model is not None:
                tops = top_logprobs(
                    self.model, j.prompts, [r.token_ids for r in rs], j.params, j.top_logprobs
                )
                for r, t in zip(rs, tops, strict=True):
                    r.top = t
            out.append(rs)
        return out
