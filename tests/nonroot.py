"""Run sandbox code from a process that is not root, as most users run textgym.

CI runs as root, where the process backend starts bubblewrap as an unprivileged host uid of
its own (`drop_host_uid`). A user who is not root gets `drop_host_uid=False`: bubblewrap runs
as the user, and the sandbox's processes are that user's. The hostile-code tests run in that
setting too: `run_as_nobody` forks this process, drops it to uid 65534 and calls a function
there; `NobodyBackend` does that for every `execute` of a backend.
"""

from __future__ import annotations

import os
import pickle
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import pytest

from textgym.sandbox import ExecRequest, ExecResult, SandboxBackend
from textgym.sandbox.process import ProcessBackend

NOBODY = 65534
T = TypeVar("T")


def run_as_nobody(fn: Callable[..., T], *args: Any, groups: Sequence[int] = ()) -> T:
    """`fn(*args)` in a forked child of uid/gid 65534 (and supplementary `groups`); its result.

    When this process is not root it is already unprivileged: `fn` runs here. What `fn` needs
    must be imported before the call (the child may not read the interpreter's prefix).

    Raises:
        RuntimeError: when `fn` raised in the child (with its traceback) or the child died.
    """
    if os.geteuid() != 0:
        return fn(*args)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop, call, send the pickled outcome, exit without pytest's teardown
        try:
            os.close(r)
            os.setgroups(list(groups))
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            outcome: tuple[str, Any] = ("ok", fn(*args))
        except BaseException:
            outcome = ("error", traceback.format_exc())
        try:
            with os.fdopen(w, "wb") as f:
                f.write(pickle.dumps(outcome))
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r, "rb") as f:
        data = f.read()
    os.waitpid(pid, 0)
    if not data:
        raise RuntimeError("the uid-65534 child died without an answer")
    kind, value = pickle.loads(data)
    if kind != "ok":
        raise RuntimeError(f"in the uid-65534 child:\n{value}")
    return value


class NobodyBackend(SandboxBackend):
    """A backend whose every `execute` runs in a process of uid 65534 (`run_as_nobody`)."""

    def __init__(self, inner: SandboxBackend):
        super().__init__(max_workers=inner.max_workers)
        self.inner = inner
        self.name = inner.name

    @classmethod
    def check(cls) -> tuple[bool, str]:
        """Not a backend of its own."""
        return False, "a test wrapper"

    def execute(self, request: ExecRequest) -> ExecResult:
        """`inner.execute(request)` from a process of uid 65534."""
        return run_as_nobody(self.inner.execute, request)


def nobody_process_backend(**kwargs: Any) -> NobodyBackend:
    """The process backend as a user who is not root would have it (`drop_host_uid=False`).

    Skips the test when no interpreter that uid 65534 may run is there.
    """
    backend = ProcessBackend(drop_host_uid=False, **kwargs)
    if not os.access(backend.python, os.X_OK) or not _world_reachable(backend.python):
        pytest.skip(f"{backend.python} is not reachable by uid 65534")
    return NobodyBackend(backend)


def _world_reachable(path: str) -> bool:
    real = os.path.realpath(path)
    parts = real.split("/")
    for i in range(2, len(parts)):
        if not os.stat("/".join(parts[:i])).st_mode & 0o001:
            return False
    return bool(os.stat(real).st_mode & 0o005)
