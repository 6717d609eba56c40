"""Isolated execution of untrusted code: one interface, backends chosen by name.

    from textgym.sandbox import get_backend
    result = get_backend("process").run(code="print(1 + 1)", timeout_s=5)
    result.stdout, result.exit_code, result.timed_out, result.oom

Backends (`get_backend(name)`; envs and verifiers take `sandbox="process"|"docker"`):
- `process` (default): bubblewrap namespaces, read-only system, tmpfs work dir,
  uid 65534, rlimits, wall-clock kill of the process tree (`textgym.sandbox.process`).
- `docker`: pooled warm containers of a locally built image with no network,
  read-only root, memory/pids limits (`textgym.sandbox.docker`).
- `unsafe_local`: a plain subprocess with rlimits and NO isolation, for development on
  machines without either; it warns every time it is created and is never a default.

`textgym sandbox check` prints which backends work on this machine and why not.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from textgym.sandbox.base import (
    ExecRequest,
    ExecResult,
    SandboxBackend,
    SandboxError,
    SandboxUnavailableError,
    make_request,
)
from textgym.sandbox.local import UnsafeLocalBackend
from textgym.sandbox.process import ProcessBackend

BACKENDS = ("process", "docker", "unsafe_local")
DEFAULT_BACKEND = "process"
_shared: dict[tuple[str, tuple[tuple[str, Any], ...]], SandboxBackend] = {}
_shared_lock = threading.Lock()


def backend_class(name: str) -> type[SandboxBackend]:
    """The backend class registered under `name`.

    Raises:
        ValueError: on an unknown name (the message lists the known ones).
    """
    if name == "process":
        return ProcessBackend
    if name == "docker":
        from textgym.sandbox.docker import DockerBackend

        return DockerBackend
    if name == "unsafe_local":
        return UnsafeLocalBackend
    raise ValueError(f"unknown sandbox backend {name!r}; choose one of {list(BACKENDS)}")


def get_backend(name: str | SandboxBackend = DEFAULT_BACKEND, **options: Any) -> SandboxBackend:
    """The process-wide shared backend for `name` and `options` (created on first use).

    Sharing matters for `docker`, whose warm containers are reused by every env and
    verifier of the process. A backend instance passed in is returned as is.

    Raises:
        ValueError: on an unknown backend name.
        SandboxUnavailableError: when the backend cannot run here (the message says why).
    """
    if isinstance(name, SandboxBackend):
        return name
    cls = backend_class(name)
    key = (name, tuple(sorted(options.items())))
    with _shared_lock:
        if key not in _shared:
            _shared[key] = cls(**options)
        return _shared[key]


def run(
    files: Mapping[str, str | bytes] | None = None,
    code: str | None = None,
    *,
    backend: str | SandboxBackend = DEFAULT_BACKEND,
    **kwargs: Any,
) -> ExecResult:
    """Run code in the shared `backend`; arguments as `SandboxBackend.run`.

    Raises:
        ValueError: on a malformed request or unknown backend.
        SandboxUnavailableError / SandboxError: when the sandbox cannot run or fails.
    """
    return get_backend(backend).run(files, code, **kwargs)


def run_batch(
    requests: Sequence[ExecRequest], *, backend: str | SandboxBackend = DEFAULT_BACKEND
) -> list[ExecResult]:
    """Run many requests on the shared `backend` with its bounded worker pool; results in order."""
    return get_backend(backend).run_batch(requests)


def check_backends() -> list[tuple[str, bool, str]]:
    """`(name, works, reason)` for each backend on this machine (`unsafe_local` is never 'working')."""
    rows = []
    for name in ("process", "docker"):
        try:
            cls = backend_class(name)
        except ImportError as e:  # pragma: no cover - the SDK is a dependency
            rows.append((name, False, str(e)))
            continue
        ok, why = cls.check()
        rows.append((name, ok, why))
    rows.append(("unsafe_local", False, "no isolation: development only, never chosen by default"))
    return rows


def close_all() -> None:
    """Close every shared backend (removes the docker backend's containers)."""
    with _shared_lock:
        for b in _shared.values():
            b.close()
        _shared.clear()


__all__ = [
    "BACKENDS",
    "ExecRequest",
    "ExecResult",
    "ProcessBackend",
    "SandboxBackend",
    "SandboxError",
    "SandboxUnavailableError",
    "UnsafeLocalBackend",
    "backend_class",
    "check_backends",
    "close_all",
    "get_backend",
    "make_request",
    "run",
    "run_batch",
]
