"""`LLMAgent`: a chat-templated policy behind a generation backend that reports exact tokens.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    GenerationConfig,
    LogitsProcessor,
    LogitsProcessorList,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from textgym.models import load_model, load_tokenizer
from textgym.types import Message


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
    """

    token_ids: list[int]
    logprobs: torch.Tensor
    finish_reason: Literal["stop", "length"]


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


class SeededGumbelNoise(LogitsProcessor):
    """Adds Gumbel noise from one generator per row, so that greedy decoding draws a sample.

    The Gumbel-max trick (Gumbel 1954; Maddison et al. 2014, arXiv:1411.0030, §2):
    `argmax_v(s_v + g_v)` with `g_v = −log(−log U_v)`, `U_v ~ Uniform(0, 1)` i.i.d., is
    distributed as `softmax(s)`. Row i's noise comes from its own `torch.Generator` seeded
    with `seeds[i]`, so its t-th token depends only on its seed and its own logits, not on
    which other rows share the batch or on the global RNG. Filtered logits (−inf) stay −inf.

    Args:
        seeds: one seed per row of the generation batch.
        device: where the generators (and the noise) live.
    """

    def __init__(self, seeds: list[int], device: torch.device):
        self.generators = [torch.Generator(device=device).manual_seed(int(s)) for s in seeds]
        self.device = device

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return `scores + Gumbel noise`, [B, V] (float32)."""
        V = scores.shape[-1]
        u = torch.stack([torch.rand(V, generator=g, device=self.device) for g in self.generators])
        tiny = torch.finfo(u.dtype).tiny
        u = u.clamp_(min=tiny, max=1.0 - torch.finfo(u.dtype).eps)
        noise = -torch.log(-torch.log(u))
        return scores.float() + noise.to(scores.device)  # type: ignore[return-value]


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


class MultinomialSample(LogitsProcessor):
    """Draws each row's next token from `softmax(scores)` with the global torch RNG.

    Returns scores that are 0 at the drawn token and −inf elsewhere, so the argmax that
    greedy search takes is the draw (the same `torch.multinomial` call that
    `do_sample=True` makes, here under textgym's control).
    """

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return the one-hot (0 / −inf) scores of one draw per row, [B, V] float32."""
        probs = torch.softmax(scores.float(), dim=-1)
        drawn = torch.multinomial(probs, num_samples=1)  # [B, 1]
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


def _has_gen_config(path: str | Path) -> bool:
    return (Path(path) / "generation_config.json").is_file()


class TransformersBackend:
    """In-process generation with a Hugging Face causal LM (the trainable policy itself).

    `model.generate` runs as greedy search (`do_sample=False`, one beam) under
    `neutral_generation`, with explicit neutral values for the processing fields, and the
    sampling is textgym's processors: `TemperatureLogitsWarper`, `TopKLogitsWarper`,
    `TopPLogitsWarper` (when on), `SampledLogprobs`, then the draw (`MultinomialSample`
    from the global RNG, or `SeededGumbelNoise` with per-row seeds). Greedy decoding runs
    `SampledLogprobs` alone (T = 1). No per-step logits are kept beyond one step.

    Args:
        model: the policy; generation runs under `torch.no_grad()` in eval mode.
        tokenizer: its tokenizer (pad and EOS ids are taken from it).
        batch_size: prompts per `generate` call (bounds activation memory).
    """

    def __init__(self, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, batch_size: int = 64):
        self.model = model
        self.tokenizer = tokenizer
        self.batch_size = batch_size
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
                (`SeededGumbelNoise`), independent of batching and of the global RNG. None
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
        ids = torch.full((len(prompts), P), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), P), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, P - len(p) :] = torch.tensor(p, dtype=torch.long)
            mask[i, P - len(p) :] = 1
        greedy = params.temperature == 0
        recorder = SampledLogprobs()
        processors = LogitsProcessorList()
        if not greedy:
            # HF's warper order (temperature, top-k, top-p); the recorder sees what is drawn from.
            processors.append(TemperatureLogitsWarper(params.temperature))
            if params.top_k > 0:
                processors.append(TopKLogitsWarper(params.top_k))
            if params.top_p < 1:
                processors.append(TopPLogitsWarper(params.top_p))
        processors.append(recorder)
        if not greedy:
            processors.append(MultinomialSample() if seeds is None else SeededGumbelNoise(seeds, device))
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
        gens = []
        eos = torch.tensor(self.eos_ids)
        for i in range(new.shape[0]):
            is_eos = torch.isin(new[i], eos).nonzero()
            if len(is_eos):
                n, reason = int(is_eos[0]) + 1, "stop"
            else:
                n, reason = new.shape[1], "length"
            gens.append(Generation(new[i, :n].tolist(), lp[i, :n].clone(), reason))  # type: ignore[arg-type]
        return gens


class LLMAgent:
    """A policy that answers chat messages: chat template + generation backend.

    Args:
        model: a Hugging Face causal LM (None with a remote backend).
        tokenizer: its tokenizer, with a chat template.
        backend: "transformers" (in-process, trainable), or a backend object with
            `generate(prompts, params)` and `eos_ids` (`VLLMBackend`, see `from_pretrained`;
            `OpenAIBackend`, see `from_endpoint`).
        batch_size: prompts per generation call.

    Raises:
        ValueError: on an unknown backend, no model for the transformers backend, or a
            tokenizer without a chat template.
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        backend: Any = "transformers",
        batch_size: int = 64,
    ):
        if tokenizer.chat_template is None:
            raise ValueError("the tokenizer has no chat_template")
        self.model = model
        self.tokenizer = tokenizer
        if isinstance(backend, str):
            if backend != "transformers":
                raise ValueError(
                    f"unknown backend {backend!r}; available: 'transformers', or "
                    "LLMAgent.from_pretrained(path, backend='vllm') / LLMAgent.from_endpoint(...)"
                )
            if model is None:
                raise ValueError("the transformers backend needs a model")
            self.backend = TransformersBackend(model, tokenizer, batch_size)
        else:
            self.backend = backend

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        backend: Literal["transformers", "vllm"] = "transformers",
        vllm_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> LLMAgent:
        """Load a local HF folder and generate with the transformers or the vLLM backend.

        With `backend="vllm"`, an in-process `VLLMBackend` loads the weights (`vllm_kwargs`
        go to it) and only the tokenizer is loaded here.

        Raises:
            FileNotFoundError, ValueError: see `textgym.models.load_model`.
            ImportError: for the vllm backend when vLLM is not installed.
        """
        if backend == "transformers":
            model, tok = load_model(path)
            return cls(model, tok, **kwargs)
        if backend != "vllm":
            raise ValueError(f"unknown backend {backend!r}; available: 'transformers', 'vllm'")
        from textgym.agents.vllm_backend import VLLMBackend

        tok = load_tokenizer(path)
        eos = eos_token_ids(tok, GenerationConfig.from_pretrained(path) if _has_gen_config(path) else None)
        engine = VLLMBackend(path, eos, **(vllm_kwargs or {}))
        kwargs.pop("batch_size", None)
        return cls(None, tok, backend=engine, **kwargs)

    @classmethod
    def from_endpoint(cls, base_url: str, model: str, tokenizer_path: str | Path, **kwargs: Any) -> LLMAgent:
        """An agent generating through an OpenAI-compatible endpoint (`OpenAIBackend`).

        The tokenizer (a local folder with the served model's tokenizer and chat template)
        renders prompts to token ids and decodes the returned ids; the end-of-turn ids are
        the tokenizer's EOS (first: the one appended to a response that stops without one)
        plus those of the folder's `generation_config.json`, if any. kwargs go to
        `OpenAIBackend`.

        Raises:
            OSError: when the tokenizer folder cannot be loaded.
        """
        from transformers import AutoTokenizer

        from textgym.agents.openai_backend import OpenAIBackend

        tok = AutoTokenizer.from_pretrained(tokenizer_path)
        gen = GenerationConfig.from_pretrained(tokenizer_path) if _has_gen_config(tokenizer_path) else None
        eos = sorted(eos_token_ids(tok, gen), key=lambda i: i != tok.eos_token_id)
        return cls(None, tok, backend=OpenAIBackend(base_url, model, eos, **kwargs))

    def encode_prompt(self, messages: list[Message], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """Render `messages` with the chat template (generation prompt added) into token ids.

        `tools` (OpenAI function schemas, e.g. a tool env's `info["tools"]`) go to the
        template's `tools=` argument.
        """
        ids = self.tokenizer.apply_chat_template(
            messages,
            tools=tools or None,  # type: ignore[arg-type]
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        return list(ids)  # type: ignore[arg-type]

    def decode(self, token_ids: list[int]) -> str:
        """Decode generated ids to the text an environment receives (end-of-turn id dropped)."""
        if token_ids and token_ids[-1] in self.backend.eos_ids:
            token_ids = token_ids[:-1]
        return str(self.tokenizer.decode(token_ids, skip_special_tokens=False))

    def generate(
        self, prompts: list[list[int]], params: SamplingParams, seeds: list[int] | None = None
    ) -> list[Generation]:
        """Sample one response per token-id prompt.

        `seeds` (one per prompt) makes each response a function of its seed alone; only the
        transformers backend takes them.

        Raises:
            ValueError: if seeds are given to a backend that cannot honour them.
        """
        if seeds is None:
            return self.backend.generate(prompts, params)
        if not isinstance(self.backend, TransformersBackend):
            name = type(self.backend).__name__
            raise ValueError(f"per-sequence seeds need the transformers backend, not {name}")
        return self.backend.generate(prompts, params, seeds=seeds)

    def act(self, messages: list[Message], params: SamplingParams | None = None) -> str:
        """Reply to one conversation (greedy by default) and return the text."""
        params = params or SamplingParams(temperature=0.0)
        (gen,) = self.generate([self.encode_prompt(messages)], params)
        return self.decode(gen.token_ids)
