"""`RolloutBatch`: trajectories padded into the tensors of one training forward pass.

Built by the trainers from the `Trajectory`s a rollout recorded (`textgym.agents.trajectory`);
prompt columns are left-padded to a shared width P and response columns right-padded to L.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from textgym import distributed
from textgym.agents.trajectory import Trajectory


@dataclass
class RolloutBatch:
    """A batch of trajectories padded for one forward pass.

    The prompts are left-padded to a common width P so that the first policy token of
    every row sits in column P; everything after is right-padded to width P + L. The
    policy's logits are then only needed for the last L + 1 positions
    (`logits_to_keep`), and every per-token tensor below covers the L response columns.

    Attributes:
        input_ids: [B, P+L] int64, pad id where `attention_mask == 0`.
        attention_mask: [B, P+L] int64.
        position_ids: [B, P+L] int64, positions counted over real tokens only.
        prompt_width: P.
        loss_mask: [B, L] float32, 1.0 on policy tokens.
        old_logprobs: [B, L] float32, sampling log-probabilities (0.0 off the mask).
        token_rewards: [B, L] float32.
        rewards: [B] float32, episode returns.
        groups: [B] int64, group index of each row (-1 when ungrouped).
        step_rewards: [B, L] float32, process rewards on the tokens that end a step
            (`Trajectory.step_rewards`; zeros for rows without), or None.
        step_mask: [B, L] float32, 1.0 on the tokens that end a step, or None. After
            `with_reward_source`, 1.0 on every token that carries a reward event the trainer sees
            (step ends, turn ends), which is what the process estimator normalises over.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    prompt_width: int
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    token_rewards: torch.Tensor
    rewards: torch.Tensor
    groups: torch.Tensor
    step_rewards: torch.Tensor | None = None
    step_mask: torch.Tensor | None = None

    @classmethod
    def from_trajectories(cls, trajs: list[Trajectory], pad_id: int) -> RolloutBatch:
        """Pad `trajs` into one batch (see the class docstring for the layout).

        Raises:
            ValueError: if `trajs` is empty.
        """
        if not trajs:
            raise ValueError("cannot build a RolloutBatch from zero trajectories")
        P = max(t.prompt_length for t in trajs)
        L = max(len(t.token_ids) - t.prompt_length for t in trajs)
        B = len(trajs)
        input_ids = torch.full((B, P + L), pad_id, dtype=torch.long)
        attention_mask = torch.zeros((B, P + L), dtype=torch.long)
        loss_mask = torch.zeros((B, L))
        old_logprobs = torch.zeros((B, L))
        token_rewards = torch.zeros((B, L))
        step_rewards, step_mask = torch.zeros((B, L)), torch.zeros((B, L))
        for i, t in enumerate(trajs):
            p, n = t.prompt_length, len(t.token_ids) - t.prompt_length
            input_ids[i, P - p : P + n] = t.token_ids
            attention_mask[i, P - p : P + n] = 1
            loss_mask[i, :n] = t.loss_mask[p:]
            old_logprobs[i, :n] = t.logprobs[p:]
            token_rewards[i, :n] = t.token_rewards[p:]
            if t.step_rewards is not None and t.step_mask is not None:
                step_rewards[i, :n] = t.step_rewards[p:]
                step_mask[i, :n] = t.step_mask[p:]
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        return cls(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            prompt_width=P,
            loss_mask=loss_mask,
            old_logprobs=old_logprobs,
            token_rewards=token_rewards,
            rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32),
            groups=torch.tensor([t.group for t in trajs], dtype=torch.long),
            step_rewards=step_rewards,
            step_mask=step_mask,
        )

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def select(self, idx: torch.Tensor | list[int]) -> RolloutBatch:
        """Return the rows `idx` (a minibatch), trimmed of columns that are padding in every row."""
        idx = torch.as_tensor(idx, dtype=torch.long)
        am = self.attention_mask[idx]
        used = am.any(0).nonzero()
        lo = int(used.min()) if len(used) else 0
        lo = min(lo, self.prompt_width)
        hi = int(used.max()) + 1 if len(used) else self.prompt_width
        hi = max(hi, self.prompt_width + 1)
        P, L = self.prompt_width, self.loss_mask.shape[1]
        hi = min(hi, P + L)
        return RolloutBatch(
            input_ids=self.input_ids[idx, lo:hi],
            attention_mask=am[:, lo:hi],
            position_ids=self.position_ids[idx, lo:hi],
            prompt_width=P - lo,
            loss_mask=self.loss_mask[idx, : hi - P],
            old_logprobs=self.old_logprobs[idx, : hi - P],
            token_rewards=self.token_rewards[idx, : hi - P],
            rewards=self.rewards[idx],
            groups=self.groups[idx],
            step_rewards=None if self.step_rewards is None else self.step_rewards[idx, : hi - P],
            step_mask=None if self.step_mask is None else self.step_mask[idx, : hi - P],
        )

    def with_reward_source(self, source: str, step_weight: float = 1.0) -> RolloutBatch:
        """The batch with the rewards a trainer sees: the outcome, the steps' process rewards, or both.

        - "outcome": `token_rewards` and `rewards` as recorded (each turn's reward on its last
          policy token); the reward events are the turn ends.
        - "steps": `token_rewards = w · step_rewards`, `rewards = w · Σ_t step_rewards` (the
          sequence's summed process reward, what a per-sequence estimator such as `grpo` sees);
          the reward events are the step ends.
        - "both": the sum of the two; the events are the step ends and the turn ends (a token that
          ends both carries the sum, as one event).

        `step_mask` of the result marks the reward events (for the `grpo_process` estimator).

        Args:
            source: "outcome", "steps" or "both".
            step_weight: w ≥ 0, the weight of the process rewards.

        Raises:
            ValueError: on an unknown `source`.
        """
        if source not in ("outcome", "steps", "both"):
            raise ValueError(f"reward source must be 'outcome', 'steps' or 'both', got {source!r}")
        m = self.loss_mask > 0
        after = torch.zeros_like(m)
        after[:, :-1] = m[:, 1:]
        turn_ends = (m & ~after).float()  # the last policy token of each turn
        zeros = torch.zeros_like(self.token_rewards)
        steps = zeros if self.step_rewards is None else self.step_rewards * step_weight
        step_ends = zeros if self.step_mask is None else self.step_mask
        if source == "outcome":
            token_rewards, rewards, events = self.token_rewards, self.rewards, turn_ends
        elif source == "steps":
            token_rewards, rewards, events = steps, steps.sum(-1), step_ends
        else:
            token_rewards = self.token_rewards + steps
            rewards, events = self.rewards + steps.sum(-1), torch.maximum(turn_ends, step_ends)
        return dataclasses.replace(self, token_rewards=token_rewards, rewards=rewards, step_mask=events)

    def to(self, device: torch.device | str) -> RolloutBatch:
        """Move every tensor to `device`."""
        moved: dict[str, Any] = {
            k: v.to(device) for k, v in self.__dict__.items() if isinstance(v, torch.Tensor)
        }
        return dataclasses.replace(self, **moved)


def rank_micro_batches(rows: list[int], micro_batch_size: int) -> list[tuple[list[int], bool]]:
    """This rank's contiguous slice of a global batch `rows`, cut into micro-batches.

    The slice is rank r's `rows[r·s : (r+1)·s]` with `s = ceil(len(rows) / ranks)`, so the
    slices concatenated in rank order are `rows` (what `distributed.all_gather_list` rebuilds).
    A rank that needs fewer micro-batches than the fullest one (a ragged batch; possibly none
    at all) gets filler micro-batches `([rows[0]], True)` to run with weight 0, so that every
    rank makes the same forward and backward calls, as a sharded model requires. One process:
    all of `rows`, never a filler.

    Args:
        rows: the global batch (example indices), the same list on every rank; not empty.
        micro_batch_size: examples per forward pass.

    Returns:
        `(indices, is_filler)` pairs, the same number on every rank.
    """
    w = distributed.world()
    per = -(-len(rows) // w.size)
    mine = rows[w.rank * per : (w.rank + 1) * per]
    out = [(mine[i : i + micro_batch_size], False) for i in range(0, len(mine), micro_batch_size)]
    fullest = -(-per // micro_batch_size)
    out += [([rows[0]], True)] * (fullest - len(out))
    return out


def token_budget_micro_batches(
    prompt_lengths: torch.Tensor | list[int],
    response_lengths: torch.Tensor | list[int],
    rows: list[int],
    max_tokens: int,
    packed: bool,
) -> list[list[int]]:
    """Cut `rows` into micro-batches of at most `max_tokens` tokens, similar lengths together.

    The rows are sorted by total length (longest first, ties in `rows` order) and taken
    greedily: a micro-batch closes when the next row would push its cost over the budget.
    The cost of a packed micro-batch is Σ (prompt + response) lengths; of a padded one,
    rows × (longest prompt + longest response), the width `RolloutBatch.select` trims it
    to. A row over the budget by itself runs alone.

    Args:
        prompt_lengths: [B] real prompt tokens of every row of the batch.
        response_lengths: [B] real response tokens (including padding-free env turns).
        rows: the row indices to cut (a minibatch).
        max_tokens: the budget per micro-batch, in tokens.
        packed: cost as a packed (True) or a padded (False) micro-batch.

    Returns:
        Lists of row indices; their union is `rows`.

    Raises:
        ValueError: if `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    p = [int(x) for x in prompt_lengths]
    r = [int(x) for x in response_lengths]
    order = sorted(rows, key=lambda i: -(p[i] + r[i]))  # stable: ties keep `rows` order
    out: list[list[int]] = []
    cur: list[int] = []
    total = max_p = max_r = 0
    for i in order:
        padded = (len(cur) + 1) * (max(max_p, p[i]) + max(max_r, r[i]))
        cost = total + p[i] + r[i] if packed else padded
        if cur and cost > max_tokens:
            out.append(cur)
            cur, total, max_p, max_r = [], 0, 0, 0
        cur.append(i)
        total += p[i] + r[i]
        max_p, max_r = max(max_p, p[i]), max(max_r, r[i])
    if cur:
        out.append(cur)
    return out


def group_token_budget_micro_batches(
    prompt_lengths: torch.Tensor | list[int],
    response_lengths: torch.Tensor | list[int],
    groups: torch.Tensor | list[int],
    rows: list[int],
    max_tokens: int,
) -> list[list[int]]:
    """Cut `rows` into micro-batches of whole groups, at most `max_tokens` tokens each.

    For rows that share their group's prompt (`textgym.training.shared_prompts`: the prompt runs
    once per micro-batch, each response runs in a bucket of similar lengths), a group costs its
    prompt once plus its responses: `prompt + Σ response lengths`. Groups are taken in group
    order and added while the micro-batch stays within the budget, so a step of short answers
    runs in a few large micro-batches (bigger matmuls, fewer calls) and a step of long ones in
    more, smaller ones, at the same peak of activation memory. A group over the budget by itself
    is cut into runs of its rows that fit (each paying the prompt); a row over it alone runs
    alone.

    Args:
        prompt_lengths: [B] real prompt tokens of every row of the batch.
        response_lengths: [B] real response tokens of every row.
        groups: [B] group index of every row (rows of a group share their prompt).
        rows: the row indices to cut (a minibatch).
        max_tokens: the budget per micro-batch, in tokens.

    Returns:
        Lists of row indices, each list's rows ordered by group; their union is `rows`.

    Raises:
        ValueError: if `max_tokens` < 1.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    p = [int(x) for x in prompt_lengths]
    r = [int(x) for x in response_lengths]
    g = [int(x) for x in groups]
    members: dict[int, list[int]] = {}
    for i in sorted(rows, key=lambda i: (g[i], i)):
        members.setdefault(g[i], []).append(i)
    pieces: list[tuple[int, list[int]]] = []  # (cost, rows): whole groups, or runs of an oversize one
    for group in members.values():
        cost = p[group[0]] + sum(r[i] for i in group)
        if cost <= max_tokens:
            pieces.append((cost, group))
            continue
        run: list[int] = []
        for i in group:
            if run and p[i] + sum(r[j] for j in run) + r[i] > max_tokens:
                pieces.append((p[run[0]] + sum(r[j] for j in run), run))
                run = []
            run.append(i)
        pieces.append((p[run[0]] + sum(r[j] for j in run), run))
    out: list[list[int]] = []
    cur: list[int] = []
    total = 0
    for cost, piece in pieces:
        if cur and total + cost > max_tokens:
            out.append(cur)
            cur, total = [], 0
        cur += piece
        total += cost
    if cur:
        out.append(cur)
    return out


def row_lengths(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """([B] real prompt tokens, [B] real response tokens) of `batch`'s rows."""
    P = batch.prompt_width
    am = batch.attention_mask
    return am[:, :P].sum(-1).cpu(), am[:, P:].sum(-1).cpu()


def no_token_budget_under_torchrun(micro_batch_tokens: int | None, world_size: int) -> None:
    """Refuse `micro_batch_tokens` with several ranks (their forward calls would not pair up).

    Raises:
        textgym.config.ConfigError: if `micro_batch_tokens` is set and `world_size` > 1.
    """
    if micro_batch_tokens is not None and world_size > 1:
        from textgym.config import ConfigError

        raise ConfigError(
            f"micro_batch_tokens={micro_batch_tokens} runs in one process only: under torchrun "
            f"({world_size} ranks) each rank would make a different number of forward calls, "
            "which a sharded model cannot; use micro_batch_size there"
        )


def chunks(idx: torch.Tensor, size: int) -> list[torch.Tensor]:
    """Split a 1-D index tensor into consecutive pieces of `size` (the last may be shorter)."""
    return [idx[i : i + size] for i in range(0, len(idx), size)]
