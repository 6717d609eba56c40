"""`TransformersBackend`: generation with a Hugging Face causal LM that reports exact tokens.

The transformers backend batches token-id prompts (left-padded), samples with
`model.generate`, and returns for each prompt the sampled token ids (through the
end-of-turn token, inclusive) and their sampling log-probabilities. Repeated prompts
(the G samples of a group) are prefilled once. Nothing on this path re-tokenizes
generated text.

Sampling is exactly what `SamplingParams` says: `generate` runs in greedy-search mode with
a neutral generation config (the model folder's `generation_config.json` is swapped out for
the call, keeping only its special-token ids), and textgym's own logits processors do all
the work — temperature, top-k, top-p, recording the sampled token's log-probability, and
drawing the token. Nothing a folder sets (top_k, repetition_penalty, min_p, ...) applies.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
)

from textgym.agents.sampling import Generation, SamplingParams, eos_token_ids, truncate_logits


class TruncationWarper(LogitsProcessor):
    """Top-k then top-p truncation (`textgym.agents.sampling.truncation_mask`): dropped tokens get −inf.

    The same function the trainer applies when it recomputes log-probs, so the recorded
    log-probs and the trainer's are of one distribution (HF's `TopKLogitsWarper` and
    `TopPLogitsWarper` keep the same tokens; this is the project's one definition of them).

    Args:
        top_k: keep the k most likely tokens (0: off).
        top_p: nucleus mass (1: off).
    """

    def __init__(self, top_k: int, top_p: float):
        self.top_k, self.top_p = top_k, top_p

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return `scores` [B, V] with the truncated tokens at −inf."""
        return truncate_logits(scores, self.top_k, self.top_p)  # type: ignore[return-value]


class SampledLogprobs(LogitsProcessor):
    """Records the log-probability of each sampled token, holding one step's [B, V] at most.

    Placed after the warpers and before the processor that draws the token: at step t it
    keeps `log_softmax(scores_t)` ([B, V], float32) until step t + 1, whose `input_ids`
    end with the token drawn at step t, and then keeps only that token's entry ([B]).
    `finish` gathers the last step from the returned sequences. Scores pass through unchanged.
    """

    def __init__(self) -> None:
        self.steps: list[torch.Tensor] = []  # [B] per finished step
        self.pending: torch.Tensor | None = None  # [B, V]: the latest step's log-softmax

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Record the previous step's token, keep this step's log-softmax; return `scores`."""
        if self.pending is not None:
            self.steps.append(self.pending.gather(-1, input_ids[:, -1:].to(self.pending.device))[:, 0])
        self.pending = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def finish(self, new_tokens: torch.Tensor) -> torch.Tensor:
        """The log-probabilities of `new_tokens` ([B, N], the generated columns), as [B, N] float32.

        Steps that `generate` ran and then undid (a deferred stop check) are dropped.

        Raises:
            RuntimeError: if fewer than N - 1 steps were recorded (the processor did not see
                every step of this generation).
        """
        n = new_tokens.shape[1]
        if n == 0:
            return torch.zeros(new_tokens.shape, dtype=torch.float32)
        if len(self.steps) < n - 1:
            raise RuntimeError(f"recorded {len(self.steps)} steps for {n} generated tokens")
        steps = self.steps[:n]
        if len(steps) < n:
            assert self.pending is not None
            last = new_tokens[:, -1:].to(self.pending.device)
            steps = [*steps, self.pending.gather(-1, last)[:, 0]]
        self.pending = None
        return torch.stack(steps, dim=1).float()


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


class MultinomialSample(LogitsProcessor):
    """Draws each row's next token from `softmax(scores)` with the global torch RNG.

    The draw is `inverse_cdf_sample` (one uniform per row), a draw from the same distribution
    as `torch.multinomial` (what `do_sample=True` calls) at a tenth of its CPU cost. Returns
    scores that are 0 at the drawn token and −inf elsewhere, so the argmax that greedy
    search takes is the draw.
    """

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return the one-hot (0 / −inf) scores of one draw per row, [B, V] float32."""
        probs = torch.softmax(scores.float(), dim=-1)
        drawn = inverse_cdf_sample(probs)  # [B, 1]
        out = torch.full_like(probs, float("-inf"))
        return out.scatter_(-1, drawn, 0.0)  # type: ignore[return-value]


_SPECIAL_TOKEN_FIELDS = ("eos_token_id", "pad_token_id", "bos_token_id", "decoder_start_token_id")


def neutral_generation_config(source: GenerationConfig | None) -> GenerationConfig:
    """A generation config that sets nothing but `source`'s special-token ids.

    Transformers fills every field a `generate` call leaves unset (None) from
    `model.generation_config` (`GenerationMixin._prepare_generation_config`), and many
    fields are only "off" when None (`min_p`, `bad_words_ids`, `suppress_tokens`,
    `sequence_bias`, `forced_bos_token_id`, ...). Swapped in for the call, this config leaves
    them None, so nothing from a folder's `generation_config.json` reaches sampling.
    """
    ids = {k: getattr(source, k, None) for k in _SPECIAL_TOKEN_FIELDS} if source is not None else {}
    return GenerationConfig(**{k: v for k, v in ids.items() if v is not None})


def _generation_owners(model: Any) -> list[Any]:
    """The objects whose `generation_config` `model.generate` reads.

    The model itself, the base model of a peft wrapper (`get_base_model()`, whose config
    peft's `generate` copies), the module inside `torch.compile` (`_orig_mod`): those among
    them that hold a `generation_config` attribute of their own.

    Raises:
        TypeError: when none does (its generation config could not be neutralised).
    """
    owners: list[Any] = []
    todo = [model]
    while todo:
        m = todo.pop()
        if any(m is o for o in owners):
            continue
        owners.append(m)
        get_base = getattr(m, "get_base_model", None)
        if callable(get_base):
            todo.append(get_base())
        if isinstance(getattr(m, "_orig_mod", None), torch.nn.Module):
            todo.append(m._orig_mod)
    found = [m for m in owners if "generation_config" in vars(m)]
    if not found:
        raise TypeError(f"{type(model).__name__} holds no generation_config to neutralise for generate()")
    return found


@contextmanager
def neutral_generation(model: Any) -> Iterator[None]:
    """Swap `model`'s generation config for `neutral_generation_config(...)` inside the block.

    The model's own config object is put back afterwards, untouched (what a user saves with
    the model is what they loaded or set).

    Raises:
        TypeError: see `_generation_owners`.
    """
    owners = _generation_owners(model)
    saved = [m.generation_config for m in owners]
    try:
        for m, cfg in zip(owners, saved, strict=True):
            m.generation_config = neutral_generation_config(cfg)
        yield
    finally:
        for m, cfg in zip(owners, saved, strict=True):
            m.generation_config = cfg


class TransformersBackend:
    """In-process generation with a Hugging Face causal LM (the trainable policy itself).

    `model.generate` runs as greedy search (`do_sample=False`, one beam) under
    `neutral_generation`, with explicit neutral values for the processing fields, and the
    sampling is textgym's processors: `TemperatureLogitsWarper` (when T ≠ 1), `TruncationWarper`
    (top-k, top-p, when on), `SampledLogprobs`, then the draw (`MultinomialSample`
    from the global RNG, or `SeededSample` with per-row generators). Greedy decoding runs
    `SampledLogprobs` alone (T = 1). No per-step logits are kept beyond one step.

    Args:
        model: the policy; generation runs under `torch.no_grad()` in eval mode.
        tokenizer: its tokenizer (pad and EOS ids are taken from it).
        batch_size: prompts per `generate` call (bounds activation memory).

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
            each token was drawn from (`SampledLogprobs`).

        Raises:
            ValueError: if `seeds` is not one per prompt.
            TypeError: if the model's generation config cannot be swapped out (see
                `neutral_generation`).
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
        greedy = params.temperature == 0
        recorder = SampledLogprobs()
        processors = LogitsProcessorList()
        if not greedy:
            # HF's warper order (temperature, top-k, top-p); the recorder sees what is drawn from.
            if params.temperature != 1.0:  # x / 1.0 is x exactly: no [B, V] pass per token at T = 1
                processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0 or params.top_p < 1:
                processors.append(TruncationWarper(params.top_k, params.top_p))
        processors.append(recorder)
        if not greedy:
            processors.append(MultinomialSample() if seeds is None else SeededSample(seeds, device))
        # Greedy search over textgym's processors. Every processing field is explicit and
        # neutral; those whose neutral value is None (min_p, bad_words_ids, suppress_tokens,
        # sequence_bias, forced_bos/eos_token_id, ...) stay None because the model's own config
        # is swapped for a neutral one (`neutral_generation`). HF's warpers (top_k, top_p,
        # min_p, typical_p, epsilon/eta cutoff) only run with do_sample=True, which is never set.
        config = GenerationConfig(
            do_sample=False,
            num_beams=1,
            num_return_sequences=1,
            temperature=1.0,
            top_p=1.0,
            typical_p=1.0,
            epsilon_cutoff=0.0,
            eta_cutoff=0.0,
            repetition_penalty=1.0,
            encoder_repetition_penalty=1.0,
            length_penalty=1.0,
            no_repeat_ngram_size=0,
            encoder_no_repeat_ngram_size=0,
            min_new_tokens=0,
            renormalize_logits=False,
            remove_invalid_values=False,
            guidance_scale=1.0,
            use_cache=True,
            max_new_tokens=params.max_new_tokens,
            eos_token_id=self.eos_ids,
            pad_token_id=self.pad_id,
            output_logits=False,
            output_scores=False,
            return_dict_in_generate=False,
        )
        ids, mask = ids.to(device), mask.to(device)
        was_training = self.model.training
        self.model.eval()
        try:
            cache = self._shared_prefix_cache(prompts, ids, mask)
            with neutral_generation(self.model):
                sequences = self.model.generate(  # type: ignore[operator]
                    input_ids=ids,
                    attention_mask=mask,
                    past_key_values=cache,
                    generation_config=config,
                    logits_processor=processors,
                    synced_gpus=False,  # sharded models generate inside `distributed.full_params`
                )
        finally:
            self.model.train(was_training)
        new = sequences[:, P:]  # [B, N]
        lp = recorder.finish(new).cpu()  # [B, N]
        new = new.cpu()
        # Each row ends at its first end-of-turn token (inclusive), else it used the whole budget.
        is_eos = torch.isin(new, torch.tensor(self.eos_ids))  # [B, N]
        stopped = is_eos.any(dim=1).tolist()
        first = (is_eos.int().argmax(dim=1) + 1).tolist() if new.shape[1] else [0] * len(stopped)
        gens = []
        for i, (row, stop, n_stop) in enumerate(zip(new.tolist(), stopped, first, strict=True)):
            n = n_stop if stop else len(row)
            gens.append(Generation(row[:n], lp[i, :n].clone(), "stop" if stop else "length"))
        return gens
