"""The reward model's trained module (`RewardNet`) and the layouts of its forward pass.

A micro-batch of pairs is scored as 2k sequences, chosen first then rejected: right-padded
rows ([2k, T] with an attention mask), or one padding-free packed row (`pack_sequences`:
[1, Σ lengths], positions restarting at 0 per sequence, no attention mask, so transformers
builds the block-diagonal causal mask). Either way the Bradley–Terry score is the score head
at each sequence's last real token, and the GRM regulariser's NLL is taken only at the
chosen responses' target positions through the LM head in chunks of tokens
(`textgym.training.logprobs.head_logprobs`), so no [k, T, V] fp32 logits are kept.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from textgym.training.logprobs import CHUNK_ELEMENTS, head_logprobs
from textgym.verifiers.reward_model import last_token_reward

__all__ = ["RewardNet", "nll_targets", "pack_sequences", "packed_nll_targets"]


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


def _lm_positions(row: list[int], start: int, loss_mask: list[int]) -> list[tuple[int, int]]:
    """(position, target token) of each counted response token: token t is predicted at t − 1."""
    return [(start + j - 1, row[start + j]) for j, keep in enumerate(loss_mask) if keep and start + j >= 1]


def nll_targets(ids: list[list[int]], starts: list[int], loss_masks: list[list[int]], T: int) -> torch.Tensor:
    """Next-token targets [n, T] of the response tokens: the token id at the position that predicts it.

    Args:
        ids: the token rows (prompt + response), n lists of at most T tokens.
        starts: index of each row's first response token.
        loss_masks: per response token, 1 where it counts (the policy's tokens).
        T: the padded width.

    Returns:
        A long tensor, −100 (cross-entropy's ignore index) where nothing is predicted.
    """
    target = torch.full((len(ids), T), -100, dtype=torch.long)
    for i, (row, s, lm) in enumerate(zip(ids, starts, loss_masks, strict=True)):
        for pos, tok in _lm_positions(row, s, lm):
            target[i, pos] = tok
    return target


def pack_sequences(rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padding-free layout of token rows: `(input_ids [1, N], position_ids [1, N], last [n])`.

    The rows are concatenated in order (N = Σ lengths); position ids restart at 0 for each
    row, which is how transformers finds the sequence boundaries; `last[i]` is the packed
    index of row i's last token (where its reward is read).

    Raises:
        ValueError: if a row is empty.
    """
    if any(len(r) == 0 for r in rows):
        raise ValueError("cannot pack an empty sequence")
    ids = torch.tensor([t for r in rows for t in r], dtype=torch.long)[None]
    positions = torch.cat([torch.arange(len(r)) for r in rows])[None]
    last = torch.tensor([len(r) for r in rows]).cumsum(0) - 1
    return ids, positions, last


def packed_nll_targets(
    ids: list[list[int]], starts: list[int], loss_masks: list[list[int]], N: int
) -> torch.Tensor:
    """`nll_targets` of the first rows of a packed row of N tokens (`pack_sequences`): [1, N].

    Row i's positions are offset by the lengths of the rows before it, so `ids` must be the
    packed row's first sequences, in order (the chosen responses of a micro-batch).
    """
    target = torch.full((1, N), -100, dtype=torch.long)
    offset = 0
    for row, s, lm in zip(ids, starts, loss_masks, strict=True):
        for pos, tok in _lm_positions(row, s, lm):
            target[0, offset + pos] = tok
        offset += len(row)
    return target


class RewardNet(torch.nn.Module):
    """What the reward-model trainer trains and shards: backbone, score head, and the regulariser's LM head.

    It holds the modules of a sequence-classification model under the same names (`model`,
    `score`), so its state dict is the reward model's, plus `lm_head.weight` when the
    regulariser uses an untied LM head. Its `forward` computes both the rewards and the NLL,
    so that under FSDP2 the root unit (embeddings, final norm, score and LM heads) is
    unsharded while the tied embedding or the LM head multiplies the hidden states; outside
    a forward those parameters are sharded `DTensor`s.

    Args:
        rm: the `AutoModelForSequenceClassification` (one label) whose modules are trained.
        lm_head: the regulariser's output projection [V, H], or None without the regulariser.
            The input embedding itself (tied) is used as is; another tensor becomes the
            parameter `lm_head.weight`.

    Attributes:
        hf: `rm` itself, for its config and `save_pretrained` (not a submodule: `model` and
            `score` are registered here, so no parameter is counted twice).
        regularised: whether `forward` can compute the NLL (an LM head was given).
        chunk_elements: tokens × V of the NLL's fp32 logits held at once (`head_logprobs`).
    """

    model: Any
    score: torch.nn.Module
    hf: PreTrainedModel

    def __init__(self, rm: PreTrainedModel, lm_head: torch.Tensor | None = None):
        super().__init__()
        self.model = rm.model
        self.score = rm.score  # type: ignore[assignment]
        object.__setattr__(self, "hf", rm)  # not a submodule: its modules are registered above
        self._no_split_modules = list(getattr(rm, "_no_split_modules", None) or [])  # for `shard`
        self.regularised = lm_head is not None
        self.chunk_elements = CHUNK_ELEMENTS
        self.lm_head: torch.nn.Linear | None = None
        if lm_head is not None and lm_head is not rm.model.embed_tokens.weight:
            V, H = lm_head.shape
            self.lm_head = torch.nn.Linear(H, V, bias=False, device=lm_head.device)
            self.lm_head.weight = torch.nn.Parameter(lm_head.detach())

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None,
        targets: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        last: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Rewards of the sequences and the summed NLL of the first rows' target tokens.

        Two layouts. Padded: `input_ids` [n, T] right-padded with `attention_mask` [n, T].
        Packed (`pack_sequences`): `input_ids` and `position_ids` [1, N], `attention_mask`
        None, `last` [n] the packed index of each sequence's last token. The reward is the
        score head at each sequence's last real token in both. The NLL is the text-generation
        regulariser of GRM (Yang et al. 2024, arXiv:2406.10216, eq. 6, the SFT form on the
        chosen responses): −Σ log softmax(hidden @ head^T)[target], token t predicted from
        the hidden state at t − 1, computed only at the target positions and in chunks of
        tokens (`head_logprobs`; equal to the full-logits cross-entropy, tested to 1e-5).

        Args:
            input_ids: [n, T] right-padded token ids, or [1, N] packed.
            attention_mask: [n, T], 1 on real tokens; None when packed.
            targets: next-token targets, −100 where nothing counts, or None to skip the NLL:
                [k, T] of the first k padded rows (`nll_targets`), or [1, N] of the packed
                row (`packed_nll_targets`).
            position_ids: [1, N] positions restarting at 0 per sequence (packed only).
            last: [n] packed index of each sequence's last token (packed only).

        Returns:
            rewards [n] (fp32), and the NLL summed over the target tokens in nats (fp32
            scalar), or None.

        Raises:
            ValueError: unless exactly one layout is given: `attention_mask`, or `position_ids`
                and `last`.
        """
        if (position_ids is None) != (last is None) or (last is None) == (attention_mask is None):
            raise ValueError("pass attention_mask (padded) or position_ids and last (packed)")
        if attention_mask is not None:
            out = self.model(input_ids=input_ids, attention_mask=attention_mask)
            hidden = out.last_hidden_state
            rewards = last_token_reward(self, hidden, attention_mask).float()
        else:
            out = self.model(input_ids=input_ids, position_ids=position_ids, use_cache=False)
            hidden = out.last_hidden_state
            rewards = self.score(hidden[0, last])[:, 0].float()
        if targets is None or not self.regularised:
            return rewards, None
        head = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        counted = targets != -100
        logprobs, _ = head_logprobs(
            lambda h: h @ head.T,
            hidden[: len(targets)][counted],
            targets[counted],
            chunk_elements=self.chunk_elements,
            vocab_size=int(head.shape[0]),
        )
        if logprobs.numel() == 0:  # still in the head's graph (zero gradient), as every rank's must be
            return rewards, head[:0].sum().float()
        return rewards, -logprobs.sum()

    def save_pretrained(self, folder: str | Path, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the reward model as a Hugging Face folder, and an untied LM head beside it.

        The folder is what `AutoModelForSequenceClassification.from_pretrained` loads; the LM
        head, when there is one, goes to `lm_head.safetensors` (a checkpoint needs it to
        resume; `from_pretrained` ignores the file). `state_dict` is this module's full state
        (`distributed.model_state` when sharded); default: `self.state_dict()`.
        """
        from safetensors.torch import save_file

        state = dict(self.state_dict() if state_dict is None else state_dict)
        head = state.pop("lm_head.weight", None)
        self.hf.save_pretrained(folder, state_dict=state)
        if head is not None:
            save_file(
                {"lm_head.weight": head.detach().cpu().contiguous()},
                str(Path(folder) / "lm_head.safetensors"),
            )
