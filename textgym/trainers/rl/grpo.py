"""GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300) and its family, as options of one trainer.

- GRPO: group-relative advantages, per-sequence token mean, k3 KL in the loss.
- DAPO (Yu et al. 2025, arXiv:2503.14476): `clip_high` > `clip_low` (clip-higher),
  `dynamic_sampling` (on accuracy, fillers out of the loss: `GroupSelection`),
  `loss_aggregation: token_mean`, `overlong_filter` / `overlong_penalty`.
- Dr. GRPO (Liu et al. 2025, arXiv:2503.20783): `scale_rewards: none`,
  `loss_aggregation: seq_mean_token_sum_norm`.
- RLOO (Ahmadian et al. 2024, arXiv:2402.14740): `advantage_estimator: rloo`.
- REINFORCE++ (Hu 2025, arXiv:2501.03262): `advantage_estimator: reinforce_pp` with
  `kl_placement: reward`, `kl_estimator: k1`.
- Process supervision (DeepSeekMath §4.1.3): `advantage_estimator: grpo_process` with
  `reward_source: steps` or `both` (per-step rewards from the env or a process reward model).
- Expert guidance (after LUFFY, Yan et al. 2025, arXiv:2504.14945): `expert_guidance: true`
  puts the env's oracle episode in place of one sample of each group that failed entirely
  (`ExpertGuide`).

With `kl_placement: reward`, GRPO and RLOO subtract β·Σ_t KL_t from each sequence's reward
before the group statistics (the KL is computed from the rollout's log-probabilities,
without gradient); REINFORCE++ puts −β·KL_t on every token and sums rewards-to-go.

Distributed (torchrun), each rank holds whole groups; the advantages are computed from the
rewards of the whole batch, gathered from every rank (so `scale_rewards: batch` and the
statistics are those of the global batch), and REINFORCE++ whitens over every rank's tokens.
Dynamic sampling gathers each round's groups and picks from the global list exactly as one
process would, then gives each rank its slice.

The trainer is `OnPolicyTrainer`; `build_grpo` builds its GRPO parts (`GroupAdvantages`, and
a `GroupSelection` when dynamic sampling or expert guidance is on).
"""

from __future__ import annotations

import dataclasses

import torch

from textgym import distributed
from textgym.agents.demonstrator import OracleDemonstrator
from textgym.agents.trajectory import Trajectory
from textgym.algorithms.advantages import token_level_rewards
from textgym.algorithms.kl_control import FixedKLController
from textgym.algorithms.registry import AdvantageInputs, get_advantage
from textgym.config import GRPOConfig
from textgym.distributed.process_group import World
from textgym.trainers.rl.algorithm import Algorithm, Collect, Plain, Selection, Setup
from textgym.trainers.rl.on_policy import OnPolicyTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.rollout_metrics import rollout_metrics
from textgym.training.shaping import apply_overlong_penalty
from textgym.training.sources.base import RolloutRequest
from textgym.training.sources.local import AgentSource


def group_accuracy(group: list[Trajectory]) -> list[float]:
    """The accuracy of each trajectory of a group, for DAPO's dynamic-sampling filter.

    The env's `reward/correct` term (`Trajectory.reward_terms`, summed over turns) when it
    has one; otherwise the reward without the trainer's shaping (DAPO's overlong penalty,
    `reward/overlong`), so that the penalty alone never makes a group look informative.
    Rounded to 1e-9 so that float noise does not either.
    """
    return [
        round(
            t.reward_terms["reward/correct"]
            if "reward/correct" in t.reward_terms
            else t.reward - t.reward_terms.get("reward/overlong", 0.0),
            9,
        )
        for t in group
    ]


class GroupAdvantages:
    """GRPO's advantages: the registered estimator `cfg.advantage_estimator` over the batch's groups.

    Args:
        cfg: the stage config.
        world: the data-parallel world (the estimator sees every rank's sequence rewards).
    """

    def __init__(self, cfg: GRPOConfig, world: World) -> None:
        self.cfg, self.world = cfg, world

    def __call__(
        self,
        batch: RolloutBatch,
        trajs: list[Trajectory],
        ref_logprobs: torch.Tensor | None,
        metrics: dict[str, float],
    ) -> torch.Tensor:
        """[B] advantages (GRPO, RLOO) or [B, L] (REINFORCE++) from the registered estimator.

        `cfg.advantage_estimator` names a function registered with `@register_advantage`
        (`textgym.algorithms.registry`; the built-ins are in `textgym.algorithms.advantages`).
        It gets the whole batch's sequence rewards and this rank's token rewards (both with
        the KL penalty when it goes in the reward; `ref_logprobs` [B, L] are the reference's);
        see the module docstring.
        """
        cfg = self.cfg
        in_reward = cfg.kl_placement == "reward" and cfg.kl_coef > 0
        token_rewards, kl_stats = token_level_rewards(
            batch.token_rewards,
            batch.loss_mask,
            batch.old_logprobs if in_reward else None,
            ref_logprobs if in_reward else None,
            kl_coef=cfg.kl_coef if in_reward else 0.0,
            estimator=cfg.kl_estimator,
        )
        metrics.update(kl_stats)
        rewards = batch.rewards
        if in_reward:
            kl_seq = (batch.token_rewards * batch.loss_mask).sum(-1) - token_rewards.sum(-1)
            rewards = rewards - kl_seq  # β·Σ_t KL_t
        estimator = get_advantage(cfg.advantage_estimator)  # `@register_advantage` functions
        adv, stats = estimator(
            AdvantageInputs(
                rewards=distributed.all_gather_tensor(rewards),  # the whole batch's, every rank's rows
                token_rewards=token_rewards,
                mask=batch.loss_mask,
                group_size=cfg.group_size,
                scale_rewards=cfg.scale_rewards,
                reduce=distributed.all_reduce_sum,
                step_mask=batch.step_mask,
            )
        )
        metrics.update(stats)
        if adv.ndim == 2:  # per-token advantages of this rank's rows
            return adv
        first = self.world.rank * len(batch)  # per-sequence advantages of the whole batch
        return adv[first : first + len(batch)]


class ExpertGuide:
    """Puts the expert's episode in place of the last sample of each group that failed entirely.

    A group in which every sample fails (`group_accuracy` ≤ 0 for all G) has zero
    group-relative advantage everywhere, so it teaches nothing; when the policy almost never
    succeeds from a state (p ≈ 0.002 in GuessNumber's deep states), such groups are the rule
    there. This is off-policy guidance in the spirit of LUFFY (Yan et al. 2025, "Learning to
    Reason under Off-Policy Guidance", arXiv:2504.14945, §3), which mixes expert traces into
    GRPO's groups; here only into groups with no success, and with the plain clipped
    surrogate (no policy shaping). The row's episode is the env's `oracle_action` played from
    the same task (`OracleDemonstrator`, in the policy's tokens, its turns in the loss; an
    env whose reset is not a function of the task index restarts elsewhere), rolled out by an
    `AgentSource` (lockstep, one episode per task), scored by the env and given DAPO's
    overlong penalty when it is on. Its log-probs are recomputed by the trainer before the
    update (`Selection.guided_rows`), so its importance ratio starts at 1; when the expert
    wins, its advantage is (1 − 1/G)/σ and the failed samples' slightly negative.

    Args:
        setup: the trainer's setup (config, tokenizer, envs, sampling parameters, settings).

    Raises:
        ValueError: if the env has no `oracle_action`.
    """

    def __init__(self, setup: Setup) -> None:
        cfg = setup.cfg
        try:
            setup.envs[0].get_wrapper_attr("oracle_action")
        except AttributeError:
            raise ValueError(
                f"expert_guidance needs an env with an oracle_action; {cfg.env.id} has none"
            ) from None
        self.cfg = cfg
        settings = dataclasses.replace(setup.settings, group_size=1, mode="lockstep")
        self.source = AgentSource(settings, OracleDemonstrator(setup.tokenizer), setup.envs, setup.params)

    def __call__(self, trajs: list[Trajectory], metrics: dict[str, float]) -> torch.Tensor:
        """Replace the failed groups' last samples in `trajs` (this rank's, G per group) in place.

        Returns [B] bool, the guided rows. Metrics: `guidance/groups_frac` (guided groups over
        this rank's groups) and `guidance/expert_reward_mean` (the expert episodes' mean reward;
        0 when none).
        """
        G = self.cfg.group_size
        failed = [g for g in range(0, len(trajs), G) if max(group_accuracy(trajs[g : g + G])) <= 0.0]
        guided = torch.zeros(len(trajs), dtype=torch.bool)
        experts: list[Trajectory] = []
        if failed:
            experts = self.source.rollout(RolloutRequest([trajs[g].task_index for g in failed]))
            if self.cfg.overlong_penalty is not None:  # shaped as the sampled rows are
                op = self.cfg.overlong_penalty
                apply_overlong_penalty(experts, op.max_len, op.cache_len, op.factor)
            for g, expert in zip(failed, experts, strict=True):
                row = g + G - 1
                expert.group, expert.task_index = trajs[row].group, trajs[row].task_index
                expert.policy_version = trajs[row].policy_version
                trajs[row] = expert
                guided[row] = True
        metrics["guidance/groups_frac"] = len(failed) / max(1, len(trajs) // G)
        metrics["guidance/expert_reward_mean"] = sum(t.reward for t in experts) / max(1, len(experts))
        return guided


class GroupSelection:
    """GRPO's choice of the step's groups: DAPO's dynamic sampling, or expert guidance.

    Args:
        cfg: the stage config (`dynamic_sampling`, `max_sampling_tries`, `expert_guidance`).
        world: the data-parallel world.
        guide: the `ExpertGuide` (None without `expert_guidance`).
    """

    def __init__(self, cfg: GRPOConfig, world: World, guide: ExpertGuide | None) -> None:
        self.cfg, self.world, self.guide = cfg, world, guide

    def select(self, plain: Plain, collect: Collect, metrics: dict[str, float]) -> Selection:
        """The step's groups; with dynamic sampling, groups whose accuracy is all equal are replaced.

        Without dynamic sampling: the trainer's batch (`plain`), with the expert's episodes in
        the failed groups when guidance is on. DAPO's dynamic sampling (Yu et al. 2025, eq. 11)
        keeps only groups with 0 < #correct < G: it filters on accuracy (`group_accuracy`), not
        on the reward, so a group that is all correct (or all wrong) is dropped even when the
        overlong penalty makes its rewards differ — as verl's `filter_groups.metric: acc` does
        (groups whose accuracy has zero std are dropped). It rolls out further batches of
        `prompts_per_step` tasks (`collect`), up to `max_sampling_tries` rounds, and fills a
        batch that is still short with dropped groups. Those fillers carry no learning signal
        (zero advantage), so they are masked out of the loss (`Selection.loss_rows`): they
        count in neither `num_tokens` nor `num_seqs` and do not dilute the kept groups'
        gradient. Metrics: `sampling/rounds`, `sampling/dropped_groups` (over all rounds),
        `sampling/filled_groups` (dropped groups used as filler). Distributed, every rank sees
        every round's groups (gathered) and makes the same choice; it keeps its contiguous
        `prompts_per_step / ranks` of the chosen groups.
        """
        cfg, G = self.cfg, self.cfg.group_size
        if not cfg.dynamic_sampling:
            trajs = plain(metrics)
            guided = None if self.guide is None else self.guide(trajs, metrics)
            return Selection(trajs, guided_rows=guided)
        kept: list[list[Trajectory]] = []
        dropped: list[list[Trajectory]] = []
        everything: list[Trajectory] = []
        rounds = 0
        while len(kept) < cfg.prompts_per_step and rounds < cfg.max_sampling_tries:
            trajs = distributed.all_gather_list(collect(cfg.prompts_per_step, rounds))
            rounds += 1
            everything += trajs
            for g in range(0, len(trajs), G):
                group = trajs[g : g + G]
                (kept if len(set(group_accuracy(group))) > 1 else dropped).append(group)
        short = max(0, cfg.prompts_per_step - len(kept))
        chosen = kept[: cfg.prompts_per_step] + dropped[:short]
        filler = [False] * (len(chosen) - short) + [True] * short
        k = cfg.prompts_per_step // self.world.size
        chosen = chosen[self.world.rank * k : (self.world.rank + 1) * k]
        filler = filler[self.world.rank * k : (self.world.rank + 1) * k]
        metrics.update(rollout_metrics(everything, gather=False))
        metrics.update(
            {
                "sampling/rounds": float(rounds),
                "sampling/dropped_groups": float(len(dropped)),
                "sampling/filled_groups": float(short),
            }
        )
        out = []
        for gi, group in enumerate(chosen, start=self.world.rank * k):  # renumber: the global batch's
            for t in group:
                t.group = gi
                out.append(t)
        return Selection(out, loss_rows=torch.tensor([not f for f in filler for _ in range(G)]))


def build_grpo(setup: Setup) -> Algorithm:
    """GRPO's parts: group-relative advantages, a fixed β, and a `GroupSelection` when one is asked.

    Raises:
        ValueError: if `expert_guidance` is on and the env has no `oracle_action`.
    """
    cfg: GRPOConfig = setup.cfg
    guide = ExpertGuide(setup) if cfg.expert_guidance else None
    selection = GroupSelection(cfg, setup.world, guide) if cfg.dynamic_sampling or guide else None
    return Algorithm(GroupAdvantages(cfg, setup.world), FixedKLController(cfg.kl_coef), selection=selection)


class GRPOTrainer(OnPolicyTrainer):
    """Trains `model` in place with GRPO (or DAPO, Dr. GRPO, RLOO, REINFORCE++) on `cfg.env`.

    The `OnPolicyTrainer` with GRPO's parts (`build_grpo`); see it for the arguments; `cfg` is
    a `GRPOConfig`.
    """

    name = "grpo"
    cfg: GRPOConfig
    build = staticmethod(build_grpo)
