"""Best-of-N: pick one of N sampled answers by a verifier's score, beside majority vote and pass@N.

With N samples of each task (`evaluate(..., samples=N)`), best-of-n for n ≤ N takes the first n
samples of every task and keeps the one a scorer ranks highest (a process reward model's
aggregate step score, `PRMVerifier`; ties go to the earlier sample); its accuracy is the share of
tasks whose kept answer is correct. The same n samples give majority vote (self-consistency,
Wang et al. 2022, arXiv:2203.11171: the most frequent extracted final answer, `extract_answer`,
compared as stripped strings, ties to the answer seen first; samples without an answer do not
vote) and pass@n (Chen et al. 2021's unbiased estimator over all N samples, `pass_at_k`), the
ceiling any picker can reach. Lightman et al. 2023 (arXiv:2305.20050, §3, Fig. 3) compare PRM,
ORM and majority voting this way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from textgym.evaluation.core import EvalResult, pass_at_k
from textgym.verifiers.extraction import extract_answer


def sample_counts(samples: int) -> list[int]:
    """The n reported for N samples: 1, 2, 4, … up to N, and N itself.

    Examples:
        >>> sample_counts(8), sample_counts(6), sample_counts(1)
        ([1, 2, 4, 8], [1, 2, 4, 6], [1])
    """
    ns, n = [], 1
    while n < samples:
        ns.append(n)
        n *= 2
    return [*ns, samples]


def majority_pick(texts: Sequence[str]) -> int | None:
    """Index of the first sample whose extracted answer is the most frequent one (None: no answer at all).

    Examples:
        >>> majority_pick([r"\\boxed{3}", r"\\boxed{4}", r"\\boxed{4}", "no idea"])
        1
        >>> majority_pick(["no idea"]) is None
        True
    """
    answers = [extract_answer(t) for t in texts]
    keys = [a.text.strip() if a is not None else None for a in answers]
    votes = Counter(k for k in keys if k is not None)
    if not votes:
        return None
    top = max(votes.values())
    return next(i for i, k in enumerate(keys) if k is not None and votes[k] == top)


def best_of_n(
    result: EvalResult, scores: Sequence[Sequence[float]], ns: Sequence[int] | None = None
) -> list[dict[str, Any]]:
    """Accuracy of best-of-n by `scores`, of majority vote and pass@n, for each n of `ns`.

    Args:
        result: an evaluation with N = `result.samples` samples per task (its `episodes` in
            task order, samples in order, each with `messages` and `correct`).
        scores: per task, the scorer's score of each of its N samples.
        ns: the n to report (default `sample_counts(N)`); each in 1..N.

    Returns:
        One row per n: `n`, `best_of_n` (the scorer's pick), `majority` (majority vote),
        `pass_at_n`, `mean` (mean accuracy of single samples, the same for every n).

    Raises:
        ValueError: if `scores` is not N per task, or an n is outside 1..N.
    """
    N = result.samples
    if len(scores) != result.n or any(len(s) != N for s in scores):
        raise ValueError(f"need {N} scores for each of {result.n} tasks")
    ns = sample_counts(N) if ns is None else list(ns)
    if any(not 1 <= n <= N for n in ns):
        raise ValueError(f"each n must be in 1..{N}, got {ns}")
    tasks = [result.episodes[i * N : (i + 1) * N] for i in range(result.n)]
    correct = [[int(e["correct"]) for e in eps] for eps in tasks]
    texts = [[_answer(e["messages"])[1] for e in eps] for eps in tasks]
    mean = sum(map(sum, correct)) / max(result.n * N, 1)
    rows = []
    for n in ns:
        picked = [_argmax(s[:n]) for s in scores]
        votes = [majority_pick(t[:n]) for t in texts]
        rows.append(
            {
                "n": n,
                "best_of_n": sum(c[j] for c, j in zip(correct, picked, strict=True)) / result.n,
                "majority": sum(c[j] for c, j in zip(correct, votes, strict=True) if j is not None)
                / result.n,
                "pass_at_n": sum(pass_at_k(N, sum(c), n) for c in correct) / result.n,
                "mean": mean,
            }
        )
    return rows


def prm_scores(result: EvalResult, prm: Any) -> list[list[float]]:
    """Each sample's aggregate step score under a `PRMVerifier` (its last answer, in its conversation).

    The steps are the answer's non-empty lines; the aggregate is the verifier's (`min`, `product`, `last`).
    """
    from textgym.verifiers.prm import aggregate_scores

    items = [(*_answer(e["messages"]), None) for e in result.episodes]
    steps = prm.score_steps(items)
    flat = [aggregate_scores(s, prm.aggregate) for s in steps]
    N = result.samples
    return [flat[i * N : (i + 1) * N] for i in range(result.n)]


def _answer(messages: list[dict[str, str]]) -> tuple[list[dict[str, str]], str]:
    """(the conversation before the last assistant message, that message's text); ([], "") without one."""
    for i in range(len(messages) - 1, -1, -1):
        if messages[i].get("role") == "assistant":
            return list(messages[:i]), str(messages[i].get("content", ""))
    return [], ""


def _argmax(values: Sequence[float]) -> int:
    """Index of the largest value; ties go to the earliest."""
    best = 0
    for j, v in enumerate(values):
        if v > values[best]:
            best = j
    return best
