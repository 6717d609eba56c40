"""Code shared by the sandbox backends, standard library only.

The process backend imports `apply_limits` and `CappedReader` on the host. The docker
backend ships this file's source into its containers and runs `main()` there as root
(capabilities dropped to a few): it reads one JSON request on stdin, writes the files
into the tmpfs work dir, runs the command as the unprivileged uid with rlimits and a
wall-clock timeout, kills every process the command left behind, and prints one JSON
line with the result. The untrusted command never runs with the launcher's uid, so it
cannot signal, trace or impersonate it.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any, NamedTuple

REPORT_FD_ENV = "TEXTGYM_REPORT_FD"
"""Names the command's private report channel's descriptor (`ExecRequest.report`)."""
SANDBOX_UID = 65534
"""The unprivileged uid (and gid) the untrusted command runs as: `nobody`."""

MEMORY_ERROR_MARKERS = (b"MemoryError", b"Cannot allocate memory", b"std::bad_alloc", b"out of memory")
"""Text on stderr by which a process that hit its address-space limit is recognised as OOM."""


def apply_limits(limits: dict[str, Any]) -> None:
    """Set the calling process's rlimits (called between fork and exec; inherited by children).

    Keys: `cpu_s` (RLIMIT_CPU, seconds), `memory_bytes` (RLIMIT_AS, bytes; 0 = unlimited),
    `max_processes` (RLIMIT_NPROC), `max_file_bytes` (RLIMIT_FSIZE, bytes),
    `max_open_files` (RLIMIT_NOFILE). Core dumps are disabled.
    """
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    if limits.get("memory_bytes"):
        mem = int(limits["memory_bytes"])
        resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    if limits.get("max_processes"):
        n = int(limits["max_processes"])
        resource.setrlimit(resource.RLIMIT_NPROC, (n, n))
    fsize = int(limits["max_file_bytes"])
    resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
    nofile = int(limits["max_open_files"])
    resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))


class CappedReader(threading.Thread):
    """Drain a pipe in a thread, keeping its first `cap` bytes and counting the rest.

    Draining continues past the cap so the writer never blocks on a full pipe.
    After `join()`, `data` holds at most `cap` bytes and `truncated` says whether more came.
    """

    def __init__(self, stream: IO[bytes], cap: int):
        super().__init__(daemon=True)
        self.stream, self.cap = stream, int(cap)
        self.chunks: list[bytes] = []
        self.kept = 0
        self.truncated = False

    def run(self) -> None:
        """Read until EOF."""
        read = getattr(self.stream, "read1", self.stream.read)
        try:
            while True:
                chunk = read(65536)
                if not chunk:
                    break
                room = self.cap - self.kept
                if room > 0:
                    self.chunks.append(chunk[:room])
                    self.kept += min(room, len(chunk))
                if len(chunk) > max(room, 0):
                    self.truncated = True
        except (OSError, ValueError):
            pass

    @property
    def data(self) -> bytes:
        """The bytes kept (at most `cap`)."""
        return b"".join(self.chunks)


class Outcome(NamedTuple):
    """What `communicate` saw: exit status, capped outputs and their truncation flags, timing.

    `report` is what came through the private report channel (empty when there was none).
    """

    returncode: int
    stdout: bytes
    stderr: bytes
    stdout_truncated: bool
    stderr_truncated: bool
    timed_out: bool
    duration_s: float
    report: bytes = b""
    report_truncated: bool = False


def report_pipe(wanted: bool) -> tuple[int | None, int | None]:
    """`(read end, write end)` of a new private report channel, or `(None, None)` when not wanted.

    The write end is for the command only (pass it with `pass_fds`, name it in the command's
    environment under `TEXTGYM_REPORT_FD`, then close it here); `communicate` drains the read end.
    """
    if not wanted:
        return None, None
    return os.pipe()


def communicate(
    proc: subprocess.Popen[bytes],
    stdin: bytes,
    timeout_s: float,
    max_output_bytes: int,
    start: float,
    before_join: Callable[[], None] | None = None,
    report_fd: int | None = None,
) -> Outcome:
    """Feed `stdin`, drain stdout/stderr capped at `max_output_bytes` each, wait up to `timeout_s`.

    On timeout the process group of `proc` (a session leader) is SIGKILLed. `before_join` runs
    after the exit and before the output readers are joined (e.g. to kill leftovers that still
    hold the pipes). `start` is the `time.monotonic()` the run is timed from (seconds).
    `report_fd`, the read end of the private report channel (`report_pipe`), is drained
    (capped the same way) and closed.
    """
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out = CappedReader(proc.stdout, max_output_bytes)
    err = CappedReader(proc.stderr, max_output_bytes)
    out.start()
    err.start()
    rep = None
    if report_fd is not None:
        rep = CappedReader(os.fdopen(report_fd, "rb", buffering=0), max_output_bytes)
        rep.start()
    with contextlib.suppress(OSError):  # the command may exit without reading its input
        proc.stdin.write(stdin)
    with contextlib.suppress(OSError):
        proc.stdin.close()
    timed_out = False
    try:
        proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        with contextlib.suppress(OSError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    duration = time.monotonic() - start
    if before_join is not None:
        before_join()
    out.join(timeout=5)
    err.join(timeout=5)
    report, report_truncated = b"", False
    if rep is not None:
        rep.join(timeout=5)
        report, report_truncated = rep.data, rep.truncated
        with contextlib.suppress(OSError, ValueError):
            rep.stream.close()
    return Outcome(
        proc.returncode, out.data, err.data, out.truncated, err.truncated, timed_out, duration,
        report, report_truncated,
    )  # fmt: skip


def looks_oom(stderr: bytes, returncode: int | None, timed_out: bool) -> bool:
    """Whether a run died of its memory limit: an allocation failure on stderr, or SIGKILL not sent by us."""
    if timed_out:
        return False
    tail = stderr[-4096:]
    return returncode not in (0, None) and (
        any(m in tail for m in MEMORY_ERROR_MARKERS) or returncode == -signal.SIGKILL
    )


def _clean_dir(path: str) -> None:
    if not os.path.isdir(path):
        return
    for name in os.listdir(path):
        p = os.path.join(path, name)
        if os.path.isdir(p) and not os.path.islink(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)


def _drop_privileges_and_limit(limits: dict[str, Any]) -> None:
    os.setsid()
    os.setgroups([])
    os.setgid(SANDBOX_UID)
    os.setuid(SANDBOX_UID)
    apply_limits(limits)


SHARED_DIRS = ("/tmp", "/dev/shm", "/dev/mqueue")
"""Writable places of a pooled container besides the work dir; wiped before and after each run."""
_IPC_RMID = 0


def _remove_ipc_objects() -> None:
    """Remove the System V shared-memory segments, message queues and semaphore sets of this uid.

    They live in the container's IPC namespace, which outlives a run in a pooled container;
    called as the sandbox uid (the owner may remove them).
    """
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    removers = {
        "shm": lambda i: libc.shmctl(i, _IPC_RMID, None),
        "msg": lambda i: libc.msgctl(i, _IPC_RMID, None),
        "sem": lambda i: libc.semctl(i, 0, _IPC_RMID),
    }
    for kind, remove in removers.items():
        try:
            with open(f"/proc/sysvipc/{kind}") as f:
                rows = f.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 1 and fields[1].isdigit():
                remove(int(fields[1]))


def _kill_leftovers() -> None:
    """Kill every process of the sandbox uid (daemons, fork bombs) and remove its IPC objects."""
    for _ in range(3):
        try:
            pid = os.fork()
        except OSError:
            return
        if pid == 0:  # child: become the sandbox uid, then signal all of its processes
            try:
                os.setgid(SANDBOX_UID)
                os.setuid(SANDBOX_UID)
                os.kill(-1, signal.SIGKILL)
                _remove_ipc_objects()
            finally:
                os._exit(0)
        os.waitpid(pid, 0)


def main() -> None:
    """Container side of the docker backend: one request on stdin, one JSON result line on stdout."""
    request = json.loads(sys.stdin.buffer.read())
    workdir = request.get("workdir", "/work")
    for d in (workdir, *SHARED_DIRS):
        _clean_dir(d)
    for rel, b64 in request["files"].items():
        path = os.path.join(workdir, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(base64.b64decode(b64))
    for root, dirs, files in os.walk(workdir):
        for n in dirs + files:
            os.chown(os.path.join(root, n), SANDBOX_UID, SANDBOX_UID)
    limits = request["limits"]
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
    report_r, report_w = report_pipe(bool(request.get("report")))
    if report_w is not None:
        env[REPORT_FD_ENV] = str(report_w)
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            request["cmd"],
            cwd=workdir,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            pass_fds=() if report_w is None else (report_w,),
            preexec_fn=lambda: _drop_privileges_and_limit(limits),
        )
    finally:
        if report_w is not None:
            os.close(report_w)  # the command's alone: the launcher (another uid) keeps the read end
    stdin = base64.b64decode(request.get("stdin") or "")
    o = communicate(
        proc,
        stdin,
        float(limits["timeout_s"]),
        limits["max_output_bytes"],
        start,
        before_join=_kill_leftovers,
        report_fd=report_r,
    )
    result = {
        "exit_code": o.returncode,
        "stdout": base64.b64encode(o.stdout).decode(),
        "stderr": base64.b64encode(o.stderr).decode(),
        "stdout_truncated": o.stdout_truncated,
        "stderr_truncated": o.stderr_truncated,
        "timed_out": o.timed_out,
        "oom": looks_oom(o.stderr, o.returncode, o.timed_out),
        "duration_s": o.duration_s,
        "report": base64.b64encode(o.report).decode(),
        "report_truncated": o.report_truncated,
    }
    for d in (workdir, *SHARED_DIRS):
        _clean_dir(d)
    sys.stdout.write(json.dumps(result) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
