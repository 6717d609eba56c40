"""Gymnasium spaces for text: any unicode string, and a list of chat messages.

`gymnasium.spaces.Text` only admits a finite charset (letters and digits by default),
which rejects prose and LaTeX, so textgym defines its own two spaces.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from textgym.types import Message

# Printable ASCII plus a few multi-byte characters, so sampled actions exercise unicode paths.
_SAMPLE_CHARSET = tuple(chr(c) for c in range(32, 127)) + tuple("\n\téü×√π∑→✓中文😀")


class UnicodeText(spaces.Space[str]):
    """A space of all unicode strings.

    `contains` accepts any `str`, of any length (environments score over-long
    actions instead of rejecting them). `sample` draws a random string of at most
    `max_sample_length` characters from a mixed ASCII/unicode charset using the
    space's own `np_random`.
    """

    def __init__(self, max_sample_length: int = 64, seed: int | np.random.Generator | None = None):
        self.max_sample_length = int(max_sample_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Strings have no fixed-size flat form."""
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Return a random string (masks are not supported and must be None)."""
        if mask is not None or probability is not None:
            raise ValueError("UnicodeText.sample does not support mask or probability")
        n = int(self.np_random.integers(0, self.max_sample_length + 1))
        idx = self.np_random.integers(0, len(_SAMPLE_CHARSET), size=n)
        return "".join(_SAMPLE_CHARSET[i] for i in idx)

    def contains(self, x: Any) -> bool:
        """Return True for any `str`."""
        return isinstance(x, str)

    def __repr__(self) -> str:
        return "UnicodeText()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, UnicodeText)


class ChatMessages(spaces.Space[list[Message]]):
    """A space of chat-message lists: `[{"role": r, "content": str}, ...]` with r in `roles`.

    An empty list is a member (the observation after a single-turn episode ends).
    """

    def __init__(
        self,
        roles: Sequence[str] = ("system", "user", "tool"),
        max_sample_messages: int = 2,
        seed: int | np.random.Generator | None = None,
    ):
        self.roles = tuple(roles)
        self.max_sample_messages = int(max_sample_messages)
        self._text = UnicodeText()
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        """Message lists have no fixed-size flat form."""
        return False

    def seed(self, seed: int | None = None) -> int:  # type: ignore[override]
        """Seed this space and its inner text space."""
        seeds: int = super().seed(seed)
        self._text.seed(int(self.np_random.integers(2**31)))
        return seeds

    def sample(self, mask: Any = None, probability: Any = None) -> list[Message]:
        """Return a random list of 1..max_sample_messages messages."""
        if mask is not None or probability is not None:
            raise ValueError("ChatMessages.sample does not support mask or probability")
        n = int(self.np_random.integers(1, self.max_sample_messages + 1))
        return [
            {
                "role": self.roles[int(self.np_random.integers(len(self.roles)))],
                "content": self._text.sample(),
            }
            for _ in range(n)
        ]

    def contains(self, x: Any) -> bool:
        """Return True when `x` is a list of `{"role", "content"}` dicts with allowed roles."""
        if not isinstance(x, list):
            return False
        for m in x:
            if not isinstance(m, dict) or not isinstance(m.get("content"), str):
                return False
            if m.get("role") not in self.roles:
                return False
        return True

    def __repr__(self) -> str:
        return f"ChatMessages(roles={self.roles})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatMessages) and other.roles == self.roles
