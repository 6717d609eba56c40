"""One registry class behind every table of named things, and the advantage and policy-loss tables.

`Registry[T]` maps names to things of one kind (advantage estimators, policy losses, the
preference trainers' pair losses, the stages of `textgym train`): `register(name)` is its
decorator, `get(name)` its lookup, `names()` the sorted names. Every registry refuses a second
entry under a taken name (unless `replace=True`) and answers an unknown name with one error,
`UnknownNameError` (a `KeyError` and a `ValueError`), naming the known names and how to add one.

`@register_advantage("name")` makes an advantage estimator selectable by the GRPO trainer
(`grpo.advantage_estimator`, table `ADVANTAGES`); `@register_policy_loss("name")` makes a policy
loss selectable by every on-policy trainer (`grpo.policy_loss`, `ppo.policy_loss`, table
`POLICY_LOSSES`).

## Advantage estimators

A registered estimator is a function `fn(inputs: AdvantageInputs) -> (advantages, stats)`:

- a per-sequence estimator returns advantages [N] for `inputs.rewards` (the rewards of the
  whole batch, every rank's rows in rank order); the trainer keeps this rank's rows;
- a per-token estimator returns advantages [B, L] for this rank's rows (`inputs.token_rewards`,
  `inputs.mask`), using `inputs.reduce` for any statistic over the whole batch.

`stats` are detached floats, logged with the step's metrics (keys like `adv/std`). The
built-in estimators (`grpo`, `rloo`, `reinforce_pp`, `grpo_process`) are registered in
`textgym.algorithms.advantages`, which `ADVANTAGES` imports before its first lookup, so
`ADVANTAGES.names()` lists them. Adding one:

    from textgym.algorithms.registry import AdvantageInputs, register_advantage

    @register_advantage("mean_baseline")
    def mean_baseline(x: AdvantageInputs):
        adv = x.rewards - x.rewards.mean()
        return adv, {"adv/std": float(adv.std())}

then `grpo.advantage_estimator: mean_baseline` selects it.

## Policy losses
A registered policy loss is a function `fn(inputs: PolicyLossInputs) -> (loss, stats)`: the
scalar loss of one micro-batch (reduced with `textgym.algorithms.aggregate.aggregate` so that
micro-batch losses add up to the minibatch's) and detached float stats (`loss/policy`,
`clip/frac`, ...). The built-in `ppo_clip` (PPO's clipped surrogate with the config's clip
range, dual-clip, KL in the loss and importance weights) is registered in
`textgym.algorithms.clipped_loss`; `gspo`, `gspo_token` (Zheng et al. 2025) and `cispo` (MiniMax 2025)
in `textgym.algorithms.policy_losses`; `POLICY_LOSSES` imports both before its first lookup.

This module imports nothing heavy (torch only for type checking), so the config can validate
names against it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")


class UnknownNameError(KeyError, ValueError):
    """A registry has nothing under the name asked for.

    Both a `KeyError` (a failed lookup) and a `ValueError` (a bad config value), so code that
    catches either keeps working. Its text reads, e.g.
    `policy_loss: unknown policy loss 'nope'; registered: cispo, gspo, gspo_token, ppo_clip
    (add one with @register_policy_loss from textgym.algorithms.registry)`; a caller that knows
    the config section prefixes it (`grpo.policy_loss: ...`).

    Attributes:
        kind: what the registry holds ("advantage estimator", "stage", ...).
        field: the config field whose value is looked up ("" when the name is itself the field).
        name: the name asked for.
        known: the registered names, sorted.
        add_with: how to add one (a decorator and its module).
    """

    def __init__(self, kind: str, field: str, name: str, known: list[str], add_with: str) -> None:
        """Keep the parts of the message (see the class's attributes)."""
        super().__init__(name)
        self.kind, self.field, self.name, self.known, self.add_with = kind, field, name, known, add_with

    def __reduce__(self) -> tuple[type[UnknownNameError], tuple[str, str, str, list[str], str]]:
        """Rebuild from all its parts when unpickled (another process's error)."""
        return type(self), (self.kind, self.field, self.name, self.known, self.add_with)

    def __str__(self) -> str:
        """The message (unquoted, unlike a plain `KeyError`'s)."""
        where = f"{self.field}: " if self.field else ""
        known = ", ".join(self.known) or "none"
        return f"{where}unknown {self.kind} {self.name!r}; registered: {known} (add one with {self.add_with})"


class Registry(Generic[T]):
    """Names → things of one kind, filled by a decorator, read by name.

    Args:
        kind: what it holds, for messages ("advantage estimator").
        field: the config field whose value names an entry ("advantage_estimator"); "" when the
            name is itself the field (stages).
        add_with: how a user adds one, for the unknown-name message
            ("@register_advantage from textgym.algorithms.registry").
        modules: modules that register the built-ins, imported before the first lookup
            (`get`, `names`, `in`), so that a lookup sees them whatever was imported before.
    """

    def __init__(self, kind: str, field: str, add_with: str, modules: Sequence[str] = ()) -> None:
        """Make an empty registry (see the class's arguments)."""
        self.kind, self.field, self.add_with = kind, field, add_with
        self._modules = tuple(modules)
        self._loaded = not self._modules
        self._entries: dict[str, T] = {}

    def _load(self) -> None:
        """Import the modules that register the built-ins, once.

        Raises:
            ImportError: what importing one of them raises.
        """
        if self._loaded:
            return
        self._loaded = True  # first: a module that looks a name up while it loads does not recurse
        try:
            for module in self._modules:
                importlib.import_module(module)
        except BaseException:
            self._loaded = False  # the next lookup tries again (and raises again)
            raise

    def register(self, name: str, *, replace: bool = False) -> Callable[[T], T]:
        """Decorator: register the decorated thing under `name` (and return it unchanged).

        Registering the same object again under its name is a no-op (a module imported twice).

        Args:
            name: the name that selects it.
            replace: allow replacing another entry already registered under `name`.

        Raises:
            ValueError: if `name` is empty, or (when decorating) it is taken by another entry and
                `replace` is False.
        """
        if not name:
            raise ValueError(f"a {self.kind} needs a name")

        def add(item: T) -> T:
            taken = self._entries.get(name)
            if taken is not None and taken is not item and not replace:
                raise ValueError(
                    f"{self.kind} {name!r} is already registered ({_qualname(taken)}); "
                    "pass replace=True to replace it"
                )
            self._entries[name] = item
            return item

        return add

    def unregister(self, name: str) -> None:
        """Remove `name` if it is registered (a test's or a notebook's throwaway entry)."""
        self._entries.pop(name, None)

    def get(self, name: str) -> T:
        """The entry registered under `name`.

        Raises:
            UnknownNameError: if none is; its message names `name`, the registered names and
                how to add one.
        """
        self._load()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.kind, self.field, name, self.names(), self.add_with) from None

    def names(self) -> list[str]:
        """The registered names, sorted (the built-ins included)."""
        self._load()
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        """Whether `name` is registered (the built-ins included)."""
        self._load()
        return name in self._entries

    def __repr__(self) -> str:
        """`Registry('advantage estimator': grpo, rloo, ...)`, the names registered so far."""
        return f"Registry({self.kind!r}: {', '.join(sorted(self._entries))})"


def _qualname(item: Any) -> str:
    """`module.qualname` of a registered function (its repr for anything else)."""
    if hasattr(item, "__qualname__"):
        return f"{getattr(item, '__module__', '?')}.{item.__qualname__}"
    return repr(item)


@dataclass(frozen=True)
class AdvantageInputs:
    """What an advantage estimator gets from the GRPO trainer at one step.

    Attributes:
        rewards: [N] float, each sequence's reward over the whole batch (all ranks' rows,
            grouped contiguously by task, N = num_groups × G); with `kl_placement: reward`,
            already minus β·Σ_t KL_t.
        token_rewards: [B, L] this rank's per-token rewards (the reward on each turn's last
            policy token; −β·KL_t on every token with `kl_placement: reward`).
        mask: [B, L] 1 on this rank's policy tokens that count in the loss, else 0.
        group_size: G, samples per task.
        scale_rewards: the config's `scale_rewards` ("group", "batch" or "none").
        reduce: sums a tensor over data-parallel ranks (identity on one process), for
            statistics of the whole batch from per-rank tensors; None: the local batch alone.
        step_mask: [B, L] 1 on this rank's tokens that carry a reward event the trainer sees
            (step ends and/or turn ends, per the config's `reward_source`;
            `RolloutBatch.with_reward_source`); None when not given.
    """

    rewards: torch.Tensor
    token_rewards: torch.Tensor
    mask: torch.Tensor
    group_size: int
    scale_rewards: str = "group"
    reduce: Callable[[torch.Tensor], torch.Tensor] | None = None
    step_mask: torch.Tensor | None = None


AdvantageFn = Callable[[AdvantageInputs], "tuple[torch.Tensor, dict[str, float]]"]
"""An advantage estimator: `AdvantageInputs` in, `(advantages [N] or [B, L], stats)` out."""

ADVANTAGES: Registry[AdvantageFn] = Registry(
    "advantage estimator",
    "advantage_estimator",
    "@register_advantage from textgym.algorithms.registry",
    modules=["textgym.algorithms.advantages"],
)
"""The advantage estimators by name (`grpo.advantage_estimator`)."""


@dataclass(frozen=True)
class PolicyLossInputs:
    """What a policy loss gets from the on-policy update for one micro-batch.

    Attributes:
        logprobs: [B, L] log π_θ of the taken tokens (requires grad).
        old_logprobs: [B, L] log π_old, the sampling log-probs (no grad).
        advantages: [B, L] per-token or [B] per-sequence advantages.
        mask: [B, L] 1.0 on the policy tokens that count in the loss.
        config: the stage's config (`GRPOConfig` or `PPOConfig`): `clip_low`, `clip_high`,
            `dual_clip`, `loss_aggregation`, `kl_estimator`, `sampling.max_new_tokens`, ...
        ref_logprobs: [B, L] log π_ref when the KL is in the loss, else None.
        kl_coef: β of the KL in the loss (0.0: none; the controller's current value for PPO).
        is_weights: [B, L] truncated importance weights of the rollout correction, or None.
        num_seqs: sequences in the minibatch this micro-batch belongs to (see `aggregate`).
        num_tokens: policy tokens in that minibatch (see `aggregate`).
    """

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    config: Any
    ref_logprobs: torch.Tensor | None = None
    kl_coef: float = 0.0
    is_weights: torch.Tensor | None = None
    num_seqs: float | None = None
    num_tokens: float | None = None


PolicyLossFn = Callable[[PolicyLossInputs], "tuple[torch.Tensor, dict[str, float]]"]
"""A policy loss: `PolicyLossInputs` in, `(scalar loss, stats)` out."""

POLICY_LOSSES: Registry[PolicyLossFn] = Registry(
    "policy loss",
    "policy_loss",
    "@register_policy_loss from textgym.algorithms.registry",
    modules=["textgym.algorithms.clipped_loss", "textgym.algorithms.policy_losses"],
)
"""The policy losses by name (`grpo.policy_loss`, `ppo.policy_loss`)."""


def register_advantage(name: str, *, replace: bool = False) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator: register an advantage estimator under `name` (`ADVANTAGES.register`).

    Args:
        name: the value of `advantage_estimator` that selects it.
        replace: allow replacing an estimator already registered under `name`.

    Raises:
        ValueError: if `name` is empty or taken (and `replace` is False).
    """
    return ADVANTAGES.register(name, replace=replace)


def get_advantage(name: str) -> AdvantageFn:
    """The estimator registered under `name` (`ADVANTAGES.get`; the GRPO trainer's call).

    Raises:
        UnknownNameError: if none is, listing the registered names.
    """
    return ADVANTAGES.get(name)


def register_policy_loss(name: str, *, replace: bool = False) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator: register a policy loss under `name` (`POLICY_LOSSES.register`).

    Args:
        name: the value of `policy_loss` that selects it.
        replace: allow replacing a loss already registered under `name`.

    Raises:
        ValueError: if `name` is empty or taken (and `replace` is False).
    """
    return POLICY_LOSSES.register(name, replace=replace)


def get_policy_loss(name: str) -> PolicyLossFn:
    """The policy loss registered under `name` (`POLICY_LOSSES.get`; the on-policy update's call).

    Raises:
        UnknownNameError: if none is, listing the registered names.
    """
    return POLICY_LOSSES.get(name)
