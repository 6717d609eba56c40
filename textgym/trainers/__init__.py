"""The trainers, one class per family: SFT, RL, preference, reward models.

SFT; RL (the GRPO family, PPO); preference (offline, online DPO); reward models
(Bradley-Terry, process reward).

`from textgym.trainers import GRPOTrainer` imports the class on first use; the maths they
share is in `textgym.algorithms`, the machinery in `textgym.training`.
"""

from textgym._lazy import lazy_exports

_EXPORTS = {
    "SFTTrainer": "textgym.trainers.sft",
    "GRPOTrainer": "textgym.trainers.rl.grpo",
    "PPOTrainer": "textgym.trainers.rl.ppo",
    "PreferenceTrainer": "textgym.trainers.preference.offline",
    "OnlineDPOTrainer": "textgym.trainers.preference.online",
    "RewardModelTrainer": "textgym.trainers.reward.bradley_terry",
    "PRMTrainer": "textgym.trainers.reward.prm",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
