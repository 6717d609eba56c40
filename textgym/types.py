"""Plain data types shared by environments, verifiers and agents."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, str]
"""One chat message in OpenAI format: `{"role": ..., "content": ...}`."""


@dataclass(frozen=True)
class Task:
    """One problem an environment can pose.

    Attributes:
        task_id: stable identifier (dataset row id or generator index), e.g. "gsm8k/test/17".
        prompt: the problem text shown to the agent (without the env's instruction).
        answer: the gold final answer as a string ("72", "\\frac{14}{3}"), or "" when none.
        solution: a gold worked solution an SFT stage can imitate, or None.
        metadata: anything else the dataset carries (subject, level, ...).
    """

    task_id: str
    prompt: str
    answer: str = ""
    solution: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
