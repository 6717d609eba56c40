"""Reasoning steps of a completion: one step per non-empty line.

Process supervision scores a solution step by step (Lightman et al. 2023, "Let's Verify Step
by Step", arXiv:2305.20050; Uesato et al. 2022, arXiv:2211.14275). textgym's unit of a step
is a line: `split_steps` cuts a completion into its non-empty lines and gives each one's
character span. The span's end, `end`, is one past the step's last non-whitespace character,
so `text[:end]` is the completion up to and including the step; environments report these
ends as `info["step_ends"]` beside `info["step_rewards"]`, and the rollout places each step's
reward on the token that holds the character `text[end - 1]`
(`textgym.agents.rollout.step_token_indices`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepSpan:
    """One step of a completion: `text[start:end]` is the step without surrounding whitespace.

    Attributes:
        start: offset of the step's first non-whitespace character.
        end: one past its last non-whitespace character (exclusive end).
    """

    start: int
    end: int


def split_steps(text: str) -> list[StepSpan]:
    r"""The non-empty lines of `text` as character spans, in order (whitespace-only lines are skipped).

    Lines are separated by `\n` (a `\r` before it is whitespace). Offsets index `text` itself.

    Examples:
        >>> text = "12*3=36\n\n 5+36=41 \n\\boxed{41}"
        >>> [(s.start, s.end) for s in split_steps(text)]
        [(0, 7), (10, 17), (19, 29)]
        >>> [text[s.start : s.end] for s in split_steps(text)]
        ['12*3=36', '5+36=41', '\\boxed{41}']
        >>> split_steps("  \n")
        []
    """
    spans: list[StepSpan] = []
    pos = 0
    for line in text.split("\n"):
        stripped = line.strip()
        if stripped:
            start = pos + (len(line) - len(line.lstrip()))
            spans.append(StepSpan(start, start + len(stripped)))
        pos += len(line) + 1
    return spans
