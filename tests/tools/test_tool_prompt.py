"""Tool schemas for chat templates that ignore `tools` (textgym.tools.prompt), on real tokenizers.

A copy of the tiny model whose template is replaced by a plain ChatML one with no branch for tools
(what SmolLM2's is) stands in for such a model here; tests/models/test_packaged.py checks SmolLM2's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gymnasium as gym
import pytest
from typer.testing import CliRunner

import textgym  # noqa: F401
from textgym.agents import LLMAgent, observation_tokens
from textgym.agents.template_check import check_template
from textgym.cli import app
from textgym.models import load_tokenizer
from textgym.tools import calculator_tool, parse_tool_calls
from textgym.tools.prompt import MARKER, TOOLS_FOOTER, ensure_tool_prompt, tool_support, tools_system_text

# ChatML with a default system prompt and no `tools` branch (written for this test)
NO_TOOLS_TEMPLATE = (
    "{% for m in messages %}"
    "{% if loop.first and m['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are terse.<|im_end|>\\n' }}{% endif %}"
    "{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
REFUSING_TEMPLATE = "{% if tools %}{{ raise_exception('no tools here') }}{% endif %}" + NO_TOOLS_TEMPLATE


def _with_template(src: Path, dst: Path, template: str) -> Path:
    shutil.copytree(src, dst)
    config_path = dst / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    if "chat_template" in config:
        config["chat_template"] = template
        config_path.write_text(json.dumps(config))
    else:  # transformers 5 keeps it in its own file
        (dst / "chat_template.jinja").write_text(template)
    return dst


@pytest.fixture(scope="module")
def no_tools_dir(tiny_model_dir, tmp_path_factory):
    return _with_template(tiny_model_dir, tmp_path_factory.mktemp("tpl") / "no_tools", NO_TOOLS_TEMPLATE)


def test_a_template_that_ignores_tools_gets_them_in_the_system_prompt(no_tools_dir):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(no_tools_dir)
    support = tool_support(raw)
    assert not support.renders_tools and not support.wrapped
    tok = load_tokenizer(no_tools_dir)
    assert tok.chat_template.startswith(MARKER) and tok.chat_template.endswith(NO_TOOLS_TEMPLATE)
    tools = [calculator_tool().schema()]
    user = [{"role": "user", "content": "Compute 2+3."}]

    def render(t, messages, tools=None):
        return t.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)

    # no system message: one holding the tools block replaces the template's default
    assert render(tok, user, tools) == (
        f"<|im_start|>system\n{tools_system_text(tools)}<|im_end|>\n"
        "<|im_start|>user\nCompute 2+3.<|im_end|>\n<|im_start|>assistant\n"
    )
    # a system message: the block is appended to it
    system = [{"role": "system", "content": "Be exact."}, *user]
    assert render(tok, system, tools).startswith(
        f"<|im_start|>system\nBe exact.\n\n{tools_system_text(tools)}<|im_end|>"
    )
    # without tools nothing changes
    assert render(tok, user) == render(raw, user) and render(tok, system) == render(raw, system)
    assert tool_support(tok).renders_tools and tool_support(tok).wrapped
    assert not ensure_tool_prompt(tok)  # idempotent
    # the instruction's format is the one the parser reads
    example = TOOLS_FOOTER.split("\n")[4]
    filled = example.replace('"<function name>"', '"calculator"').replace(
        "{<arguments as JSON>}", '{"expression": "2+3"}'
    )
    calls, errors = parse_tool_calls(filled)
    assert not errors and calls[0].name == "calculator" and calls[0].arguments == {"expression": "2+3"}


def test_the_wrapped_template_keeps_multi_turn_token_bookkeeping(no_tools_dir):
    agent = LLMAgent.from_pretrained(no_tools_dir)
    env = gym.make("textgym/ToolMath-v0", tools="calculator")
    obs, info = env.reset(options={"task_index": 0})
    prompt = agent.tokenizer.decode(agent.encode_prompt(obs, tools=info["tools"]))
    assert "<tools>" in prompt and '"name": "calculator"' in prompt and "Compute 52-88." in prompt
    assert check_template(agent.tokenizer).append_only
    ids = observation_tokens(
        agent.tokenizer,
        [{"role": "tool", "content": "-36"}],
        True,
        agent.backend.eos_ids,
        tools=info["tools"],
    )
    assert agent.tokenizer.decode(ids) == "\n<|im_start|>tool\n-36<|im_end|>\n<|im_start|>assistant\n"


def test_a_template_that_renders_tools_is_left_alone(tiny_model_dir):
    from transformers import AutoTokenizer

    raw = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tool_support(raw).renders_tools and not tool_support(raw).wrapped
    assert load_tokenizer(tiny_model_dir).chat_template == raw.chat_template


def test_a_template_that_refuses_tools_is_wrapped(tiny_model_dir, tmp_path):
    folder = _with_template(tiny_model_dir, tmp_path / "refusing", REFUSING_TEMPLATE)
    from transformers import AutoTokenizer

    support = tool_support(AutoTokenizer.from_pretrained(folder))
    assert not support.renders_tools and "no tools here" in (support.error or "")
    tok = load_tokenizer(folder)
    text = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], tools=[calculator_tool().schema()], tokenize=False
    )
    assert "<tools>" in text


def test_check_template_reports_a_template_that_ignores_tools(no_tools_dir, tiny_model_dir):
    r = CliRunner().invoke(app, ["check-template", str(no_tools_dir)], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    assert "tools: IGNORED by this template" in r.output and "system prompt" in r.output
    assert "append-only: yes" in r.output
    r = CliRunner().invoke(app, ["check-template", str(tiny_model_dir)], catch_exceptions=False)
    assert r.exit_code == 0 and "tools: rendered by the template (Hermes <tool_call> format)" in r.output
