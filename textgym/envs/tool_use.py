"""`ToolUseWrapper`: turns any text env into a tool-using one, and `textgym/ToolMath-v0`.

The wrapper offers its tools through `info["tools"]` at reset (OpenAI function schemas,
for the chat template's `tools=` argument) and intercepts each action before the
wrapped env sees it: a reply that calls tools (`<tool_call>...</tool_call>`) is answered
with one `role: "tool"` message per call and does not reach the env; a reply without a
tool call is the agent's answer and goes to the wrapped env's `step`. Malformed calls,
unknown tools, bad arguments and tool exceptions are answered with a tool message saying
what went wrong and cost `error_penalty` (default 0.0), never an exception. The number of
turns is bounded by `TimeLimit` (`max_episode_steps`), which counts tool turns too.
"""

from __future__ import annotations

import inspect
from typing import Any, SupportsFloat

import gymnasium as gym

from textgym.envs.arithmetic import ArithmeticEnv
from textgym.envs.math_qa import GSM8KEnv
from textgym.sandbox import SandboxBackend
from textgym.tools.base import Tool, format_tool_call, parse_tool_calls
from textgym.tools.calculator import calculator_tool
from textgym.tools.python import python_tool
from textgym.types import Message

MAX_CALLS_PER_TURN = 4


class ToolUseWrapper(gym.Wrapper[list[Message], str, list[Message], str]):
    r"""Let the agent call `tools` before it answers the wrapped env (see the module docstring).

    Args:
        env: any textgym env (single-turn or multi-turn).
        tools: the tools offered; names must be unique.
        error_penalty: reward (≤ 0 usually) of a turn whose calls include an error.
        max_calls_per_turn: calls beyond this many in one reply are refused with an error message.
        schemas_in_prompt: put the tools' schemas in `info["tools"]` at reset, which the rollout
            passes to the chat template (the usual way). False leaves them out: the prompt is
            then only the env's own (its instruction names the tools), e.g. for a small model
            whose tokenizer spends hundreds of tokens on a JSON schema, taught the call format by
            demonstrations.

    `info` after a tool turn: `tool_calls` (count), `tool_errors` (count), `reward/tool_error`
    (the penalty paid, so a rubric-style term is logged), and the wrapped env's base info.

    Raises:
        ValueError: on duplicate tool names.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> from textgym.tools import calculator_tool
        >>> env = ToolUseWrapper(gym.make("textgym/Arithmetic-v0").unwrapped, [calculator_tool()])
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> call = '<tool_call>{"name": "calculator", "arguments": {"expression": "52-88"}}</tool_call>'
        >>> env.step(call)[:3]
        ([{'role': 'tool', 'content': '-36'}], 0.0, False)
        >>> env.step('<tool_call>{"name": "calculator", "arguments": {}}</tool_call>')[0][0]["role"]
        'tool'
        >>> env.step(r"\boxed{-36}")[1:3]   # no tool call: the answer goes to the env
        (1.0, True)
    """

    def __init__(
        self,
        env: gym.Env[list[Message], str],
        tools: list[Tool],
        error_penalty: float = 0.0,
        max_calls_per_turn: int = MAX_CALLS_PER_TURN,
        schemas_in_prompt: bool = True,
    ):
        super().__init__(env)
        names = [t.name for t in tools]
        if len(set(names)) != len(names):
            raise ValueError(f"tool names must be unique, got {names}")
        self.tools = {t.name: t for t in tools}
        self.error_penalty = float(error_penalty)
        self.max_calls_per_turn = int(max_calls_per_turn)
        self.schemas_in_prompt = bool(schemas_in_prompt)
        self._base_info: dict[str, Any] = {}

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools in OpenAI function format, as passed to `apply_chat_template(tools=...)`."""
        return [t.schema() for t in self.tools.values()]

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Reset the wrapped env; `info["tools"]` carries the schemas (unless `schemas_in_prompt` is off)."""
        obs, info = self.env.reset(seed=seed, options=options)
        self._base_info = {k: info[k] for k in ("task_id", "task_index", "answer") if k in info}
        info = dict(info)
        if self.schemas_in_prompt:
            info["tools"] = self.tool_schemas()
        return obs, info

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Run the tool calls in `action`, or pass an answer without calls to the wrapped env."""
        if not isinstance(action, str) or "<tool_call>" not in action:
            obs, reward, terminated, truncated, info = self.env.step(action)
            info = dict(info)
            info.setdefault("reward/tool_error", 0.0)
            return obs, reward, terminated, truncated, info
        calls, errors = parse_tool_calls(action)
        messages: list[Message] = []
        n_errors = 0
        for err in errors:
            messages.append({"role": "tool", "content": f"error: {err.reason}"})
            n_errors += 1
        for i, call in enumerate(calls):
            if i >= self.max_calls_per_turn:
                messages.append(
                    {
                        "role": "tool",
                        "content": f"error: at most {self.max_calls_per_turn} tool calls per turn",
                    }
                )
                n_errors += 1
                continue
            tool = self.tools.get(call.name)
            if tool is None:
                known = ", ".join(sorted(self.tools))
                messages.append(
                    {"role": "tool", "content": f"error: unknown tool {call.name!r}; tools: {known}"}
                )
                n_errors += 1
                continue
            result = tool(call.arguments)
            n_errors += int(result.error)
            messages.append({"role": "tool", "content": result.content})
        penalty = self.error_penalty if n_errors else 0.0
        info = dict(self._base_info)
        info.update({"tool_calls": len(calls), "tool_errors": n_errors, "reward/tool_error": penalty})
        return messages, penalty, False, False, info

    def oracle_action(self, messages: list[Message]) -> str:
        """A scripted expert's next reply: the wrapped env's oracle, after one tool call where it has one.

        Delegates to the wrapped env's `oracle_tool_call(tools)` (given the offered tool names,
        or with no argument where it takes none; a `(tool, arguments)` pair or None) on the
        first turn, then to its `oracle_action(messages)`.
        """
        inner = self.env.unwrapped
        first_turn = not any(m.get("role") == "tool" for m in messages)
        pick = getattr(inner, "oracle_tool_call", None)
        # an env's own `oracle_tool_call()` may take no argument (the offered tools not needed)
        if pick is None:
            call = None
        else:
            call = pick(list(self.tools)) if inspect.signature(pick).parameters else pick()
        if first_turn and call is not None and call[0] in self.tools:
            return format_tool_call(*call)
        return inner.oracle_action(messages)  # type: ignore[attr-defined]


_TOOLMATH_TEMPLATE = (
    "You can use the {tools}. When you know the answer, reply without a "
    "tool call and put the final answer, one number, within \\boxed{{}}."
)
TOOLMATH_INSTRUCTION = _TOOLMATH_TEMPLATE.format(tools="calculator and python tools")
"""ToolMath's default instruction (both tools offered; `make_tool_math(tools=...)` names its own)."""


def make_tool_math(
    source: str = "arithmetic",
    sandbox: str | SandboxBackend = "process",
    error_penalty: float = 0.0,
    tools: str | list[str] = "calculator,python",
    schemas_in_prompt: bool = True,
    **kwargs: Any,
) -> ToolUseWrapper:
    r"""`textgym/ToolMath-v0`: Arithmetic (`source="arithmetic"`, default) or GSM8K (`"gsm8k"`) with tools.

    The tools are `calculator` and `python` (run in `sandbox`), or those named in `tools` (a
    comma-separated string or a list: `tools="calculator"` offers the calculator alone, whose
    schema is a third of the two's in the prompt). Other kwargs go to the math env (e.g.
    `split`, `digits`, `n_terms`, `instruction`). The answer turn is scored by the math rubric.
    `schemas_in_prompt=False` keeps the tools' JSON schemas out of the prompt (see
    `ToolUseWrapper`); the instruction should then name the tools.

    Raises:
        ValueError: on an unknown source or tool name, or no tool.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/ToolMath-v0")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> print(obs[0]["content"][:14])
        Compute 52-88.
        >>> [t["function"]["name"] for t in info["tools"]]
        ['calculator', 'python']
        >>> call = '<tool_call>{"name": "calculator", "arguments": {"expression": "52-88"}}</tool_call>'
        >>> obs, reward, terminated, truncated, info = env.step(call)
        >>> obs, reward, terminated
        ([{'role': 'tool', 'content': '-36'}], 0.0, False)
        >>> env.step(r"\boxed{-36}")[1:3]
        (1.0, True)
    """
    names = [t.strip() for t in (tools.split(",") if isinstance(tools, str) else tools) if t.strip()]
    known = {"calculator": calculator_tool, "python": lambda: python_tool(sandbox)}
    if not names or set(names) - set(known):
        raise ValueError(f"ToolMath tools must be a non-empty subset of {sorted(known)}, got {tools!r}")
    offered = f"{names[0]} tool" if len(names) == 1 else " and ".join(names) + " tools"
    kwargs.setdefault("instruction", _TOOLMATH_TEMPLATE.format(tools=offered))
    if source == "arithmetic":
        env: gym.Env[list[Message], str] = ArithmeticEnv(**kwargs)
    elif source == "gsm8k":
        env = GSM8KEnv(**kwargs)
    else:
        raise ValueError(f"ToolMath source must be 'arithmetic' or 'gsm8k', got {source!r}")
    return ToolUseWrapper(
        env, [known[n]() for n in names], error_penalty=error_penalty, schemas_in_prompt=schemas_in_prompt
    )
