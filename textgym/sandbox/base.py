"""The sandbox contract: `ExecRequest` in, `ExecResult` out, a backend in between.

Every backend isolates by the operating system (namespaces, an unprivileged uid,
rlimits, containers), never by looking at the code. A request names files to put in
a fresh work dir (or `code`, stored as `main.py`), a command, stdin, and limits.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any, Self

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_MEMORY_MB = 512
DEFAULT_MAX_OUTPUT_BYTES = 64 * 1024
DEFAULT_MAX_PROCESSES = 64
DEFAULT_MAX_FILE_BYTES = 16 * 1024 * 1024
DEFAULT_MAX_OPEN_FILES = 256
DEFAULT_WORKDIR_BYTES = 64 * 1024 * 1024
DEFAULT_CMD = ("python3", "main.py")
DEFAULT_IMAGE = "textgym-sandbox:latest"
"""The Docker image tag `textgym sandbox build-image` writes and the Docker backend runs."""


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code inside it): a backend error, a broken engine."""


class SandboxUnavailableError(SandboxError):
    """A backend cannot run on this machine; the message says why and how to fix it."""


@dataclass(frozen=True)
class ExecResult:
    """What one sandboxed command did.

    Attributes:
        exit_code: the command's exit status; negative `-N` when it died of signal N
            (e.g. -9 after the wall-clock kill), as `subprocess` reports it.
        stdout: the first `max_output_bytes` bytes of standard output, decoded as UTF-8
            (invalid bytes replaced).
        stderr: the same for standard error.
        stdout_truncated: True when stdout was longer than the cap and was cut.
        stderr_truncated: True when stderr was cut.
        timed_out: True when the wall-clock limit killed the command's process tree.
        oom: True when the command died of its memory limit (address-space limit hit,
            or killed by the kernel/cgroup OOM killer).
        duration_s: wall-clock seconds from start to exit (the kill included).
        backend: name of the backend that ran it ("process", "docker", ...).
        report: what the command wrote to its private report channel (`ExecRequest.report`),
            its first `max_output_bytes` bytes decoded as UTF-8; "" when none was asked for.
        report_truncated: True when the report channel carried more than the cap.
    """

    exit_code: int
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    oom: bool = False
    duration_s: float = 0.0
    backend: str = ""
    report: str = ""
    report_truncated: bool = False

    @property
    def truncated(self) -> bool:
        """True when either stream was cut at the output cap."""
        return self.stdout_truncated or self.stderr_truncated

    @property
    def ok(self) -> bool:
        """True when the command exited 0 within its limits."""
        return self.exit_code == 0 and not self.timed_out and not self.oom


@dataclass(frozen=True)
class ExecRequest:
    """One command to run in a sandbox.

    Attributes:
        files: relative path -> content (str is written as UTF-8) placed in a fresh work dir.
        cmd: the argv; a leading "python"/"python3" means the backend's interpreter.
        stdin: bytes or text fed to the command's standard input, then closed.
        timeout_s: wall-clock limit (seconds); the whole process tree is killed at it.
            The CPU-time rlimit is `ceil(timeout_s) + 1` seconds.
        memory_mb: address-space limit of each process (MiB); 0 disables it.
        max_output_bytes: each of stdout and stderr is cut at this many bytes.
        max_processes: process-count rlimit (RLIMIT_NPROC) of the sandbox uid.
        max_file_bytes: largest file the command may write (RLIMIT_FSIZE, bytes).
        max_open_files: open file descriptors per process (RLIMIT_NOFILE).
        network: False (default) gives the command no network at all.
        report: give the command a private report channel: the write end of a pipe, at the
            descriptor named by the environment variable `TEXTGYM_REPORT_FD`, held by the
            command's own process and by no other process in the sandbox (not the sandbox's
            init, which holds the command's stdin, stdout and stderr; not the launcher, which
            runs as another uid). What comes through it is `ExecResult.report`. A command that
            runs untrusted code keeps the channel to itself: it closes the descriptor in every
            child it forks, and makes itself non-dumpable so no process of its uid can reach
            it through `/proc/<pid>/fd` (the code judge, `textgym.verifiers._code_harness`).
    """

    files: Mapping[str, str | bytes] = field(default_factory=dict)
    cmd: Sequence[str] = DEFAULT_CMD
    stdin: str | bytes = b""
    timeout_s: float = DEFAULT_TIMEOUT_S
    memory_mb: int = DEFAULT_MEMORY_MB
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    max_processes: int = DEFAULT_MAX_PROCESSES
    max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_open_files: int = DEFAULT_MAX_OPEN_FILES
    network: bool = False
    report: bool = False

    def __post_init__(self) -> None:
        if not self.cmd or not all(isinstance(a, str) for a in self.cmd):
            raise ValueError(f"cmd must be a non-empty list of strings, got {self.cmd!r}")
        if not (self.timeout_s > 0 and math.isfinite(self.timeout_s)):
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}")
        for name in ("memory_mb", "max_output_bytes", "max_processes", "max_file_bytes", "max_open_files"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        for rel in self.files:
            p = PurePosixPath(rel)
            if not rel or p.is_absolute() or ".." in p.parts:
                raise ValueError(f"file names must be relative paths inside the work dir, got {rel!r}")

    def file_bytes(self) -> dict[str, bytes]:
        """The files with str contents encoded as UTF-8."""
        return {k: v.encode() if isinstance(v, str) else bytes(v) for k, v in self.files.items()}

    def stdin_bytes(self) -> bytes:
        """Stdin encoded as UTF-8 when given as text."""
        return self.stdin.encode() if isinstance(self.stdin, str) else bytes(self.stdin)

    def limits(self) -> dict[str, Any]:
        """The limits as the plain dict `_launcher.apply_limits` takes."""
        return {
            "timeout_s": float(self.timeout_s),
            "cpu_s": math.ceil(self.timeout_s) + 1,
            "memory_bytes": self.memory_mb * 1024 * 1024,
            "max_processes": self.max_processes,
            "max_file_bytes": self.max_file_bytes,
            "max_open_files": self.max_open_files,
            "max_output_bytes": self.max_output_bytes,
        }


def make_request(
    files: Mapping[str, str | bytes] | None = None, code: str | None = None, **kwargs: Any
) -> ExecRequest:
    """Build an `ExecRequest` from `files` and/or `code` (stored as `main.py`).

    Raises:
        ValueError: when neither files nor code is given, or a field is out of range.
    """
    merged: dict[str, str | bytes] = dict(files or {})
    if code is not None:
        merged["main.py"] = code
    if not merged:
        raise ValueError("give the code to run: `code=` or `files=`")
    if kwargs.get("cmd") is None:
        kwargs.pop("cmd", None)
    if kwargs.get("stdin") is None:
        kwargs.pop("stdin", None)
    return ExecRequest(files=merged, **kwargs)


class SandboxBackend(ABC):
    """A way to run untrusted commands isolated by the operating system.

    Subclasses implement `execute(request)` and `check()`; `run` and `run_batch` are shared.
    Backends are thread-safe: `run_batch` calls `execute` from a bounded pool of threads.

    Args:
        max_workers: how many commands `run_batch` runs at once.
    """

    name = "base"

    def __init__(self, max_workers: int = 4):
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = int(max_workers)
        self._lock = threading.Lock()

    @classmethod
    @abstractmethod
    def check(cls) -> tuple[bool, str]:
        """Whether this backend works on this machine, with a one-line reason (never raises)."""

    @abstractmethod
    def execute(self, request: ExecRequest) -> ExecResult:
        """Run one request.

        Raises:
            SandboxError: when the sandbox itself fails (the code's own failures are results).
        """

    def run(
        self,
        files: Mapping[str, str | bytes] | None = None,
        code: str | None = None,
        *,
        cmd: Sequence[str] | None = None,
        stdin: str | bytes | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        memory_mb: int = DEFAULT_MEMORY_MB,
        max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
        network: bool = False,
        **limits: Any,
    ) -> ExecResult:
        """Run `cmd` (default `python3 main.py`) over `files` / `code` in a fresh work dir.

        Args:
            files: relative path -> content put in the work dir.
            code: shorthand for `files={"main.py": code}`.
            cmd: argv; defaults to `["python3", "main.py"]`.
            stdin: fed to the command, then closed.
            timeout_s: wall-clock limit in seconds (the process tree is killed at it).
            memory_mb: address-space limit (MiB).
            max_output_bytes: cap of each output stream (bytes).
            network: give the command network access (default: none at all).
            **limits: `max_processes`, `max_file_bytes`, `max_open_files` (see `ExecRequest`).

        Raises:
            ValueError: on a malformed request (no code, bad limits, absolute file paths).
            SandboxError: when the sandbox itself fails.
        """
        request = make_request(
            files,
            code,
            cmd=tuple(cmd) if cmd is not None else None,
            stdin=stdin,
            timeout_s=timeout_s,
            memory_mb=memory_mb,
            max_output_bytes=max_output_bytes,
            network=network,
            **limits,
        )
        return self.execute(request)

    def run_batch(self, requests: Sequence[ExecRequest]) -> list[ExecResult]:
        """Run many requests, at most `max_workers` at a time; results in request order.

        Raises:
            SandboxError: when the sandbox itself fails on any request.
        """
        if len(requests) <= 1 or self.max_workers == 1:
            return [self.execute(r) for r in requests]
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(requests))) as pool:
            return list(pool.map(self.execute, requests))

    def close(self) -> None:  # noqa: B027 (optional hook)
        """Release what the backend holds (containers, pools). Safe to call twice."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
