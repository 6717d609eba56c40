"""Agents: a policy behind a generation backend, and the rollout loop that records trajectories."""

from textgym.agents.llm_agent import Generation, LLMAgent, SamplingParams, TransformersBackend
from textgym.agents.rollout import observation_tokens, rollout
from textgym.agents.trajectory import Trajectory

__all__ = [
    "Generation",
    "LLMAgent",
    "SamplingParams",
    "Trajectory",
    "TransformersBackend",
    "observation_tokens",
    "rollout",
]
