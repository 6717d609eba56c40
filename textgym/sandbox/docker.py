"""The `docker` backend: commands run in warm containers of a locally built image.

Each container is started once with no network (`network_mode="none"`), a read-only
root filesystem, tmpfs `/work` and `/tmp`, memory and pids limits, every capability
dropped but the few the launcher needs, and `no-new-privileges`. A run is one `exec`
of the launcher (`_launcher.py`, shipped as source): it wipes `/work` and `/tmp`, writes
the request's files, runs the command as uid 65534 with rlimits and the wall-clock
timeout, kills whatever the command left running, and reports back. Containers are
pooled and reused between runs (reset as above), so a run costs an `exec`, not a
container start. A container whose run overran (by `timeout_s + grace_s`) or broke is
killed and replaced.

Needs a Docker engine (`docker.from_env()`: `DOCKER_HOST` or the local socket) and the
image (`textgym sandbox build-image`, or any image with python3 on PATH: `image=`).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from textgym.sandbox.base import (
    DEFAULT_IMAGE,
    DEFAULT_WORKDIR_BYTES,
    ExecRequest,
    ExecResult,
    SandboxBackend,
    SandboxError,
    SandboxUnavailableError,
)

LAUNCHER_SOURCE = (Path(__file__).parent / "_launcher.py").read_text(encoding="utf-8")
_IDLE = (  # pid 1 of each container: reap orphans, otherwise sleep
    "import os, time\nwhile True:\n    try:\n        os.wait()\n"
    "    except ChildProcessError:\n        time.sleep(1)\n"
)
_CAPS = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "KILL", "SETGID", "SETUID"]
LABEL = "textgym.sandbox"


def connect(base_url: str | None = None) -> Any:
    """A `docker.DockerClient` that answered a ping.

    Raises:
        SandboxUnavailableError: when the SDK is missing or no engine answers (with how to start one).
    """
    try:
        import docker
    except ImportError as e:
        raise SandboxUnavailableError("the docker backend needs the Docker SDK: pip install docker") from e
    try:
        client = (
            docker.DockerClient(base_url=base_url, max_pool_size=32)
            if base_url
            else docker.from_env(max_pool_size=32)
        )
        client.ping()
    except Exception as e:
        where = base_url or os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
        raise SandboxUnavailableError(
            f"no Docker engine answers at {where} ({type(e).__name__}); start one, e.g. "
            "`dockerd --storage-driver=vfs --iptables=false --bridge=none &` as root"
        ) from e
    return client


def _read_frames(sock: Any, deadline: float) -> tuple[bytes, bytes]:
    """Read a non-TTY exec stream (8-byte frame headers) until EOF; raise TimeoutError at the deadline."""
    raw = sock._sock if hasattr(sock, "_sock") else sock
    buf = bytearray()
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        raw.settimeout(remaining)
        try:
            chunk = raw.recv(65536)
        except TimeoutError:  # an OSError too: let it through to the caller
            raise
        except OSError as e:
            raise SandboxError(f"exec stream broke: {e}") from e
        if not chunk:
            break
        buf += chunk
    out, err = bytearray(), bytearray()
    i = 0
    while i + 8 <= len(buf):
        kind, size = buf[i], int.from_bytes(buf[i + 4 : i + 8], "big")
        (out if kind == 1 else err).extend(buf[i + 8 : i + 8 + size])
        i += 8 + size
    return bytes(out), bytes(err)


class DockerBackend(SandboxBackend):
    """Run commands in pooled, network-less, read-only containers (see the module docstring).

    Args:
        image: the image (default `TEXTGYM_SANDBOX_IMAGE` or "textgym-sandbox:latest").
        max_workers: how many commands `run_batch` runs at once (also the warm pool's size).
        container_memory_mb: the container's cgroup memory limit (MiB, swap included); each
            run's own `memory_mb` is an address-space rlimit inside it.
        pids_limit: the container's process limit (cgroup pids).
        workdir_bytes: size of the tmpfs `/work` (bytes); `/tmp` gets a quarter.
        grace_s: seconds beyond a run's `timeout_s` before the host kills the container.
        base_url: the engine's address (default: `DOCKER_HOST` or the local socket).

    Raises:
        SandboxUnavailableError: when no engine answers or the image is missing (the message
            says to run `textgym sandbox build-image`).
    """

    name = "docker"

    def __init__(
        self,
        image: str | None = None,
        max_workers: int = 4,
        container_memory_mb: int = 1024,
        pids_limit: int = 128,
        workdir_bytes: int = DEFAULT_WORKDIR_BYTES,
        grace_s: float = 10.0,
        base_url: str | None = None,
    ):
        super().__init__(max_workers=max_workers)
        self.image = image or os.environ.get("TEXTGYM_SANDBOX_IMAGE", DEFAULT_IMAGE)
        self.client = connect(base_url)
        try:
            self.client.images.get(self.image)
        except Exception as e:
            raise SandboxUnavailableError(
                f"docker image {self.image!r} not found in the engine: build it with "
                "`textgym sandbox build-image` (no registry needed), or pass image= an image with python3"
            ) from e
        self.container_memory_mb = int(container_memory_mb)
        self.pids_limit = int(pids_limit)
        self.workdir_bytes = int(workdir_bytes)
        self.grace_s = float(grace_s)
        self._idle: list[Any] = []
        self._all: set[str] = set()
        self._pool_lock = threading.Lock()
        self._finalizer = weakref.finalize(self, DockerBackend._remove_all, self.client, self._all)

    @classmethod
    def check(cls) -> tuple[bool, str]:
        """Run `python3 -c 'print(1)'` in a container of the default image; say what worked or why not."""
        try:
            with cls(max_workers=1) as backend:
                result = backend.run(code="import sys; print(sys.version.split()[0])", timeout_s=30)
                warm = backend.run(code="print(1)", timeout_s=30)
                version = backend.client.version().get("Version", "?")
        except (SandboxError, OSError) as e:
            return False, str(e)
        if not result.ok:
            return (
                False,
                f"the test program failed in the container: exit {result.exit_code}: {result.stderr[-300:]}",
            )
        return True, (
            f"engine {version}; image {backend.image}; python {result.stdout.strip()}; "
            f"{warm.duration_s:.2f} s per run in a warm container"
        )

    # -- pool --------------------------------------------------------------------------
    def _start_container(self) -> Any:
        mem = f"{self.container_memory_mb}m"
        try:
            container = self.client.containers.run(
                self.image,
                ["python3", "-c", _IDLE],
                detach=True,
                network_mode="none",
                read_only=True,
                tmpfs={
                    "/work": f"size={self.workdir_bytes},mode=1777",
                    "/tmp": f"size={max(self.workdir_bytes // 4, 1 << 20)},mode=1777",
                },
                mem_limit=mem,
                memswap_limit=mem,
                pids_limit=self.pids_limit,
                cap_drop=["ALL"],
                cap_add=_CAPS,
                security_opt=["no-new-privileges"],
                user="0",
                working_dir="/work",
                labels={LABEL: "1"},
                hostname="sandbox",
            )
        except Exception as e:
            raise SandboxError(f"could not start a container of {self.image}: {e}") from e
        with self._pool_lock:
            self._all.add(container.id)
        return container

    def _acquire(self) -> Any:
        with self._pool_lock:
            if self._idle:
                return self._idle.pop()
        return self._start_container()

    def _release(self, container: Any) -> None:
        with self._pool_lock:
            self._idle.append(container)

    def _discard(self, container: Any) -> None:
        with self._pool_lock:
            self._all.discard(container.id)
        with contextlib.suppress(Exception):
            container.remove(force=True)

    def warm(self, n: int | None = None) -> None:
        """Start containers until `n` (default `max_workers`) are idle in the pool."""
        n = self.max_workers if n is None else n
        while len(self._idle) < n:
            self._release(self._start_container())

    @staticmethod
    def _remove_all(client: Any, ids: set[str]) -> None:
        for cid in list(ids):
            with contextlib.suppress(Exception):
                client.api.remove_container(cid, force=True)
        ids.clear()

    def close(self) -> None:
        """Remove every container this backend started."""
        with self._pool_lock:
            self._idle.clear()
        self._remove_all(self.client, self._all)

    # -- running -----------------------------------------------------------------------
    def execute(self, request: ExecRequest) -> ExecResult:
        """Run `request` in a warm container; see `SandboxBackend.run`.

        Raises:
            ValueError: when the request asks for network access (pooled containers have none).
            SandboxError: when the engine or the container fails (twice in a row).
        """
        if request.network:
            raise ValueError(
                "the docker backend runs without network; use sandbox='process' with network=True"
            )
        payload = json.dumps(
            {
                "files": {k: base64.b64encode(v).decode() for k, v in request.file_bytes().items()},
                "cmd": list(request.cmd),
                "stdin": base64.b64encode(request.stdin_bytes()).decode(),
                "limits": request.limits(),
                "report": request.report,
            }
        ).encode()
        last_error: Exception | None = None
        for _attempt in range(2):
            container = self._acquire()
            start = time.monotonic()
            try:
                result = self._exec(container, payload, request, start)
            except TimeoutError:
                self._discard(container)  # the launcher itself overran: kill everything in it
                return ExecResult(
                    -9, "", "", timed_out=True, duration_s=time.monotonic() - start, backend=self.name
                )
            except SandboxError as e:
                self._discard(container)
                last_error = e
                continue
            self._release(container)
            return result
        raise SandboxError(f"docker backend failed twice: {last_error}")

    def _exec(self, container: Any, payload: bytes, request: ExecRequest, start: float) -> ExecResult:
        api = self.client.api
        try:
            exec_id = api.exec_create(
                container.id, ["python3", "-I", "-c", LAUNCHER_SOURCE], stdin=True, user="0", workdir="/work"
            )["Id"]
            sock = api.exec_start(exec_id, socket=True)
        except Exception as e:
            raise SandboxError(f"exec in container {container.short_id} failed: {e}") from e
        raw = sock._sock if hasattr(sock, "_sock") else sock
        try:
            raw.sendall(payload)
            raw.shutdown(socket.SHUT_WR)
            out, err = _read_frames(sock, start + request.timeout_s + self.grace_s)
        finally:
            with contextlib.suppress(OSError):
                sock.close()
        try:
            data = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            info = api.exec_inspect(exec_id)
            if info.get("ExitCode") == 137:  # the cgroup OOM killer took the launcher with the command
                return ExecResult(-9, "", err.decode(errors="replace"), oom=True, backend=self.name)
            raise SandboxError(
                f"launcher gave no result (exit {info.get('ExitCode')}): "
                f"{err.decode(errors='replace')[-500:]}"
            ) from None
        return ExecResult(
            exit_code=int(data["exit_code"]),
            stdout=base64.b64decode(data["stdout"]).decode("utf-8", errors="replace"),
            stderr=base64.b64decode(data["stderr"]).decode("utf-8", errors="replace"),
            stdout_truncated=bool(data["stdout_truncated"]),
            stderr_truncated=bool(data["stderr_truncated"]),
            timed_out=bool(data["timed_out"]),
            oom=bool(data["oom"]),
            duration_s=float(data["duration_s"]),
            backend=self.name,
            report=base64.b64decode(data.get("report", "")).decode("utf-8", errors="replace"),
            report_truncated=bool(data.get("report_truncated", False)),
        )
