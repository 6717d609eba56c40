"""The log-probability forward every trainer shares: log π(response token | prefix) of a `RolloutBatch`.

Only the response positions' logits are materialised, and the prompt of a group (the G samples
of one task) runs through the model once when the batch allows it (`shared_prompt_rows`).
"""

from __future__ import annotations

import torch
from transformers import PreTrainedModel

from textgym.trainers.batch import RolloutBatch
from textgym.trainers.losses import entropy_from_logits


def shared_prompt_rows(
    batch: RolloutBatch, even_if_unique: bool = False
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Find rows whose prompt columns can be computed once: `(first_rows, inverse)` or None.

    `first_rows[k]` is the first row of the k-th distinct group and `inverse[i]` the group
    position of row i, so `x[first_rows][inverse]` rebuilds a per-row tensor. None when no
    group repeats (unless `even_if_unique`), a row is ungrouped (-1), or rows of one group
    differ in their prompt.
    """
    if batch.groups.numel() == 0 or bool((batch.groups < 0).any()):
        return None
    uniq, inverse = torch.unique(batch.groups, return_inverse=True)
    if len(uniq) == len(batch) and not even_if_unique:
        return None
    rows = torch.arange(len(batch), device=inverse.device)
    first = torch.full((len(uniq),), len(batch), dtype=torch.long, device=inverse.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    P = batch.prompt_width
    if not torch.equal(batch.input_ids[first][inverse][:, :P], batch.input_ids[:, :P]):
        return None
    return first, inverse


def sequence_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    entropy_grad: bool = False,
    split_prompt: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens of `batch` under `model`.

    Only the response positions' logits are materialised (`logits_to_keep`), and
    log-softmax is computed as `gather(logits) − logsumexp(logits)` to avoid a second
    [B, L, V] tensor.

    With `share_prompts`, rows of one group (the G samples of a task, identical prompt
    columns) run their prompt through the model once: the prompt's KV cache is computed
    for each distinct prompt and gathered to every row of its group, then only the
    response columns are run. The result is the same function of the parameters (its
    gradient sums over the group through the shared cache), with about
    `(num_groups·P + B·L) / (B·(P + L))` of the tokens. Under gradient checkpointing (in
    training mode) HF drops the KV cache, so prompts are not shared then.

    A sharded model (FSDP) must make the same forward calls on every rank; a rank's
    micro-batch may hold repeated groups while another's does not, so `split_prompt` runs
    the prompt/response pair of calls even when no prompt repeats.

    Args:
        model: a causal LM.
        batch: the padded batch (`RolloutBatch` layout: prompt width P, response width L).
        temperature: logits are divided by it (the sampling temperature; 0 is treated as 1).
        with_entropy: also return the per-token entropy (no grad unless `entropy_grad`).
        share_prompts: compute each group's prompt once when the batch allows it.
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus).
        split_prompt: with `share_prompts`, always run prompt and response as two calls.

    Returns:
        logprobs [B, L] (0 where the batch has padding — mask it), entropy [B, L] or None.
    """
    P, L = batch.prompt_width, batch.loss_mask.shape[1]
    checkpointing = model.training and bool(getattr(model, "is_gradient_checkpointing", False))
    shared = shared_prompt_rows(batch, split_prompt) if share_prompts and not checkpointing else None
    if shared is None:
        out = model(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            logits_to_keep=L + 1,
            use_cache=False,
        )
        logits = out.logits[:, :-1]  # [B, L, V]: position P-1+t predicts token P+t
    else:
        first, inverse = shared
        prompt = model(
            input_ids=batch.input_ids[first, :P],
            attention_mask=batch.attention_mask[first, :P],
            position_ids=batch.position_ids[first, :P],
            logits_to_keep=1,
            use_cache=True,
        )
        cache = prompt.past_key_values
        cache.batch_select_indices(inverse)  # [groups, ...] -> [B, ...], differentiable gather
        response = model(
            input_ids=batch.input_ids[:, P:],
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids[:, P:],
            past_key_values=cache,
            use_cache=True,
        )
        logits = torch.cat([prompt.logits[inverse], response.logits[:, :-1]], dim=1)  # [B, L, V]
    logits = logits.float()
    if temperature and temperature != 1.0:
        logits = logits / temperature
    targets = batch.input_ids[:, P:]  # [B, L]
    logprobs = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
    entropy = None
    if with_entropy and entropy_grad:
        entropy = entropy_from_logits(logits)
    elif with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
    return logprobs, entropy
