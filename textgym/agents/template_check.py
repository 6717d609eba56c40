"""Check that a chat template is append-only for multi-turn tool conversations (`textgym check-template`).

Rollouts append each observation to the token sequence the policy already saw (see
`textgym.agents.rollout.observation_tokens`); they never re-render earlier turns. That is
exact for templates whose rendering of turn k+1 starts with the rendering of turn k. Some
templates rewrite history when a conversation is rendered whole, e.g. Qwen3's drops the
`<think>` blocks of earlier assistant turns. For those, textgym's policy is: the trajectory
is the one growing token sequence the policy actually saw and sampled, stored as token ids
and trained on as such; re-rendering the messages with the template would give a different
sequence (which is why nothing in textgym re-renders or re-tokenizes a trajectory).
This check renders a fixed tool conversation turn by turn and reports where a template
rewrites history.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from transformers import PreTrainedTokenizerBase

from textgym.tools.base import format_tool_call
from textgym.tools.calculator import calculator_tool
from textgym.types import Message


def probe_conversation() -> tuple[list[Message], list[dict[str, Any]]]:
    """A three-turn tool conversation with `<think>` blocks, and its tool schemas."""
    calc = calculator_tool().schema()
    python = {
        "type": "function",
        "function": {
            "name": "python",
            "description": "Run Python code.",
            "parameters": {
                "type": "object",
                "properties": {"code": {"type": "string"}},
                "required": ["code"],
            },
        },
    }
    messages: list[Message] = [
        {"role": "system", "content": "You are a careful assistant."},
        {"role": "user", "content": "What is 17 * 23? Check it twice."},
        {
            "role": "assistant",
            "content": "<think>\nUse the calculator.\n</think>\n\n"
            + format_tool_call("calculator", {"expression": "17 * 23"}),
        },
        {"role": "tool", "content": "391"},
        {
            "role": "assistant",
            "content": "<think>\nNow python.\n</think>\n\n"
            + format_tool_call("python", {"code": "print(17 * 23)"}),
        },
        {"role": "tool", "content": "391\n"},
        {"role": "assistant", "content": "<think>\nBoth agree.\n</think>\n\nThe answer is \\boxed{391}."},
    ]
    return messages, [calc, python]


@dataclass
class TemplateReport:
    """Result of `check_template`.

    Attributes:
        append_only: True when every turn's rendering extends the previous one, in text and tokens.
        turns: assistant turns checked.
        problems: one line per violation (turn, text or tokens, where it diverges).
    """

    append_only: bool
    turns: int
    problems: list[str] = field(default_factory=list)


def _render(
    tok: PreTrainedTokenizerBase, messages: list[Message], tools: list[dict[str, Any]], gen: bool
) -> str:
    out = tok.apply_chat_template(
        messages,
        tools=tools,  # type: ignore[arg-type]
        tokenize=False,
        add_generation_prompt=gen,
    )
    assert isinstance(out, str)
    return out


def _divergence(a: str, b: str) -> str:
    i = next((k for k in range(min(len(a), len(b))) if a[k] != b[k]), min(len(a), len(b)))
    lo = max(0, i - 30)
    return f"at char {i}: {json.dumps(a[lo : i + 30])} became {json.dumps(b[lo : i + 30])}"


def check_template(tokenizer: PreTrainedTokenizerBase) -> TemplateReport:
    """Render the probe conversation turn by turn and check it is append-only.

    For each assistant turn k: the conversation up to the generation prompt must be a prefix
    of the conversation with turn k (the reply follows the prompt), and the conversation
    through turn k must be a prefix of the conversation through turn k+1, both as text and as
    token ids.

    Raises:
        ValueError: when the tokenizer has no chat template.
    """
    if tokenizer.chat_template is None:
        raise ValueError("the tokenizer has no chat_template")
    messages, tools = probe_conversation()
    turns = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    problems: list[str] = []
    previous: str | None = None
    for k, i in enumerate(turns, 1):
        prompt = _render(tokenizer, messages[:i], tools, True)
        full = _render(tokenizer, messages[: i + 1], tools, False)
        if not full.startswith(prompt):
            problems.append(
                f"turn {k}: the reply does not follow the generation prompt ({_divergence(prompt, full)})"
            )
        if previous is not None:
            if not full.startswith(previous):
                problems.append(f"turn {k}: rendering rewrites turn {k - 1} ({_divergence(previous, full)})")
            else:
                a = tokenizer(previous, add_special_tokens=False)["input_ids"]
                b = tokenizer(full, add_special_tokens=False)["input_ids"]
                if b[: len(a)] != a:
                    problems.append(
                        f"turn {k}: the text extends turn {k - 1} but its tokens do not "
                        "(a merge across the boundary)"
                    )
        previous = full
    return TemplateReport(append_only=not problems, turns=len(turns), problems=problems)
