"""A process reward model (PRM) as a verifier: a score per step of a completion, and one for the whole.

The model is a one-label `AutoModelForTokenClassification` (the policy's body with a scalar
head per token) trained by `textgym prm train` (`textgym.trainers.reward.prm`). A completion's steps are
its non-empty lines (`textgym.verifiers.steps.split_steps`, or an env's `info["step_ends"]`);
the PRM's score for step k is `σ(head(h_t))` at the token t that holds the step's last character
(`step_token_indices`, the rule the rollout places step rewards by), read from one forward pass
of `chat_template(prompt) + response`: the probability that the solution is still on a path to
the correct answer after step k (Math-Shepherd, Wang et al. 2023, arXiv:2312.08935).

One score for the whole completion aggregates the step scores (`aggregate_scores`): "min" (the
weakest step, as Math-Shepherd ranks best-of-N), "product" (the probability that every step is
right, Lightman et al. 2023, arXiv:2305.20050, §4.1), or "last" (the score after the final
step). A completion without a step scores 0.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForTokenClassification, AutoTokenizer, PreTrainedTokenizerBase

from textgym.types import Message, Task
from textgym.verifiers.base import Score
from textgym.verifiers.reward_model import pad_rows
from textgym.verifiers.steps import split_steps, step_token_indices

AGGREGATES = ("min", "product", "last")


def aggregate_scores(scores: Sequence[float], how: str = "min") -> float:
    """One score from a completion's step scores: their minimum, product, or the last one (0.0 for none).

    Raises:
        ValueError: on an unknown `how`.

    Examples:
        >>> [aggregate_scores([0.9, 0.5, 0.8], how) for how in ("min", "product", "last")]
        [0.5, 0.36000000000000004, 0.8]
        >>> aggregate_scores([], "min")
        0.0
    """
    if how not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {AGGREGATES}, got {how!r}")
    if not scores:
        return 0.0
    if how == "min":
        return float(min(scores))
    if how == "product":
        return float(math.prod(scores))
    return float(scores[-1])


def encode_steps(
    tokenizer: PreTrainedTokenizerBase,
    messages: list[Message],
    response: str,
    step_ends: Sequence[int] | None = None,
) -> tuple[list[int], list[int]]:
    """The PRM's input for one answer and the positions its step scores are read at.

    Args:
        tokenizer: the PRM's tokenizer (with the chat template).
        messages: the conversation before the response (rendered with the generation prompt).
        response: the answer's text (tokenized as is, after the prompt).
        step_ends: each step's end offset in `response`; default: its non-empty lines.

    Returns:
        (token ids of prompt + response, the index in them of the token holding each step's last
        character; one per step, in order).
    """
    prompt = tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    ids = list(tokenizer(response, add_special_tokens=False)["input_ids"])
    ends = [s.end for s in split_steps(response)] if step_ends is None else list(step_ends)

    def decode(t: list[int]) -> str:
        return str(tokenizer.decode(t, skip_special_tokens=False))

    positions = step_token_indices(decode, ids, ends) if ends and ids else []
    offset = len(prompt)  # type: ignore[arg-type]
    return list(prompt) + ids, [offset + j for j in positions]  # type: ignore[arg-type]


def step_logits(model: Any, rows: list[list[int]], positions: list[list[int]], pad_id: int) -> torch.Tensor:
    """The head's logits at each row's step positions, concatenated: [Σ_i len(positions[i])] (fp32).

    Args:
        model: a one-label token-classification model.
        rows: token rows (right-padded here).
        positions: per row, the indices of its step tokens.
        pad_id: the padding id.
    """
    device = next(model.parameters()).device
    ids, mask = pad_rows(rows, pad_id)
    logits = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits[..., 0].float()
    r = torch.tensor([i for i, p in enumerate(positions) for _ in p], dtype=torch.long, device=device)
    c = torch.tensor([j for p in positions for j in p], dtype=torch.long, device=device)
    return logits[r, c]


class PRMVerifier:
    """Scores a completion step by step with a trained PRM (a `Verifier`: total, never raises on text).

    Args:
        model_dir: a folder written by `textgym prm train` (token-classification model and
            tokenizer with the chat template; its `textgym.json` names the default aggregate).
        device: where the model runs.
        aggregate: "min", "product" or "last" (`aggregate_scores`); None: the folder's default
            (else "min").
        batch_size: answers per forward pass.

    `__call__(completion, task)` renders `[user: task.prompt]` before the completion; its
    `Score.reward` is the aggregate, with `details` `step_scores` (one probability per step) and
    `step_ends`. `score_steps` scores answers to whole conversations (what the env wrapper and
    best-of-N use, with the env's exact prompt).

    Raises:
        OSError: when the folder cannot be loaded.
        ValueError: on an unknown aggregate.
    """

    def __init__(
        self, model_dir: str | Path, device: str = "cpu", aggregate: str | None = None, batch_size: int = 64
    ):
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForTokenClassification.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(device).eval()  # type: ignore[arg-type]
        meta = Path(model_dir) / "textgym.json"
        saved = json.loads(meta.read_text(encoding="utf-8")).get("aggregate") if meta.is_file() else None
        self.aggregate = aggregate or saved or "min"
        aggregate_scores([], self.aggregate)  # validates the name
        tok = self.tokenizer
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)  # type: ignore[arg-type]
        self.batch_size = batch_size

    @torch.no_grad()
    def score_steps(
        self, items: Sequence[tuple[list[Message], str, Sequence[int] | None]]
    ) -> list[list[float]]:
        """Each answer's step scores: `items` are (conversation before it, answer, step ends or None).

        Returns:
            Per answer, σ(logit) at each step's last token, in step order ([] without a step).
        """
        out: list[list[float]] = []
        for i in range(0, len(items), self.batch_size):
            encoded = [encode_steps(self.tokenizer, m, r, e) for m, r, e in items[i : i + self.batch_size]]
            rows, positions = [e[0] for e in encoded], [e[1] for e in encoded]
            probs = torch.sigmoid(step_logits(self.model, rows, positions, self.pad_id)).tolist()
            for p in positions:
                out.append(probs[: len(p)])
                probs = probs[len(p) :]
        return out

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` as the answer to `task.prompt`: the aggregate of its step scores."""
        ends = [s.end for s in split_steps(completion)]
        (scores,) = self.score_steps([([{"role": "user", "content": task.prompt}], completion, ends)])
        agg = aggregate_scores(scores, self.aggregate)
        return Score(reward=agg, details={"step_scores": scores, "step_ends": ends})
