"""Run configuration: pure pydantic schemas, one module per stage, loaded from YAML with overrides.

`load_config(path, ["grpo.steps=10"])` reads a YAML run config, applies `key.sub=value`
overrides and validates it; every model forbids unknown keys and checks ranges, so a wrong key
or value fails before any work starts with the dotted path of the bad field (`ConfigError`).
Validating imports only the leaf packages `textgym.envs` and `textgym.sandbox`; what depends on
the machine (reward-model folders, an installed vLLM) is checked by `validate_runtime`.

Modules: `base` (model, env, sampling, optimizer, LoRA, parallelism), `sft`, `rl` (rollout
engine, GRPO family), `ppo`, `preference` (DPO family), `rft` (rejection-sampling fine-tuning),
`online_dpo`, `reward_model`, `prm` (process reward model), `judge` (an LLM judge as an env
reward term), `eval`, `run`
(`RunConfig` and the loader), `runtime` (`validate_runtime`).
"""

from textgym.config.base import (
    ConfigError,
    EnvConfig,
    LoraSettings,
    ModelConfig,
    OptimConfig,
    ParallelConfig,
    SamplingConfig,
)
from textgym.config.eval import AgentConfig, EvalConfig, EvalJobConfig
from textgym.config.judge import JudgeTermConfig
from textgym.config.online_dpo import OnlineDPOConfig
from textgym.config.ppo import CriticConfig, PPOConfig
from textgym.config.preference import DPO_BETA, SIMPO_BETA, CollectConfig, PairConfig, PreferenceConfig
from textgym.config.prm import PRMConfig, PRMLabelConfig
from textgym.config.reward_model import RewardModelConfig
from textgym.config.rft import RationalizeConfig, RFTCollectConfig, RFTConfig, RFTFilterConfig
from textgym.config.rl import GRPOConfig, OverlongPenaltyConfig, RolloutEngineConfig, VLLMEngineConfig
from textgym.config.run import RunConfig, apply_overrides, format_validation_error, load_config
from textgym.config.runtime import validate_runtime
from textgym.config.sft import DemonstrationsConfig, SFTConfig, SFTTargetConfig

__all__ = [
    "DPO_BETA",
    "SIMPO_BETA",
    "AgentConfig",
    "CollectConfig",
    "ConfigError",
    "CriticConfig",
    "DemonstrationsConfig",
    "EnvConfig",
    "EvalConfig",
    "EvalJobConfig",
    "GRPOConfig",
    "JudgeTermConfig",
    "LoraSettings",
    "ModelConfig",
    "OnlineDPOConfig",
    "OptimConfig",
    "OverlongPenaltyConfig",
    "PPOConfig",
    "PRMConfig",
    "PRMLabelConfig",
    "PairConfig",
    "ParallelConfig",
    "PreferenceConfig",
    "RFTCollectConfig",
    "RFTConfig",
    "RFTFilterConfig",
    "RationalizeConfig",
    "RewardModelConfig",
    "RolloutEngineConfig",
    "RunConfig",
    "SFTConfig",
    "SFTTargetConfig",
    "SamplingConfig",
    "VLLMEngineConfig",
    "apply_overrides",
    "format_validation_error",
    "load_config",
    "validate_runtime",
]
