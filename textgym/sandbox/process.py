"""The `process` backend: each command in a fresh bubblewrap sandbox (the embedded default).

Isolation (all by the kernel; see bwrap(1)):
- every namespace unshared (`--unshare-all`: user, pid, net, ipc, uts, cgroup), so the
  command sees no host process, no network interface but loopback, its own hostname;
- the system (`/usr` and the interpreter's prefix) mounted read-only, `/etc` reduced to
  what the dynamic loader needs plus a two-line passwd; no home, no repository, no `/root`;
- a fresh tmpfs as the work dir (`/work`, size-capped) and another as `/tmp`;
- uid/gid 65534 (`nobody`) inside the sandbox with every capability dropped; when textgym
  runs as root, bubblewrap itself is started as host uid 65534, so the command is
  unprivileged on the host too (not only inside its user namespace);
- rlimits: CPU seconds, address space, processes, file size, open files, no core dumps;
- a wall-clock timeout that SIGKILLs bubblewrap's process group; `--die-with-parent`
  and the pid namespace then take the whole tree down (daemonised children included).

When bubblewrap is missing this backend refuses to start (`SandboxUnavailableError`);
it never falls back to running code unsandboxed.
"""

from __future__ import annotations

import os
import queue
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

from textgym.sandbox._launcher import (
    REPORT_FD_ENV,
    SANDBOX_UID,
    apply_limits,
    communicate,
    looks_oom,
    report_pipe,
)
from textgym.sandbox.base import (
    DEFAULT_WORKDIR_BYTES,
    ExecRequest,
    ExecResult,
    SandboxBackend,
    SandboxError,
    SandboxUnavailableError,
)

WORKDIR = "/work"
_INSTALL_HINT = (
    "install it with `apt-get install bubblewrap` (Debian/Ubuntu) or `dnf install bubblewrap`; "
    "or choose sandbox='docker'. textgym never runs untrusted code unsandboxed unless you "
    "explicitly pick the 'unsafe_local' backend"
)
_ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime", "/etc/alternatives", "/etc/nsswitch.conf")
_NET_ETC_FILES = ("/etc/resolv.conf", "/etc/hosts", "/etc/ssl", "/etc/ca-certificates")
HOST_UID_BASE = 0x70000000
"""Host uids of the sandboxes when textgym runs as root: one per worker slot (base + slot), so the
process-count rlimit and the right to signal are per sandbox, not shared by concurrent runs."""
_SETUP_RETRIES = 4
_PASSWD = (
    "root:x:0:0:root:/root:/usr/sbin/nologin\n"
    f"nobody:x:{SANDBOX_UID}:{SANDBOX_UID}:nobody:{WORKDIR}:/usr/sbin/nologin\n"
)
_GROUP = f"root:x:0:\nnogroup:x:{SANDBOX_UID}:\n"


def _others_can_reach(path: Path) -> bool:
    """True when every directory on the way to `path` is searchable, and the file readable, by others."""
    p = path.resolve()
    for parent in [*reversed(p.parents)]:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(p.stat().st_mode & stat.S_IROTH)


def default_python() -> str:
    """The interpreter that runs `python3` inside the sandbox.

    The system's `/usr/bin/python3` when there is one (it lives under the read-only `/usr`
    and any uid can run it), else the interpreter running textgym (its base prefix is
    mounted read-only too).
    """
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    base = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    return str(base if base.exists() else Path(sys.executable).resolve())


def _memfd(name: str, data: bytes) -> int:
    fd = os.memfd_create(name.replace("/", "_")[:200] or "file", 0)
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


class _TransientSetupError(SandboxError):
    """bubblewrap failed with EAGAIN (resources still held by a run being torn down)."""


class ProcessBackend(SandboxBackend):
    """Run each command in its own bubblewrap sandbox (see the module docstring for what is isolated).

    Args:
        python: the interpreter that a leading `python`/`python3` in `cmd` resolves to
            (default: `default_python()`); its prefix is mounted read-only when it is not under /usr.
        max_workers: how many sandboxes `run_batch` runs at once.
        workdir_bytes: size cap of the tmpfs work dir (bytes); `/tmp` gets a quarter of it.
        drop_host_uid: start bubblewrap as an unprivileged host uid, one per concurrent run
            (`HOST_UID_BASE + slot`; default: when running as root and the interpreter is readable
            by any user). Inside the sandbox the uid is always 65534.

    Raises:
        SandboxUnavailableError: when `bwrap` is not installed (the message says how to install it)
            or the interpreter is missing.
    """

    name = "process"

    def __init__(
        self,
        python: str | None = None,
        max_workers: int = 4,
        workdir_bytes: int = DEFAULT_WORKDIR_BYTES,
        drop_host_uid: bool | None = None,
    ):
        super().__init__(max_workers=max_workers)
        bwrap = shutil.which("bwrap")
        if bwrap is None:
            raise SandboxUnavailableError(f"the 'process' sandbox needs bubblewrap (bwrap): {_INSTALL_HINT}")
        self.bwrap = bwrap
        self.python = python or default_python()
        if not os.access(self.python, os.X_OK):
            raise SandboxUnavailableError(f"sandbox interpreter {self.python!r} is not an executable file")
        self.workdir_bytes = int(workdir_bytes)
        if drop_host_uid is None:
            drop_host_uid = os.geteuid() == 0 and _others_can_reach(Path(self.python))
        self.drop_host_uid = bool(drop_host_uid)
        self._mounts = self._system_mounts()
        self._slots: queue.SimpleQueue[int] = queue.SimpleQueue()
        self._next_slot = 0

    # -- setup -------------------------------------------------------------------------
    def _system_mounts(self) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
            if os.path.islink(top):
                args += ["--symlink", os.readlink(top), top]
            elif os.path.isdir(top):
                args += ["--ro-bind", top, top]
        for path in _ETC_FILES:
            args += ["--ro-bind-try", path, path]
        prefix = Path(self.python).resolve().parent.parent
        if not str(prefix).startswith("/usr"):
            args += ["--ro-bind", str(prefix), str(prefix)]
        return args

    @classmethod
    def check(cls) -> tuple[bool, str]:
        """Start one sandbox and run `python3 -c 'print(1)'` in it; say what worked or why not."""
        try:
            backend = cls()
            result = backend.run(code="import sys; print(sys.version.split()[0])", timeout_s=20)
        except (SandboxError, OSError) as e:
            return False, str(e)
        if not result.ok:
            return (
                False,
                f"bwrap ran but the test program failed: exit {result.exit_code}: {result.stderr[-300:]}",
            )
        version = subprocess.run([backend.bwrap, "--version"], capture_output=True, text=True).stdout.strip()
        uid = f"{HOST_UID_BASE}+slot" if backend.drop_host_uid else str(os.geteuid())
        return True, (
            f"{version}; python {result.stdout.strip()} ({backend.python}); host uid {uid}; "
            f"{result.duration_s:.2f} s per run"
        )

    # -- running -----------------------------------------------------------------------
    def _argv(self, request: ExecRequest, fds: list[int], report_w: int | None = None) -> list[str]:
        argv = [self.bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--hostname", "sandbox"]
        if request.network:
            argv += ["--share-net"]
            for path in _NET_ETC_FILES:
                argv += ["--ro-bind-try", path, path]
        argv += self._mounts
        argv += ["--proc", "/proc", "--dev", "/dev"]
        argv += ["--size", str(max(self.workdir_bytes // 4, 1 << 20)), "--tmpfs", "/tmp"]
        argv += ["--size", str(self.workdir_bytes), "--tmpfs", WORKDIR]
        for path, content in (("/etc/passwd", _PASSWD), ("/etc/group", _GROUP)):
            fd = _memfd(path, content.encode())
            fds.append(fd)
            argv += ["--ro-bind-data", str(fd), path]
        dirs: set[str] = set()
        for rel in request.files:
            parent = os.path.dirname(rel)
            while parent and parent not in dirs:
                dirs.add(parent)
                parent = os.path.dirname(parent)
        for d in sorted(dirs):
            argv += ["--dir", f"{WORKDIR}/{d}"]
        for rel, data in request.file_bytes().items():
            fd = _memfd(rel, data)
            fds.append(fd)
            argv += ["--file", str(fd), f"{WORKDIR}/{rel}"]
        argv += [
            "--chdir",
            WORKDIR,
            "--uid",
            str(SANDBOX_UID),
            "--gid",
            str(SANDBOX_UID),
            "--cap-drop",
            "ALL",
        ]
        argv += ["--clearenv", "--setenv", "PATH", "/usr/local/bin:/usr/bin:/bin"]
        argv += ["--setenv", "HOME", WORKDIR, "--setenv", "LANG", "C.UTF-8", "--setenv", "TMPDIR", "/tmp"]
        if report_w is not None:  # bubblewrap's init closes it; only the command holds it
            argv += ["--setenv", REPORT_FD_ENV, str(report_w)]
        cmd = list(request.cmd)
        if cmd[0] in ("python", "python3"):
            cmd[0] = self.python
        return [*argv, "--", *cmd]

    def _acquire_slot(self) -> int:
        try:
            return self._slots.get_nowait()
        except queue.Empty:
            with self._lock:
                self._next_slot += 1
                return self._next_slot - 1

    def execute(self, request: ExecRequest) -> ExecResult:
        """Run `request` in a fresh sandbox; see `SandboxBackend.run`.

        A setup failure for lack of resources (EAGAIN while processes of a previous run in
        the same slot are still being torn down) is retried with backoff.

        Raises:
            SandboxError: when bubblewrap cannot be started or fails to set up the sandbox.
        """
        slot = self._acquire_slot()
        try:
            for attempt in range(_SETUP_RETRIES):
                try:
                    return self._execute(request, HOST_UID_BASE + slot)
                except _TransientSetupError as e:
                    if attempt == _SETUP_RETRIES - 1:
                        raise SandboxError(str(e)) from None
                    time.sleep(0.05 * 4**attempt)
        finally:
            self._slots.put(slot)
        raise AssertionError("unreachable")

    def _execute(self, request: ExecRequest, host_uid: int) -> ExecResult:
        fds: list[int] = []
        limits = request.limits()
        info_r, info_w = os.pipe()  # bwrap writes {"child-pid": N} here once the sandbox is set up
        report_r, report_w = report_pipe(request.report)
        try:
            fds.append(info_w)
            if report_w is not None:
                fds.append(report_w)
            argv = self._argv(request, fds, report_w)
            argv[1:1] = ["--info-fd", str(info_w)]
            drop = self.drop_host_uid
            start = time.monotonic()
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=fds,
                start_new_session=True,
                preexec_fn=lambda: apply_limits(limits),
                user=host_uid if drop else None,
                group=host_uid if drop else None,
                extra_groups=[] if drop else None,
            )
        except OSError as e:
            os.close(info_r)
            if report_r is not None:
                os.close(report_r)
            raise SandboxError(f"could not start bubblewrap ({self.bwrap}): {e}") from e
        finally:
            for fd in fds:
                os.close(fd)
        o = communicate(
            proc,
            request.stdin_bytes(),
            request.timeout_s,
            request.max_output_bytes,
            start,
            report_fd=report_r,
        )
        timed_out = o.timed_out
        os.set_blocking(info_r, False)
        try:
            info = os.read(info_r, 4096)
        except BlockingIOError:
            info = b""
        finally:
            os.close(info_r)
        if b"child-pid" not in info and not timed_out:
            first = o.stderr.decode(errors="replace").strip().splitlines()[:1]
            if first and "temporarily unavailable" in first[0]:
                raise _TransientSetupError(f"bubblewrap could not set up the sandbox: {first[0]}")
            raise SandboxError(
                f"bubblewrap could not set up the sandbox: {first[0] if first else proc.returncode}"
            )
        code = o.returncode
        if code > 128 and not timed_out and code - 128 in set(signal.Signals):
            code = -(code - 128)  # bwrap reports a child killed by signal N as 128 + N
        return ExecResult(
            exit_code=code,
            stdout=o.stdout.decode("utf-8", errors="replace"),
            stderr=o.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=o.stdout_truncated,
            stderr_truncated=o.stderr_truncated,
            timed_out=timed_out,
            oom=looks_oom(o.stderr, code, timed_out),
            duration_s=o.duration_s,
            backend=self.name,
            report=o.report.decode("utf-8", errors="replace"),
            report_truncated=o.report_truncated,
        )
