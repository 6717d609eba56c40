"""A micro-batch whose rows share prompts: each prompt run once, the responses in buckets of similar length.

The G samples of one task (a GRPO group) share their prompt. `sequence_logprobs` runs each
distinct prompt through the decoder once and gathers its KV cache to the rows of its group
(`shared_prompt_hidden`); the responses then run on that cache. Padding every response to the
longest one in the micro-batch would make one 32-token answer among 4-token ones cost 8× the
real work, so the rows run in buckets of similar length (`length_buckets`), each padded to its
own longest. Values and gradients are those of one padded forward up to float summation order
(tests/agents/test_agent.py).
"""

from __future__ import annotations

from typing import Any

import torch

from textgym.training.batch import RolloutBatch

BUCKET_OVERHEAD_TOKENS = 32
"""What one more decoder call over a bucket of responses costs, in padded token positions.

Chosen, not tuned: a call's fixed cost (each layer's kernel launches, the KV gather, matmuls
with fewer rows) is of the order of tens of token positions for SmolLM2-135M on 2 CPU cores.
At 32, a lone 32-token response among 4-token ones gets a bucket of its own (tests), while
lengths a few tokens apart share one.
"""


def length_buckets(lengths: list[int], overhead: int = BUCKET_OVERHEAD_TOKENS) -> list[list[int]]:
    """Split rows into buckets of similar length that cost the fewest padded positions.

    A bucket runs as one padded call: it costs `rows × its longest length + overhead` token
    positions. The rows are sorted by length and cut where the total is least (an exact
    dynamic programme over the sorted order, O(n²) for n rows; an optimal cut of sorted
    lengths is contiguous in that order).

    Args:
        lengths: [n] the real length of each row (tokens, ≥ 0).
        overhead: the cost of one more call, in token positions (≥ 0).

    Returns:
        Buckets of row indices (into `lengths`), each sorted by length, shortest bucket first;
        every row is in exactly one. Empty for no rows.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    n = len(order)
    best = [0] + [0] * n  # best[j]: least cost of the first j sorted rows
    cut = [0] * (n + 1)  # cut[j]: where the last bucket of those j rows starts
    for j in range(1, n + 1):
        longest = lengths[order[j - 1]]
        best[j], cut[j] = min((best[i] + (j - i) * longest + overhead, i) for i in range(j))
    buckets: list[list[int]] = []
    j = n
    while j > 0:
        buckets.append(order[cut[j] : j])
        j = cut[j]
    return buckets[::-1]


def shared_prompt_hidden(
    decoder: Any,
    batch: RolloutBatch,
    shared: tuple[torch.Tensor, torch.Tensor],
    real: torch.Tensor,
    bucket_overhead: int,
) -> torch.Tensor:
    """The hidden states [N, H] that predict the N real response tokens, prompts run once per group.

    Each distinct prompt runs once (`shared`: `first` [G] rows, `inverse` [B] group of each
    row); its KV cache is gathered to the rows of a bucket (`length_buckets` over the rows'
    response lengths) and the bucket's responses, padded to its longest, run on it. The
    gathers are differentiable, so the gradient of every row reaches its group's prompt. The
    rows come back in `real`'s row-major order (`hidden[real]` of one padded forward). A cache
    that is not made of plain `DynamicLayer`s (sliding windows, linear attention) is gathered
    once for all rows (one bucket).
    """
    from transformers.cache_utils import DynamicLayer

    first, inverse = shared
    P = batch.prompt_width
    prompt = decoder(
        input_ids=batch.input_ids[first, :P],
        attention_mask=batch.attention_mask[first, :P],
        position_ids=batch.position_ids[first, :P],
        use_cache=True,
    )
    cache = prompt.past_key_values
    plain = all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))
    layers = [(layer.keys, layer.values) for layer in cache.layers] if plain else []  # [G, heads, P, d]
    last_prompt = prompt.last_hidden_state[:, -1:]  # [G, 1, H]: predicts each group's first token
    # a row's width: through its last real response column (0: no response token)
    columns = torch.arange(1, real.shape[1] + 1, device=real.device)
    widths = (real * columns).amax(dim=1).tolist() if real.numel() else [0] * len(batch)
    flat = torch.full(real.shape, -1, dtype=torch.long, device=real.device)
    flat[real] = torch.arange(int(real.sum()), device=real.device)  # row-major index of each real token
    pieces: list[torch.Tensor] = []
    where: list[torch.Tensor] = []
    buckets = length_buckets(widths, bucket_overhead) if plain else [list(range(len(batch)))]
    for bucket in buckets:
        w = max(widths[i] for i in bucket)
        if w == 0:
            continue
        rows = torch.tensor(bucket, device=real.device)
        groups = inverse[rows]
        if plain:
            for layer, (keys, values) in zip(cache.layers, layers, strict=True):
                layer.keys, layer.values = keys[groups], values[groups]  # [b, heads, P, d]
        else:
            cache.batch_select_indices(groups)  # [G, ...] -> [b, ...], differentiable gather
        response = decoder(
            input_ids=batch.input_ids[rows, P : P + w],
            attention_mask=batch.attention_mask[rows, : P + w],
            position_ids=batch.position_ids[rows, P : P + w],
            past_key_values=cache,
            use_cache=True,
        )
        hidden = torch.cat([last_prompt[groups], response.last_hidden_state[:, :-1]], dim=1)  # [b, w, H]
        keep = real[rows, :w]
        pieces.append(hidden[keep])
        where.append(flat[rows, :w][keep])
    if not pieces:
        return last_prompt.new_zeros((0, last_prompt.shape[-1]))
    return torch.cat(pieces)[torch.argsort(torch.cat(where))]
