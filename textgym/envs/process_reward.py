"""`ProcessRewardWrapper`: any textgym env whose step rewards come from a process reward model.

The env's own reward (the outcome) and terms stay as they are; the PRM's step scores become
`info["step_rewards"]`, which the rollout places on the tokens that end the steps and the RL
trainers consume with `reward_source: steps` or `both` (docs: "Process rewards").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym

from textgym.envs.reward_model import ConversationWrapper
from textgym.verifiers.prm import PRMVerifier, aggregate_scores
from textgym.verifiers.steps import split_steps

_PRMS: dict[str, PRMVerifier] = {}


def shared_prm(model_dir: str | Path, device: str = "cpu") -> PRMVerifier:
    """One `PRMVerifier` per (folder, device) in the process, shared by every wrapped env."""
    key = f"{Path(model_dir).resolve()}@{device}"
    if key not in _PRMS:
        _PRMS[key] = PRMVerifier(model_dir, device=device)
    return _PRMS[key]


class ProcessRewardWrapper(ConversationWrapper):
    """Replaces an env's step rewards (or gives an env step rewards) with a PRM's step scores.

    After each step the agent's turn is scored by the PRM (`PRMVerifier.score_steps`) in the
    conversation so far; its steps are the env's (`info["step_ends"]`) when the env reports them,
    else the turn's non-empty lines. With p_k the PRM's probability after step k, the step
    rewards are, by `mode`:

    - "delta" (default): `p_k − p_{k−1}` with p_0 = 0, potential-based shaping with the PRM as
      the potential (Ng, Harada & Russell 1999, "Policy invariance under reward transformations",
      Theorem 1): the rewards of a turn telescope to its last step's score p_K, so writing more
      steps earns nothing by itself, while each step is still credited with how much it moved
      the PRM's estimate;
    - "score": `p_k` itself at each step (Math-Shepherd's step-by-step PPO, Wang et al. 2023,
      §3.4): their sum grows with the number of steps, which a policy can exploit by writing
      more lines.

    `info` then holds `step_rewards`, `step_ends`, `prm_step_scores` (the p_k),
    `env_step_rewards` (the env's own step rewards when it had some: e.g. worked Arithmetic's
    checker, the true measure) and the logged term `reward/prm` (the PRM's aggregate, not part
    of the reward). The reward is the env's, unchanged.

    Args:
        env: a textgym env.
        model_dir: the PRM folder (`textgym prm train`).
        device: where the PRM runs.
        mode: "delta" or "score".

    Raises:
        ValueError: on an unknown mode.
    """

    def __init__(self, env: gym.Env, model_dir: str | Path, device: str = "cpu", mode: str = "delta"):
        super().__init__(env)
        if mode not in ("delta", "score"):
            raise ValueError(f"mode must be 'delta' or 'score', got {mode!r}")
        self.prm = shared_prm(model_dir, device)
        self.mode = mode

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        """Step the env; the step rewards become the PRM's scores of the turn's steps."""
        obs, reward, terminated, truncated, info = self.env.step(action)
        text = str(action)
        info = dict(info)
        ends = info.get("step_ends")
        if ends is None:
            ends = [s.end for s in split_steps(text)]
        (scores,) = self.prm.score_steps([(self._history, text, ends)])
        if "step_rewards" in info:
            info["env_step_rewards"] = info["step_rewards"]
        rewards = (
            scores
            if self.mode == "score"
            else [p - q for p, q in zip(scores, [0.0, *scores[:-1]], strict=True)]
        )
        info["step_rewards"], info["step_ends"], info["prm_step_scores"] = rewards, list(ends), scores
        info["reward/prm"] = aggregate_scores(scores, self.prm.aggregate)
        self._history = [*self._history, {"role": "assistant", "content": text}, *list(obs)]
        return obs, reward, terminated, truncated, info
