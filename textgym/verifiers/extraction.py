"""Final-answer extraction: the marker a response's final answer is read from.

`extract_answer` looks for an explicit final-answer marker, in this priority:

1. `\\boxed{...}` (also `\\fbox{...}`) — the **last** one wins, braces matched;
2. `<answer>...</answer>` — the last one;
3. `#### N` (GSM8K style) — the last one, to the end of its line;
4. "the (final) answer is ..." — the last one, to the end of its sentence.

The answer rule (`textgym.verifiers.answer_rule`) and the math, format and digit-match
verifiers (`textgym.verifiers.math`, `textgym.verifiers.format`) read answers through it. The
completion is read after `textgym.verifiers.answer_text.normalize_unicode` (a minus sign written
U+2212, fullwidth or Arabic-Indic digits are `-` and ASCII digits).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from textgym.verifiers.answer_text import normalize_unicode

MAX_SCAN_CHARS = 200_000
"""Completions longer than this (characters) are cut to their last MAX_SCAN_CHARS before extraction."""
MAX_ANSWER_CHARS = 1_000
"""Extracted answers longer than this are not compared (no real final answer is that long)."""

_BOX_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_SAYS = ("the final answer is", "the answer is")
_MAX_BOX_STARTS = 20
"""At most this many of the last `\\boxed{` openings are tried when the last ones are unbalanced."""


@dataclass(frozen=True)
class Extracted:
    """An extracted final answer: its text and the marker it came from ("boxed", "answer_tag", ...)."""

    text: str
    kind: str


def _balanced_from(text: str, start: int) -> int | None:
    """The index of the `}` closing the brace opened just before `start`, or None.

    At most `4 * MAX_ANSWER_CHARS` characters are scanned; None when it is not closed within them.
    """
    depth = 1
    for j in range(start, min(len(text), start + 4 * MAX_ANSWER_CHARS)):
        c = text[j]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return j
    return None


def _last_boxed(text: str) -> str | None:
    """Return the content of the last balanced `\\boxed{...}`, or None.

    Each opening is scanned for at most `4 * MAX_ANSWER_CHARS` characters, and only the
    last `_MAX_BOX_STARTS` openings are tried, so the cost is bounded on any input.
    """
    starts = [m.end() for m in _BOX_RE.finditer(text)][-_MAX_BOX_STARTS:]
    for start in reversed(starts):
        end = _balanced_from(text, start)
        if end is not None:
            return text[start:end]
    return None


def boxed_spans(text: str) -> list[tuple[str, int, int]]:
    r"""Every balanced `\boxed{...}` of `text` (of its last `_MAX_BOX_STARTS` openings) with where it stands.

    Returns `(content, start, end)` triples in order: `start` is the offset of the backslash,
    `end` the offset just past the closing brace. Braces nest, so `\boxed{\text{Paris}}` holds
    `\text{Paris}`. The answer readers of the game and web envs take their guesses from it
    (`textgym.envs.wordle`, `.guess_number`, `.web.envs`). Bounded like `_last_boxed`.

    Examples:
        >>> boxed_spans(r"so \boxed{\text{Paris}}.")
        [('\\text{Paris}', 3, 23)]
    """
    out = []
    for m in list(_BOX_RE.finditer(text))[-_MAX_BOX_STARTS:]:
        end = _balanced_from(text, m.end())
        if end is not None:
            out.append((text[m.end() : end], m.start(), end + 1))
    return out


def all_boxed(text: str) -> list[tuple[str, int]]:
    """Every balanced `\\boxed{...}` of `text` (of its last `_MAX_BOX_STARTS` openings), in order.

    Returns `(content, end)` pairs, `end` being the offset just past the closing brace. A box
    nested in another is listed too. Bounded like `_last_boxed`.

    Examples:
        >>> [c for c, _ in all_boxed(r"\\boxed{147} or \\boxed{148}")]
        ['147', '148']
    """
    return [(content, end) for content, _, end in boxed_spans(text)]


def _last_tagged(text: str, lower: str) -> str | None:
    """Return the content of the last `<answer>...</answer>` (case-insensitive), or None."""
    end = lower.rfind("</answer>")
    if end < 0:
        return None
    start = lower.rfind("<answer>", 0, end)
    return None if start < 0 else text[start + len("<answer>") : end]


def _last_hashes(text: str) -> str | None:
    """Return the rest of the line after the last `####`, or None."""
    i = text.rfind("####")
    if i < 0:
        return None
    line_end = text.find("\n", i)
    return text[i + 4 : line_end if line_end >= 0 else len(text)]


def _last_answer_is(text: str, lower: str) -> str | None:
    """Return the sentence after the last "the (final) answer is", or None."""
    best = max(((lower.rfind(p), p) for p in _SAYS), default=(-1, ""))
    if best[0] < 0:
        return None
    rest = text[best[0] + len(best[1]) :].lstrip(" :\t")
    stop = len(rest)
    for sep in ("\n", ". "):
        k = rest.find(sep)
        if k >= 0:
            stop = min(stop, k)
    return rest[:stop].rstrip(" .")


def extract_answer(completion: str) -> Extracted | None:
    r"""Extract the final answer from model output by the marker priority in the module docstring.

    Runs in time linear in `len(completion)` (capped at `MAX_SCAN_CHARS`). The text is read
    after `normalize_unicode`, so the answer returned is in ASCII look-alikes (`−5` is `-5`).

    Args:
        completion: the model's text; any string (NUL bytes and huge inputs included).

    Returns:
        The extracted answer (stripped) and its marker kind, or None when no marker is present.

    Examples:
        >>> extract_answer(r"first \boxed{1}, then \boxed{2}")
        Extracted(text='2', kind='boxed')
        >>> extract_answer("<answer> 42 </answer>")
        Extracted(text='42', kind='answer_tag')
        >>> extract_answer("So the answer is 7. Done.")
        Extracted(text='7', kind='answer_is')
        >>> extract_answer("no marker here") is None
        True
        >>> extract_answer("The answer is \u2212148.")
        Extracted(text='-148', kind='answer_is')
    """
    text = normalize_unicode(completion[-MAX_SCAN_CHARS:])
    boxed = _last_boxed(text)
    if boxed is not None:
        return Extracted(boxed.strip(), "boxed")
    lower = text.lower()
    for kind, found in (
        ("answer_tag", _last_tagged(text, lower)),
        ("hashes", _last_hashes(text)),
        ("answer_is", _last_answer_is(text, lower)),
    ):
        if found is not None:
            return Extracted(found.strip(), kind)
    return None
