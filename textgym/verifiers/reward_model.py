"""A verifier that scores completions with a trained reward model (`textgym rm train`).

The model is a one-label `AutoModelForSequenceClassification` whose score is read at the last
non-padding token of `prompt + response` (see `textgym.trainers.reward.bradley_terry` for how it is
trained). The padding and scoring helpers here are shared with the trainer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from textgym.types import Message, Task
from textgym.verifiers.base import Score


def pad_rows(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token rows into ids [n, T] and attention mask [n, T]."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def last_hidden_states(model: Any, rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states [n, T, H] of right-padded `rows` and their attention mask [n, T]."""
    device = next(model.parameters()).device
    ids, mask = pad_rows(rows, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    return model.model(input_ids=ids, attention_mask=mask).last_hidden_state, mask


def last_token_reward(model: Any, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The score head at each row's last real token: [n, T, H] -> [n]."""
    last = mask.sum(-1) - 1
    return model.score(hidden[torch.arange(len(hidden), device=hidden.device), last])[:, 0]


def score_sequences(model: Any, rows: list[list[int]], pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """Reward of each token sequence [n] (the head's output at its last real token).

    The last real token is found from the attention mask, so a pad id that also occurs
    inside a sequence does not confuse it. For an unsharded model (the verifier).
    """
    out = []
    for i in range(0, len(rows), batch_size):
        hidden, mask = last_hidden_states(model, rows[i : i + batch_size], pad_id)
        out.append(last_token_reward(model, hidden, mask))
    return torch.cat(out)


class RewardModelVerifier:
    """Scores completions with a trained reward model (a `Verifier`: total, never raises on text).

    Args:
        model_dir: a folder written by `train_reward_model` (sequence-classification model,
            tokenizer with the chat template).
        device: where the model runs.

    `__call__(completion, task)` renders `[user: task.prompt, assistant: completion]`;
    `score_messages(messages)` scores a whole conversation whose last message is the
    assistant's. The score is the model's scalar (unbounded; a log-odds scale).

    Raises:
        OSError: when the folder cannot be loaded.
    """

    def __init__(self, model_dir: str | Path, device: str = "cpu"):
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32)
        self.model.to(device).eval()  # type: ignore[arg-type]
        self.pad_id = int(self.model.config.pad_token_id or 0)

    def encode(self, messages: list[Message]) -> list[int]:
        """Token ids of a conversation ending with the assistant's turn (prompt + response + end-of-turn)."""
        prompt = self.tokenizer.apply_chat_template(
            messages[:-1], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        response = self.tokenizer(str(messages[-1]["content"]), add_special_tokens=False)["input_ids"]
        return list(prompt) + list(response) + [int(self.tokenizer.eos_token_id)]  # type: ignore[arg-type]

    @torch.no_grad()
    def score_messages(self, conversations: list[list[Message]]) -> list[float]:
        """Reward of each conversation (its last message is the scored assistant turn)."""
        rows = [self.encode(m) for m in conversations]
        return score_sequences(self.model, rows, self.pad_id).tolist()

    def __call__(self, completion: str, task: Task) -> Score:
        """Score `completion` as the answer to `task.prompt`."""
        (r,) = self.score_messages(
            [[{"role": "user", "content": task.prompt}, {"role": "assistant", "content": completion}]]
        )
        return Score(reward=float(r), details={"reward_model": float(r)})
