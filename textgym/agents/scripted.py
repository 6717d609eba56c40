"""Moved to `textgym.evaluation.scripted`; this module keeps the old import path working."""

from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted, play_episode

__all__ = ["OracleAgent", "RandomAgent", "evaluate_scripted", "play_episode"]
