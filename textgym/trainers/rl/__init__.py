"""The RL trainers: the on-policy loop, its update, GRPO and its family, PPO.

`on_policy` (the loop: rollouts, rewards, advantages, update), `update` (the minibatch
update), `grpo` (GRPO and its family), `ppo` (PPO), `critic` (PPO's value model, an object
the PPO trainer holds).
"""

from textgym._lazy import lazy_exports

_EXPORTS = {
    "GRPOTrainer": "textgym.trainers.rl.grpo",
    "PPOTrainer": "textgym.trainers.rl.ppo",
    "OnPolicyTrainer": "textgym.trainers.rl.on_policy",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
