"""Versioned weight sync on the server side: `textgym serve --weight-sync`.

A trainer (`textgym.training.sources.servers.RolloutServerGroup`) pushes new weights to its
rollout servers through a process group of their own (`textgym.distributed.transfer`). The
server's part, over HTTP:

- `POST /weights/init_group` `{group, master_addr, master_port, rank, world_size, backend,
  timeout_s}`: join the trainer's sync group as `rank` (in a background thread; the answer
  comes at once, and `GET /weights/status` says "ready" once joined, "failed" if not within
  `timeout_s`). A group joined before is dropped.
- `POST /weights/update` `{group, version, step, tensors: [{name, shape, dtype}], bucket_bytes,
  lora, aliases, timeout_s}`: the names, shapes and dtypes of what the trainer is about to broadcast.
  They are checked first (HTTP 400 naming the tensor; nothing is received), then a background
  thread receives the buckets into fresh buffers while generation goes on, and once all have
  arrived pauses generation (takes `Batcher.lock` when the round in flight ends), loads them,
  sets the policy version and resumes generation: a response is generated entirely by one
  version, the one it reports. With `lora` (a list of `{"module", "fan_in_fan_out", "adapters": [{"name",
  "scale"}]}`) the tensors are LoRA factors, merged onto the server's base weights with
  `merge_lora_weight` (the trainer's own merge, so the weights are bitwise equal). `aliases`
  names tensors the trainer sent once because they share storage (tied embeddings:
  `{"lm_head.weight": "model.embed_tokens.weight"}`); the server loads them under both names.
- `GET /weights/status`: `{state, policy_version, step, group, rank, received, expected, error}`;
  state is "idle", "joining", "ready", "receiving" or "failed". A new `init_group` may come at
  any time: a sync still receiving in the old group is abandoned (it loads nothing).
- `GET /weights/checksum` (transformers backend): SHA-256 of the model's `state_dict()`.

Every wait is bounded: joining, and a whole sync (receiving, then the wait for the generation
round in flight to end), by the request's `timeout_s`. A sync that fails (the trainer or
another server died, a timeout) leaves the old weights and version in place (nothing is
loaded until every bucket has arrived), drops the group, and reports state "failed" with the
error; the trainer builds a new group to sync again. Requests that arrive while new weights
are being loaded wait in the queue.

`TEXTGYM_SERVE_SYNC_DELAY_S` (a test hook) makes the server sleep that many seconds before
receiving each bucket, so a test can kill a server in the middle of a broadcast.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Literal

import torch
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field

from textgym.agents.weight_sync import merge_lora_weight
from textgym.distributed import transfer
from textgym.distributed.transfer import TensorSpec
from textgym.serve.batching import Batcher
from textgym.serve.protocol import APIError

DELAY_ENV = "TEXTGYM_SERVE_SYNC_DELAY_S"
"""Seconds to sleep before each received bucket (a test hook; unset: 0)."""

log = logging.getLogger(__name__)


class InitGroupRequest(BaseModel):
    """`POST /weights/init_group`: join the trainer's sync group."""

    model_config = ConfigDict(extra="forbid")
    group: str = Field(min_length=1, max_length=200, description="The group's name (fresh per group).")
    master_addr: str = Field(min_length=1, description="The trainer's address (its TCPStore).")
    master_port: int = Field(ge=1, le=65535)
    rank: int = Field(ge=1, description="This server's rank (the trainer is 0).")
    world_size: int = Field(ge=2)
    backend: Literal["gloo", "nccl"] = "gloo"
    timeout_s: float = Field(gt=0, le=86400, description="Seconds joining, then each sync, may take.")


class LoraAdapter(BaseModel):
    """One adapter of a LoRA layer: its name and scale α / r."""

    model_config = ConfigDict(extra="forbid")
    name: str
    scale: float


class LoraLayerSpec(BaseModel):
    """How one LoRA layer merges: W + Σ scale·B A onto `{module}.weight`."""

    model_config = ConfigDict(extra="forbid")
    module: str
    fan_in_fan_out: bool = False
    adapters: list[LoraAdapter]


class UpdateRequest(BaseModel):
    """`POST /weights/update`: what the trainer will broadcast, and the version it becomes."""

    model_config = ConfigDict(extra="forbid")
    group: str
    version: int = Field(ge=0)
    step: int | None = None
    tensors: list[dict[str, Any]] = Field(min_length=1)
    bucket_bytes: int = Field(ge=1)
    lora: list[LoraLayerSpec] | None = None
    aliases: dict[str, str] = Field(
        default_factory=dict, description="Tied names left out: {alias: name sent}."
    )
    timeout_s: float = Field(gt=0, le=86400)


class WeightReceiver:
    """The server's end of weight syncs: joins sync groups, receives, loads, sets the version.

    Args:
        batcher: the server's `Batcher` (its `lock` pauses generation; its `policy_version`
            is the version answered with every response).
        backend: the generation backend (`TransformersBackend` or `VLLMBackend`).
        model: the transformers model (weights copied into its parameters), or None for vLLM
            (weights handed to `VLLMBackend.load_weights`).
        model_dir: the served model folder (the vLLM backend's LoRA base weights are read from it).
    """

    def __init__(self, batcher: Batcher, backend: Any, model: Any, model_dir: str | Path):
        self.batcher, self.backend, self.model, self.model_dir = batcher, backend, model, Path(model_dir)
        self.state = "idle"
        self.error: str | None = None
        self.group: Any = None
        self.group_name: str | None = None
        self.rank: int | None = None
        self.step: int | None = None
        self.received = self.expected = 0
        self.backend_name = "gloo"
        self._base: dict[str, torch.Tensor] = {}  # LoRA base weights (transformers: per module)
        self._full: dict[str, torch.Tensor] | None = None  # vLLM: the full HF state LoRA merges onto
        self._mutex = threading.Lock()  # guards the fields above between HTTP and sync threads

    def status(self) -> dict[str, Any]:
        """`{state, policy_version, step, group, rank, received, expected, error}`."""
        return {
            "state": self.state,
            "policy_version": self.batcher.policy_version,
            "step": self.step,
            "group": self.group_name,
            "rank": self.rank,
            "received": self.received,
            "expected": self.expected,
            "error": self.error,
        }

    def init_group(self, req: InitGroupRequest) -> dict[str, Any]:
        """Start joining the group `req` names (a background thread); answer the status at once.

        A sync still receiving in the old group is abandoned: its thread ends at its own
        timeout and loads nothing.
        """
        with self._mutex:
            self.group, self.group_name, self.rank = None, req.group, req.rank
            self.state, self.error = "joining", None
        threading.Thread(target=self._join, args=(req,), name="textgym-weights-join", daemon=True).start()
        return self.status()

    def _join(self, req: InitGroupRequest) -> None:
        try:
            group = transfer.new_group(
                req.backend,
                req.master_addr,
                req.master_port,
                req.rank,
                req.world_size,
                req.timeout_s,
                req.group,
            )
        except Exception as e:
            self._fail(req.group, f"could not join group {req.group!r}: {type(e).__name__}: {e}")
            return
        with self._mutex:
            if self.group_name == req.group:  # not replaced by a newer init_group meanwhile
                self.group, self.backend_name, self.state = group, req.backend, "ready"

    def _fail(self, group: str | None, message: str) -> None:
        log.warning("weight sync: %s", message)
        with self._mutex:
            if self.group_name == group:
                self.group, self.state, self.error = None, "failed", message

    def update(self, req: UpdateRequest) -> dict[str, Any]:
        """Check what the trainer will send, then receive it in a background thread.

        Raises:
            APIError: 409 when not joined to `req.group` (or a sync is already receiving);
                400 naming a tensor whose name, shape or dtype this model cannot take.
        """
        specs = [TensorSpec.from_json(t) for t in req.tensors]
        with self._mutex:
            if self.state != "ready" or self.group_name != req.group:
                raise APIError(
                    409,
                    f"not ready for group {req.group!r} (state {self.state!r}, group {self.group_name!r})",
                    code="not_in_group",
                )
            self._check(specs, req.lora, req.aliases)
            self.state, self.error, self.received, self.expected = "receiving", None, 0, len(specs)
            group = self.group
        args = (req, specs, group)
        threading.Thread(target=self._receive, args=args, name="textgym-weights-receive", daemon=True).start()
        return self.status()

    def _check(
        self, specs: list[TensorSpec], lora: list[LoraLayerSpec] | None, aliases: dict[str, str]
    ) -> None:
        """Raise APIError 400 for a tensor this model cannot take (vLLM checks on load)."""
        for s in specs:
            try:
                s.torch_dtype  # noqa: B018 - validates the name
            except ValueError as e:
                raise APIError(400, str(e), "tensors") from None
        if self.model is None:
            return
        params = self.model.state_dict()
        if lora is None:
            sent = {s.name: s for s in specs}
            for alias, name in aliases.items():
                if name not in sent:
                    raise APIError(400, f"alias {alias}: {name} is not sent", "aliases")
                specs = [*specs, TensorSpec(alias, sent[name].shape, sent[name].dtype)]
            for s in specs:
                if s.name not in params:
                    raise APIError(400, f"{s.name}: no such tensor in the served model", "tensors")
                if tuple(params[s.name].shape) != s.shape:
                    shape = tuple(params[s.name].shape)
                    raise APIError(
                        400, f"{s.name}: shape {s.shape}, the served model's is {shape}", "tensors"
                    )
            return
        by_name = {s.name: s for s in specs}
        for layer in lora:
            key = f"{layer.module}.weight"
            if key not in params:
                raise APIError(400, f"{key}: no such tensor in the served model", "lora")
            out_f, in_f = params[key].shape[::-1] if layer.fan_in_fan_out else params[key].shape
            for a in layer.adapters:
                a_s, b_s = (
                    by_name.get(f"{layer.module}.lora_A.{a.name}"),
                    by_name.get(f"{layer.module}.lora_B.{a.name}"),
                )
                if a_s is None or b_s is None:
                    raise APIError(400, f"{layer.module}: factors of adapter {a.name!r} missing", "tensors")
                if len(a_s.shape) != 2 or a_s.shape[1] != in_f or b_s.shape != (out_f, a_s.shape[0]):
                    raise APIError(
                        400,
                        f"{layer.module}: LoRA factors {a_s.shape}, {b_s.shape} do not fit {key}",
                        "tensors",
                    )

    def _receive(self, req: UpdateRequest, specs: list[TensorSpec], group: Any) -> None:
        """Receive every bucket (generation goes on), then load them with generation paused."""
        deadline = time.monotonic() + req.timeout_s
        try:
            device = (
                torch.device("cuda", torch.cuda.current_device()) if self.backend_name == "nccl" else "cpu"
            )
            delay = float(os.environ.get(DELAY_ENV, "0") or 0)
            got: dict[str, torch.Tensor] = {}
            for idx in transfer.plan_buckets(specs, req.bucket_bytes):
                if delay:
                    time.sleep(delay)
                part = [specs[i] for i in idx]
                buf = torch.empty(transfer.bucket_nbytes(part), dtype=torch.uint8, device=device)
                transfer.broadcast(group, buf, max(deadline - time.monotonic(), 0.001))
                got.update({s.name: t for s, t in zip(part, transfer.unpack(buf, part), strict=True)})
                self.received += len(idx)
            if req.lora is None:
                got.update({alias: got[name] for alias, name in req.aliases.items()})
            if not self.batcher.lock.acquire(timeout=max(deadline - time.monotonic(), 0.001)):
                raise TimeoutError("the generation round in flight did not end in time")
            try:
                with self._mutex:
                    if self.group_name != req.group:  # superseded by a newer group meanwhile
                        return
                self._load(got, req.lora, req.aliases)
                self.batcher.policy_version = req.version
            finally:
                self.batcher.lock.release()
            with self._mutex:
                self.step, self.state = req.step, "ready"
        except Exception as e:
            self._fail(
                req.group, f"sync to version {req.version} (step {req.step}) failed: {type(e).__name__}: {e}"
            )

    @torch.no_grad()
    def _load(
        self, got: dict[str, torch.Tensor], lora: list[LoraLayerSpec] | None, aliases: dict[str, str]
    ) -> None:
        """Load received tensors: copied into the transformers model, or handed to vLLM."""
        if self.model is not None:
            params = self.model.state_dict()
            if lora is None:
                for name, t in got.items():
                    params[name].copy_(t)
                self._base.clear()  # LoRA merges onto these weights from now on
                return
            for layer in lora:
                key = f"{layer.module}.weight"
                base = self._base.setdefault(key, params[key].detach().clone())
                params[key].copy_(self._merge(layer, base, got))
            return
        if lora is None:
            fresh = {k: v.clone() for k, v in got.items()}  # own storage, not views of a bucket
            self._full = {**(self._full or {}), **{k: v.cpu() for k, v in fresh.items()}}
            self.backend.load_weights(fresh.items())
            return
        if self._full is None:
            self._full = _folder_state(self.model_dir)
        merged = dict(self._full)
        for layer in lora:
            key = f"{layer.module}.weight"
            merged[key] = self._merge(layer, self._full[key], got)
        merged.update({alias: merged[name] for alias, name in aliases.items() if name in merged})
        self.backend.load_weights(merged.items())

    @staticmethod
    def _merge(layer: LoraLayerSpec, base: torch.Tensor, got: dict[str, torch.Tensor]) -> torch.Tensor:
        factors = [
            (got[f"{layer.module}.lora_A.{a.name}"], got[f"{layer.module}.lora_B.{a.name}"], a.scale)
            for a in layer.adapters
        ]
        return merge_lora_weight(
            base, [(a.to(base.device), b.to(base.device), s) for a, b, s in factors], layer.fan_in_fan_out
        )

    def checksum(self) -> str:
        """SHA-256 of the served model's `state_dict()` (`transfer.checksum`), between rounds.

        Raises:
            APIError: 400 with the vllm backend (its engine keeps fused weights, not the
                Hugging Face tensors); 503 if generation does not pause within 60 s.
        """
        if self.model is None:
            raise APIError(400, "the checksum needs the transformers backend; compare greedy outputs instead")
        if not self.batcher.lock.acquire(timeout=60):
            raise APIError(503, "generation did not pause within 60 s")
        try:
            return transfer.checksum(self.model.state_dict().items())
        finally:
            self.batcher.lock.release()


def _folder_state(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the model folder's safetensors files (CPU)."""
    from safetensors.torch import load_file

    state: dict[str, torch.Tensor] = {}
    for f in sorted(model_dir.glob("*.safetensors")):
        state.update(load_file(f))
    return state


def add_weight_routes(app: FastAPI, receiver: WeightReceiver) -> None:
    """Add `/weights/init_group`, `/weights/update`, `/weights/status` and `/weights/checksum` to `app`."""

    @app.post("/weights/init_group")
    async def init_group(req: InitGroupRequest) -> dict[str, Any]:
        return receiver.init_group(req)

    @app.post("/weights/update")
    def update(req: UpdateRequest) -> dict[str, Any]:  # a thread: checking reads the weights
        return receiver.update(req)

    @app.get("/weights/status")
    async def status() -> dict[str, Any]:
        return receiver.status()

    @app.get("/weights/checksum")
    def checksum() -> dict[str, Any]:
        return {"sha256": receiver.checksum(), "policy_version": receiver.batcher.policy_version}
