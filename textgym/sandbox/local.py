"""The `unsafe_local` backend: a plain subprocess with rlimits and NO isolation.

For development on a machine with neither bubblewrap nor Docker. The code runs as you,
sees your files and your network. It is never a default: it must be named explicitly,
and it warns each time one is created.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import warnings

from textgym.sandbox._launcher import REPORT_FD_ENV, apply_limits, communicate, looks_oom, report_pipe
from textgym.sandbox.base import ExecRequest, ExecResult, SandboxBackend


class UnsafeLocalBackend(SandboxBackend):
    """Run commands in a temporary directory as the current user, with rlimits only.

    Warns (`UserWarning`) on creation: this is not a sandbox.
    """

    name = "unsafe_local"

    def __init__(self, max_workers: int = 4):
        super().__init__(max_workers=max_workers)
        warnings.warn(
            "sandbox backend 'unsafe_local' runs untrusted code WITHOUT isolation (your uid, files and "
            "network); use it only for development, never on model output you do not trust",
            UserWarning,
            stacklevel=2,
        )

    @classmethod
    def check(cls) -> tuple[bool, str]:
        """Always 'not a sandbox'."""
        return False, "no isolation: development only"

    def execute(self, request: ExecRequest) -> ExecResult:
        """Run `request` in a temporary directory (rlimits, wall-clock kill of the process group)."""
        limits = request.limits()
        with tempfile.TemporaryDirectory(prefix="textgym-unsafe-") as work:
            for rel, data in request.file_bytes().items():
                path = os.path.join(work, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "wb") as f:
                    f.write(data)
            cmd = list(request.cmd)
            if cmd[0] in ("python", "python3"):
                cmd[0] = sys.executable
            report_r, report_w = report_pipe(request.report)
            env = None if report_w is None else {**os.environ, REPORT_FD_ENV: str(report_w)}
            start = time.monotonic()
            try:
                proc = subprocess.Popen(
                    cmd,
                    cwd=work,
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    pass_fds=() if report_w is None else (report_w,),
                    start_new_session=True,
                    preexec_fn=lambda: apply_limits(limits),
                )
            finally:
                if report_w is not None:
                    os.close(report_w)
            o = communicate(
                proc,
                request.stdin_bytes(),
                request.timeout_s,
                request.max_output_bytes,
                start,
                report_fd=report_r,
            )
        return ExecResult(
            exit_code=o.returncode,
            stdout=o.stdout.decode("utf-8", errors="replace"),
            stderr=o.stderr.decode("utf-8", errors="replace"),
            stdout_truncated=o.stdout_truncated,
            stderr_truncated=o.stderr_truncated,
            timed_out=o.timed_out,
            oom=looks_oom(o.stderr, o.returncode, o.timed_out),
            duration_s=o.duration_s,
            backend=self.name,
            report=o.report.decode("utf-8", errors="replace"),
            report_truncated=o.report_truncated,
        )
