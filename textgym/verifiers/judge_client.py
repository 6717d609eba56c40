"""The HTTP side of LLM-as-judge: one chat request to an OpenAI-compatible endpoint, and a judgement cache.

`JudgeClient.chat` sends `{endpoint}/v1/chat/completions` requests from any number of threads,
at most `concurrency` in flight at once (a semaphore shared by every thread); 429, 5xx,
timeouts and dropped connections are retried with exponential backoff (`backoff_s · 2^k`,
at most `max_backoff_s`; a `Retry-After` header, in seconds or as an HTTP date, is waited
instead), at most `max_retries` times; any other 4xx is an immediate `JudgeError` naming the
status and the endpoint. `JudgementCache` keeps each judgement (the judge's reply text, with
the verdict nonce of the request that got it) under a hash of everything that determines it,
in memory and optionally in a JSONL file, and lets a second asker of the same key wait for the
first one's request instead of sending another.
"""

from __future__ import annotations

import email.utils
import hashlib
import json
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import httpx


class JudgeError(RuntimeError):
    """The judge endpoint refused a request (4xx other than 429) or kept failing after every retry."""


def chat_url(endpoint: str) -> str:
    """`{endpoint}/v1/chat/completions`, whether or not `endpoint` already ends in `/v1`."""
    root = endpoint.rstrip("/")
    return (root if root.endswith("/v1") else root + "/v1") + "/chat/completions"


def retry_after_s(value: str | None, now: float | None = None) -> float | None:
    """Seconds to wait from a `Retry-After` header (delta-seconds or an HTTP date); None if absent or bad."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError):
        return None
    return max(0.0, when - (time.time() if now is None else now))


class JudgeClient:
    """Chat requests to one judge model, bounded in concurrency, retried on transient failures.

    Args:
        endpoint: base URL, e.g. "http://127.0.0.1:8000" (with or without "/v1").
        model: the served model name.
        sampling: request fields sent as they are (temperature, max_tokens, ...): textgym's own,
            so nothing is left for a server to fill from a model folder's generation config.
        concurrency: requests in flight at once, over every thread using this client.
        timeout_s: per-request timeout (seconds).
        max_retries: retries of a retryable failure (429, 5xx, timeout, connection error).
        backoff_s: the first retry's delay; it doubles with each retry.
        max_backoff_s: the longest wait between two attempts (Retry-After included).
        api_key: sent as a bearer token when given.

    `stats` counts `requests` (HTTP attempts), `ok` (the successful ones), `retries`, `failures`
    (calls that raised) and the total `latency_s` of the successful requests, over the client's life.
    """

    def __init__(
        self,
        endpoint: str,
        model: str,
        sampling: dict[str, Any],
        *,
        concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        api_key: str | None = None,
    ):
        if concurrency < 1 or max_retries < 0 or timeout_s <= 0 or backoff_s < 0:
            raise ValueError(
                "need concurrency >= 1, max_retries >= 0, timeout_s > 0 and backoff_s >= 0, got "
                f"{concurrency}, {max_retries}, {timeout_s}, {backoff_s}"
            )
        self.url = chat_url(endpoint)
        self.model = model
        self.sampling = dict(sampling)
        self.concurrency = int(concurrency)
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.backoff_s = float(backoff_s)
        self.max_backoff_s = float(max_backoff_s)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._slots = threading.BoundedSemaphore(self.concurrency)
        self._http = httpx.Client(
            limits=httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        )
        self._lock = threading.Lock()
        self.stats: dict[str, float] = {"requests": 0, "ok": 0, "retries": 0, "failures": 0, "latency_s": 0.0}

    def body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        """The JSON body of a request for `messages` (what the cache key is computed from)."""
        return {"model": self.model, "messages": messages, **self.sampling}

    def _count(self, **add: float) -> None:
        with self._lock:
            for k, v in add.items():
                self.stats[k] += v

    def chat(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply text (the first choice's `message.content`) to `messages`.

        Raises:
            JudgeError: on a 4xx other than 429 (status, endpoint and the server's message), or
                when every attempt failed (the last failure named).
        """
        body = self.body(messages)
        last = ""
        for attempt in range(self.max_retries + 1):
            wait: float | None = None
            with self._slots:
                t0 = time.perf_counter()
                self._count(requests=1)
                try:
                    r = self._http.post(self.url, json=body, headers=self._headers, timeout=self.timeout_s)
                except (httpx.TimeoutException, httpx.TransportError) as e:
                    last = f"{type(e).__name__}: {e}"
                else:
                    if r.status_code == 200:
                        try:
                            text = r.json()["choices"][0]["message"]["content"]
                        except (ValueError, KeyError, IndexError, TypeError) as e:
                            last = f"HTTP 200 with a malformed body ({type(e).__name__}): {r.text[:200]!r}"
                        else:
                            self._count(ok=1, latency_s=time.perf_counter() - t0)
                            return str(text or "")
                    elif r.status_code == 429 or r.status_code >= 500:
                        last = f"HTTP {r.status_code}: {r.text[:300]}"
                        wait = retry_after_s(r.headers.get("retry-after"))
                    else:
                        self._count(failures=1)
                        raise JudgeError(
                            f"judge endpoint {self.url} refused the request: HTTP {r.status_code}: "
                            f"{r.text[:300]}"
                        )
            if attempt < self.max_retries:
                self._count(retries=1)
                delay = self.backoff_s * 2**attempt if wait is None else wait
                time.sleep(min(delay, self.max_backoff_s))
        self._count(failures=1)
        raise JudgeError(f"judge endpoint {self.url} failed {self.max_retries + 1} times; last: {last}")

    def models(self) -> list[str] | None:
        """The model ids the endpoint serves (`GET /v1/models`), or None when it has no such route.

        Raises:
            JudgeError: when the endpoint cannot be reached at all.
        """
        url = self.url.removesuffix("/chat/completions") + "/models"
        try:
            r = self._http.get(url, headers=self._headers, timeout=min(self.timeout_s, 10.0))
        except (httpx.TimeoutException, httpx.TransportError) as e:
            raise JudgeError(f"cannot reach the judge endpoint {url}: {type(e).__name__}: {e}") from None
        if r.status_code != 200:
            return None
        try:
            return [str(m["id"]) for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            return None

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()


def cache_key(body: dict[str, Any], endpoint: str) -> str:
    """SHA-256 of the endpoint and the whole request body (model, rubric-filled messages, sampling)."""
    blob = json.dumps({"endpoint": endpoint, "body": body}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class JudgementCache:
    """Judgements by key, in memory and (with `path`) appended to a JSONL file that later runs reload.

    A judgement is the judge's reply and the nonce of the request that got it: the reply's
    verdict is read against that nonce (`textgym.verifiers.judge_verdict`), whichever request
    later finds it in the cache. `get_or_compute(key, compute, nonce)` returns
    `(text, nonce, hit)`; concurrent callers with the same key wait for the first one's
    `compute` rather than repeating it. Failures are not cached. Each file line is
    `{"key": ..., "judgement": ..., "nonce": ...}`; unreadable lines, and lines without a nonce
    (written before verdicts were tagged), are skipped.
    """

    def __init__(self, path: str | Path | None = None):
        self.path = None if path is None else Path(path)
        self._done: dict[str, tuple[str, str]] = {}
        self._pending: dict[str, Future[tuple[str, str]]] = {}
        self._lock = threading.Lock()
        if self.path is not None and self.path.is_file():
            for line in self.path.read_text(encoding="utf-8", errors="replace").splitlines():
                try:
                    row = json.loads(line)
                    self._done[str(row["key"])] = (str(row["judgement"]), str(row["nonce"]))
                except (ValueError, KeyError, TypeError):
                    continue

    def __len__(self) -> int:
        return len(self._done)

    def get_or_compute(self, key: str, compute: Callable[[], str], nonce: str) -> tuple[str, str, bool]:
        """`(text, nonce, hit)`: the cached judgement for `key`, or `compute()`'s, stored under `nonce`.

        Raises:
            Exception: whatever `compute` raises, to every caller waiting on it; nothing is stored then.
        """
        with self._lock:
            if key in self._done:
                return (*self._done[key], True)
            mine = key not in self._pending
            if mine:
                self._pending[key] = Future()
            future = self._pending[key]
        if not mine:
            return (*future.result(), True)
        try:
            text = compute()
        except BaseException as e:
            with self._lock:
                del self._pending[key]
            future.set_exception(e)
            raise
        with self._lock:
            self._done[key] = (text, nonce)
            del self._pending[key]
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with self.path.open("a", encoding="utf-8") as f:
                    row = {"key": key, "judgement": text, "nonce": nonce}
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        future.set_result((text, nonce))
        return text, nonce, False
