"""Agents: a policy behind a generation backend, and the rollout loops (lockstep, continuous)."""

from textgym.agents.continuous import rollout_continuous, rollout_fn
from textgym.agents.llm_agent import LLMAgent
from textgym.agents.rollout import RolloutStats, observation_tokens, rollout
from textgym.agents.sampling import Generation, SamplingParams
from textgym.agents.trajectory import Trajectory
from textgym.agents.transformers_backend import TransformersBackend

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
