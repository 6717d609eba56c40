"""PPO's critic: the value model (`build_critic`, `sequence_values`) and `Critic`, which PPO holds.

`Critic` is the network with its optimizer, schedule and this iteration's targets, and the
loss, step, checkpoint and save of each; the PPO trainer holds one instead of subclassing it in.

The value loss is the clipped one of `textgym.algorithms.auxiliary.value_loss` (PPO, Schulman
et al. 2017, arXiv:1707.06347; value clipping as in OpenAI's baselines).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForTokenClassification, PreTrainedModel

from textgym import distributed
from textgym.algorithms.auxiliary import value_loss
from textgym.config import PPOConfig
from textgym.models import disable_dropout
from textgym.training.batch import RolloutBatch
from textgym.training.checkpoint import load_weights, save_model_folder
from textgym.training.optim import build_optimizer, load_optimizer, save_optimizer
from textgym.training.precision import compute_autocast

_VALUE_HEAD: dict[str, Any] = {"id2label": {0: "value"}, "label2id": {"value": 0}, "classifier_dropout": 0.0}


def build_critic(policy: PreTrainedModel, path: str | None = None) -> PreTrainedModel:
    """A value model: `AutoModelForTokenClassification` with one label (a scalar per token).

    The backbone is the policy's (copied from the model in memory) or loaded from `path`;
    the head is zero-initialised, so every value starts at 0. Dropout is off everywhere in it
    (`textgym.models.disable_dropout`), whatever the backbone's config says.

    Args:
        policy: the policy; its config and backbone weights are used when `path` is None.
        path: a local HF folder to take the backbone from instead.

    Returns:
        The critic on the policy's device, in fp32.

    Raises:
        RuntimeError: if the policy's backbone does not fit the critic's (a custom architecture).
    """
    device = next(policy.parameters()).device
    if path is not None:
        critic = AutoModelForTokenClassification.from_pretrained(path, **_VALUE_HEAD)
    else:
        config = policy.config.__class__.from_dict({**policy.config.to_dict(), **_VALUE_HEAD})
        critic = AutoModelForTokenClassification.from_config(config)
        from textgym.agents.weight_sync import is_lora, merged_state_dict

        if is_lora(policy):
            # The backbone of a LoRA policy under its plain names (the merged weights).
            lora_policy: Any = policy
            prefix = lora_policy.get_base_model().base_model_prefix + "."
            merged = merged_state_dict(policy)
            critic.base_model.load_state_dict(
                {k[len(prefix) :]: v for k, v in merged.items() if k.startswith(prefix)}
            )
        else:
            critic.base_model.load_state_dict(policy.base_model.state_dict())
    disable_dropout(critic)  # values are a deterministic function of the weights
    head = value_head(critic)
    with torch.no_grad():
        head.weight.zero_()
        if head.bias is not None:
            head.bias.zero_()
    return critic.float().to(device)


def value_head(critic: PreTrainedModel) -> torch.nn.Linear:
    """The critic's scalar head: the `score` (Llama, Qwen2, ...) or `classifier` (GPT-2, BERT-style) linear.

    Raises:
        RuntimeError: if the token-classification model has neither.
    """
    for name in ("score", "classifier"):
        head = getattr(critic, name, None)
        if isinstance(head, torch.nn.Linear):
            return head
    raise RuntimeError(f"{type(critic).__name__} has no `score` or `classifier` linear head for the values")


def sequence_values(critic: PreTrainedModel, batch: RolloutBatch) -> torch.Tensor:
    """Values of the states along the response: [B, L + 1].

    Column t < L is V(s_t), the value of the prefix before response token t (read from the
    head at position P − 1 + t); column n_i (the row's response length) is the value of the
    whole sequence, the state after its last turn, used to bootstrap a truncated episode.
    The value loss trains that kind of state at the mid-episode turn ends
    (`advantages.turn_end_value_targets`).

    Args:
        critic: a token-classification model with one label.
        batch: the padded batch (prompt width P, response width L).

    Returns:
        [B, L + 1] fp32 values (computed under the critic's `compute_autocast`).
    """
    P = batch.prompt_width
    with compute_autocast(critic):  # bf16 compute when `parallel.mixed_precision` says so
        out = critic(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        )
    return out.logits[:, P - 1 :, 0].float()


class Critic:
    """PPO's value model as an object the trainer holds.

    The network, its optimizer and schedule, this iteration's targets, and the loss, step,
    checkpoint and save of each.

    Args:
        policy: the policy, unsharded; the critic's backbone is copied from it (`build_critic`)
            unless `cfg.critic.path` names another.
        cfg: the PPO config (`critic`: path, optimizer, value clip; `loss_aggregation` and
            `sampling.max_new_tokens` for the loss's reduction).
        updates: optimizer steps the critic takes over the run (for its schedule).
        shard: places the critic as the policy is placed (precision, FSDP2 under torchrun).
        gradient_checkpointing: recompute the critic's activations in the backward pass.
    """

    def __init__(
        self,
        policy: PreTrainedModel,
        cfg: PPOConfig,
        updates: int,
        shard: Callable[[torch.nn.Module], Any],
        *,
        gradient_checkpointing: bool = False,
    ) -> None:
        self.cfg = cfg
        self.epochs = cfg.critic.epochs  # passes per batch; those past the policy's train it alone
        self.warmup_steps = cfg.critic_warmup_steps  # iterations that train the critic only
        self.model = build_critic(policy, cfg.critic.path)
        if gradient_checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        shard(self.model)
        self.optimizer, self.scheduler = build_optimizer(self.model, cfg.critic.optim, updates)
        # this iteration's targets (`set_targets`), all [B, L] on this rank
        self.mask = self.old_values = self.returns = self.targets = torch.empty(0)

    @torch.no_grad()
    def values(self, batch: RolloutBatch, per_micro_batch: Callable[..., torch.Tensor]) -> torch.Tensor:
        """[B, L + 1] values of the batch's states (`sequence_values`), in eval mode, per micro-batch."""
        self.model.eval()
        return per_micro_batch(batch, lambda sub: sequence_values(self.model, sub), extra_columns=1)

    def set_targets(
        self, values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, targets: torch.Tensor
    ) -> None:
        """This iteration's value targets, all [B, L].

        Args:
            values: V(s_t) at rollout time (the value clip's centre).
            returns: the GAE returns (logged, and read by tests).
            mask: the positions the critic trains on: policy tokens and mid-episode turn ends.
            targets: the regression targets there (the returns, plus the turn ends' targets).
        """
        self.mask, self.old_values, self.returns, self.targets = mask, values * mask, returns, targets

    def loss(
        self, sub: RolloutBatch, rows: torch.Tensor, minibatch: torch.Tensor, num_seqs: float
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """The clipped value loss over the critic's positions of the micro-batch `rows`.

        Its token denominator is this rank's share of the minibatch's critic positions (the
        policy tokens plus the turn ends), so micro-batches and ranks add up to the whole
        minibatch's loss as for the policy (`algorithms.auxiliary.value_loss`); its sequence
        denominator `num_seqs` is the policy's: this rank's share of the minibatch's rows in the
        loss (rows out of it, e.g. cut by the overlong filter, count in neither).
        """
        cfg = self.cfg
        self.model.train()
        Lm = sub.loss_mask.shape[1]
        values = sequence_values(self.model, sub)[:, :Lm]
        critic_tokens = float(self.mask[minibatch].sum())
        return value_loss(
            values,
            self.old_values[rows, :Lm],
            self.targets[rows, :Lm],
            self.mask[rows, :Lm],
            clip_range=cfg.critic.value_clip,
            aggregation=cfg.loss_aggregation,
            num_seqs=num_seqs,
            num_tokens=max(distributed.share(critic_tokens), 1.0 / distributed.world().size),
            norm_len=cfg.sampling.max_new_tokens,
        )

    def step(self) -> dict[str, float]:
        """Clip the gradient (`critic.optim.max_grad_norm`), step the optimizer and schedule; stats."""
        stats = {}
        if self.cfg.critic.optim.max_grad_norm is not None:
            gn = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.critic.optim.max_grad_norm)
            stats["value/grad_norm"] = distributed.grad_norm(gn)
        self.optimizer.step()
        self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return stats

    def skip(self) -> dict[str, float]:
        """After a minibatch with no position in the loss: drop its (zero) gradient, take no step.

        AdamW's momentum and weight decay would move the weights on a zero gradient; the
        schedule does not advance either. No stats.
        """
        self.optimizer.zero_grad(set_to_none=True)
        return {}

    def gradient_sync(self, sync: bool) -> None:
        """Whether the coming backward passes reduce the critic's gradients over ranks."""
        distributed.set_requires_gradient_sync(self.model, sync)

    def save(self, folder: Path) -> None:
        """Checkpoint the critic into `folder`: weights, optimizer, schedule (collective)."""
        save_model_folder(folder, self.model)
        save_optimizer(folder / "optimizer.pt", self.model, self.optimizer)
        if distributed.is_main():
            torch.save(self.scheduler.state_dict(), folder / "scheduler.pt")

    def load(self, folder: Path) -> None:
        """Restore what `save` wrote."""
        load_weights(folder, self.model)
        load_optimizer(folder / "optimizer.pt", self.model, self.optimizer)
        self.scheduler.load_state_dict(torch.load(folder / "scheduler.pt", weights_only=False))

    def save_final(self, folder: Path, extra: dict[str, Any]) -> None:
        """Save the trained critic to `folder` with a `textgym.json` (`role: critic`, plus `extra`)."""
        save_model_folder(folder, self.model)
        if distributed.is_main():
            (folder / "textgym.json").write_text(json.dumps({"role": "critic", **extra}), encoding="utf-8")
        distributed.barrier()
