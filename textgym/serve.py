"""`textgym serve MODEL_DIR`: an OpenAI-compatible HTTP server of a local model (FastAPI + uvicorn).

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt as text or token ids; with
`logprobs` and `return_tokens_as_token_ids`, each sampled token comes back as "token_id:N"
with its log-probability, as vLLM's server does), `POST /v1/chat/completions` (messages
rendered by the model's chat template). Generation is textgym's transformers backend or,
with `--backend vllm`, an in-process vLLM engine; one request at a time. The `openai` agent
backend talks to this server or to any other OpenAI-compatible one.

Sampling is exactly what a request asks: `temperature`, `top_p` and `top_k`, each defaulting
to textgym's `SamplingParams` default (1.0, 1.0, 0 = off) when unset — never to the model
folder's `generation_config.json`. The other sampling fields vLLM's server takes
(`min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `min_tokens`) are
accepted at their neutral values (what textgym's `openai` backend sends) and refused with
HTTP 400 otherwise.
"""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from textgym.agents.llm_agent import SamplingParams, TransformersBackend
from textgym.models import load_model, load_tokenizer

_DEFAULT = SamplingParams()

NEUTRAL_SAMPLING_FIELDS: dict[str, float] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
}
"""Sampling fields of vLLM's server that textgym does not implement, with the value that turns each off."""


class _Sampling(BaseModel):
    """The sampling fields shared by both requests (unset: textgym's defaults)."""

    model_config = ConfigDict(extra="ignore")
    temperature: float = Field(_DEFAULT.temperature, ge=0.0)
    top_p: float = Field(_DEFAULT.top_p, gt=0.0, le=1.0)
    top_k: int = Field(_DEFAULT.top_k, ge=-1, description="0 or -1: off (vLLM's convention)")
    min_p: float = NEUTRAL_SAMPLING_FIELDS["min_p"]
    repetition_penalty: float = NEUTRAL_SAMPLING_FIELDS["repetition_penalty"]
    presence_penalty: float = NEUTRAL_SAMPLING_FIELDS["presence_penalty"]
    frequency_penalty: float = NEUTRAL_SAMPLING_FIELDS["frequency_penalty"]
    min_tokens: int = int(NEUTRAL_SAMPLING_FIELDS["min_tokens"])

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The `SamplingParams` this request asks for.

        Raises:
            HTTPException: 400 when a field textgym does not implement is not at its neutral value.
        """
        bad = {k: getattr(self, k) for k, v in NEUTRAL_SAMPLING_FIELDS.items() if getattr(self, k) != v}
        if bad:
            raise HTTPException(
                400,
                f"textgym serve samples with temperature, top_p and top_k only; {bad} must be "
                f"left unset or sent as { ({k: NEUTRAL_SAMPLING_FIELDS[k] for k in bad}) }",
            )
        return SamplingParams(self.temperature, self.top_p, max(self.top_k, 0), max_tokens)


class CompletionRequest(_Sampling):
    """The fields of OpenAI's completions request that textgym serves (others are ignored)."""

    model: str = ""
    prompt: str | list[int] | list[list[int]] | list[str]
    max_tokens: int = Field(16, ge=1, le=32768)
    logprobs: int | None = Field(None, ge=0, le=1)
    return_tokens_as_token_ids: bool = False


class ChatRequest(_Sampling):
    """The fields of OpenAI's chat completions request that textgym serves."""

    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    logprobs: bool = False


def build_app(
    model_dir: str | Path,
    served_name: str | None = None,
    device: str = "cpu",
    backend_name: str = "transformers",
    vllm_kwargs: dict[str, Any] | None = None,
) -> FastAPI:
    """The server app for the model in `model_dir` (loaded once, on `device`).

    Args:
        model_dir: a local Hugging Face model folder.
        served_name: the model name clients ask for (default: the folder's name).
        device: where the transformers backend runs ("cpu", "cuda", ...).
        backend_name: "transformers" or "vllm" (`VLLMBackend`, which picks its own device).
        vllm_kwargs: passed to `VLLMBackend` (e.g. `{"dtype": "float32"}`; its default "auto"
            lets vLLM choose, which on CPU can be bfloat16 for a float32 checkpoint).

    Raises:
        FileNotFoundError / ValueError: from `load_model` when the folder is not a usable model,
            or on an unknown backend.
        ImportError: for the vllm backend when vLLM is not installed.
    """
    backend: Any
    if backend_name == "transformers":
        model, tokenizer = load_model(model_dir)
        model.to(device)  # type: ignore[arg-type]
        backend = TransformersBackend(model, tokenizer, batch_size=64)
    elif backend_name == "vllm":
        from transformers import GenerationConfig

        from textgym.agents.llm_agent import eos_token_ids
        from textgym.agents.vllm_backend import VLLMBackend

        tokenizer = load_tokenizer(model_dir)
        gen = Path(model_dir) / "generation_config.json"
        eos = eos_token_ids(tokenizer, GenerationConfig.from_pretrained(model_dir) if gen.is_file() else None)
        backend = VLLMBackend(model_dir, eos, **(vllm_kwargs or {}))
    else:
        raise ValueError(f"unknown backend {backend_name!r}; available: 'transformers', 'vllm'")
    name = served_name or Path(model_dir).name
    lock = threading.Lock()
    app = FastAPI(title="textgym serve", docs_url=None, redoc_url=None)

    def sample(prompts: list[list[int]], params: SamplingParams) -> list[Any]:
        with lock:
            return backend.generate(prompts, params)

    @app.get("/v1/models")
    def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "textgym"}]}

    @app.post("/v1/completions")
    def completions(req: CompletionRequest) -> dict[str, Any]:
        if req.model and req.model != name:
            raise HTTPException(404, f"model {req.model!r} is not served here; this server serves {name!r}")
        raw = req.prompt
        if isinstance(raw, str):
            prompts = [tokenizer(raw, add_special_tokens=False)["input_ids"]]
        elif raw and all(isinstance(x, int) for x in raw):
            prompts = [list(raw)]  # type: ignore[arg-type]
        elif raw and all(isinstance(x, str) for x in raw):
            prompts = [tokenizer(x, add_special_tokens=False)["input_ids"] for x in raw]  # type: ignore[arg-type]
        else:
            prompts = [list(p) for p in raw]  # type: ignore[union-attr,arg-type]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise HTTPException(400, "empty prompt")
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise HTTPException(400, f"prompt token ids must be in [0, {vocab})")
        params = req.sampling_params(req.max_tokens)
        gens = sample(prompts, params)
        choices = []
        for i, g in enumerate(gens):
            choice: dict[str, Any] = {
                "index": i,
                "text": tokenizer.decode(g.token_ids, skip_special_tokens=False),
                "finish_reason": g.finish_reason,
            }
            if req.logprobs is not None:
                tokens = (
                    [f"token_id:{t}" for t in g.token_ids]
                    if req.return_tokens_as_token_ids
                    else [tokenizer.decode([t]) for t in g.token_ids]
                )
                choice["logprobs"] = {"tokens": tokens, "token_logprobs": g.logprobs.tolist()}
            choices.append(choice)
        return {
            "id": f"cmpl-{uuid.uuid4().hex}",
            "object": "text_completion",
            "created": int(time.time()),
            "model": name,
            "choices": choices,
            "usage": {
                "prompt_tokens": sum(len(p) for p in prompts),
                "completion_tokens": sum(len(g.token_ids) for g in gens),
            },
        }

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest) -> dict[str, Any]:
        if req.model and req.model != name:
            raise HTTPException(404, f"model {req.model!r} is not served here; this server serves {name!r}")
        try:
            ids = tokenizer.apply_chat_template(
                req.messages, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:
            raise HTTPException(400, f"cannot render the messages: {e}") from None
        params = req.sampling_params(req.max_tokens)
        (g,) = sample([list(ids)], params)  # type: ignore[arg-type]
        ids_out = g.token_ids[:-1] if g.finish_reason == "stop" else g.token_ids
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": tokenizer.decode(ids_out, skip_special_tokens=False)},
            "finish_reason": g.finish_reason,
        }
        if req.logprobs:
            choice["logprobs"] = {
                "content": [
                    {"token": f"token_id:{t}", "logprob": float(lp)}
                    for t, lp in zip(g.token_ids, g.logprobs.tolist(), strict=True)
                ]
            }
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": name,
            "choices": [choice],
        }

    return app
