"""`textgym serve MODEL_DIR`: an OpenAI-compatible HTTP server of a local model (FastAPI + uvicorn).

Endpoints: `GET /v1/models`, `POST /v1/completions` (prompt as text or token ids; with
`logprobs` and `return_tokens_as_token_ids`, each sampled token comes back as "token_id:N"
with its log-probability, as vLLM's server does), `POST /v1/chat/completions` (messages
rendered by the model's chat template). Generation is textgym's transformers backend or,
with `--backend vllm`, an in-process vLLM engine; one request at a time. The `openai` agent
backend talks to this server or to any other OpenAI-compatible one.
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


class CompletionRequest(BaseModel):
    """The fields of OpenAI's completions request that textgym serves (others are ignored)."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    prompt: str | list[int] | list[list[int]] | list[str]
    max_tokens: int = Field(16, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    logprobs: int | None = Field(None, ge=0, le=1)
    return_tokens_as_token_ids: bool = False


class ChatRequest(BaseModel):
    """The fields of OpenAI's chat completions request that textgym serves."""

    model_config = ConfigDict(extra="ignore")
    model: str = ""
    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int = Field(256, ge=1, le=32768)
    temperature: float = Field(1.0, ge=0.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    logprobs: bool = False


def build_app(
    model_dir: str | Path,
    served_name: str | None = None,
    device: str = "cpu",
    backend_name: str = "transformers",
) -> FastAPI:
    """The server app for the model in `model_dir` (loaded once, on `device`).

    Args:
        model_dir: a local Hugging Face model folder.
        served_name: the model name clients ask for (default: the folder's name).
        device: where the transformers backend runs ("cpu", "cuda", ...).
        backend_name: "transformers" or "vllm" (`VLLMBackend`, which picks its own device).

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
        backend = VLLMBackend(model_dir, eos)
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
        params = SamplingParams(req.temperature, req.top_p, req.top_k, req.max_tokens)
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
        params = SamplingParams(req.temperature, req.top_p, 0, req.max_tokens)
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
