"""`python`: runs a snippet in the sandbox and returns its stdout, stderr and whether they were cut."""

from __future__ import annotations

from textgym.sandbox import SandboxBackend, get_backend
from textgym.tools.base import Tool


def python_tool(
    sandbox: str | SandboxBackend = "process", timeout_s: float = 5.0, memory_mb: int = 512
) -> Tool:
    """The `python` tool: `code` runs as `python3 main.py` in a fresh sandbox (no network).

    The result text holds stdout, then stderr under a marker, the exit code when it is not 0,
    and "[timed out]" / "[output truncated]" flags.

    Raises:
        SandboxUnavailableError: when the backend cannot run here (at creation, not per call).
    """
    backend = get_backend(sandbox)

    def run(code: str) -> str:
        r = backend.run(code=code, timeout_s=timeout_s, memory_mb=memory_mb, max_output_bytes=8192)
        parts = [r.stdout]
        if r.stderr:
            parts.append("[stderr]\n" + r.stderr)
        if r.timed_out:
            parts.append(f"[timed out after {timeout_s:g} s]")
        elif r.exit_code != 0:
            parts.append(f"[exit code {r.exit_code}]")
        if r.truncated:
            parts.append("[output truncated]")
        text = "\n".join(p for p in parts if p)
        return text if text.strip() else "[no output; use print() to see values]"

    return Tool(
        name="python",
        description="Run Python 3 code in a sandbox (no network, no files kept) and return what it prints.",
        parameters={
            "type": "object",
            "properties": {"code": {"type": "string", "description": "The program; print() what you need."}},
            "required": ["code"],
            "additionalProperties": False,
        },
        fn=run,
    )
