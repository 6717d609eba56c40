"""`RewardModelWrapper`: any textgym env with its reward replaced by a reward model's score.

PPO (or any trainer) then optimises the learned reward while the env's own verifier terms
(`reward/correct`, ...) stay in `info` as the true measure (RLHF).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym

from textgym.types import Message
from textgym.verifiers.reward_model import RewardModelVerifier

_VERIFIERS: dict[str, RewardModelVerifier] = {}


class ConversationWrapper(gym.Wrapper):
    """A wrapper that keeps the conversation so far in `_history` (a learned scorer reads it).

    `reset` sets it to the first observation's messages; a subclass's `step` appends the
    agent's turn and the env's reply.
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._history: list[Message] = []

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        """Reset the env and remember the conversation."""
        obs, info = self.env.reset(**kwargs)
        self._history = list(obs)
        return obs, info


class RewardModelWrapper(ConversationWrapper):
    """Replaces an env's reward by a reward model's score of the agent's turn.

    The wrapped env's own reward terms stay in `info` (so `reward/correct` still measures
    true accuracy); the learned score goes in `info["reward/rm"]` and becomes the reward.
    One model per folder is shared by all wrapped envs of the process.

    Args:
        env: a textgym env (its `messages` hold the conversation so far).
        model_dir: the reward model folder.
        weight: scale of the learned reward.
        device: where the reward model runs.
    """

    def __init__(self, env: gym.Env, model_dir: str | Path, weight: float = 1.0, device: str = "cpu"):
        super().__init__(env)
        key = f"{Path(model_dir).resolve()}@{device}"
        if key not in _VERIFIERS:
            _VERIFIERS[key] = RewardModelVerifier(model_dir, device=device)
        self.verifier = _VERIFIERS[key]
        self.weight = float(weight)

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; the reward becomes `weight · RM(conversation + action)`."""
        obs, _, terminated, truncated, info = self.env.step(action)
        conv = [*self._history, {"role": "assistant", "content": str(action)}]
        (r,) = self.verifier.score_messages([conv])
        self._history = conv + list(obs)
        info = dict(info)
        info["reward/rm"] = float(r)
        return obs, self.weight * float(r), terminated, truncated, info
