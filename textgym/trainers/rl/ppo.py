"""PPO with a per-token critic and GAE, RLHF style.

Schulman et al. 2017 (arXiv:1707.06347); Ziegler et al. 2019 (arXiv:1909.08593); Ouyang et
al. 2022, InstructGPT (arXiv:2203.02155).

Models in memory: the policy, the critic (a transformer backbone with a scalar head per
token, initialised from the policy or `critic.path`), and the frozen reference when β > 0.

Per iteration: roll out; per-token rewards `r_t = R_t − β·KL_t` (each turn's reward R on its
last policy token, the KL estimate from the rollout's log-probabilities, k1 by default);
values V(s_t) of the state before each response token; GAE(γ, λ) over policy tokens only
(environment tokens of multi-turn episodes are skipped, a `truncated` episode bootstraps
from the critic's value of its final state, a `terminated` one from 0); returns = Â + V;
advantages whitened; then μ epochs over minibatches of the clipped surrogate for the policy
and the (clipped) value loss for the critic, each with its own optimizer. β is fixed or
adapted towards `kl_target` (`kl_control.AdaptiveKLController`); wherever the KL goes (reward
or loss) it is weighted by the controller's current β, which moves after each iteration's
update from the KL of that iteration's rollouts.

Truncation. verl and OpenRLHF treat the end of every response as terminal (the value after
the last response token is 0, nothing is bootstrapped), which is right for a response cut
by its length budget but not for gymnasium's `truncated`: an episode cut by `TimeLimit`
(or `max_turns`) would have continued, and its last state's value is the expected return
still to come. That value cannot be a regression target of the truncated episode itself
(nothing of it was observed; its only consistent λ-return is V itself). It is learnt from
the same kind of state mid-episode instead: the state after a turn's last policy token,
whose target is the return of the next turn's first token (the environment's reply carries
no reward or discount; `advantages.turn_end_value_targets`). Those states join the policy
tokens' in the value loss, so the bootstrap reads a kind of position the critic is trained
on (Pardo et al. 2018, "Time Limits in Reinforcement Learning", arXiv:1712.00378:
partial-episode bootstrapping). A batch of single-turn episodes has no such state, and its
value loss is unchanged.

The trainer is `OnPolicyTrainer`; `build_ppo` builds its PPO parts: the `Critic`, the KL
controller and `GAEAdvantages`.

Distributed (torchrun), the critic is sharded like the policy; GAE runs per sequence on each
rank's rows, while whitening, explained variance and the KL controller's measurement use
the whole batch (statistics summed over ranks).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from textgym import distributed
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.advantages import (
    explained_variance,
    gae,
    masked_mean,
    token_level_rewards,
    turn_end_value_targets,
    whiten,
)
from textgym.algorithms.kl_control import AdaptiveKLController, FixedKLController
from textgym.config import PPOConfig
from textgym.distributed.process_group import World
from textgym.trainers.rl.algorithm import Algorithm, Setup
from textgym.trainers.rl.critic import Critic
from textgym.trainers.rl.on_policy import OnPolicyTrainer
from textgym.training.batch import RolloutBatch


class GAEAdvantages:
    """PPO's advantages: per-token rewards with the KL penalty, GAE over the critic's values, whitened.

    Args:
        cfg: the stage config (γ, λ, KL placement and estimator, whitening).
        critic: the critic whose values GAE uses and whose targets it sets.
        kl: the KL controller: its β weights the penalty; it gets the iteration's KL (`measure`).
        per_micro_batch: no-grad passes in the update's micro-batches (`PolicyUpdate.per_micro_batch`).
        world: the data-parallel world (batch statistics over every rank's rows).
    """

    def __init__(
        self,
        cfg: PPOConfig,
        critic: Critic,
        kl: FixedKLController,
        per_micro_batch: Callable[..., torch.Tensor],
        world: World,
    ) -> None:
        self.cfg, self.critic, self.kl, self.world = cfg, critic, kl, world
        self.per_micro_batch = per_micro_batch

    def __call__(
        self,
        batch: RolloutBatch,
        trajs: list[Trajectory],
        ref_logprobs: torch.Tensor | None,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """[B, L] GAE advantages; sets the critic's targets and the KL the controller moves β by."""
        cfg = self.cfg
        mask = batch.loss_mask
        beta = self.kl.value
        in_reward = cfg.kl_placement == "reward" and beta > 0
        rewards, kl_stats = token_level_rewards(
            batch.token_rewards,
            mask,
            batch.old_logprobs if in_reward else None,
            ref_logprobs if in_reward else None,
            kl_coef=beta if in_reward else 0.0,
            estimator=cfg.kl_estimator,
        )
        metrics.update(kl_stats)
        values_all = self.critic.values(batch, self.per_micro_batch)  # [B, L+1]
        L = mask.shape[1]
        values = values_all[:, :L]
        n_cols = batch.attention_mask[:, batch.prompt_width :].sum(-1)  # [B] response columns used
        # Bootstrap only an episode cut short: one that terminated ends at 0 even when a time
        # limit fired on its last step too (gymnasium's `TimeLimit` then sets both flags).
        truncated = torch.tensor([t.truncated and not t.terminated for t in trajs], device=mask.device)
        final_value = values_all.gather(1, n_cols[:, None].clamp(max=L))[:, 0]
        bootstrap = torch.where(truncated, final_value, torch.zeros_like(final_value))
        adv, returns = gae(rewards, values, mask, gamma=cfg.gamma, lam=cfg.lam, bootstrap=bootstrap)
        # The critic trains on the policy tokens' states and on the mid-episode turn ends, the
        # kind of state the bootstrap above reads (`turn_end_value_targets`).
        ends, end_targets = turn_end_value_targets(mask, returns)
        self.critic.set_targets(values, returns, mask + ends, returns + end_targets)
        reduce = distributed.all_reduce_sum  # batch statistics over every rank's rows
        metrics["value/explained_variance"] = explained_variance(values, returns, mask, reduce=reduce)
        metrics["value/mean_rollout"] = float(masked_mean(values, mask))  # token-weighted over ranks
        metrics["returns/mean"] = float(masked_mean(returns, mask))
        metrics["kl/coef"] = beta
        if cfg.whiten_advantages:
            adv = whiten(adv, mask, reduce=reduce)
        # The controller moves β after this iteration's update (`OnPolicyTrainer.update`), so the
        # β in the reward or the loss of this iteration is the one logged as `kl/coef`.
        n_seqs = len(batch) * self.world.size
        if "kl/ref_seq" in kl_stats:
            self.kl.measure(distributed.mean(kl_stats["kl/ref_seq"]), n_seqs)
        elif ref_logprobs is not None:  # KL in the loss: still track it for the controller
            kl = (batch.old_logprobs - ref_logprobs) * mask
            self.kl.measure(distributed.mean(float(kl.sum(-1).mean())), n_seqs)
        return adv


def describe_ppo(m: dict[str, float]) -> str:
    """PPO's part of the progress line: the critic's explained variance and β."""
    return f"  ev {m.get('value/explained_variance', float('nan')):.2f}  β {m.get('kl/coef', 0.0):.3g}"


def build_ppo(setup: Setup) -> Algorithm:
    """PPO's parts: the critic (its schedule spans `critic.epochs` passes per batch), β's controller, GAE.

    β is fixed, or adapted towards `kl_target` (`AdaptiveKLController`) after each update.
    """
    cfg: PPOConfig = setup.cfg
    critic_updates = setup.updates // cfg.epochs * max(cfg.epochs, cfg.critic.epochs)
    critic = Critic(
        setup.policy, cfg, critic_updates, setup.shard, gradient_checkpointing=setup.gradient_checkpointing
    )
    kl = (
        AdaptiveKLController(cfg.kl_coef, cfg.kl_target, cfg.kl_horizon)
        if cfg.kl_target is not None
        else FixedKLController(cfg.kl_coef)
    )
    gae_ = GAEAdvantages(cfg, critic, kl, setup.per_micro_batch, setup.world)
    return Algorithm(gae_, kl, critic=critic, describe=describe_ppo)


class PPOTrainer(OnPolicyTrainer):
    """Trains `model` in place with PPO and a learned critic on `cfg.env`.

    The `OnPolicyTrainer` with PPO's parts (`build_ppo`); see it for the arguments; `cfg` is a
    `PPOConfig`. The critic (`critic`) is trained by the update beside the policy,
    checkpointed beside it (`checkpoints/step_N/critic/`) and saved to `<stage_dir>/critic/` at
    the end; β is the `kl` controller's, fixed or adapted towards `kl_target` after each update.
    """

    name = "ppo"
    cfg: PPOConfig
    critic: Critic
    build = staticmethod(build_ppo)
