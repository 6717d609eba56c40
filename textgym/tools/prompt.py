"""Tool schemas for chat templates that ignore `tools`: textgym puts them in the system prompt.

A tool env hands its tools to the chat template (`apply_chat_template(messages, tools=...)`).
Many templates have no branch for `tools` (SmolLM2's, most base models'): they render the
same text with or without them, and the model never learns that it has tools. For such a
template, `ensure_tool_prompt` prefixes the template with a Jinja block that, when `tools` is
given, appends this to the system message (or adds a system message holding it):

    # Tools

    You can call the functions below. Their JSON signatures, one per line:
    <tools>
    {"type": "function", "function": {"name": "calculator", ...}}
    </tools>

    To call one, reply with a JSON object holding its name and arguments inside tool_call tags:
    <tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>
    A function's result comes back in a tool message. Reply without a tool call when you have the answer.

and then renders the original template with that system message and no `tools`. The calls are
read by `textgym.tools.base.parse_tool_calls` (Hermes `<tool_call>` blocks), as for templates
that render tools themselves. Templates that use `tools` are left alone. A wrapped tokenizer
saved with `save_pretrained` (e.g. in a checkpoint) keeps the wrapped template, so a trained
policy is served with the prompt it was trained with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

MARKER = "{#- textgym: tool schemas in the system prompt (textgym.tools.prompt) -#}"
"""The first line of a wrapped template (how `ensure_tool_prompt` recognises its own work)."""

TOOLS_HEADER = "# Tools\n\nYou can call the functions below. Their JSON signatures, one per line:\n<tools>"
"""The text before the schemas."""
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call one, reply with a JSON object holding its name and arguments inside tool_call "
    'tags:\n<tool_call>{"name": "<function name>", "arguments": {<arguments as JSON>}}</tool_call>\n'
    "A function's result comes back in a tool message. Reply without a tool call when you have the answer."
)
"""The text after the schemas: the call format `parse_tool_calls` reads."""


def tools_system_text(tools: list[dict[str, Any]]) -> str:
    """The system-prompt block for `tools` (OpenAI function schemas), as the wrapped template writes it."""
    return TOOLS_HEADER + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + TOOLS_FOOTER


def _jinja_string(text: str) -> str:
    """`text` as a Jinja string literal (JSON's escapes are Jinja's)."""
    return json.dumps(text)


WRAPPER = (
    MARKER
    + "{%- if tools %}"
    + f"{{%- set ns = namespace(text={_jinja_string(TOOLS_HEADER)}) %}}"
    + "{%- for tool in tools %}{%- set ns.text = ns.text + '\\n' + (tool | tojson) %}{%- endfor %}"
    + f"{{%- set ns.text = ns.text + {_jinja_string(TOOLS_FOOTER)} %}}"
    + "{%- if messages and messages[0]['role'] == 'system' %}"
    + "{%- set messages = [{'role': 'system', 'content': messages[0]['content'] + '\\n\\n' + ns.text}]"
    + " + messages[1:] %}"
    + "{%- else %}"
    + "{%- set messages = [{'role': 'system', 'content': ns.text}] + messages %}"
    + "{%- endif %}"
    + "{%- set tools = none %}"
    + "{%- endif %}"
)
"""The Jinja block put in front of a template that ignores `tools` (it renders nothing itself)."""

_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "textgym_probe_tool",
        "description": "A tool that only exists to see whether a chat template renders tools.",
        "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    },
}


@dataclass(frozen=True)
class ToolSupport:
    """How a chat template treats `tools` (see `tool_support`).

    Attributes:
        renders_tools: the rendering changes when a tool schema is passed (with and without a
            system message).
        wrapped: the template is already textgym's wrapper around one that ignored them.
        error: the template's error when rendered with tools (it then counts as ignoring them).
        hermes: the tools prompt mentions `<tool_call>`, the call format textgym parses
            (a template with its own format may ask for calls textgym does not read).
    """

    renders_tools: bool
    wrapped: bool
    error: str | None = None
    hermes: bool = True


def _render(tokenizer: PreTrainedTokenizerBase, messages: list[dict[str, str]], tools: Any) -> str:
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)
    return str(out)


def tool_support(tokenizer: PreTrainedTokenizerBase) -> ToolSupport:
    """Render two probe conversations (with and without a system message) with and without a tool schema.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if tokenizer.chat_template is None:
        raise ValueError("the tokenizer has no chat_template")
    wrapped = any(t.startswith(MARKER) for t in _templates(tokenizer))
    user = {"role": "user", "content": "What is 2 + 2?"}
    renders, hermes = True, True
    for messages in ([user], [{"role": "system", "content": "Be brief."}, user]):
        try:
            plain = _render(tokenizer, messages, None)
            with_tools = _render(tokenizer, messages, [_PROBE_TOOL])
        except Exception as e:  # a template may refuse tools (raise_exception) or any other way
            return ToolSupport(renders_tools=False, wrapped=wrapped, error=f"{type(e).__name__}: {e}")
        renders = renders and with_tools != plain
        hermes = hermes and "<tool_call>" in with_tools
    return ToolSupport(renders_tools=renders, wrapped=wrapped, hermes=hermes or not renders)


def _templates(tokenizer: PreTrainedTokenizerBase) -> list[str]:
    t = tokenizer.chat_template
    return list(t.values()) if isinstance(t, dict) else [t] if isinstance(t, str) else []


def ensure_tool_prompt(tokenizer: PreTrainedTokenizerBase) -> bool:
    """Wrap the tokenizer's chat template so that it puts `tools` in the system prompt, if it ignores them.

    Changes `tokenizer.chat_template` in place (every named template when it is a dict) and
    leaves templates that render tools alone. Idempotent.

    Returns:
        True when the template was wrapped by this call.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    support = tool_support(tokenizer)
    if support.renders_tools:
        return False
    template = tokenizer.chat_template
    if isinstance(template, dict):
        tokenizer.chat_template = {k: WRAPPER + v for k, v in template.items()}
    else:
        tokenizer.chat_template = WRAPPER + str(template)
    return True
