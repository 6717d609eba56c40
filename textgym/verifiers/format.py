"""Format verifier: does the completion state its final answer in a recognised marker?"""

from __future__ import annotations

from textgym.types import Task
from textgym.verifiers.base import Score
from textgym.verifiers.extraction import extract_answer

DEFAULT_MARKERS = ("boxed", "answer_tag")


class FormatVerifier:
    r"""Reward 1.0 when the completion carries a final-answer marker of an accepted kind, else 0.0.

    Marker kinds are those of `textgym.verifiers.extraction.extract_answer`: "boxed"
    (`\boxed{...}`), "answer_tag" (`<answer>...</answer>`), "hashes" (`#### N`),
    "answer_is" ("the answer is ..."). The marker must hold a non-empty answer.

    Examples:
        >>> from textgym.types import Task
        >>> task = Task(task_id="t", prompt="Compute 3+4.", answer="7")
        >>> FormatVerifier()(r"so \boxed{7}", task).reward, FormatVerifier()("the answer is 7", task).reward
        (1.0, 0.0)
        >>> FormatVerifier(markers=("answer_is",))("the answer is 7", task).reward
        1.0
    """

    def __init__(self, markers: tuple[str, ...] = DEFAULT_MARKERS):
        self.markers = tuple(markers)

    def __call__(self, completion: str, task: Task) -> Score:
        """Score the presence of a final-answer marker in `completion`."""
        if not isinstance(completion, str):
            return Score(0.0, {"marker": None})
        ext = extract_answer(completion)
        ok = ext is not None and ext.kind in self.markers and bool(ext.text)
        return Score(1.0 if ok else 0.0, {"marker": ext.kind if ext else None})
