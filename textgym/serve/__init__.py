"""`textgym serve`: an OpenAI-compatible HTTP server of a local model.

`build_app` (in `app`) makes the FastAPI app; `protocol` holds the request models,
OpenAI-shaped errors and the reply helpers; `batching` the bounded request queue and the
worker that batches it. The names other code imports are re-exported here.
"""

from textgym.serve.app import build_app
from textgym.serve.batching import Batcher, Job, QueueFullError, Result
from textgym.serve.protocol import (
    NEUTRAL_SAMPLING_FIELDS,
    APIError,
    ChatRequest,
    CompletionRequest,
    tool_calls_from_text,
)

__all__ = [
    "NEUTRAL_SAMPLING_FIELDS",
    "APIError",
    "Batcher",
    "ChatRequest",
    "CompletionRequest",
    "Job",
    "QueueFullError",
    "Result",
    "build_app",
    "tool_calls_from_text",
]
