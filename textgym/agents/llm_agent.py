"""`LLMAgent`: a chat-templated policy behind a generation backend that reports exact tokens.

The backend is the in-process transformers one (`TransformersBackend`, the trainable policy
itself), an in-process vLLM engine (`VLLMBackend`) or an OpenAI-compatible endpoint
(`OpenAIBackend`); `SamplingParams` and `Generation` (`textgym.agents.sampling`) are what
every backend takes and returns.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from textgym.agents.sampling import Generation, SamplingParams, eos_token_ids
from textgym.agents.transformers_backend import TransformersBackend
from textgym.models import load_model, load_tokenizer, resolve_model
from textgym.types import Message

__all__ = [
    "LLMAgent",
]


def _has_gen_config(path: str | Path) -> bool:
    return (Path(path) / "generation_config.json").is_file()


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

    @property
    def context_length(self) -> int | None:
        """The backend's context window in tokens, or None when it reports none (an endpoint).

        An episode's prompt, every turn and the next response must fit it: `rollout` truncates
        an episode before it outgrows it.
        """
        n = getattr(self.backend, "context_length", None)
        return int(n) if n else None

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        backend: Literal["transformers", "vllm"] = "transformers",
        vllm_kwargs: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> LLMAgent:
        """Load a model and generate with the transformers or the vLLM backend.

        `path` is a local HF folder, a packaged model name (pulled into the cache on first use)
        or a Hub id (`textgym.models.resolve_model`). With `backend="vllm"`, an in-process
        `VLLMBackend` loads the weights (`vllm_kwargs` go to it) and only the tokenizer is loaded here.

        Raises:
            FileNotFoundError, ValueError: see `textgym.models.load_model`.
            textgym.model_pull.PullError, ChecksumError: pulling a packaged model failed.
            ImportError: for the vllm backend when vLLM is not installed.
        """
        path = resolve_model(path)
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

        The tokenizer (a local folder with the served model's tokenizer and chat template, or a
        packaged model name) renders prompts to token ids and decodes the returned ids; a
        template that ignores tools gets them in its system prompt
        (`textgym.tools.prompt.ensure_tool_prompt`). The end-of-turn ids are the tokenizer's EOS
        (first: the one appended to a response that stops without one) plus those of the
        folder's `generation_config.json`, if any. kwargs go to `OpenAIBackend`.

        Raises:
            OSError: when the tokenizer folder cannot be loaded.
        """
        from transformers import AutoTokenizer

        from textgym.agents.openai_backend import OpenAIBackend
        from textgym.tools.prompt import ensure_tool_prompt

        tokenizer_path = resolve_model(tokenizer_path, require_config=False)
        tok = AutoTokenizer.from_pretrained(tokenizer_path)
        if tok.chat_template is not None:
            ensure_tool_prompt(tok)
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

        `seeds` (one per prompt) makes each response a function of its seed alone (and of the
        backend: the same seed samples other tokens on vLLM than on transformers); the
        transformers backend, vLLM (a per-request generator) and the `openai` backend (sent as
        each request's `seed`) take them.

        Raises:
            ValueError: if seeds are given to a backend that cannot honour them.
        """
        if seeds is None:
            return self.backend.generate(prompts, params)
        from textgym.agents.openai_backend import OpenAIBackend
        from textgym.agents.vllm_backend import VLLMBackend

        if not isinstance(self.backend, TransformersBackend | OpenAIBackend | VLLMBackend):
            name = type(self.backend).__name__
            raise ValueError(f"per-sequence seeds need the transformers, vllm or openai backend, not {name}")
        return self.backend.generate(prompts, params, seeds=seeds)

    def act(self, messages: list[Message], params: SamplingParams | None = None) -> str:
        """Reply to one conversation (greedy by default) and return the text."""
        params = params or SamplingParams(temperature=0.0)
        (gen,) = self.generate([self.encode_prompt(messages)], params)
        return self.decode(gen.token_ids)
