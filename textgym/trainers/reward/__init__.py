"""The reward-model trainers: Bradley-Terry outcome reward models and process reward models.

`bradley_terry` (its batched forward in `bradley_terry_forward`) and `prm`.
"""

from textgym._lazy import lazy_exports

_EXPORTS = {
    "RewardModelTrainer": "textgym.trainers.reward.bradley_terry",
    "PRMTrainer": "textgym.trainers.reward.prm",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
