"""Tools an agent can call: a JSON-schema declaration, argument validation, Hermes-style parsing.

A tool is declared once (`Tool`: name, description, JSON-schema `parameters`) and offered to
the model in the OpenAI function format (`Tool.schema()`), which is what chat templates'
`tools=` argument takes. The model calls tools in the format of Qwen2.5's (Hermes) template:

    <tool_call>
    {"name": "calculator", "arguments": {"expression": "17 * 23"}}
    </tool_call>

`parse_tool_calls` finds every such block; a block that is not valid JSON, lacks a name,
or has non-object arguments becomes a `ToolCallError` (reported back to the agent, never
raised). `Tool.__call__` validates the arguments against the schema (`jsonschema`) and
turns a bad argument or an exception inside the tool into an error result.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jsonschema

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.DOTALL)
MAX_RESULT_CHARS = 4000
"""Tool results longer than this (characters) are cut, with a note saying so."""


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: the tool's name and its arguments (a JSON object)."""

    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True)
class ToolCallError:
    """A `<tool_call>` block that could not be parsed, and why."""

    raw: str
    reason: str


@dataclass(frozen=True)
class ToolResult:
    """What a tool returned (`content`, text) and whether it failed (`error`)."""

    name: str
    content: str
    error: bool = False


def parse_tool_calls(text: str) -> tuple[list[ToolCall], list[ToolCallError]]:
    """Parse every Hermes-style `<tool_call>{...}</tool_call>` block of a model's reply.

    An unclosed final block (generation cut at max tokens) is parsed too. `arguments` given
    as a JSON string holding an object (as some models emit) is decoded.

    Returns:
        `(calls, errors)` in order of appearance; both empty when the text calls no tool.
    """
    calls: list[ToolCall] = []
    errors: list[ToolCallError] = []
    for m in TOOL_CALL_RE.finditer(text):
        raw = m.group(1).strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            errors.append(
                ToolCallError(raw[:500], f"the tool call is not valid JSON ({e.msg} at char {e.pos})")
            )
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
            errors.append(
                ToolCallError(raw[:500], 'a tool call needs {"name": <string>, "arguments": {...}}')
            )
            continue
        args = obj.get("arguments", {})
        if isinstance(args, str):
            with contextlib.suppress(json.JSONDecodeError):
                args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            errors.append(ToolCallError(raw[:500], f"arguments of {obj['name']!r} must be a JSON object"))
            continue
        calls.append(ToolCall(obj["name"], args))
    return calls, errors


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The text of one call in the format `parse_tool_calls` reads (used by scripted agents)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


@dataclass
class Tool:
    """A callable tool with a JSON-schema declaration.

    Args:
        name: the function name the model calls.
        description: one or two sentences the model reads.
        parameters: JSON schema of the arguments (an "object" schema).
        fn: called as `fn(**arguments)` with validated arguments; returns text.
        max_result_chars: results are cut at this many characters.
    """

    name: str
    description: str
    parameters: dict[str, Any]
    fn: Callable[..., str]
    max_result_chars: int = MAX_RESULT_CHARS
    _validator: Any = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        jsonschema.Draft202012Validator.check_schema(self.parameters)
        self._validator = jsonschema.Draft202012Validator(self.parameters)

    def schema(self) -> dict[str, Any]:
        """The OpenAI function declaration: `{"type": "function", "function": {...}}`."""
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    def __call__(self, arguments: dict[str, Any]) -> ToolResult:
        """Validate `arguments` and run the tool; bad arguments and exceptions become error results."""
        problems = sorted(self._validator.iter_errors(arguments), key=lambda e: list(e.path))
        if problems:
            where = "/".join(str(p) for p in problems[0].path) or "arguments"
            return ToolResult(
                self.name, f"error: bad arguments for {self.name} ({where}: {problems[0].message})", True
            )
        try:
            out = str(self.fn(**arguments))
        except Exception as e:  # the tool's failure is the agent's observation
            return ToolResult(self.name, f"error: {self.name} failed: {type(e).__name__}: {e}"[:1000], True)
        if len(out) > self.max_result_chars:
            out = out[: self.max_result_chars] + f"\n[... cut at {self.max_result_chars} characters]"
        return ToolResult(self.name, out)
