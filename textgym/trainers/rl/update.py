"""The update half of an on-policy iteration: μ epochs of the clipped surrogate over minibatches.

`PolicyUpdate` is the base of `OnPolicyTrainer` (`textgym.trainers.rl.on_policy`): it holds the
update loop (`update`: shuffled minibatches, micro-batch accumulation, the clipped policy
loss with its KL and entropy terms, the critic's loss through hooks, clipping and the
optimizer step, metrics reduced over ranks) and the no-grad log-probability passes the
iteration needs (π_old recomputed by the trainer, π_ref of the reference).

The loss is the one the config's `policy_loss` names in the registry
(`textgym.algorithms.registry.register_policy_loss`); the default, "ppo_clip"
(`textgym.algorithms.clipped_loss.clipped_policy_loss`), is PPO's clipped surrogate (Schulman et al.
2017, arXiv:1707.06347, eq. 7) with the options of the GRPO family; "gspo", "gspo_token" and
"cispo" are in `textgym.algorithms.policy_losses`.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR
from transformers import PreTrainedModel

from textgym import distributed
from textgym.algorithms import policy_losses  # noqa: F401  (registers gspo, gspo_token, cispo)
from textgym.algorithms.aggregate import aggregate
from textgym.algorithms.registry import PolicyLossInputs, get_policy_loss
from textgym.config import GRPOConfig, PPOConfig
from textgym.distributed.process_group import World
from textgym.training.batch import RolloutBatch, row_lengths, token_budget_micro_batches
from textgym.training.logprobs import sequence_logprobs
from textgym.training.rollout_metrics import chunks


class PolicyUpdate:
    """The policy update and the log-probability passes of an on-policy trainer (see the module).

    The attributes below are set by `OnPolicyTrainer.__init__`.
    """

    cfg: GRPOConfig | PPOConfig
    policy: Any
    reference: PreTrainedModel | None
    optimizer: torch.optim.Optimizer
    scheduler: LambdaLR
    device: torch.device
    world: World
    minibatch_size: int
    micro_batch_size: int
    step: int
    _is_weights: torch.Tensor | None

    # --- hooks of the update (PPO's critic overrides them) -------------------------------
    def _critic_loss(
        self, sub: RolloutBatch, rows: torch.Tensor, minibatch: torch.Tensor, num_tokens: float
    ) -> tuple[torch.Tensor, dict[str, float]] | None:
        """The critic's loss on the micro-batch `rows` of `minibatch` (None: no critic).

        `num_tokens` is this rank's share of the minibatch's policy tokens (the policy loss's
        denominator); a critic that trains other positions too computes its own.
        """
        return None

    def _loss_kl_coef(self) -> float:
        """β of the KL term in the loss (`kl_placement: loss`): `cfg.kl_coef`; PPO's controller's β."""
        return self.cfg.kl_coef

    def _critic_step(self) -> dict[str, float]:
        """Step the critic's optimizer after a minibatch; return its stats."""
        return {}

    def _gradient_sync(self, sync: bool) -> None:
        """Whether the coming backward passes reduce gradients over ranks (the last micro-batch does)."""
        distributed.set_requires_gradient_sync(self.policy, sync)

    def _update_policy(self) -> bool:
        """Whether this iteration steps the policy (PPO's critic warm-up says no)."""
        return True

    # --- the update and its no-grad passes ---------------------------------------------
    # long: the paper's loop in one place: epochs × minibatches × micro-batches, losses, step
    def update(
        self,
        batch: RolloutBatch,
        advantages: torch.Tensor,
        ref_logprobs: torch.Tensor | None = None,
        *,
        epochs: int | None = None,
        step_policy: bool | None = None,
        loss_rows: torch.Tensor | None = None,
    ) -> dict[str, float]:
        """μ epochs over shuffled minibatches of `batch`, accumulating over micro-batches.

        Args:
            batch: the rollout batch (on the policy's device).
            advantages: [B] per-sequence or [B, L] per-token advantages.
            ref_logprobs: [B, L] log π_ref of the batch (computed here when the KL is in the
                loss and it is not given).
            epochs: passes over the batch (default `cfg.epochs`).
            step_policy: False trains only the critic (default: `_update_policy()`).
            loss_rows: [B] bool, the rows that count in the policy loss (None: all). The
                others must have their `loss_mask` zeroed already (so they are out of
                `num_tokens`); here they are left out of `num_seqs` too.

        Returns:
            Loss, KL, clip, entropy and gradient-norm metrics, averaged over optimizer steps
            (losses) or policy tokens (the rest), over all ranks.

        Distributed: each rank takes `minibatch_size / ranks` of its rows per minibatch; the
        loss denominators (`num_tokens`, `num_seqs`) are this rank's share of the global
        minibatch's (`distributed.share`), so FSDP's average of the ranks' gradients is the
        gradient of the whole minibatch. The gradient reduce-scatter runs once per minibatch,
        after its last micro-batch.
        """
        cfg = self.cfg
        if cfg.kl_placement != "loss":
            ref_logprobs = None
        elif ref_logprobs is None:
            ref_logprobs = self._reference_logprobs(batch)
        kl_coef = self._loss_kl_coef() if cfg.kl_placement == "loss" else 0.0
        advantages = advantages.to(self.device)
        step_policy = self._update_policy() if step_policy is None else step_policy
        sums: dict[str, float] = defaultdict(float)
        weights: dict[str, float] = defaultdict(float)
        updates = 0
        policy_loss = get_policy_loss(cfg.policy_loss)  # `@register_policy_loss` functions
        every = cfg.entropy_every
        log_entropy = every > 0 and getattr(self, "step", 0) % every == 0
        self.policy.train(step_policy)
        for _ in range(cfg.epochs if epochs is None else epochs):
            for mb in chunks(torch.randperm(len(batch)), self.minibatch_size):
                # The global Σ mask (at least 1) divided by the ranks: see the docstring.
                num_tokens = max(distributed.share(float(batch.loss_mask[mb].sum())), 1.0 / self.world.size)
                num_seqs: float = len(mb)
                if loss_rows is not None:
                    num_seqs = max(distributed.share(float(loss_rows[mb].sum())), 1.0 / self.world.size)
                self.optimizer.zero_grad(set_to_none=True)
                micros = self._micro_batches(batch, mb)
                for i, micro in enumerate(micros):
                    self._gradient_sync(i == len(micros) - 1)
                    sub = batch.select(micro)
                    micro_d = micro.to(self.device)
                    Lm = sub.loss_mask.shape[1]
                    w = float(sub.loss_mask.sum())
                    critic = self._critic_loss(sub, micro_d, mb, num_tokens)
                    if critic is not None:
                        critic[0].backward()
                        for k, v in critic[1].items():
                            if k.startswith("loss/"):
                                sums[k] += v
                            else:
                                sums[k] += v * w
                                weights[k] += w
                    if not step_policy:
                        continue
                    logprobs, entropy, logits_entropy = self._policy_forward(sub, log_entropy)
                    adv = advantages[micro_d] if advantages.ndim == 1 else advantages[micro_d, :Lm]
                    is_w = None if self._is_weights is None else self._is_weights[micro_d, :Lm]
                    loss, stats = policy_loss(
                        PolicyLossInputs(
                            logprobs,
                            sub.old_logprobs,
                            adv,
                            sub.loss_mask,
                            cfg,
                            ref_logprobs=None if ref_logprobs is None else ref_logprobs[micro_d, :Lm],
                            kl_coef=kl_coef,
                            is_weights=is_w,
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
                    for k, v in stats.items():
                        if k.startswith("loss/"):
                            sums[k] += v  # micro-batch losses add up to the minibatch loss
                        else:
                            sums[k] += v * w
                            weights[k] += w
                if step_policy:
                    if cfg.optim.max_grad_norm is not None:
                        gn = torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.optim.max_grad_norm)
                        sums["grad_norm"] += distributed.grad_norm(gn)  # the global norm, on every rank
                        weights["grad_norm"] += 1.0
                    self.optimizer.step()
                    self.scheduler.step()
                for k, v in self._critic_step().items():
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
        return out

    def _policy_forward(
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
            **self._sampled_distribution(),
        )
        if entropy is None:
            return logprobs, None, None
        return logprobs, entropy.detach(), entropy if grad else None

    def _sampled_distribution(self) -> dict[str, Any]:
        """`sequence_logprobs`' keywords for the distribution the rollouts sampled from.

        Temperature, top-k and top-p of `cfg.sampling` (the policy π is the truncated,
        renormalised distribution when the cuts are on), and the packing setting.
        """
        s = self.cfg.sampling
        return {"temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "packed": self.cfg.packing}

    @torch.no_grad()
    def _trainer_logprobs(self, batch: RolloutBatch) -> torch.Tensor:
        """[B, L] log π_old of the batch's tokens under the current policy, in eval mode."""
        policy, dist = self.policy, self._sampled_distribution()
        split = distributed.is_sharded(policy)  # every rank makes the same forward calls
        was_training = policy.training
        policy.eval()
        try:
            return self.per_micro_batch(
                batch, lambda sub: sequence_logprobs(policy, sub, split_prompt=split, **dist)[0]
            )
        finally:
            policy.train(was_training)

    @torch.no_grad()
    def _reference_logprobs(self, batch: RolloutBatch) -> torch.Tensor | None:
        """[B, L] log π_ref of the batch's tokens (None without a reference)."""
        if self.cfg.lora is not None and self.cfg.kl_coef > 0:
            from textgym.training.lora import reference_of

            policy, dist = self.policy, self._sampled_distribution()
            was_training = policy.training
            policy.eval()
            try:
                with reference_of(policy) as ref:
                    return self.per_micro_batch(batch, lambda sub: sequence_logprobs(ref, sub, **dist)[0])
            finally:
                policy.train(was_training)
        if self.reference is None:
            return None
        reference, dist = self.reference, self._sampled_distribution()
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
        for micro in self._micro_batches(batch, torch.arange(len(batch))):
            part = fn(batch.select(micro))
            part = torch.nn.functional.pad(part, (0, width - part.shape[1]))
            if out is None:
                out = part.new_zeros((len(batch), width))
            out[micro.to(part.device)] = part
        assert out is not None
        return out

    def _micro_batches(self, batch: RolloutBatch, rows: torch.Tensor) -> list[torch.Tensor]:
        """The micro-batches of the minibatch `rows` [n] (row indices into `batch`).

        `micro_batch_size` rows each, in order; or token-budget ones (`micro_batch_tokens`,
        similar lengths together: `textgym.training.batch.token_budget_micro_batches`).
        """
        budget = self.cfg.micro_batch_tokens
        if budget is None:
            return chunks(rows, self.micro_batch_size)
        prompt, response = row_lengths(batch)
        cut = token_budget_micro_batches(prompt, response, rows.tolist(), budget, self.cfg.packing)
        return [torch.tensor(m, dtype=torch.long) for m in cut]
