"""`TransformersBackend`: generation with a Hugging Face causal LM that reports exact tokens.

The transformers backend batches token-id prompts (left-padded), prefills each distinct prompt
once (the G samples of a group share it), then decodes one token per step for the rows still
running (`TransformersBackend._decode`): a row that samples its end-of-turn token leaves the
batch, so a step costs what the running rows cost, not what the longest one does. It returns
for each prompt the sampled token ids (through the end-of-turn token, inclusive) and their
sampling log-probabilities. Nothing on this path re-tokenizes generated text.

Sampling is exactly what `SamplingParams` says and nothing else: the decode loop calls the
model's forward pass, never `model.generate`, so no field of a model folder's
`generation_config.json` (top_k, repetition_penalty, min_p, ...) can reach it. Temperature,
top-k and top-p (`textgym.agents.sampling.truncate_logits`), the recorded log-probability and
the draw (`inverse_cdf`: one float64 uniform per row, from the global RNG or each row's own
generator, `SeededSample`) are this module's.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    LogitsProcessor,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from textgym.agents.sampling import Generation, SamplingParams, eos_token_ids, truncate_logits


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The token whose CDF interval holds `u`: `c_{v-1} ≤ u_b · c_V < c_v`, with c the float64 running sum.

    The deterministic half of `inverse_cdf_sample` (see there): with `u ~ Uniform[0, 1)`
    token v is returned with probability (c_v − c_{v-1}) / c_V = p_v / Σ p, to float64
    rounding. Zero-probability tokens have empty intervals and are never returned.

    Args:
        probs: [B, V] non-negative weights (need not sum to 1), float32 or float64.
        u: [B, 1] float64 in [0, 1).

    Returns:
        [B, 1] int64 token ids.

    Raises:
        RuntimeError: when a row's total is not finite and positive (NaN, inf, or all zeros), as
            `torch.multinomial` does.
    """
    c = probs.double().cumsum_(-1)  # [B, V] float64, non-decreasing
    total = c[:, -1:].contiguous()  # [B, 1] (searchsorted wants contiguous values)
    if not bool(((total > 0) & torch.isfinite(total)).all()):
        raise RuntimeError("probability tensor contains either inf, nan or a row that sums to 0")
    drawn = torch.searchsorted(c, u.to(c) * total, right=True)  # [B, 1]
    # u · total can round up to total itself; the last token of positive mass is then the draw.
    return torch.minimum(drawn, torch.searchsorted(c, total, right=False))


def inverse_cdf_sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row from the categorical distribution `probs`, by inverse-CDF sampling.

    Row b's draw is `inverse_cdf(probs, u)[b]` with `u_b ~ Uniform[0, 1)` (53-bit float64, one
    per row): the token v with `c_{v-1} ≤ u_b · c_V < c_v`, where `c` is the float64 running
    sum of the row's probabilities, so P(v) = p_v / Σ p exactly, up to float64 rounding (2^-53
    relative), and the draw is from `probs` as given (Devroye 1986, "Non-Uniform Random
    Variate Generation", §III.2, sequential search by bisection). Zero-probability tokens
    (top-k / top-p filtered, −inf logits) are never drawn. It uses B random numbers where
    `torch.multinomial` draws B·V exponentials (its CPU cost is ~10× this one's at V = 1,024).

    Args:
        probs: [B, V] non-negative weights (need not sum to 1), float32 or float64.
        generator: the RNG (default: the global one of the device).

    Returns:
        [B, 1] int64 token ids.

    Raises:
        RuntimeError: see `inverse_cdf`.
    """
    u = torch.rand((probs.shape[0], 1), dtype=torch.float64, device=probs.device, generator=generator)
    return inverse_cdf(probs, u)


class SeededSample(LogitsProcessor):
    """Draws each row's next token from `softmax(scores)` with that row's own generator.

    Row i's draw is `inverse_cdf_sample` of its probabilities with a `torch.Generator`
    seeded by `seeds[i]` (one float64 uniform per row and step), so its t-th token depends
    only on its seed and its own logits: not on which other rows share the batch, nor on
    the global RNG. Exact to float64 rounding in the far tail too (a token of probability
    e^-18 is drawn at its rate; float32 Gumbel noise, clamped below 1 − 2^-23, drew it at
    0.3% of it). Filtered tokens (−inf) are never drawn. Returns scores that are 0 at the
    drawn token and −inf elsewhere, so the argmax that greedy search takes is the draw.

    Args:
        seeds: one seed per row of the generation batch.
        device: where the generators live (the scores' device).
    """

    def __init__(self, seeds: list[int], device: torch.device):
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return the one-hot (0 / −inf) scores of one draw per row, [B, V] float32."""
        probs = torch.softmax(scores.float(), dim=-1)
        drawn = torch.cat([inverse_cdf_sample(probs[b : b + 1], g) for b, g in enumerate(self.generators)])
        out = torch.full_like(probs, float("-inf"))
        return out.scatter_(-1, drawn, 0.0)  # type: ignore[return-value]


def _draw(
    logits: torch.Tensor,
    params: SamplingParams,
    rows: torch.Tensor,
    batch: int,
    generators: list[torch.Generator] | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One decode step's tokens and their log-probs ([b] each) from the running rows' `logits` [b, V].

    Greedy (T = 0): the argmax, its log-probability under `log_softmax(logits)`. Otherwise the
    logits are divided by T, truncated (`truncate_logits`: top-k, top-p), and each row draws by
    `inverse_cdf` from one float64 uniform: from its own generator (`generators[r]` for the
    row's original index r in `rows`), or from the global RNG, which draws `batch` uniforms
    (one per row of the full batch, finished or not) and keeps the running rows' ones.
    """
    scores = logits.float()
    if params.temperature == 0:
        drawn = scores.argmax(dim=-1)
        return drawn, torch.log_softmax(scores, dim=-1).gather(-1, drawn[:, None])[:, 0]
    if params.temperature != 1.0:
        scores = scores / params.temperature
    logp = torch.log_softmax(truncate_logits(scores, params.top_k, params.top_p), dim=-1)
    device = logits.device
    if generators is None:
        u = torch.rand((batch, 1), dtype=torch.float64, device=device)[rows]
    else:
        u = torch.cat(
            [
                torch.rand((1, 1), dtype=torch.float64, device=device, generator=generators[r])
                for r in rows.tolist()
            ]
        )
    drawn = inverse_cdf(logp.exp(), u)[:, 0]
    return drawn, logp.gather(-1, drawn[:, None])[:, 0]


class TransformersBackend:
    """In-process generation with a Hugging Face causal LM (the trainable policy itself).

    Prefill, then a decode loop over the model's forward pass (`_decode`): greedy takes the
    argmax; sampling divides by T, applies top-k / top-p (`truncate_logits`), records the
    log-probability of the drawn token under that distribution and draws by `inverse_cdf`.
    Rows that ended their turn leave the batch. No per-step logits are kept beyond one step.

    Args:
        model: the policy; generation runs under `torch.no_grad()` in eval mode.
        tokenizer: its tokenizer (pad and EOS ids are taken from it).
        batch_size: prompts per batch (bounds activation memory).

    Attributes:
        context_length: the model's context window in tokens (`max_position_embeddings`), or
            None when its config names none.
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        n = getattr(model.config, "max_position_embeddings", None)
        self.context_length: int | None = int(n) if isinstance(n, int) and n > 0 else None
        self.eos_ids = eos_token_ids(tokenizer, model.generation_config)
        self.pad_id = int(tokenizer.pad_token_id)  # type: ignore[arg-type]

    def _shared_prefix_cache(self, prompts: list[list[int]], ids: torch.Tensor, mask: torch.Tensor) -> Any:
        """Prefill each distinct prompt once (all but its last token) and gather the KV cache per row.

        A group of G samples of one task repeats its prompt G times; `generate` then only
        processes the last prompt token of each row. Returns None when no prompt repeats.
        """
        keys: dict[tuple[int, ...], int] = {}
        inverse = [keys.setdefault(tuple(p), len(keys)) for p in prompts]
        if len(keys) == len(prompts) or ids.shape[1] < 2:
            return None
        first = torch.tensor([inverse.index(k) for k in range(len(keys))], device=ids.device)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids[first, :-1],
            attention_mask=mask[first, :-1],
            position_ids=position_ids[first, :-1],
            use_cache=True,
            logits_to_keep=1,
        )
        cache = out.past_key_values
        cache.batch_select_indices(torch.tensor(inverse, device=ids.device))
        return cache

    @torch.no_grad()
    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Sample one response per prompt (prompts given as token ids).

        Args:
            prompts: token ids of each prompt.
            params: sampling parameters.
            seeds: one seed per prompt: each response is then sampled from its own generator
                (`SeededSample`), independent of batching and of the global RNG. None
                samples from the global torch RNG. Ignored when decoding greedily.

        Returns:
            One `Generation` per prompt, in order; its log-probs are those of the distribution
            each token was drawn from (after temperature, top-k and top-p: `_decode`).

        Raises:
            ValueError: if `seeds` is not one per prompt.
        """
        if seeds is not None and len(seeds) != len(prompts):
            raise ValueError(f"got {len(seeds)} seeds for {len(prompts)} prompts")
        out: list[Generation] = []
        for i in range(0, len(prompts), self.batch_size):
            chunk_seeds = None if seeds is None else seeds[i : i + self.batch_size]
            out += self._generate_batch(prompts[i : i + self.batch_size], params, chunk_seeds)
        return out

    def _generate_batch(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Generation]:
        device = next(self.model.parameters()).device
        P = max(len(p) for p in prompts)
        # Left-padded [B, P] ids and mask, built as lists (one tensor each, not two writes per row).
        ids = torch.tensor([[self.pad_id] * (P - len(p)) + list(p) for p in prompts], dtype=torch.long)
        mask = torch.tensor([[0] * (P - len(p)) + [1] * len(p) for p in prompts], dtype=torch.long)
        ids, mask = ids.to(device), mask.to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._shared_prefix_cache(prompts, ids, mask)
            tokens, logprobs, stopped = self._decode(ids, mask, cache, params, seeds)
        finally:
            self.model.train(was_training)
        return [
            Generation(t, torch.tensor(lp, dtype=torch.float32), "stop" if s else "length")
            for t, lp, s in zip(tokens, logprobs, stopped, strict=True)
        ]

    def _decode(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        cache: Any,
        params: SamplingParams,
        seeds: list[int] | None,
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """Sample up to `params.max_new_tokens` tokens per row; a row that ends its turn leaves the batch.

        The prompt ([B, P] left-padded `ids`, `mask`; `cache` holding all but its last token when
        `_shared_prefix_cache` prefilled it) is run once, then one token per step for the rows
        still running. A row leaves once it samples an end-of-turn id: its KV cache rows are
        dropped (`batch_select_indices`) as soon as a quarter of the rows in the batch are done, so
        a step's cost follows the rows still running, not the longest one (lockstep decoding paid
        for every row until the last finished).

        Each step's processing is the distribution `SamplingParams` names and nothing else:
        greedy takes the argmax of the logits; sampling divides by T, applies `truncate_logits`
        (top-k, top-p), records `log_softmax` of the result at the drawn token and draws by
        `inverse_cdf` from the global RNG (one float64 uniform for each of the B rows per step,
        finished or not, as the full batch drew before) or from each row's own generator
        (`SeededSample`'s: a row's tokens depend on its seed alone). One step of [rows, V] scores
        is held at a time.

        Returns:
            per row: the sampled ids (through the end-of-turn id, inclusive), their log-probs, and
            whether it stopped (else it used the whole budget).
        """
        B = ids.shape[0]
        device = ids.device
        greedy = params.temperature == 0
        generators = None if greedy or seeds is None else SeededSample(seeds, device).generators
        eos = torch.tensor(self.eos_ids, device=device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        if cache is None:
            out = self.model(
                input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1
            )
        else:  # the cache holds all but the last prompt token
            out = self.model(
                input_ids=ids[:, -1:],
                attention_mask=mask,
                position_ids=positions[:, -1:],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=1,
            )
        cache, logits = out.past_key_values, out.logits[:, -1, :]
        next_position = positions[:, -1] + 1  # [b]
        rows = torch.arange(B, device=device)  # the original row of each batch row
        running = torch.ones(B, dtype=torch.bool, device=device)  # batch rows not yet finished
        tokens: list[list[int]] = [[] for _ in range(B)]
        logprobs: list[list[float]] = [[] for _ in range(B)]
        stopped = [False] * B
        for step in range(params.max_new_tokens):
            drawn, lp = _draw(logits, params, rows, B, generators)
            for r, t, value, live in zip(
                rows.tolist(), drawn.tolist(), lp.tolist(), running.tolist(), strict=True
            ):
                if live:
                    tokens[r].append(t)
                    logprobs[r].append(value)
            ended = running & torch.isin(drawn, eos)
            for r in rows[ended].tolist():
                stopped[r] = True
            running = running & ~ended
            if not running.any() or step == params.max_new_tokens - 1:
                break
            if 4 * int((~running).sum()) >= len(rows):  # a quarter of the batch is done: drop them
                keep = running.nonzero()[:, 0]
                cache.batch_select_indices(keep)
                rows, mask, next_position, drawn = rows[keep], mask[keep], next_position[keep], drawn[keep]
                running = running[keep]
            mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=1)
            out = self.model(
                input_ids=drawn[:, None],
                attention_mask=mask,
                position_ids=next_position[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits = out.past_key_values, out.logits[:, -1, :]
            next_position = next_position + 1
        return tokens, logprobs, stopped
