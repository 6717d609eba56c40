"""The typed record of a rollout: one `Trajectory` per episode.

The padded training tensors built from trajectories (`RolloutBatch`) live with the trainers
(`textgym.training.batch`): rollouts do not know how they are trained on.

Token-level arrays of a `Trajectory` are aligned with `token_ids`: index *t* describes
token *t*. Prompt and environment tokens have `loss_mask == 0`; tokens the policy
sampled have `loss_mask == 1` and carry the log-probability they were sampled with.
Each turn's reward sits on the last token the policy generated in that turn; process rewards
(an env's `info["step_rewards"]`) sit in `step_rewards`, each on the token that ends its step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from textgym.types import Message

TRUNCATION_CAUSES = ("time_limit", "max_turns", "context")
"""Why a truncated episode was cut (`Trajectory.truncation`); each has its own rollout metric."""

EPISODE_COUNTS = ("tool_calls", "tool_errors", "invalid_actions", "judge_refusals")
"""The per-episode counts a rollout keeps (`Trajectory.counts`), each reported as a mean."""


def turn_counts(info: dict[str, Any]) -> dict[str, int]:
    """One env step's contribution to the `EPISODE_COUNTS`, read from its `info`.

    `tool_calls` and `tool_errors` are the tool wrapper's counts for the step
    (`info["tool_calls"]`, `info["tool_errors"]`; non-numbers count 0); `invalid_actions` is 1
    when the env flagged the action (`info["invalid_action"]`); `judge_refusals` is 1 when a
    code env's judge refused what the solution offered (`info["judge_refused"]`: a value that is
    not plain data, an entry point that is not a function: a reward-hack attempt).

    Examples:
        >>> turn_counts({"tool_calls": 2, "tool_errors": 1})
        {'tool_calls': 2, 'tool_errors': 1, 'invalid_actions': 0, 'judge_refusals': 0}
        >>> turn_counts({"invalid_action": True, "tool_calls": "n/a"})
        {'tool_calls': 0, 'tool_errors': 0, 'invalid_actions': 1, 'judge_refusals': 0}
    """
    raw = {"tool_calls": info.get("tool_calls", 0), "tool_errors": info.get("tool_errors", 0),
           "invalid_actions": int(bool(info.get("invalid_action"))),
           "judge_refusals": int(bool(info.get("judge_refused")))}  # fmt: skip
    numeric = {k: isinstance(v, int | float) and not isinstance(v, bool) for k, v in raw.items()}
    return {k: int(v) if numeric[k] else 0 for k, v in raw.items()}


@dataclass
class Trajectory:
    """One episode, exactly as the policy produced it.

    Attributes:
        token_ids: [T] int64, the whole sequence (prompt, responses, environment turns).
        loss_mask: [T] float32, 1.0 where the policy sampled the token, else 0.0.
        logprobs: [T] float32, log π_sample(token_t | tokens_<t) for policy tokens, 0.0 elsewhere.
            π_sample is the distribution the token was drawn from: `log_softmax(logits / T)`
            (T = 1 for greedy decoding), restricted to the tokens top-k / top-p kept and
            renormalised when they are on (`textgym.agents.sampling.truncation_mask`).
        token_rewards: [T] float32, each turn's reward on that turn's last policy token.
        prompt_length: number of tokens before the first policy token.
        messages: the conversation as text (what the environment saw and said).
        reward: the episode return Σ_turns reward (undiscounted).
        reward_terms: each rubric term summed over turns, e.g. {"reward/correct": 1.0}.
        task_index, task_id, env_id: which task of which environment.
        group: index of the group of samples of the same task (GRPO), or -1.
        terminated, truncated: how the episode ended, never both: `terminated` when the env
            reached a terminal state (a `TimeLimit` that fired on the same step does not make it
            truncated), else `truncated` when a time limit or the rollout's `max_turns` cut it.
        info: the environment's last `info` dict.
        finish_reason: how the last turn's generation ended: "stop" (end-of-turn token)
            or "length" (cut at `max_new_tokens`; the response is overlong).
        step_rewards: [T] float32, the process rewards an env reported (`info["step_rewards"]`),
            each on the token holding its step's last character
            (`textgym.verifiers.steps.step_token_indices`), 0.0 elsewhere; None when not recorded
            (a rollout records zeros for an env without step rewards).
        step_mask: [T] float32, 1.0 on the tokens that end a step (where `step_rewards` sit,
            whatever their value), else 0.0; None when not recorded.
        policy_version: the version of the weights that sampled it: the number of optimizer
            updates they had seen (a rollout server's reported version, the oldest over its
            turns; else the trainer's tag; 0 when not recorded). A trainer at version s trains
            on it with staleness s - policy_version (`rollout.max_staleness`).
        token_versions: [T] int64, the version that sampled each policy token (its turn's
            version, as a rollout server reported it), -1 on other tokens; None when the
            backend reports no version (in-process). A multi-turn episode that continues
            across a weight push (a partial rollout at turn boundaries) has tokens of several
            versions; `policy_version` is the oldest. Kept in memory only (the trajectory
            store keeps `policy_version`).
        truncation: why a truncated episode was cut: "time_limit" (the env's `TimeLimit`
            or its own truncation), "max_turns" (the rollout's cap) or "context" (the next
            observation and response would not fit the context window: `rollout`'s
            `max_context_tokens`); "" when not truncated. Kept in memory only.
        counts: per-episode counts summed over its turns from each step's `info`:
            "tool_calls", "tool_errors" (tool envs), "invalid_actions" (actions the env could not
            use: `info["invalid_action"]`); see `EPISODE_COUNTS`. Kept in memory only.
    """

    token_ids: torch.Tensor
    loss_mask: torch.Tensor
    logprobs: torch.Tensor
    token_rewards: torch.Tensor
    prompt_length: int
    messages: list[Message]
    reward: float
    reward_terms: dict[str, float] = field(default_factory=dict)
    task_index: int = -1
    task_id: str = ""
    env_id: str = ""
    group: int = -1
    terminated: bool = True
    truncated: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    finish_reason: str = "stop"
    step_rewards: torch.Tensor | None = None
    step_mask: torch.Tensor | None = None
    policy_version: int = 0
    token_versions: torch.Tensor | None = None
    truncation: str = ""
    counts: dict[str, int] = field(default_factory=dict)

    @property
    def response_length(self) -> int:
        """Number of policy tokens (all turns)."""
        return int(self.loss_mask.sum().item())

    @property
    def turns(self) -> int:
        """The policy's turns: the runs of policy tokens (`loss_mask` 1) in `token_ids`.

        Each turn the policy took is one run, ended by the env's or tool's tokens that follow
        it. Assistant messages that came with the first observation (an env that opens part
        way into a game, e.g. `GuessNumberEnv(oracle_prefix=...)`) are context, not turns.
        """
        mask = self.loss_mask.flatten() > 0
        if not bool(mask.any()):
            return 0
        starts = mask[1:] & ~mask[:-1]
        return int(starts.sum().item()) + int(bool(mask[0]))


def episode_correct(terms: dict[str, float], reward: float) -> int:
    """Whether an episode counts as correct (1) or not (0).

    Correct when its `reward/correct` term, summed over its turns, reaches 1 (up to 1e-9 of
    float rounding). `TextGymAdapter` puts the env's `accuracy_term` (or Gymnasium's
    `info["is_success"]`) there. An env with none of these counts a return of at least 1 (full
    credit) as correct, so partial credit never counts as solved; `textgym env check` fails it.
    """
    return int(terms.get("reward/correct", reward) >= 1.0 - 1e-9)
