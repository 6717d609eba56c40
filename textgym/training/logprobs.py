"""The log-probability forward every trainer shares: log π(response token | prefix) of a `RolloutBatch`.

Memory at real vocabularies is decided by the logits, not the weights: at b = 8 rows,
L = 1,024 response tokens and V = 151,936 ids one fp32 [b, L, V] tensor is ~5 GB, and a
naive forward keeps several (the logits, their temperature-scaled copy, `logsumexp`'s saved
input, the entropy's softmax). So the decoder's last hidden states are taken instead
([b, L, H], H ≪ V) and pushed through the LM head in chunks of tokens (`head_logprobs`):
each chunk's logits live only while its log-probs and entropies are computed, and under
autograd each chunk is checkpointed (`torch.utils.checkpoint`), so backward recomputes one
chunk's logits at a time. Peak logits memory is one chunk (`chunk_elements` fp32 values,
128 MB by default) instead of the whole batch's; the price is one more LM-head matmul per
chunk in backward. When the whole batch fits in one chunk (small vocabularies), nothing
is checkpointed and the computation is the plain one.

Only the real (non-padding) response positions go through the head, and the prompt of a
group (the G samples of one task) runs through the model once when the batch allows it
(`shared_prompt_rows`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from textgym.agents.sampling import truncation_mask
from textgym.algorithms.auxiliary import entropy_from_logits
from textgym.training.batch import RolloutBatch
from textgym.training.shared_prompts import BUCKET_OVERHEAD_TOKENS, shared_prompt_hidden

CHUNK_ELEMENTS = 2**25
"""Default budget of one head chunk: tokens × vocabulary ≤ this many fp32 logits (128 MB)."""


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


def truncated_logits(
    logits: torch.Tensor, targets: torch.Tensor, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """`logits` [..., V] restricted to the tokens the sampler's top-k / top-p kept, and the target.

    The rollout's log-probs are those of the truncated, renormalised distribution the token
    was drawn from (`textgym.agents.sampling.truncation_mask`); the trainer's must be of the
    same distribution, or the importance ratio at the first minibatch is Z_t (the mass the
    cut kept) instead of 1. The mask is computed without gradient; the target token
    (`targets` [...], int64) is always kept, so its log-prob stays finite when an update
    has moved it out of the kept set (at the sampling weights it is inside by construction).
    Returns `logits` itself when both cuts are off.
    """
    keep = truncation_mask(logits, top_k, top_p)
    if keep is None:
        return logits
    keep.scatter_(-1, targets[..., None], True)
    return logits.masked_fill(~keep, float("-inf"))


def _head_chunk(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    entropy: str,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probs [n] and entropies [n] of one chunk of tokens.

    `entropy`: "grad" (in the graph), "nograd" (computed without gradient) or "none" (zeros).
    """
    logits = head(hidden).float()  # [n, V]
    if temperature != 1.0:
        logits = logits / temperature
    kept = truncated_logits(logits, targets, top_k, top_p)  # −inf where the sampler's cut dropped
    lse = torch.logsumexp(kept, dim=-1)  # [n]
    logprobs = logits.gather(-1, targets[:, None])[:, 0] - lse
    if entropy == "none":
        return logprobs, torch.zeros_like(logprobs.detach())
    # H = −Σ p log p = lse − Σ p·z with p = softmax(z): one [n, V] temporary besides the logits
    # (p is exactly 0 on dropped tokens, whose z stays finite here).
    with torch.set_grad_enabled(torch.is_grad_enabled() and entropy == "grad"):
        ent = lse - (torch.softmax(kept, dim=-1) * logits).sum(-1)
    return logprobs, ent if entropy == "grad" else ent.detach()


def head_logprobs(
    head: Callable[[torch.Tensor], torch.Tensor],
    hidden: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = False,
    entropy_grad: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    vocab_size: int | None = None,
    top_k: int = 0,
    top_p: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The log-softmax of head(h) / T at the targets, and optionally the entropy, chunked over tokens.

    The token log-probability is `z_y − logsumexp(z)` with `z = head(h) / T`, and the entropy
    `H = logsumexp(z) − Σ_v softmax(z)_v z_v` (= −Σ p log p), both in fp32 whatever the
    head's dtype. With `top_k` / `top_p` on, both are of the truncated distribution the
    sampler drew from (`truncated_logits`: the logsumexp and the sum run over the kept
    tokens and the target). Tokens are processed `max(1, chunk_elements // V)` at a time; with
    gradients enabled and more than one chunk, each chunk is checkpointed so that only its
    input hidden states are kept for backward (one chunk's [n, V] logits are recomputed
    there). The values and gradients equal the unchunked computation's up to float
    summation order (tested to 1e-5 in fp32).

    Args:
        head: the LM head (`model.get_output_embeddings()`), [n, H] → [n, V].
        hidden: [N, H] final hidden states (after the decoder's last norm).
        targets: [N] int64 token ids whose log-probs are wanted.
        temperature: z = logits / T (0 is treated as 1).
        with_entropy: also compute the entropy of each token's distribution.
        entropy_grad: keep the entropy in the autograd graph (an entropy bonus); otherwise
            it is computed without gradient.
        chunk_elements: tokens × V per chunk (fp32 logits held at once).
        vocab_size: V (default: the head's `out_features` or its weight's rows).
        top_k: the sampler's top-k (0: off).
        top_p: the sampler's top-p (1: off).

    Returns:
        logprobs [N] float32 (with grad when `hidden` or the head has it), entropy [N] float32
        or None.
    """
    T = float(temperature) if temperature else 1.0
    if vocab_size is None:
        weight = getattr(head, "weight", None)
        vocab_size = int(weight.shape[0]) if weight is not None else 1
    step = max(1, chunk_elements // max(vocab_size, 1))
    N = hidden.shape[0]
    grad = torch.is_grad_enabled() and (hidden.requires_grad or _has_grad(head))
    chunked = step < N
    mode = "none" if not with_entropy else ("grad" if entropy_grad else "nograd")
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, N, step):
        h, y = hidden[s : s + step], targets[s : s + step]
        if grad and chunked:
            lp, ent = checkpoint(_head_chunk, head, h, y, T, mode, top_k, top_p, use_reentrant=False)
        else:
            lp, ent = _head_chunk(head, h, y, T, mode, top_k, top_p)
        lps.append(lp)
        ents.append(ent)
    if not lps:
        empty = hidden.new_zeros(0, dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(lps), (torch.cat(ents) if with_entropy else None)


def _has_grad(module: Any) -> bool:
    params = getattr(module, "parameters", None)
    return params is not None and any(p.requires_grad for p in params())


def chunked_head_supported(model: Any) -> bool:
    """Whether `model`'s logits are `get_output_embeddings()(get_decoder()(...).last_hidden_state)`.

    True for HF causal LMs with a decoder and an output embedding and no post-processing of
    the logits (Gemma-2's soft-capping, Cohere's or Granite's logit scale are excluded).
    Sharded (FSDP2) models are excluded by the caller: their head's weight is only gathered
    inside the root module's forward.
    """
    if not (hasattr(model, "get_decoder") and hasattr(model, "get_output_embeddings")):
        return False
    config = getattr(model, "config", None)
    for name in ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier_scale"):
        value = getattr(config, name, None)
        if value not in (None, 1, 1.0):
            return False
    try:
        return model.get_decoder() is not None and model.get_output_embeddings() is not None
    except (AttributeError, NotImplementedError):
        return False


def _autocast(model: Any) -> contextlib.AbstractContextManager[Any]:
    """The compute-precision context recorded on `model` (`textgym.training.precision`), if any."""
    try:
        from textgym.training.precision import compute_autocast
    except ImportError:  # pragma: no cover - precision lands separately
        return contextlib.nullcontext()
    return compute_autocast(model)


def sequence_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    entropy_grad: bool = False,
    split_prompt: bool = False,
    chunk_elements: int = CHUNK_ELEMENTS,
    packed: bool = False,
    top_k: int = 0,
    top_p: float = 1.0,
    bucket_overhead: int = BUCKET_OVERHEAD_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens of `batch` under `model`.

    The distribution is the one the rollout sampled from: `softmax(logits / T)`, truncated
    to the tokens top-k / top-p keep when they are on (`truncated_logits`; the recorded
    sampling log-probs are of that truncated distribution, so the ratio π/π_old is 1 at the
    sampling weights). Greedy (T = 0) is the full softmax at T = 1, as the samplers record.

    The decoder's hidden states at the L positions that predict the response columns are
    taken, and only the real (non-padding) ones go through the LM head, in chunks of
    `chunk_elements // V` tokens (`head_logprobs`): no [B, L, V] tensor exists at any time.
    A model whose head cannot be called apart from its forward (a sharded FSDP2 model, or a
    model that post-processes its logits: `chunked_head_supported`) takes the plain path:
    `logits_to_keep=L + 1` logits, then `gather − logsumexp`.

    With `share_prompts`, rows of one group (the G samples of a task, identical prompt
    columns) run their prompt through the model once: the prompt's KV cache is computed
    for each distinct prompt and gathered to every row of its group, then only the
    response columns are run. The result is the same function of the parameters (its
    gradient sums over the group through the shared cache), with about
    `(num_groups·P + B·L) / (B·(P + L))` of the tokens. The responses then run in buckets of
    similar length (`length_buckets`), each padded only to its own longest row, so one long
    response does not pad a whole micro-batch (`textgym.training.shared_prompts`). Under gradient
    checkpointing (in training mode) HF drops the KV cache, so prompts are not shared then.

    A sharded model (FSDP) must make the same forward calls on every rank; a rank's
    micro-batch may hold repeated groups while another's does not, so `split_prompt` runs
    the prompt/response pair of calls even when no prompt repeats.

    With `packed`, the rows' real tokens are concatenated into one row of Σ lengths tokens
    with position ids restarting at 0 for each sequence and no attention mask: transformers
    then attends within each sequence only (a block-diagonal causal mask under SDPA/eager,
    variable-length kernels under flash attention), so no padding token is computed. The
    values are those of the padded forward up to float summation order (prompts are not
    shared then). On CPU with SDPA the attention still costs (Σ lengths)² per row, so pack
    micro-batches of a bounded token count (`micro_batch_tokens`).

    Args:
        model: a causal LM.
        batch: the padded batch (`RolloutBatch` layout: prompt width P, response width L).
        temperature: logits are divided by it (the sampling temperature; 0 is treated as 1).
        with_entropy: also return the per-token entropy (no grad unless `entropy_grad`).
        share_prompts: compute each group's prompt once when the batch allows it.
        entropy_grad: keep the entropy in the autograd graph (for an entropy bonus).
        split_prompt: with `share_prompts`, always run prompt and response as two calls.
        chunk_elements: fp32 logits held at once by the chunked head (tokens × V).
        packed: run the rows as one padding-free packed sequence (see above).
        top_k: the sampler's top-k (0: off).
        top_p: the sampler's top-p (1: off).
        bucket_overhead: the cost of one more decoder call over the responses, in padded
            token positions (`length_buckets`); 0 gives each distinct length its own call.

    Returns:
        logprobs [B, L] float32 (0 where the batch has padding — mask it), entropy [B, L] or
        None.
    """
    from textgym import distributed

    if not temperature:  # greedy decoding records the untruncated softmax at T = 1
        top_k, top_p = 0, 1.0
    cut = (top_k, top_p)
    if packed:
        return _packed_logprobs(model, batch, temperature, with_entropy, entropy_grad, chunk_elements, cut)
    if distributed.is_sharded(model) or not chunked_head_supported(model):
        with _autocast(model):
            return _full_logits_logprobs(
                model, batch, temperature, with_entropy, share_prompts, entropy_grad, split_prompt, cut
            )
    P, L = batch.prompt_width, batch.loss_mask.shape[1]
    checkpointing = model.training and bool(getattr(model, "is_gradient_checkpointing", False))
    shared = shared_prompt_rows(batch, split_prompt) if share_prompts and not checkpointing else None
    decoder = model.get_decoder()
    real = batch.attention_mask[:, P:].bool()  # [B, L]: response columns that are not padding
    with _autocast(model):
        if shared is None:
            out = decoder(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                position_ids=batch.position_ids,
                use_cache=False,
            )
            # P-1+t predicts P+t: [B, L, H], then its real positions [N, H]
            hidden = out.last_hidden_state[:, P - 1 : P + L - 1][real]
        else:
            hidden = shared_prompt_hidden(decoder, batch, shared, real, bucket_overhead)
        targets = batch.input_ids[:, P:]  # [B, L]
        lp, ent = head_logprobs(
            model.get_output_embeddings(),
            hidden,
            targets[real],
            temperature,
            with_entropy=with_entropy,
            entropy_grad=entropy_grad,
            chunk_elements=chunk_elements,
            vocab_size=int(model.config.vocab_size) if hasattr(model, "config") else None,
            top_k=top_k,
            top_p=top_p,
        )
    zeros = torch.zeros(real.shape, dtype=torch.float32, device=real.device)
    logprobs = zeros.masked_scatter(real, lp)
    entropy = None if ent is None else zeros.masked_scatter(real, ent)
    return logprobs, entropy


def pack_rows(batch: RolloutBatch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The padding-free layout of `batch`: `(input_ids, position_ids, predict, real)`.

    Shapes: input_ids [1, N], position_ids [1, N], predict [M], real [B, L] bool.
    The rows' real tokens (attention mask 1) are concatenated in row order (N = Σ row
    lengths); position ids restart at 0 for each sequence, which is how transformers finds
    the sequence boundaries (`masking_utils.find_packed_sequence_indices`). `real` marks the
    response columns that are not padding (M of them, row-major) and `predict[m]` is the
    packed index of the token that predicts the m-th (its target is at `predict[m] + 1`).
    """
    mask = batch.attention_mask.bool()  # [B, S]
    flat_index = (mask.flatten().cumsum(0) - 1).view(mask.shape)  # packed index of each real token
    P = batch.prompt_width
    real = mask[:, P:]
    predict = flat_index[:, P:][real] - 1
    return batch.input_ids[mask][None], batch.position_ids[mask][None], predict, real


def _packed_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float,
    with_entropy: bool,
    entropy_grad: bool,
    chunk_elements: int,
    cut: tuple[int, float] = (0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` of `batch` packed into one row (`pack_rows`; see there); `cut` = (top_k, top_p)."""
    from textgym import distributed

    ids, positions, predict, real = pack_rows(batch)
    targets = ids[0, predict + 1]
    with _autocast(model):
        if distributed.is_sharded(model) or not chunked_head_supported(model):
            logits = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0, predict]
            lp, ent = head_logprobs(
                torch.nn.Identity(),
                logits,
                targets,
                temperature,
                with_entropy,
                entropy_grad,
                chunk_elements=2**62,
                top_k=cut[0],
                top_p=cut[1],
            )
        else:
            hidden = model.get_decoder()(
                input_ids=ids, position_ids=positions, use_cache=False
            ).last_hidden_state
            lp, ent = head_logprobs(
                model.get_output_embeddings(),
                hidden[0, predict],
                targets,
                temperature,
                with_entropy=with_entropy,
                entropy_grad=entropy_grad,
                chunk_elements=chunk_elements,
                vocab_size=int(model.config.vocab_size),
                top_k=cut[0],
                top_p=cut[1],
            )
    zeros = torch.zeros(real.shape, dtype=torch.float32, device=real.device)
    return zeros.masked_scatter(real, lp), None if ent is None else zeros.masked_scatter(real, ent)


def _full_logits_logprobs(
    model: PreTrainedModel,
    batch: RolloutBatch,
    temperature: float,
    with_entropy: bool,
    share_prompts: bool,
    entropy_grad: bool,
    split_prompt: bool,
    cut: tuple[int, float] = (0, 1.0),
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`sequence_logprobs` through the model's own forward: [B, L, V] logits (see there).

    `cut` is the sampler's (top_k, top_p).
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
    logits = truncated_logits(logits, targets, *cut)  # the sampler's top-k / top-p (targets kept)
    logprobs = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
    real = batch.attention_mask[:, P:].bool()
    logprobs = logprobs * real  # 0 on padding, as on the chunked path
    entropy = None
    if with_entropy and entropy_grad:
        entropy = entropy_from_logits(logits) * real
    elif with_entropy:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach()) * real
    return logprobs, entropy
