"""`AnswerHintWrapper`: an env whose first prompt carries the task's gold answer as a hint (STaR)."""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from textgym.types import Message


class AnswerHintWrapper(gym.Wrapper):
    """Rewrites the last user message of the first observation with the gold answer as a hint.

    STaR's rationalisation (Zelikman et al. 2022, arXiv:2203.14465, section 3.2): a model that
    failed a problem is asked again with the answer given, and a rationale it then writes that
    reaches the answer is trained on as if found unaided. Only `reset` changes: rewards are still
    the wrapped env's verifier against the gold answer, and later observations are untouched.

    Args:
        env: a text env whose `reset` info carries the task's gold answer under "answer"
            (textgym's `TextEnv` does; "" means none).
        hint: a format string of `{content}` (the message's text) and `{answer}`, e.g.
            `"{content}\\nHint: the answer is {answer}."`.

    Raises:
        ValueError: from `reset`, when the info has no "answer" (or "") or the observation no user message.

    Examples:
        >>> import textgym.envs
        >>> env = AnswerHintWrapper(textgym.envs.make("textgym/Arithmetic-v0", split="test",
        ...     operators="+", digits=1, instruction=""), "{content} (answer: {answer})")
        >>> env.reset(options={"task_index": 0})[0][-1]["content"]
        'Compute 8+6. (answer: 14)'
    """

    def __init__(self, env: gym.Env, hint: str):
        super().__init__(env)
        self.hint = hint

    def reset(self, **kwargs: Any) -> tuple[list[Message], dict[str, Any]]:
        """Reset the env and put the hint into the last user message of its observation."""
        obs, info = self.env.reset(**kwargs)
        answer = info.get("answer")
        if answer is None or answer == "":
            raise ValueError("the env's reset info has no gold 'answer' to hint with (rationalisation)")
        messages = [dict(m) for m in obs]
        users = [j for j, m in enumerate(messages) if m.get("role") == "user"]
        if not users:
            raise ValueError("the env's first observation has no user message to put the hint in")
        k = users[-1]
        messages[k]["content"] = self.hint.format(content=messages[k]["content"], answer=answer)
        return messages, info  # type: ignore[return-value]
