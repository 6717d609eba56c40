"""Isolated code execution (bubblewrap and Docker backends) — not implemented yet.

The code environments and the unit-test verifier will run untrusted code here,
isolated by the operating system; see DESIGN.md ("Sandbox") for the contract.
"""

from __future__ import annotations


def run(*args: object, **kwargs: object) -> None:
    """Not available yet.

    Raises:
        NotImplementedError: always, until the sandbox backends land.
    """
    raise NotImplementedError(
        "textgym.sandbox is not implemented yet (process and docker backends are planned)"
    )
