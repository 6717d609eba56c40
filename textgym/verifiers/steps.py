"""Reasoning steps of a completion: one step per non-empty line.

Process supervision scores a solution step by step (Lightman et al. 2023, "Let's Verify Step
by Step", arXiv:2305.20050; Uesato et al. 2022, arXiv:2211.14275). textgym's unit of a step
is a line: `split_steps` cuts a completion into its non-empty lines and gives each one's
character span. The span's end, `end`, is one past the step's last non-whitespace character,
so `text[:end]` is the completion up to and including the step; environments report these
ends as `info["step_ends"]` beside `info["step_rewards"]`, and the rollout places each step's
reward on the token that holds the character `text[end - 1]` (`step_token_indices`); a process
reward model reads its score for the step at that token too (`textgym.verifiers.prm`).
"""

from __future__ import annotations

from collections.abc import Callable
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


def step_token_indices(
    decode: Callable[[list[int]], str], token_ids: list[int], step_ends: list[int]
) -> list[int]:
    r"""Index (in `token_ids`) of the token that holds each step's last character.

    The text is `decode(token_ids)`, the action the environment received; step k ends at character
    offset `step_ends[k]` (exclusive, `split_steps`), so its last character
    is `text[step_ends[k] - 1]`. Token j covers the characters that `decode(token_ids[: j + 1])`
    agrees with `text` on; the step's reward goes on the first token that covers its last
    character. When a step ends inside a token (the token also carries text of the next step,
    e.g. one token for "6\n5"), that token gets the step's reward; several steps ending in one
    token all land on it. An offset outside `1..len(text)` is clamped to the text. Each end is
    found by bisection over prefixes (about log2(len(token_ids)) decodes per step).

    Args:
        decode: token ids -> text, as the agent decodes a response (`LLMAgent.decode`).
        token_ids: the turn's generated ids, without the end-of-turn token.
        step_ends: the steps' end offsets in the text, in characters.

    Returns:
        One token index per step end, each in `0..len(token_ids) - 1` ([] without tokens).

    Examples:
        >>> pieces = {1: "12", 2: "*3=", 3: "36\n", 4: "5+36", 5: "=41"}
        >>> decode = lambda ids: "".join(pieces[i] for i in ids)
        >>> decode([1, 2, 3, 4, 5])  # two steps, ending at offsets 7 and 15
        '12*3=36\n5+36=41'
        >>> step_token_indices(decode, [1, 2, 3, 4, 5], [7, 15])
        [2, 4]
    """
    if not token_ids:
        return []
    text = decode(token_ids)

    def covered(j: int) -> int:  # characters of `text` that tokens 0..j decode to
        prefix = decode(token_ids[: j + 1])
        n = min(len(prefix), len(text))
        k = 0
        while k < n and prefix[k] == text[k]:
            k += 1
        return k

    out = []
    for end in step_ends:
        end = min(max(int(end), 1), len(text))
        lo, hi = 0, len(token_ids) - 1  # the first j with covered(j) >= end (the last token covers all)
        while lo < hi:
            mid = (lo + hi) // 2
            if covered(mid) >= end:
                hi = mid
            else:
                lo = mid + 1
        out.append(lo)
    return out
