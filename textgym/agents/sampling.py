"""What a generation backend is asked for and what it returns: `SamplingParams` in, `Generation` out.

Shared by every backend (transformers, vLLM, OpenAI-compatible endpoints) and by the rollout
loop; nothing here imports a backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

if TYPE_CHECKING:
    from transformers import GenerationConfig, PreTrainedTokenizerBase


@dataclass(frozen=True)
class SamplingParams:
    """How to sample a response.

    These are all the sampling there is, on every backend: nothing comes from a model
    folder's `generation_config.json` (no top-k, top-p, min-p, repetition penalty, ... of its
    own), and the recorded log-probs are those of the distribution sampled from.

    Attributes:
        temperature: softmax temperature; 0 means greedy decoding.
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        top_k: keep the k most likely tokens; 0 disables it.
        max_new_tokens: response budget per turn, in tokens.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 256

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError("top_k must be >= 0 and max_new_tokens >= 1")


@dataclass
class Generation:
    """One sampled response.

    Attributes:
        token_ids: [N] the sampled ids, ending with the end-of-turn id when `finish_reason == "stop"`.
        logprobs: [N] float32, natural-log probability of each sampled id under the distribution
            it was drawn from: `log_softmax(logits / T)` (T = 1 when greedy); with top-k / top-p
            on, the truncated distribution renormalised over the kept tokens.
        finish_reason: "stop" (end-of-turn token sampled) or "length" (hit max_new_tokens).
        policy_version: the version of the weights that generated it, as a rollout server
            reports it (`textgym serve`'s `policy_version`); None from an in-process backend.
        sampled: [N] bool, which ids the policy sampled (with a real log-prob); None means all.
            An id the client added (the end-of-turn id an endpoint stopped before returning) or
            one the endpoint gave no log-prob for is False: it stays in the context but gets
            loss mask 0, so no policy is trained on a token it never drew against a made-up
            behaviour probability.
    """

    token_ids: list[int]
    logprobs: torch.Tensor
    finish_reason: Literal["stop", "length"]
    policy_version: int | None = None
    sampled: list[bool] | None = None


def eos_token_ids(
    tokenizer: PreTrainedTokenizerBase, generation_config: GenerationConfig | None
) -> list[int]:
    """End-of-turn ids: the tokenizer's EOS plus any the generation config lists (sorted)."""
    eos = generation_config.eos_token_id if generation_config is not None else None
    ids = set([eos] if isinstance(eos, int) else (eos or []))
    ids.add(int(tokenizer.eos_token_id))  # type: ignore[arg-type]
    return sorted(ids)


def derive_seed(*words: int) -> int:
    """A 64-bit seed derived from a tuple of non-negative integers (numpy's `SeedSequence` hash).

    Distinct tuples give unrelated seeds, e.g. `(run seed, step, task slot, sample, turn)`.
    """
    import numpy as np

    hi, lo = np.random.SeedSequence([int(w) for w in words]).generate_state(2, dtype=np.uint32)
    return (int(hi) << 32) | int(lo)


def truncation_mask(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor | None:
    """The tokens that top-k, then top-p (nucleus) sampling keeps: [..., V] bool, or None when both are off.

    The one definition the samplers (`truncate_logits`) and the trainer's log-probs
    (`textgym.training.logprobs`) share, so that the policy the trainer differentiates is
    the distribution that was sampled. Order and ties as in Hugging Face's `TopKLogitsWarper`
    then `TopPLogitsWarper` and vLLM's `apply_top_k_top_p`:
    - top-k (Fan et al. 2018, arXiv:1805.04833, §5.4) keeps every token whose logit is ≥ the
      k-th largest (ties at the k-th are kept);
    - top-p (Holtzman et al. 2020, arXiv:1904.09751, eq. 3), on the top-k survivors
      renormalised: with the kept tokens sorted by ascending probability, a token is dropped
      when the cumulative probability up to and including it is ≤ 1 − p; the most likely
      token is always kept. Equivalently, in descending order a token is kept while the mass
      of the tokens above it is < p, which is how it is computed: `torch.topk` of the 64 most
      likely tokens per row (then 256, 1024, ... for the rows whose nucleus is wider), their
      running sum in float64. That is ~11× cheaper than sorting all V (49,152 for SmolLM2) on a
      language model's peaked rows, where a sort of every row dominated a decode step and the
      trainer's log-probs. The two roundings (HF's float32 ascending sum, this float64 one)
      can disagree only for a token whose tail mass is within float32 rounding of 1 − p.
    Computed without gradient (a mask is not a function to differentiate).

    Args:
        logits: [..., V] scores already divided by the temperature.
        top_k: keep the k most likely tokens (0, or k ≥ V: off).
        top_p: nucleus mass in (0, 1] (1: off).

    Returns:
        [..., V] bool (True = kept), or None when neither cut applies.
    """
    V = logits.shape[-1]
    cut_k = 0 < top_k < V
    if not cut_k and top_p >= 1.0:
        return None
    with torch.no_grad():
        z = logits.detach().float()
        keep = torch.ones_like(z, dtype=torch.bool)
        if cut_k:
            kth = torch.topk(z, top_k, dim=-1).values[..., -1:]
            keep = z >= kth
            z = z.masked_fill(~keep, float("-inf"))
        if top_p < 1.0:
            keep = keep & _nucleus(z.softmax(dim=-1), top_p)
    return keep


def _nucleus(probs: torch.Tensor, top_p: float, first_k: int = 64) -> torch.Tensor:
    """[..., V] bool: the tokens top-p keeps from `probs` [..., V] (see `truncation_mask`).

    Row by row, the most likely tokens are kept while the (float64) mass above each is < `top_p`.
    Each round takes `torch.topk` of k tokens of the rows still open; a row whose k-th token is
    still kept has a wider nucleus and goes to the next round with 4k (up to V: all of them).
    """
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)
    keep = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
    rows = torch.arange(flat.shape[0], device=flat.device)
    k = min(first_k, V)
    while rows.numel():
        values, index = torch.topk(flat[rows], k, dim=-1)  # descending
        mass = values.double()
        kept = mass.cumsum(dim=-1) - mass < top_p  # the mass above each token; the first is kept
        done = ~kept[:, -1] if k < V else torch.ones_like(kept[:, -1])
        finished = rows[done]
        keep[finished.unsqueeze(1).expand(-1, k), index[done]] = kept[done]
        rows = rows[~done]
        k = min(4 * k, V)
    return keep.reshape(probs.shape)


def truncate_logits(logits: torch.Tensor, top_k: int = 0, top_p: float = 1.0) -> torch.Tensor:
    """`logits` [..., V] with the tokens `truncation_mask` drops set to −inf (as is when both are off)."""
    keep = truncation_mask(logits, top_k, top_p)
    return logits if keep is None else logits.masked_fill(~keep, float("-inf"))
