"""The OpenAI protocol of `textgym serve`: request models, OpenAI-shaped errors, reply pieces.

Requests are pydantic models (`CompletionRequest`, `ChatRequest`); fields OpenAI defines that
textgym does not implement are refused with HTTP 400 naming the field (`unsupported_fields`),
never silently ignored. Errors are `{"error": {"message", "type", "param", "code"}}`
(`APIError`). The pure helpers that build a reply from generated token ids live here too:
stop strings (`cut_at_stop`), token strings and log-probabilities (`token_strings`), and
Hermes tool calls (`tool_calls_from_text`).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from textgym.agents.sampling import SamplingParams
from textgym.tools.base import TOOL_CALL_RE, parse_tool_calls

_DEFAULT = SamplingParams()

NEUTRAL_SAMPLING_FIELDS: dict[str, float] = {
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "min_tokens": 0,
}
"""Sampling fields of vLLM's server that textgym does not implement, with the value that turns each off."""

OFF_VALUES: dict[str, Any] = {"logit_bias": None, "best_of": None, "echo": False, "suffix": None}
"""Fields OpenAI defines that textgym does not implement, accepted only at the value that leaves them off."""
IGNORED_FIELDS = frozenset(
    {"metadata", "store", "service_tier", "parallel_tool_calls", "prediction", "modalities"}
)
"""Request fields that do not change generation; accepted and ignored."""

MAX_N = 16
"""The most choices one request may ask for (`n`)."""
MAX_TOP_LOGPROBS = 20
"""The most alternatives per position (`top_logprobs`, or the completions endpoint's `logprobs`)."""


class APIError(Exception):
    """An error answered as OpenAI does: HTTP `status` with `{"error": {message, type, param, code}}`.

    Args:
        status: HTTP status (400 bad request, 404 unknown model, 503 overloaded, 500 other).
        message: what went wrong, for a person.
        param: the request field at fault (e.g. "temperature"), or None.
        code: a short machine-readable code (e.g. "model_not_found"), or None.
    """

    TYPES: ClassVar[dict[int, str]] = {
        400: "invalid_request_error",
        404: "not_found_error",
        503: "overloaded_error",
    }

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code

    def body(self) -> dict[str, Any]:
        """The JSON body: `{"error": {"message", "type", "param", "code"}}`."""
        kind = self.TYPES.get(self.status, "server_error" if self.status >= 500 else "invalid_request_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.code}}


class StreamOptions(BaseModel):
    """`stream_options`: `include_usage` adds a last chunk with the usage and no choices."""

    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class _Common(BaseModel):
    """The fields both endpoints share (sampling unset: textgym's `SamplingParams` defaults)."""

    model_config = ConfigDict(extra="allow")
    model: str = ""
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, description="0 or -1: off (vLLM's convention)")
    min_p: float = NEUTRAL_SAMPLING_FIELDS["min_p"]
    repetition_penalty: float = NEUTRAL_SAMPLING_FIELDS["repetition_penalty"]
    presence_penalty: float = NEUTRAL_SAMPLING_FIELDS["presence_penalty"]
    frequency_penalty: float = NEUTRAL_SAMPLING_FIELDS["frequency_penalty"]
    min_tokens: int = int(NEUTRAL_SAMPLING_FIELDS["min_tokens"])
    n: int = Field(1, ge=1, le=MAX_N)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    return_tokens_as_token_ids: bool = False

    def unsupported_fields(self) -> None:
        """Refuse what is not implemented.

        Raises:
            APIError: 400 naming the first field that is unknown to textgym (an extra field
                other than the metadata ones) or set to a value textgym does not implement.
        """
        for k, v in NEUTRAL_SAMPLING_FIELDS.items():
            if getattr(self, k) != v:
                raise APIError(
                    400,
                    f"textgym serve samples with temperature, top_p and top_k only; {k}={getattr(self, k)!r} "
                    f"must be left unset or sent as {v!r}",
                    param=k,
                )
        for k, v in (self.model_extra or {}).items():
            if k in IGNORED_FIELDS:
                continue
            if k in OFF_VALUES and v == OFF_VALUES[k]:
                continue
            raise APIError(400, f"textgym serve does not implement {k!r}", param=k)
        if self.stream_options is not None and not self.stream:
            raise APIError(400, "stream_options needs stream=true", param="stream_options")

    def stop_strings(self) -> list[str]:
        """The stop strings, empty ones dropped (at most 4, as OpenAI allows).

        Raises:
            APIError: 400 (param "stop") for more than 4.
        """
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > 4:
            raise APIError(400, "at most 4 stop strings", param="stop")
        return [s for s in stops if s]

    def sampling_params(self, max_tokens: int) -> SamplingParams:
        """The `SamplingParams` this request asks for (unset fields: textgym's defaults).

        Raises:
            APIError: 400 naming a field textgym does not implement (see `unsupported_fields`).
        """
        self.unsupported_fields()
        return SamplingParams(
            _DEFAULT.temperature if self.temperature is None else self.temperature,
            _DEFAULT.top_p if self.top_p is None else self.top_p,
            max(_DEFAULT.top_k if self.top_k is None else self.top_k, 0),
            max_tokens,
        )


class CompletionRequest(_Common):
    """OpenAI's completions request (`/v1/completions`): prompt as text or token ids."""

    prompt: str | list[int] | list[list[int]] | list[str]
    max_tokens: int = Field(16, ge=1, le=32768)
    logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    seeds: list[Annotated[int, Field(ge=0, lt=2**63)]] | None = None
    """textgym's extension for batched requests: one seed per prompt, each in [0, 2**63).
    Choice c of prompt p is sampled as a request of prompt p alone with `seed: seeds[p]`
    would sample it, so a batch of prompts costs one request instead of one each."""

    @model_validator(mode="after")
    def _one_kind_of_seed(self) -> CompletionRequest:
        if self.seeds is not None and self.seed is not None:
            raise ValueError("send seed (one for the request) or seeds (one per prompt), not both")
        return self


class FunctionDef(BaseModel):
    """A tool's function declaration (`tools[i].function`)."""

    model_config = ConfigDict(extra="allow")
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolDef(BaseModel):
    """One entry of `tools`: `{"type": "function", "function": {...}}`."""

    model_config = ConfigDict(extra="forbid")
    type: Literal["function"] = "function"
    function: FunctionDef


class ChatRequest(_Common):
    """OpenAI's chat completions request (`/v1/chat/completions`)."""

    messages: list[dict[str, Any]] = Field(min_length=1)
    max_tokens: int | None = Field(None, ge=1, le=32768)
    max_completion_tokens: int | None = Field(None, ge=1, le=32768)
    logprobs: bool = False
    top_logprobs: int | None = Field(None, ge=0, le=MAX_TOP_LOGPROBS)
    tools: list[ToolDef] | None = None
    tool_choice: str | dict[str, Any] | None = None

    def budget(self) -> int:
        """The response budget in tokens: `max_completion_tokens`, else `max_tokens`, else 256."""
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens if self.max_tokens is not None else 256

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The tools to render with the chat template (None: no tools, or `tool_choice="none"`).

        Raises:
            APIError: 400 (param "tool_choice") for "required" or a named function (not
                enforced by textgym, so refused), or for a tool_choice without tools.
        """
        choice = self.tool_choice
        if choice is not None and choice not in ("auto", "none"):
            raise APIError(
                400,
                "textgym serve implements tool_choice 'auto' and 'none' only "
                "('required' and a named function would need constrained decoding)",
                param="tool_choice",
            )
        if not self.tools or choice == "none":
            return None
        return [t.model_dump(exclude_none=True) for t in self.tools]


def new_id(prefix: str) -> str:
    """A fresh response id, e.g. "chatcmpl-<32 hex>"."""
    return f"{prefix}-{uuid.uuid4().hex}"


def cut_at_stop(
    ids: list[int], decode: Callable[[list[int]], str], stops: list[str]
) -> tuple[int, str] | None:
    """Where the first stop string ends a response.

    Args:
        ids: [N] the generated ids (end-of-turn id excluded).
        decode: ids -> text (the tokenizer's decode).
        stops: non-empty stop strings.

    Returns:
        `(k, text)`: the tokens to keep (the first k: through the token that completes the
        earliest stop string) and the text before that stop string (stop excluded); None when
        no stop string occurs in `decode(ids)`.
    """
    if not stops or not any(s in decode(ids) for s in stops):
        return None
    for k in range(1, len(ids) + 1):
        text = decode(ids[:k])
        hits = [i for i in (text.find(s) for s in stops) if i >= 0]
        if hits:
            return k, text[: min(hits)]
    return None  # pragma: no cover (the full text holds a stop)


def token_strings(tokenizer: Any, ids: list[int], as_ids: bool) -> list[str]:
    """The string of each token: its decoded text, or "token_id:N" when `as_ids`."""
    if as_ids:
        return [f"token_id:{t}" for t in ids]
    return [tokenizer.decode([t], skip_special_tokens=False) for t in ids]


def chat_logprobs(
    tokenizer: Any, ids: list[int], lps: list[float], tops: list[list[tuple[int, float]]] | None, as_ids: bool
) -> dict[str, Any]:
    """A chat choice's `logprobs`: `{"content": [{token, logprob, bytes, top_logprobs}, ...]}`.

    Args:
        tokenizer: the model's tokenizer (decodes each token).
        ids: [N] generated ids.
        lps: [N] their log-probabilities (natural log).
        tops: `[N][k]` `(id, logprob)` alternatives per position, or None for none.
        as_ids: tokens as "token_id:N" (`return_tokens_as_token_ids`) instead of text.
    """
    strs = token_strings(tokenizer, ids, as_ids)

    def entry(s: str, lp: float) -> dict[str, Any]:
        return {"token": s, "logprob": lp, "bytes": list(s.encode("utf-8"))}

    content = []
    for j, (s, lp) in enumerate(zip(strs, lps, strict=True)):
        alts = []
        if tops is not None:
            alt_ids = [t for t, _ in tops[j]]
            alts = [
                entry(a, v)
                for a, (_, v) in zip(token_strings(tokenizer, alt_ids, as_ids), tops[j], strict=True)
            ]
        content.append({**entry(s, lp), "top_logprobs": alts})
    return {"content": content}


def completion_logprobs(
    tokenizer: Any,
    ids: list[int],
    lps: list[float],
    tops: list[list[tuple[int, float]]] | None,
    as_ids: bool,
    start: int = 0,
) -> dict[str, Any]:
    """A completion choice's legacy `logprobs`: `tokens`, `token_logprobs`, `top_logprobs`, `text_offset`.

    Args:
        tokenizer: the model's tokenizer (decodes each token).
        ids: [N] generated ids.
        lps: [N] their log-probabilities (natural log).
        tops: `[N][k]` alternatives per position (`top_logprobs[j]` maps token string to logprob),
            or None (then `top_logprobs` is null).
        as_ids: tokens as "token_id:N".
        start: the character offset of the first token (`text_offset`).
    """
    strs = token_strings(tokenizer, ids, as_ids)
    texts = token_strings(tokenizer, ids, False)
    offsets = []
    pos = start
    for t in texts:
        offsets.append(pos)
        pos += len(t)
    top = None
    if tops is not None:
        top = [
            dict(zip(token_strings(tokenizer, [t for t, _ in row], as_ids), [v for _, v in row], strict=True))
            for row in tops
        ]
    return {"tokens": strs, "token_logprobs": lps, "top_logprobs": top, "text_offset": offsets}


def tool_calls_from_text(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """Split a reply into its content and its Hermes `<tool_call>` blocks, OpenAI-shaped.

    Parsed by textgym's Hermes parser (`textgym.tools.base.parse_tool_calls`). A block that
    does not parse stays in the content as text (it is not a call).

    Args:
        text: the model's reply (end-of-turn token excluded).

    Returns:
        `(content, tool_calls)`: the text outside the parsed blocks, stripped (None if empty),
        and `[{"id", "type": "function", "function": {"name", "arguments": <JSON string>}}]`.
    """
    calls, errors = parse_tool_calls(text)
    if not calls:
        return (text if text else None), []
    if errors:  # keep the blocks that failed in the content
        bad = {e.raw for e in errors}
        content = TOOL_CALL_RE.sub(lambda m: m.group(0) if m.group(1).strip()[:500] in bad else "", text)
    else:
        content = TOOL_CALL_RE.sub("", text)
    out = [
        {
            "id": f"call_{uuid.uuid4().hex[:24]}",
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)},
        }
        for c in calls
    ]
    content = content.strip()
    return (content or None), out
