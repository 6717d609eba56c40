"""Trainers: pure losses and advantage estimators, and one file per algorithm (SFT, GRPO)."""
