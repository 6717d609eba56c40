"""The update half of an on-policy iteration: μ epochs of the clipped surrogate over minibatches.

`PolicyUpdate` is an object the on-policy trainer (`textgym.trainers.rl.on_policy`) holds: it
holds the update loop (`update`: shuffled minibatches, micro-batch accumulation, the clipped
policy loss with its KL and entropy terms, the critic's value loss when a critic is handed in,
clipping and the optimizer steps, metrics reduced over ranks) and the no-grad
log-probability passes the iteration needs (π_old recomputed by the trainer, π_ref of the
reference).

The loss is the one the config's `policy_loss` names in the registry
(`textgym.algorithms.registry.register_policy_loss`); the default, "ppo_clip"
(`textgym.algorithms.clipped_loss.clipped_policy_loss`), is PPO's clipped surrogate (Schulman et al.
2017, arXiv:1707.06347, eq. 7) with the options of the GRPO family; "gspo", "gspo_token" and
"cispo" are in `textgym.algorithms.policy_losses`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any, Protocol

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from textgym import distributed
from textgym.algorithms import policy_losses  # noqa: F401  (registers gspo, gspo_token, cispo)
from textgym.algorithms.aggregate import aggregate
from textgym.algorithms.correction import rollout_correction
from textgym.algorithms.registry import PolicyLossInputs, get_policy_loss
from textgym.config import GRPOConfig, PPOConfig
from textgym.distributed.process_group import World
from textgym.training.batch import (
    RolloutBatch,
    chunks,
    group_token_budget_micro_batches,
    row_lengths,
    token_budget_micro_batches,
)
from textgym.training.logprobs import sequence_logprobs


class CriticLike(Protocol):
    """What the update needs of a critic (`textgym.trainers.rl.critic.Critic` is one)."""

    epochs: int
    """Passes over each batch for the critic: those beyond the policy's epochs train it alone."""

    def loss(
        self, sub: RolloutBatch, rows: torch.Tensor, minibatch: torch.Tensor, num_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The value loss of the micro-batch `rows` of `minibatch`, and its detached stats.

        `num_seqs` is this rank's share of the minibatch's rows in the loss (the policy's).
        """
        ...

    def step(self) -> dict[str, float]:
        """Step the critic's optimizer after a minibatch; return its stats."""
        ...

    def skip(self) -> dict[str, float]:
        """Drop the gradient of a minibatch with no position in the loss, without a step; stats."""
        ...

    def gradient_sync(self, sync: bool) -> None:
        """Whether the coming backward passes reduce the critic's gradients over ranks."""
        ...


class PolicyUpdate:
    """The policy update and the no-grad log-probability passes of an on-policy trainer.

    An object the trainer (`OnPolicyTrainer`) builds once its policy, reference and optimizer
    exist, and calls at step 7 of each iteration; PPO's critic, when there is one, is handed
    in and trained in the same minibatches.

    Args:
        cfg: the stage config (GRPOConfig or PPOConfig): policy loss, epochs, KL placement,
            entropy terms, sampling (the distribution π is), packing, token budget.
        policy: the policy (sharded under torchrun), trained in place.
        optimizer: the policy's optimizer.
        scheduler: its learning-rate schedule, stepped with it.
        device: the policy's device (batches and advantages are moved there).
        reference: the frozen reference π_ref (None: none, or LoRA's adapters-off policy).
        critic: a critic trained beside the policy (PPO), or None.

    A minibatch is `cfg.minibatch_size` rows (default the whole batch, `prompts_per_step ×
    group_size`) divided by the ranks (`minibatch_size`, this rank's rows), a micro-batch
    `cfg.micro_batch_size` rows (default the minibatch) unless `cfg.micro_batch_tokens` cuts
    by tokens.
    """

    def __init__(
        self,
        cfg: GRPOConfig | PPOConfig,
        policy: Any,
        optimizer: torch.optim.Optimizer,
        scheduler: LambdaLR,
        device: torch.device,
        reference: PreTrainedModel | None = None,
        critic: CriticLike | None = None,
    ) -> None:
        self.cfg, self.policy, self.optimizer, self.scheduler = cfg, policy, optimizer, scheduler
        self.device, self.reference, self.critic = device, reference, critic
        self.world: World = distributed.world()
        self.minibatch_size = (cfg.minibatch_size or cfg.batch_rows) // self.world.size  # on this rank
        self.micro_batch_size = cfg.micro_batch_size or self.minibatch_size

    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        *,
        kl_coef: float,
        epochs: int | None = None,
        step_policy: bool = True,
        loss_rows: torch.Tensor | None = None,
        is_weights: torch.Tensor | None = None,
        log_entropy: bool = True,
    ) -> dict[str, float]:
        """μ epochs of the policy (and critic) update, then critic-only passes up to `critic.epochs`.

        Args:
            batch: the rollout batch (on the policy's device).
            advantages: [B] per-sequence or [B, L] per-token advantages.
            ref_logprobs: [B, L] log π_ref of the batch (computed here when the KL is in the
                loss and it is not given).
            kl_coef: β of the KL term when `kl_placement` is "loss" (PPO's controller's β).
            epochs: passes over the batch (default `cfg.epochs`).
            step_policy: False trains only the critic (PPO's critic warm-up).
            loss_rows: [B] bool, the rows that count in the policy loss (None: all). The
                others must have their `loss_mask` zeroed already (so they are out of
                `num_tokens`); here they are left out of `num_seqs` too.
            is_weights: [B, L] truncated importance weights of the rollout correction (TIS), or None.
            log_entropy: compute the policy's entropy for the metrics (it is computed anyway
                when the bonus `entropy_coef` needs it).

        Returns:
            Loss, KL, clip, entropy and gradient-norm metrics, averaged over minibatches
            (losses) or policy tokens (the rest), over all ranks. The critic's value stats are
            those of its last pass. `update/skipped_minibatches` counts the minibatches that
            took no optimizer step because none of their tokens is in the loss.
        """
        epochs = self.cfg.epochs if epochs is None else epochs
        # the KL term's inputs, once for every pass (π_ref computed here only when not given)
        if self.cfg.kl_placement != "loss":
            ref_logprobs, kl_coef = None, 0.0
        elif ref_logprobs is None:
            ref_logprobs = self.reference_logprobs(batch)
        kw: dict[str, Any] = {"kl_coef": kl_coef, "loss_rows": loss_rows, "is_weights": is_weights}
        stats = self.passes(
            batch, advantages, ref_logprobs, epochs, step_policy, log_entropy=log_entropy, **kw
        )
        extra = 0 if self.critic is None else self.critic.epochs - epochs
        if extra > 0:
            critic_stats = self.passes(
                batch, advantages, ref_logprobs, extra, False, log_entropy=log_entropy, **kw
            )
            stats.update({k: v for k, v in critic_stats.items() if k.startswith(("loss/value", "value/"))})
        return stats

    # long: the paper's loop in one place: epochs × minibatches × micro-batches, losses, step
    def passes(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        epochs: int,
        step_policy: bool,
        *,
        kl_coef: float,
        loss_rows: torch.Tensor | None,
        is_weights: torch.Tensor | None,
        log_entropy: bool,
    ) -> dict[str, float]:
        """`epochs` passes over shuffled minibatches of `batch`, accumulating over micro-batches.

        The arguments are `update`'s, resolved: `ref_logprobs` and `kl_coef` are those of the
        KL term in the loss (None and 0 when the KL is elsewhere). The policy is stepped only
        when `step_policy`, the critic (when there is one) always.

        Distributed: each rank takes `minibatch_size / ranks` of its rows per minibatch; the
        loss denominators (`num_tokens`, `num_seqs`) are this rank's share of the global
        minibatch's (`distributed.share`), so FSDP's average of the ranks' gradients is the
        gradient of the whole minibatch. The gradient reduce-scatter runs once per minibatch,
        after its last micro-batch.
        """
        cfg, critic = self.cfg, self.critic
        advantages = advantages.to(self.device)
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        updates = skipped = 0
        policy_loss = get_policy_loss(cfg.policy_loss)  # `@register_policy_loss` functions
        self.policy.train(step_policy)
        for _ in range(epochs):
            for mb in chunks(torch.randperm(len(batch)), self.minibatch_size):
                # The global Σ mask divided by the ranks (at least 1 in all): see the docstring.
                tokens = distributed.share(float(batch.loss_mask[mb].sum()))
                # No token of the global minibatch in the loss (every row cut by the overlong
                # filter, or filler): the loss and its gradient are 0, and no optimizer step is
                # taken, since AdamW's momentum and weight decay would still move the weights.
                # The same on every rank: `tokens` is a global count.
                empty = tokens == 0.0
                skipped += int(empty)
                num_tokens = max(tokens, 1.0 / self.world.size)
                num_seqs: float = len(mb)
                if loss_rows is not None:
                    num_seqs = max(distributed.share(float(loss_rows[mb].sum())), 1.0 / self.world.size)
                self.optimizer.zero_grad(set_to_none=True)
                micros = self.micro_batches(batch, mb)
                for i, micro in enumerate(micros):
                    # the gradient reduce-scatter runs after the minibatch's last micro-batch
                    distributed.set_requires_gradient_sync(self.policy, i == len(micros) - 1)
                    if critic is not None:
                        critic.gradient_sync(i == len(micros) - 1)
                    sub = batch.select(micro)
                    micro_d = micro.to(self.device)
                    Lm = sub.loss_mask.shape[1]
                    w = float(sub.loss_mask.sum())
                    if critic is not None:
                        value_loss, value_stats = critic.loss(sub, micro_d, mb, num_seqs)
                        value_loss.backward()
                        _accumulate(sums, weights, value_stats, w)
                    if not step_policy:
                        continue
                    logprobs, entropy, logits_entropy = self.policy_forward(sub, log_entropy)
                    adv = advantages[micro_d] if advantages.ndim == 1 else advantages[micro_d, :Lm]
                    loss, stats = policy_loss(
                        PolicyLossInputs(
                            logprobs,
                            sub.old_logprobs,
                            adv,
                            sub.loss_mask,
                            cfg,
                            ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro_d, :Lm],
                            kl_coef=kl_coef,
                            is_weights=None if is_weights is None else is_weights[micro_d, :Lm],
                            num_seqs=num_seqs,
                            num_tokens=num_tokens,
                        )
                    )
                    if logits_entropy is not None:
                        bonus = aggregate(logits_entropy, sub.loss_mask, "token_mean", num_tokens=num_tokens)
                        loss = loss - cfg.entropy_coef * bonus
                        stats["loss/entropy_bonus"] = float(-cfg.entropy_coef * bonus.detach())
                    loss.backward()
                    if entropy is not None:
                        stats["entropy"] = float((entropy * sub.loss_mask).sum() / max(w, 1.0))
                    stats["loss/total"] = float(loss.detach())
                    _accumulate(sums, weights, stats, w)
                if step_policy:
                    if cfg.optim.max_grad_norm is not None:
                        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.max_grad_norm)
                        sums["grad_norm"] += distributed.grad_norm(gn)  # the global norm, on every rank
                        weights["grad_norm"] += 1.0
                    if not empty:
                        self.optimizer.step()
                        self.scheduler.step()
                if critic is not None:
                    # the critic's positions are the policy tokens and their turn ends: none either
                    stats = critic.step() if not empty else critic.skip()
                    for k, v in stats.items():
                        sums[k] += v
                        weights[k] += 1.0
                updates += 1
        # A rank's loss is its part of the global loss times the number of ranks (see the
        # docstring), so the mean over ranks is the global loss; the other statistics are
        # weighted sums, added up over ranks before dividing.
        out = {k: v / updates for k, v in sums.items() if k.startswith("loss/")}
        rest = [k for k in sums if not k.startswith("loss/")]
        ops: dict[str, distributed.MetricOp] = {k: "mean" for k in out}
        out.update({k: sums[k] for k in rest} | {f"{k}#weight": weights[k] for k in rest})
        ops.update({k: "sum" for k in out if k not in ops})
        out = distributed.reduce_metrics(out, ops=ops)
        for k in rest:
            out[k] /= max(out.pop(f"{k}#weight"), 1e-12)
        out["update/skipped_minibatches"] = float(skipped)  # a global decision: the same on every rank
        return out

    def policy_forward(
        self, sub: RolloutBatch, log_entropy: bool = True
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(logprobs [B, L], entropy [B, L] no grad or None, entropy with grad or None).

        The entropy is computed when the bonus needs it (`entropy_coef > 0`) or `log_entropy`.
        """
        grad = self.cfg.entropy_coef > 0
        logprobs, entropy = sequence_logprobs(
            self.policy,
            sub,
            with_entropy=grad or log_entropy,
            entropy_grad=grad,
            split_prompt=distributed.is_sharded(self.policy),
            **self.sampled_distribution(),
        )
        if entropy is None:
            return logprobs, None, None
        return logprobs, entropy.detach(), entropy if grad else None

    def sampled_distribution(self) -> dict[str, Any]:
        """`sequence_logprobs`' keywords for the distribution the rollouts sampled from.

        Temperature, top-k and top-p of `cfg.sampling` (the policy π is the truncated,
        renormalised distribution when the cuts are on), and the packing setting.
        """
        s = self.cfg.sampling
        return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "packed": self.cfg.packing}

    @torch.no_grad()
    def trainer_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, L] log π_old of the batch's tokens under the current policy, in eval mode."""
        policy, dist = self.policy, self.sampled_distribution()
        split = distributed.is_sharded(policy)  # every rank makes the same forward calls
        was_training = policy.training
        policy.eval()
        try:
            return self.per_micro_batch(
                batch, lambda sub: sequence_logprobs(policy, sub, split_prompt=split, **dist)[0]
            )
        finally:
            policy.train(was_training)

    def recompute_old_logprobs(
        self,
        batch: RolloutBatch,
        metrics: dict[str, float],
        guided_rows: torch.Tensor | None = None,
        recompute: bool = False,
    ) -> torch.Tensor | None:
        """Put the trainer's log π_old in `batch.old_logprobs` where the sampler's are not its own.

        Rows the sampler did not sample (`guided_rows` [B] bool, GRPO's expert guidance) take
        the trainer's. With `recompute` (a vLLM engine, rollout servers, async rollouts) or
        `rollout.tis`, every row does: the sampler's log-probs are π_rollout, the ratio's
        denominator is the trainer's π_old (with the transformers backend and `tis: true`,
        π_rollout is the KV-cached decoding's, π_old the padded training forward's; they differ
        under bf16 or FSDP). Their mismatch goes into `metrics` (`mismatch/*`).

        Returns:
            [B, L] truncated importance weights min(π_old / π_rollout, C) when `rollout.tis` is
            on (`textgym.algorithms.correction.rollout_correction`; Yao et al. 2025, "Your
            Efficient RL Framework Secretly Brings You Off-Policy RL Training"), else None.
        """
        rollout = self.cfg.rollout
        if guided_rows is not None and bool(guided_rows.any()):
            guided = guided_rows.to(self.device)[:, None]
            batch.old_logprobs = torch.where(guided, self.trainer_logprobs(batch), batch.old_logprobs)
        if not (recompute or rollout.use_tis):
            return None
        rollout_logprobs = batch.old_logprobs
        batch.old_logprobs = self.trainer_logprobs(batch)
        weights, stats = rollout_correction(
            batch.old_logprobs,
            rollout_logprobs,
            batch.loss_mask,
            cap=rollout.tis_cap if rollout.use_tis else None,
            drop_above_cap=rollout.off_policy_correction == "decoupled",
        )
        metrics.update(stats)
        return weights if rollout.use_tis else None

    @torch.no_grad()
    def reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, L] log π_ref of the batch's tokens (None without a reference)."""
        if self.cfg.lora is not None and self.cfg.kl_coef > 0:
            from textgym.training.lora import reference_of

            policy, dist = self.policy, self.sampled_distribution()
            was_training = policy.training
            policy.eval()
            try:
                with reference_of(policy) as ref:
                    return self.per_micro_batch(batch, lambda sub: sequence_logprobs(ref, sub, **dist)[0])
            finally:
                policy.train(was_training)
        if self.reference is None:
            return None
        reference, dist = self.reference, self.sampled_distribution()
        split = distributed.is_sharded(reference)
        if self.cfg.reference_device is not None and not split:
            # Placed elsewhere (another GPU, or offloaded to CPU): the micro-batch goes there
            # and its log-probs come back.
            where = torch.device(self.cfg.reference_device)
            return self.per_micro_batch(
                batch,
                lambda sub: sequence_logprobs(reference, sub.to(where), **dist)[0].to(self.device),
            )
        return self.per_micro_batch(
            batch, lambda sub: sequence_logprobs(reference, sub, split_prompt=split, **dist)[0]
        )

    @torch.no_grad()
    def per_micro_batch(
        self, batch: RolloutBatch, fn: Callable[[RolloutBatch], torch.Tensor], extra_columns: int = 0
    ) -> torch.Tensor:
        """Apply `fn` to each micro-batch of `batch` without gradient and stitch the rows back.

        `fn(sub)` returns [b, L_sub + extra_columns] for a micro-batch trimmed to L_sub response
        columns; each piece is right-padded with 0 to `L + extra_columns` and put back at its
        rows (token-budget micro-batches are not in row order).
        """
        width = batch.loss_mask.shape[1] + extra_columns
        out: torch.Tensor | None = None
        for micro in self.micro_batches(batch, torch.arange(len(batch))):
            part = fn(batch.select(micro))
            part = torch.nn.functional.pad(part, (0, width - part.shape[1]))
            if out is None:
                out = part.new_zeros((len(batch), width))
            out[micro.to(part.device)] = part
        assert out is not None
        return out

    def micro_batches(self, batch: RolloutBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """The micro-batches of the minibatch `rows` [n] (row indices into `batch`).

        `micro_batch_size` rows each, the rows ordered by group first, so that the samples of
        one task share a micro-batch and its prompt is run once (`sequence_logprobs`'
        `share_prompts`): a shuffled minibatch's micro-batches would otherwise hold a prompt
        per row. The minibatch's gradient is the sum over its rows, so the order only moves
        float rounding. Or token-budget ones (`micro_batch_tokens`): whole groups up to the
        budget, a group's prompt counted once (`group_token_budget_micro_batches`), or, when
        packing or for ungrouped rows, similar lengths together (`token_budget_micro_batches`).
        """
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            key = batch.groups[rows.to(batch.groups.device)].cpu() * (len(batch) + 1) + rows.cpu()
            return chunks(rows[torch.argsort(key).to(rows.device)], self.micro_batch_size)
        prompt, response = row_lengths(batch)
        if not self.cfg.packing and batch.groups.numel() and bool((batch.groups >= 0).all()):
            groups = batch.groups.cpu()
            cut = group_token_budget_micro_batches(prompt, response, groups, rows.tolist(), budget)
        else:
            cut = token_budget_micro_batches(prompt, response, rows.tolist(), budget, self.cfg.packing)
        return [torch.tensor(m, dtype=torch.long) for m in cut]


def _accumulate(sums: dict[str, float], weights: dict[str, float], stats: dict[str, float], w: float) -> None:
    """Add a micro-batch's `stats` into the running `sums` (and `weights`).

    Losses are added as they are (micro-batch losses add up to the minibatch loss), the rest
    weighted by the micro-batch's `w` policy tokens.
    """
    for k, v in stats.items():
        if k.startswith("loss/"):
            sums[k] += v
        else:
            sums[k] += v * w
            weights[k] += w
