"""GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300) and its family, as options of one trainer.

- GRPO: group-relative advantages, per-sequence token mean, k3 KL in the loss.
- DAPO (Yu et al. 2025, arXiv:2503.14476): `clip_high` > `clip_low` (clip-higher),
  `dynamic_sampling`, `loss_aggregation: token_mean`, `overlong_filter` / `overlong_penalty`.
- Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): `scale_rewards: none`,
  `loss_aggregation: seq_mean_token_sum_norm`.
- RLOO (Ahmadian et al. 2024, arXiv:2402.14740): `advantage_estimator: rloo`.
- REINFORCE++ (Hu 2025, arXiv:2501.03262): `advantage_estimator: reinforce_pp` with
  `kl_placement: reward`, `kl_estimator: k1`.

With `kl_placement: reward`, GRPO and RLOO subtract β·Σ_t KL_t from each sequence's reward
before the group statistics (the KL is computed from the rollout's log-probabilities,
without gradient); REINFORCE++ puts −β·KL_t on every token and sums rewards-to-go.
"""

from __future__ import annotations

import torch

from textgym.agents.trajectory import RolloutBatch, Trajectory
from textgym.config import GRPOConfig
from textgym.trainers.advantages import (
    discounted_returns,
    group_advantages,
    rloo_advantages,
    token_level_rewards,
    whiten,
)
from textgym.trainers.on_policy import OnPolicyTrainer, rollout_metrics


class GRPOTrainer(OnPolicyTrainer):
    """Trains `model` in place with GRPO (or DAPO, Dr. GRPO, RLOO, REINFORCE++) on `cfg.env`.

    See `OnPolicyTrainer` for the arguments; `cfg` is a `GRPOConfig`.
    """

    name = "grpo"
    cfg: GRPOConfig

    def sample(self, metrics: dict[str, float]) -> list[Trajectory]:
        """The step's groups; with dynamic sampling, groups with equal rewards are replaced.

        DAPO's dynamic sampling (Yu et al. 2025, eq. 11) keeps only groups with
        0 < #correct < G; it rolls out further batches of `prompts_per_step` tasks, up to
        `max_sampling_tries` rounds, and fills a batch that is still short with dropped groups
        (whose advantage is zero). Metrics: `sampling/rounds`, `sampling/dropped_groups`
        (over all rounds), `sampling/filled_groups` (dropped groups used as filler).
        """
        cfg, G = self.cfg, self.cfg.group_size
        if not cfg.dynamic_sampling:
            return super().sample(metrics)
        kept: list[list[Trajectory]] = []
        dropped: list[list[Trajectory]] = []
        everything: list[Trajectory] = []
        rounds = 0
        while len(kept) < cfg.prompts_per_step and rounds < cfg.max_sampling_tries:
            trajs = self.collect(cfg.prompts_per_step)
            rounds += 1
            everything += trajs
            for g in range(0, len(trajs), G):
                group = trajs[g : g + G]
                rewards = {round(t.reward, 9) for t in group}
                (kept if len(rewards) > 1 else dropped).append(group)
        short = max(0, cfg.prompts_per_step - len(kept))
        chosen = kept[: cfg.prompts_per_step] + dropped[:short]
        metrics.update(rollout_metrics(everything))
        metrics.update(
            {
                "sampling/rounds": float(rounds),
                "sampling/dropped_groups": float(len(dropped)),
                "sampling/filled_groups": float(short),
            }
        )
        out = []
        for gi, group in enumerate(chosen):  # renumber groups 0..n-1 for prompt sharing
            for t in group:
                t.group = gi
                out.append(t)
        return out

    def compute_advantages(
        self, batch: RolloutBatch, trajs: list[Trajectory], metrics: dict[str, float]
    ) -> torch.Tensor:
        """[B] advantages (GRPO, RLOO) or [B, L] (REINFORCE++); see the module docstring."""
        cfg = self.cfg
        in_reward = cfg.kl_placement == "reward" and cfg.kl_coef > 0
        token_rewards, kl_stats = token_level_rewards(
            batch.token_rewards,
            batch.loss_mask,
            batch.old_logprobs if in_reward else None,
            self._ref_logprobs if in_reward else None,
            kl_coef=cfg.kl_coef if in_reward else 0.0,
            estimator=cfg.kl_estimator,
        )
        metrics.update(kl_stats)
        if cfg.advantage_estimator == "reinforce_pp":
            returns = discounted_returns(token_rewards, batch.loss_mask, gamma=1.0)
            adv = whiten(returns, batch.loss_mask)
            metrics["adv/std"] = float(adv[batch.loss_mask > 0].std()) if batch.loss_mask.sum() > 1 else 0.0
            return adv
        rewards = batch.rewards
        if in_reward:
            kl_seq = (batch.token_rewards * batch.loss_mask).sum(-1) - token_rewards.sum(-1)
            rewards = rewards - kl_seq  # β·Σ_t KL_t
        if cfg.advantage_estimator == "rloo":
            adv, stats = rloo_advantages(rewards, cfg.group_size)
        else:
            adv, stats = group_advantages(rewards, cfg.group_size, cfg.scale_rewards)
        metrics.update(stats)
        return adv
