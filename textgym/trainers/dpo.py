"""The old home of `PreferenceTrainer` (textgym 0.1); it lives in `textgym.trainers.preference`.

The names are re-exported here so that `from textgym.trainers.dpo import PreferenceTrainer`
keeps working.
"""

from textgym.trainers.preference import PreferenceTrainer, reference_fingerprint

__all__ = ["PreferenceTrainer", "reference_fingerprint"]
