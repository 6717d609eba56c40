"""The verifier contract and the weighted rubric that combines verifiers into a reward.

A verifier is any callable `(completion: str, task: Task) -> Score`: pure, deterministic,
and total (it returns a score for every string, it never raises on model output).
A `Rubric` sums weighted verifier rewards; a weight-0 term is computed and logged
but does not move the reward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from textgym.types import Task


@dataclass(frozen=True)
class Score:
    """A verifier's verdict.

    Attributes:
        reward: the score, a float (1.0 / 0.0 for binary verifiers).
        details: JSON-serialisable facts behind the score (extracted answer, error reason, ...).
    """

    reward: float
    details: dict[str, Any] = field(default_factory=dict)


@runtime_checkable
class Verifier(Protocol):
    """Anything that scores a completion for a task."""

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` (the agent's text) against `task`; never raises on bad text."""
        ...


@dataclass
class RubricTerm:
    """A named, weighted verifier inside a `Rubric`."""

    name: str
    verifier: Verifier
    weight: float = 1.0


class Rubric:
    r"""Weighted sum of verifier rewards: `reward = Σ_i weight_i · verifier_i(completion, task).reward`.

    The returned `Score.details` holds every term's raw reward under `"reward/<name>"`
    (weight-0 terms included, so they are logged as metrics) and each term's own
    details under `"<name>"`.

    Examples:
        >>> from textgym.types import Task
        >>> from textgym.verifiers import FormatVerifier, MathVerifier
        >>> rubric = Rubric(
        ...     [RubricTerm("correct", MathVerifier()), RubricTerm("format", FormatVerifier(), 0.0)]
        ... )
        >>> task = Task(task_id="t", prompt="Compute 3+4.", answer="7")
        >>> score = rubric("the answer is 7", task)
        >>> score.reward, score.details["reward/correct"], score.details["reward/format"]
        (1.0, 1.0, 0.0)
    """

    def __init__(self, terms: list[RubricTerm]):
        names = [t.name for t in terms]
        if len(set(names)) != len(names):
            raise ValueError(f"rubric term names must be unique, got {names}")
        self.terms = terms

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` with every term and return the weighted total."""
        total = 0.0
        details: dict[str, Any] = {}
        for term in self.terms:
            s = term.verifier(completion, task)
            details[f"reward/{term.name}"] = float(s.reward)
            details[term.name] = s.details
            total += term.weight * float(s.reward)
        return Score(reward=total, details=details)
