"""Agents: a policy behind a generation backend, and the rollout loops (lockstep, continuous)."""

from textgym.agents.continuous import rollout_continuous, rollout_fn
from textgym.agents.llm_agent import Generation, LLMAgent, SamplingParams, TransformersBackend
from textgym.agents.rollout import RolloutStats, observation_tokens, rollout
from textgym.agents.trajectory import Trajectory

__all__ = [
    "Generation",
    "LLMAgent",
    "RolloutStats",
    "SamplingParams",
    "Trajectory",
    "TransformersBackend",
    "observation_tokens",
    "rollout",
    "rollout_continuous",
    "rollout_fn",
]
