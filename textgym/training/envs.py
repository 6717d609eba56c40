"""Build a training environment from its `EnvConfig`: `gymnasium.make`, plus the reward model when set.

This is the runtime half of `EnvConfig` (the schema in `textgym.config` stays free of runtime
imports): the reward-model wrapper loads a trained model, so it lives with the trainers.
"""

from __future__ import annotations

import gymnasium as gym

from textgym.config import EnvConfig, validate_runtime
from textgym.envs.process_reward import ProcessRewardWrapper
from textgym.envs.registry import make
from textgym.envs.reward_model import RewardModelWrapper


def make_env(cfg: EnvConfig) -> gym.Env:
    """Build the env, with `RewardModelWrapper` / `ProcessRewardWrapper` when a reward model is set.

    `cfg.reward_model` replaces the reward; `cfg.process_reward_model` the step rewards.

    Raises:
        ConfigError: when `cfg.reward_model` or `cfg.process_reward_model` is not a trained
            model's folder (no config.json).
    """
    validate_runtime(cfg)
    env: gym.Env = make(cfg.id, **cfg.kwargs)
    if cfg.reward_model is not None:
        env = RewardModelWrapper(env, cfg.reward_model, cfg.reward_model_weight, cfg.reward_model_device)
    if cfg.process_reward_model is not None:
        env = ProcessRewardWrapper(
            env, cfg.process_reward_model, cfg.process_reward_model_device, cfg.process_reward
        )
    return env
