"""Tools for agents: declared with a JSON schema, called in Hermes `<tool_call>` format."""

from textgym.tools.base import (
    Tool,
    ToolCall,
    ToolCallError,
    ToolResult,
    format_tool_call,
    parse_tool_calls,
)
from textgym.tools.browser import Browser, render_html
from textgym.tools.calculator import calculate, calculator_tool
from textgym.tools.python import python_tool
from textgym.tools.search import Document, SearchIndex

__all__ = [
    "Browser",
    "Document",
    "SearchIndex",
    "Tool",
    "ToolCall",
    "ToolCallError",
    "ToolResult",
    "calculate",
    "calculator_tool",
    "format_tool_call",
    "parse_tool_calls",
    "python_tool",
    "render_html",
]
