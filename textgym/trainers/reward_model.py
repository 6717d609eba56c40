"""A Bradley–Terry reward model trained on preference pairs, and the verifier that scores with it.

The model is `AutoModelForSequenceClassification` with one label, initialised from a causal
LM folder (the policy's backbone; the scalar head is new), scoring the last non-padding
token of `prompt + response`. The loss on a pair is `−log σ(r(x, y_w) − r(x, y_l))`
(Bradley & Terry 1952; Ouyang et al. 2022, arXiv:2203.02155, eq. 1), averaged over pairs.
A held-out share of the prompts measures pairwise accuracy (the share of held-out pairs
with r(y_w) > r(y_l)).

`RewardModelVerifier` scores completions with a trained model; `RewardModelWrapper` puts it
into any single- or multi-turn env, so PPO trains against the learned reward while the
env's own verifier terms (`reward/correct`, ...) stay in `info` as the true measure.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import pyarrow as pa
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from textgym.config import RewardModelConfig
from textgym.trainers.common import build_optimizer
from textgym.types import Message, Task
from textgym.verifiers.base import Score


def _pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad token rows into ids [n, T] and attention mask [n, T]."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids, mask


def _hidden(model: Any, rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Last hidden states [n, T, H] of right-padded `rows` and their attention mask [n, T]."""
    device = next(model.parameters()).device
    ids, mask = _pad(rows, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    return model.model(input_ids=ids, attention_mask=mask).last_hidden_state, mask


def _last_token_reward(model: Any, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The score head at each row's last real token: [n, T, H] -> [n]."""
    last = mask.sum(-1) - 1
    return model.score(hidden[torch.arange(len(hidden), device=hidden.device), last])[:, 0]


def score_sequences(model: Any, rows: list[list[int]], pad_id: int, batch_size: int = 64) -> torch.Tensor:
    """Reward of each token sequence [n] (the head's output at its last real token).

    The last real token is found from the attention mask, so a pad id that also occurs
    inside a sequence does not confuse it.
    """
    out = []
    for i in range(0, len(rows), batch_size):
        hidden, mask = _hidden(model, rows[i : i + batch_size], pad_id)
        out.append(_last_token_reward(model, hidden, mask))
    return torch.cat(out)


def _output_embeddings(model_dir: str | Path, model: Any) -> torch.nn.Parameter:
    """The causal LM's output projection [V, H] for the language-modelling regulariser.

    With tied embeddings it is the reward model's own input embedding (shared, trained);
    otherwise the LM head is loaded from `model_dir` as an extra parameter that is trained
    with the backbone and dropped when the reward model is saved.
    """
    if getattr(model.config, "tie_word_embeddings", False):
        return model.model.embed_tokens.weight  # type: ignore[no-any-return]
    from safetensors.torch import load_file

    for f in sorted(Path(model_dir).glob("*.safetensors")):
        tensors = load_file(str(f))
        if "lm_head.weight" in tensors:
            return torch.nn.Parameter(tensors["lm_head.weight"].float())
    raise ValueError(
        f"{model_dir} has no lm_head.weight for the language-modelling regulariser (lm_coef > 0)"
    )


def response_nll(
    hidden: torch.Tensor,
    mask: torch.Tensor,
    head: torch.Tensor,
    ids: list[list[int]],
    starts: list[int],
    loss_masks: list[list[int]],
) -> torch.Tensor:
    """Mean negative log-likelihood (nats per token) of the response tokens under the LM head.

    Args:
        hidden: last hidden states [n, T, H] of `prompt + response` rows.
        mask: attention mask [n, T].
        head: output embedding [V, H] (logits = hidden @ head^T).
        ids: the token rows (prompt + response), n lists.
        starts: index of each row's first response token.
        loss_masks: per response token, 1 where it counts (the policy's tokens).

    The token at position t is predicted from the hidden state at t − 1. This is the
    text-generation regulariser of GRM (Yang et al. 2024, arXiv:2406.10216, eq. 6, the SFT
    form on the chosen responses).
    """
    n, T, _ = hidden.shape
    target = torch.full((n, T), -100, dtype=torch.long, device=hidden.device)
    for i, (row, s, lm) in enumerate(zip(ids, starts, loss_masks, strict=True)):
        for j, keep in enumerate(lm):
            if keep and s + j >= 1:
                target[i, s + j - 1] = row[s + j]
    logits = hidden @ head.T  # [n, T, V]
    return torch.nn.functional.cross_entropy(logits.reshape(n * T, -1), target.reshape(-1), ignore_index=-100)


def split_by_prompt(pairs: pa.Table, eval_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """Row indices (train, held-out), all pairs of one prompt on the same side."""
    prompts = [tuple(p) for p in pairs.column("prompt_ids").to_pylist()]
    distinct = sorted(set(prompts))
    random.Random(seed).shuffle(distinct)
    held = set(distinct[: round(eval_fraction * len(distinct))])
    train = [i for i, p in enumerate(prompts) if p not in held]
    test = [i for i, p in enumerate(prompts) if p in held]
    return train, test


def train_reward_model(
    pairs: pa.Table,
    model_dir: str | Path,
    out: str | Path,
    cfg: RewardModelConfig | None = None,
    echo: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Train a reward model on `pairs` (`textgym.offline.PAIR_SCHEMA`) from `model_dir`; save it to `out`.

    Returns:
        Figures: train/held-out pair counts, held-out pairwise accuracy before and after
        training, final train loss, wall seconds. Also written to `out/textgym.json`.

    Raises:
        ValueError: if there are no training pairs.
    """
    cfg = cfg or RewardModelConfig()
    t0 = time.perf_counter()
    torch.manual_seed(cfg.seed)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, num_labels=1, dtype=torch.float32)
    pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
    model.config.pad_token_id = pad_id
    cols = {
        c: pairs.column(c).to_pylist() for c in ("prompt_ids", "chosen_ids", "rejected_ids", "chosen_mask")
    }
    chosen = [p + c for p, c in zip(cols["prompt_ids"], cols["chosen_ids"], strict=True)]
    starts = [len(p) for p in cols["prompt_ids"]]
    rejected = [p + r for p, r in zip(cols["prompt_ids"], cols["rejected_ids"], strict=True)]
    train_idx, test_idx = split_by_prompt(pairs, cfg.eval_fraction, cfg.seed)
    if not train_idx:
        raise ValueError("no training pairs")

    @torch.no_grad()
    def accuracy(idx: list[int]) -> float:
        if not idx:
            return float("nan")
        model.eval()
        rc = score_sequences(model, [chosen[i] for i in idx], pad_id)
        rr = score_sequences(model, [rejected[i] for i in idx], pad_id)
        return float((rc > rr).float().mean())

    before = accuracy(test_idx)
    steps = cfg.epochs * math.ceil(len(train_idx) / cfg.batch_size)
    head = _output_embeddings(model_dir, model) if cfg.lm_coef > 0 else None
    trained = torch.nn.Module()
    trained.model = model
    if head is not None and head is not model.model.embed_tokens.weight:
        trained.lm_head = torch.nn.ParameterList([head])  # untied LM head: trained, not saved
    optimizer, scheduler = build_optimizer(trained, cfg.optim, steps)
    rng = random.Random(cfg.seed)
    loss_value = float("nan")
    step = 0
    for epoch in range(cfg.epochs):
        order = train_idx[:]
        rng.shuffle(order)
        for b in range(0, len(order), cfg.batch_size):
            idx = order[b : b + cfg.batch_size]
            model.train()
            hidden, mask = _hidden(model, [chosen[i] for i in idx] + [rejected[i] for i in idx], pad_id)
            r = _last_token_reward(model, hidden, mask)
            rc, rr = r[: len(idx)], r[len(idx) :]
            loss = -torch.nn.functional.logsigmoid(rc - rr).mean()
            if head is not None:
                nll = response_nll(
                    hidden[: len(idx)],
                    mask[: len(idx)],
                    head,
                    [chosen[i] for i in idx],
                    [starts[i] for i in idx],
                    [cols["chosen_mask"][i] for i in idx],
                )
                loss = loss + cfg.lm_coef * nll
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.optim.max_grad_norm is not None:
                torch.nn.utils.clip_grad_norm_(trained.parameters(), cfg.optim.max_grad_norm)
            optimizer.step()
            scheduler.step()
            step += 1
            loss_value = float(loss.detach())
        if echo is not None:
            echo(
                f"rm epoch {epoch + 1}/{cfg.epochs}  loss {loss_value:.4f}  "
                f"held-out accuracy {accuracy(test_idx):.3f}"
            )
    after = accuracy(test_idx)
    result = {
        "role": "reward_model",
        "train_pairs": len(train_idx),
        "heldout_pairs": len(test_idx),
        "heldout_accuracy_before": before,
        "heldout_accuracy": after,
        "train_loss": loss_value,
        "steps": step,
        "wall_time_s": time.perf_counter() - t0,
    }
    out = Path(out)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "textgym.json").write_text(json.dumps(result, indent=2), encoding="utf-8")
    return result


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


_VERIFIERS: dict[str, RewardModelVerifier] = {}


class RewardModelWrapper(gym.Wrapper):
    """Replaces an env's reward by a reward model's score of the agent's turn.

    The wrapped env's own reward terms stay in `info` (so `reward/correct` still measures
    true accuracy); the learned score goes in `info["reward/rm"]` and becomes the reward.
    One model per folder is shared by all wrapped envs of the process.

    Args:
        env: a textgym env (its `messages` hold the conversation so far).
        model_dir: the reward model folder.
        weight: scale of the learned reward.
        device: where the reward model runs.
    """

    def __init__(self, env: gym.Env, model_dir: str | Path, weight: float = 1.0, device: str = "cpu"):
        super().__init__(env)
        key = f"{Path(model_dir).resolve()}@{device}"
        if key not in _VERIFIERS:
            _VERIFIERS[key] = RewardModelVerifier(model_dir, device=device)
        self.verifier = _VERIFIERS[key]
        self.weight = float(weight)
        self._history: list[Message] = []

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset the env and remember the conversation."""
        obs, info = self.env.reset(**kwargs)
        self._history = list(obs)
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; the reward becomes `weight · RM(conversation + action)`."""
        obs, _, terminated, truncated, info = self.env.step(action)
        conv = [*self._history, {"role": "assistant", "content": str(action)}]
        (r,) = self.verifier.score_messages([conv])
        self._history = conv + list(obs)
        info = dict(info)
        info["reward/rm"] = float(r)
        return obs, self.weight * float(r), terminated, truncated, info
