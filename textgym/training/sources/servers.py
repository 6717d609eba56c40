"""Pushing a trainer's weights to rollout servers (`textgym serve --weight-sync`), versioned and bounded.

`RolloutServerGroup(urls)` makes the trainer rank 0 and the N servers ranks 1..N of a process
group of their own (`textgym.distributed.transfer.new_group`: gloo on CPU, NCCL on GPU, the
same code; never `torch.distributed`'s default group, so a torchrun trainer keeps its own).
`push(model, version, step)`:

1. posts `/weights/update` to every server: the names, shapes and dtypes about to come, the
   version they become, the step (a server checks them and answers 400 naming a tensor it
   cannot take, before anything is sent);
2. broadcasts the tensors as byte buckets (`bucket_mb` each), each broadcast waiting at most
   the time left;
3. polls `/weights/status` until every server reports the new `policy_version`.

What is sent: a plain policy's `state_dict()` (tied tensors once); a LoRA policy's adapter
factors only (`weight_sync.lora_adapters`, r·(in + out) numbers per layer), which each server
merges onto its base weights with the trainer's own merge (`merge_lora_weight`), or, with
`lora="merged"`, the merged weights (`merged_state_dict`).

Every blocking call is bounded: HTTP calls by `http_timeout_s`, joining the group and the whole
sync by `timeout_s`. Whatever fails (a server refuses, dies, hangs or misses the deadline), the
trainer asks every server for its status (`http_timeout_s`), closes the group and raises
`WeightSyncError` naming the server(s) at fault, the step and the version, within about
`timeout_s + http_timeout_s` of the push's start. The servers keep their previous weights and
version (a server loads nothing until every bucket has arrived). The next `push` builds a new
group; a run that stops on the error resumes from its last checkpoint.
"""

from __future__ import annotations

import datetime
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal
from urllib.parse import urlparse

import httpx
import torch
import torch.distributed as dist

from textgym import distributed
from textgym.agents.weight_sync import is_lora, lora_adapters, merged_state_dict
from textgym.distributed import transfer
from textgym.distributed.transfer import TensorSpec


class WeightSyncError(RuntimeError):
    """A weight sync failed or ran out of time.

    The message names the server(s) at fault (URL and rank), what each was doing, the training
    step and the policy version, and the underlying error.

    Attributes:
        servers: URLs of the servers at fault (every server when none could be singled out).
        step: the training step of the sync (None when not given).
        version: the policy version being pushed (None while joining the group).
    """

    def __init__(self, message: str, servers: list[str], step: int | None, version: int | None):
        super().__init__(message)
        self.servers, self.step, self.version = servers, step, version


def resolve_backend(backend: str) -> str:
    """The backend of a setting ("gloo" or "nccl"): "auto" is NCCL where CUDA and NCCL are available."""
    if backend == "auto":
        return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"unknown backend {backend!r}; available: 'auto', 'gloo', 'nccl'")
    return backend


def _dedupe(named: list[tuple[str, torch.Tensor]]) -> tuple[list[tuple[str, torch.Tensor]], dict[str, str]]:
    """Tensors sharing storage (tied embeddings) once, under their first name; `{alias: name kept}`."""
    seen: dict[Any, str] = {}
    out, aliases = [], {}
    for name, t in named:
        key = (t.device, t.data_ptr(), tuple(t.shape), t.dtype, t.stride()) if t.numel() else name
        if key in seen:
            aliases[name] = seen[key]
            continue
        seen[key] = name
        out.append((name, t))
    return out, aliases


def _tied(module: torch.nn.Module) -> dict[str, str]:
    """`{alias: first name}` of parameters registered under several names (tied embeddings)."""
    first: dict[int, str] = {}
    aliases = {}
    for name, p in module.named_parameters(remove_duplicate=False):
        name = name.replace(".base_layer.", ".")  # peft's wrapped layers: the base model's names
        if id(p) in first:
            aliases[name] = first[id(p)]
        else:
            first[id(p)] = name
    return aliases


def payload(
    model: Any, lora: Literal["adapters", "merged"] = "adapters"
) -> tuple[list[tuple[str, torch.Tensor]], list[dict[str, Any]] | None, dict[str, str]]:
    """What a push sends for `model`: `(named tensors, LoRA layers or None, aliases)`.

    A plain policy: its `state_dict()` (full, gathered to rank 0, for a sharded one), tied
    tensors once (`aliases` maps each name left out to the name sent, e.g.
    `{"lm_head.weight": "model.embed_tokens.weight"}`; the server fills them back in). A LoRA
    policy: its adapter factors and layer recipes (`lora_adapters`), or with `lora="merged"`
    its merged weights. Collective for a sharded policy (call it on every rank; ranks other
    than 0 get no tensors).

    Raises:
        ValueError: on an unknown `lora`, or (adapters) trainable tensors outside the LoRA factors.
    """
    if lora not in ("adapters", "merged"):
        raise ValueError(f"lora must be 'adapters' or 'merged', not {lora!r}")
    if is_lora(model) and lora == "adapters":
        tensors, layers = lora_adapters(model)
        return tensors, layers, _tied(model.get_base_model())
    if is_lora(model):
        state = merged_state_dict(model)
    else:
        state = distributed.model_state(model) if distributed.is_sharded(model) else model.state_dict()
    named, aliases = _dedupe(list(state.items()))
    return named, None, aliases


def _local_addr(url: str) -> str:
    """This machine's address on the route to `url`'s host (what the server connects back to)."""
    host = urlparse(url).hostname or "127.0.0.1"
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))  # UDP: nothing is sent
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


class RolloutServerGroup:
    """The trainer's end of weight syncs with N rollout servers.

    Args:
        urls: the servers' base URLs (e.g. "http://10.0.0.5:8000"), each `textgym serve --weight-sync`.
        timeout_s: seconds that joining the group, and then each whole sync (HTTP, broadcast,
            loading), may take before `WeightSyncError`. It also bounds a server's wait for the
            generation round in flight to end, so allow for the longest round.
        http_timeout_s: seconds each HTTP call may take (connect and read).
        backend: "auto" (NCCL with CUDA, else gloo), "gloo" or "nccl".
        master_addr: the address the servers reach this trainer at (default: this machine's
            address on the route to the first server).
        bucket_mb: MiB per broadcast (tensors are packed into buckets of this size).

    Raises:
        ValueError: on no URLs, duplicate URLs, an unknown backend, or non-positive timeouts.
    """

    def __init__(
        self,
        urls: list[str],
        *,
        timeout_s: float = 300.0,
        http_timeout_s: float = 10.0,
        backend: str = "auto",
        master_addr: str | None = None,
        bucket_mb: float = 256.0,
    ):
        self.urls = [u.rstrip("/") for u in urls]
        if not self.urls or len(set(self.urls)) != len(self.urls):
            raise ValueError("urls must be one or more distinct server URLs")
        if timeout_s <= 0 or http_timeout_s <= 0 or bucket_mb <= 0:
            raise ValueError("timeout_s, http_timeout_s and bucket_mb must be > 0")
        self.timeout_s, self.http_timeout_s = float(timeout_s), float(http_timeout_s)
        self.backend = resolve_backend(backend)
        self.master_addr = master_addr or _local_addr(self.urls[0])
        self.bucket_bytes = int(bucket_mb * 2**20)
        self.group: Any = None
        self.group_name: str | None = None
        self._store: Any = None
        self.version: int | None = None  # the last version every server confirmed
        self._http = httpx.Client(timeout=self.http_timeout_s)
        self._faults: dict[str, str] = {}  # HTTP refusals of the sync in progress, by URL

    # ---- HTTP, every call bounded and run on all servers at once
    def _each(self, fn: Callable[[str], Any]) -> list[Any]:
        """`fn(url)` for every server concurrently; results (or the exception raised) in URL order."""

        def safe(url: str) -> Any:
            try:
                return fn(url)
            except Exception as e:
                return e

        with ThreadPoolExecutor(max_workers=len(self.urls)) as pool:
            return list(pool.map(safe, self.urls))

    def _call(self, url: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        r = self._http.post(url + path, json=body) if body is not None else self._http.get(url + path)
        if r.status_code != 200:
            raise RuntimeError(f"HTTP {r.status_code} on {path}: {r.text[:300]}")
        return r.json()  # type: ignore[no-any-return]

    def status(self) -> list[dict[str, Any] | Exception]:
        """Every server's `/weights/status` (or the exception the request raised), in URL order."""
        return self._each(lambda u: self._call(u, "/weights/status"))

    def _post_all(self, path: str, bodies: list[dict[str, Any]]) -> None:
        """POST to every server (body i to server i); a failure is recorded in `_faults` and raised."""
        results = self._each(lambda u: self._call(u, path, bodies[self.urls.index(u)]))
        for u, r in zip(self.urls, results, strict=True):
            if isinstance(r, Exception):
                self._faults[u] = f"refused {path}: {type(r).__name__}: {r}"
        if self._faults:
            raise RuntimeError(f"{len(self._faults)} server(s) refused {path}")

    def _wait_all(self, done: Callable[[dict[str, Any]], bool], deadline: float, what: str) -> None:
        """Poll every server's status until `done` holds for all, or a server failed, or the deadline."""
        while True:
            states = self.status()
            failed = [s for s in states if isinstance(s, dict) and s["state"] == "failed"]
            if failed:
                raise RuntimeError(f"a server failed: {failed[0]['error']}")
            if all(isinstance(s, dict) and done(s) for s in states):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"not every server got {what} within {self.timeout_s:g} s")
            time.sleep(0.05)

    # ---- the group
    def connect(self, step: int | None = None) -> None:
        """Build a new sync group with every server (the old one, if any, is closed first).

        Raises:
            WeightSyncError: naming the servers that could not join within `timeout_s`.
        """
        self._guard(
            lambda: self._connect(time.monotonic() + self.timeout_s), "joining the sync group", step, None
        )

    def _connect(self, deadline: float) -> None:
        self.close()
        world = len(self.urls) + 1
        name = uuid.uuid4().hex
        self._store = dist.TCPStore(
            self.master_addr,
            0,
            world,
            True,
            timeout=datetime.timedelta(seconds=self.timeout_s),
            wait_for_workers=False,
        )
        self.group_name = name
        body = {
            "group": name,
            "master_addr": self.master_addr,
            "master_port": int(self._store.port),
            "world_size": world,
            "backend": self.backend,
            "timeout_s": self.timeout_s,
        }
        self._post_all("/weights/init_group", [{**body, "rank": r + 1} for r in range(len(self.urls))])
        left = max(deadline - time.monotonic(), 0.001)
        self.group = transfer.new_group(
            self.backend, self.master_addr, 0, 0, world, left, name, store=self._store
        )
        self._wait_all(lambda s: s["state"] == "ready" and s["group"] == name, deadline, "into the group")

    def close(self) -> None:
        """Drop the sync group (the servers' pending receives then fail at once); a no-op when none."""
        self.group, self._store, self.group_name = None, None, None

    def __enter__(self) -> RolloutServerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
        self._http.close()

    # ---- a sync
    def push(
        self,
        model: Any,
        version: int,
        step: int | None = None,
        lora: Literal["adapters", "merged"] = "adapters",
    ) -> dict[str, float]:
        """Send `model`'s weights to every server; return once all serve them as `version`.

        Collective for a sharded policy (call it on every rank); only rank 0 talks to the
        servers, the others return `{}`.

        Args:
            model: the policy (a plain model or a `peft.PeftModel`).
            version: the policy version the servers report from now on (e.g. the step number).
            step: the training step, named in errors.
            lora: for a LoRA policy, send "adapters" (factors only) or "merged" weights.

        Returns:
            `{"weight_sync/bytes": bytes broadcast, "weight_sync/tensors": count,
            "time/weight_sync_s": seconds}`.

        Raises:
            WeightSyncError: a server refused, died, hung or did not confirm within `timeout_s`
                (raised within about `timeout_s + http_timeout_s`); the group is closed.
            ValueError: from `payload` (bad `lora`, trainable tensors outside the factors).
        """
        start = time.monotonic()
        named, layers, aliases = payload(model, lora)
        if not distributed.is_main():
            return {}
        specs = [TensorSpec.of(n, t) for n, t in named]
        self._guard(
            lambda: self._push(named, specs, layers, aliases, version, step, start), "the sync", step, version
        )
        self.version = version
        return {
            "weight_sync/bytes": float(sum(s.nbytes for s in specs)),
            "weight_sync/tensors": float(len(specs)),
            "time/weight_sync_s": time.monotonic() - start,
        }

    def _push(
        self,
        named: list[tuple[str, torch.Tensor]],
        specs: list[TensorSpec],
        layers: list[dict[str, Any]] | None,
        aliases: dict[str, str],
        version: int,
        step: int | None,
        start: float,
    ) -> None:
        deadline = start + self.timeout_s
        if self.group is None:
            self._connect(deadline)
        body = {
            "group": self.group_name,
            "version": version,
            "step": step,
            "tensors": [s.to_json() for s in specs],
            "bucket_bytes": self.bucket_bytes,
            "lora": layers,
            "aliases": aliases,
            "timeout_s": max(deadline - time.monotonic(), 0.001),
        }
        self._post_all("/weights/update", [body] * len(self.urls))
        device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else "cpu"
        for idx in transfer.plan_buckets(specs, self.bucket_bytes):
            buf = transfer.pack([named[i][1] for i in idx], device)
            transfer.broadcast(self.group, buf, max(deadline - time.monotonic(), 0.001))
        self._wait_all(
            lambda s: s["state"] == "ready" and s["policy_version"] == version, deadline, f"version {version}"
        )

    def _guard(self, fn: Callable[[], None], what: str, step: int | None, version: int | None) -> None:
        """Run `fn`; on any failure, find the servers at fault, close the group, raise `WeightSyncError`."""
        start = time.monotonic()
        self._faults = {}
        try:
            fn()
        except Exception as e:
            elapsed = time.monotonic() - start
            problems = self._diagnose()
            self.close()
            at = f"step {step}" if step is not None else "no step given"
            ver = f", policy version {version}" if version is not None else ""
            faults = "; ".join(f"server {u} (rank {self.urls.index(u) + 1}) {p}" for u, p in problems)
            if not problems:
                faults = "no server reported a problem: " + ", ".join(self.urls)
            msg = (
                f"weight sync failed during {what} ({at}{ver}) after {elapsed:.1f} s "
                f"(timeout {self.timeout_s:g} s): {faults}. Cause: {type(e).__name__}: {e}. "
                "The servers keep their previous weights; the sync group is closed (the next push "
                "builds a new one; a stopped run resumes from its last checkpoint)."
            )
            servers = [u for u, _ in problems] or list(self.urls)
            raise WeightSyncError(msg, servers, step, version) from e

    def _diagnose(self) -> list[tuple[str, str]]:
        """`(url, what is wrong)` for the servers at fault.

        The gravest kind found is reported: refused by HTTP, unreachable or hung first; then
        failed or out of the group; then merely behind (still receiving). A server whose sync
        failed because another one died is not blamed for it.
        """
        tiers: list[list[tuple[str, str]]] = [list(self._faults.items()), [], []]
        for url, s in zip(self.urls, self.status(), strict=True):
            if url in self._faults:
                continue
            if isinstance(s, httpx.TimeoutException):
                tiers[0].append((url, f"did not answer within {self.http_timeout_s:g} s (hung?)"))
            elif isinstance(s, httpx.TransportError):
                tiers[0].append((url, f"is unreachable (it may have died): {type(s).__name__}"))
            elif isinstance(s, Exception):
                tiers[0].append((url, f"answered an error: {s}"))
            elif s["state"] == "failed":
                tiers[1].append((url, f"failed: {s['error']}"))
            elif s["group"] != self.group_name:
                tiers[1].append((url, f"is not in the sync group (state {s['state']!r})"))
            elif s["state"] != "ready":
                tiers[2].append(
                    (url, f"was still {s['state']} ({s['received']}/{s['expected']} tensors received)")
                )
        return next((t for t in tiers if t), [])
