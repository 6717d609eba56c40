"""Offline preference losses: DPO, IPO, KTO, SimPO and ORPO, as pure functions of log-probabilities.

Every function takes sequence log-probabilities (the sum, or for the length-normalised
losses the mean, of the response tokens' log-probabilities under a model; [B] tensors),
returns the per-example losses ([B] or [N]) and a dict of detached statistics; the trainer
(`textgym.trainers.preference.offline`) averages them. The reference log-probabilities are inputs, so a
trainer computes them once for the whole dataset and caches them.

The pair losses are also registered by name (`PAIR_LOSSES`, a `textgym.algorithms.registry.Registry`;
`register_pair_loss`, `pair_loss`): the offline and the online preference trainers call
`pair_loss(cfg.loss, PairLossInputs(...))`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.nn.functional import logsigmoid

from textgym.algorithms.registry import Registry


def _pair_stats(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> dict[str, float]:
    margin = chosen_rewards - rejected_rewards
    return {
        "rewards/chosen": float(chosen_rewards.mean()),
        "rewards/rejected": float(rejected_rewards.mean()),
        "rewards/margin": float(margin.mean()),
        "rewards/accuracy": float((margin > 0).float().mean()),
    }


def dpo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    *,
    beta: float = 0.1,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """DPO's sigmoid loss (Rafailov et al. 2023, arXiv:2305.18290, eq. 7), with label smoothing.

    With h = (log π(y_w) − log π_ref(y_w)) − (log π(y_l) − log π_ref(y_l)) and ε the
    probability that a label is flipped (conservative DPO, Mitchell 2023):
    `ℓ = −(1 − ε)·log σ(β·h) − ε·log σ(−β·h)`.

    Args:
        chosen_logps: [B] summed log-probs of the chosen responses under the policy.
        rejected_logps: [B] the same for the rejected responses.
        ref_chosen_logps: [B] the chosen responses under the reference (no grad).
        ref_rejected_logps: [B] the rejected responses under the reference (no grad).
        beta: β, the strength of the implicit KL constraint.
        label_smoothing: ε in [0, 0.5).

    Returns:
        Per-pair losses [B] and stats: implicit rewards `rewards/chosen` = β·(log π − log π_ref)
        of y_w, `rewards/rejected`, `rewards/margin`, `rewards/accuracy` (share with margin > 0).

    Raises:
        ValueError: if `label_smoothing` is not in [0, 0.5) or `beta` ≤ 0.
    """
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    h = chosen_ratio - rejected_ratio
    losses = -(1 - label_smoothing) * logsigmoid(beta * h) - label_smoothing * logsigmoid(-beta * h)
    return losses, _pair_stats(beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def ipo_loss(
    chosen_logps: torch.Tensor,
    rejected_logps: torch.Tensor,
    ref_chosen_logps: torch.Tensor,
    ref_rejected_logps: torch.Tensor,
    chosen_lengths: torch.Tensor,
    rejected_lengths: torch.Tensor,
    *,
    beta: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """IPO (Azar et al. 2023, arXiv:2310.12036, eq. 17): a squared loss that regresses the margin.

    The log-ratios are averaged over response tokens (what the IPO authors used, and what
    TRL does): with h = (log π(y_w) − log π_ref(y_w))/|y_w| − (log π(y_l) − log π_ref(y_l))/|y_l|,
    `ℓ = (h − 1/(2β))²`; β is the paper's τ.

    Args:
        chosen_logps: [B] summed log-probs of the chosen responses under the policy.
        rejected_logps: [B] the same for the rejected responses.
        ref_chosen_logps: [B] the chosen responses under the reference.
        ref_rejected_logps: [B] the rejected responses under the reference.
        chosen_lengths: [B] response tokens of each chosen response (clamped to ≥ 1).
        rejected_lengths: [B] the same for the rejected responses.
        beta: τ.

    Returns:
        Per-pair losses [B] and the implicit-reward stats (as `dpo_loss`, from summed ratios).

    Raises:
        ValueError: if `beta` ≤ 0.
    """
    if beta <= 0:
        raise ValueError(f"beta must be > 0, got {beta}")
    chosen_ratio = chosen_logps - ref_chosen_logps
    rejected_ratio = rejected_logps - ref_rejected_logps
    h = chosen_ratio / chosen_lengths.clamp(min=1) - rejected_ratio / rejected_lengths.clamp(min=1)
    losses = (h - 1.0 / (2.0 * beta)) ** 2
    return losses, _pair_stats(beta * chosen_ratio.detach(), beta * rejected_ratio.detach())


def kto_reference_point(kl_logps: torch.Tensor, ref_kl_logps: torch.Tensor) -> torch.Tensor:
    """KTO's z₀ (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 7 and §4.2): a batch estimate of KL(π‖π_ref).

    `z₀ = max(0, mean_j (log π(y'_j|x_j) − log π_ref(y'_j|x_j)))` over mismatched (prompt,
    completion) pairs, not differentiated. A trainer that splits a batch into micro-batches
    or ranks sums the differences and counts over all of them first (`PreferenceTrainer`),
    so that z₀, hence the gradient, does not depend on the split.

    Args:
        kl_logps: [M] summed log-probs of the mismatched pairs under the policy.
        ref_kl_logps: [M] the same under the reference.

    Returns:
        z₀, a 0-dim tensor ≥ 0 (detached).
    """
    return (kl_logps - ref_kl_logps).mean().detach().clamp(min=0)


def kto_loss(
    logps: torch.Tensor,
    ref_logps: torch.Tensor,
    desirable: torch.Tensor,
    kl_logps: torch.Tensor | None = None,
    ref_kl_logps: torch.Tensor | None = None,
    *,
    z0: torch.Tensor | float | None = None,
    beta: float = 0.1,
    desirable_weight: float = 1.0,
    undesirable_weight: float = 1.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KTO (Ethayarajh et al. 2024, arXiv:2402.01306, eq. 7): unpaired good/bad examples.

    The reference point z₀ is a batch estimate of KL(π‖π_ref) (`kto_reference_point`): the
    mean of `log π(y'|x) − log π_ref(y'|x)` over mismatched (prompt, completion) pairs,
    clamped at 0 and not differentiated; pass the mismatched pairs' log-probs, or `z0`
    itself when it was reduced over a whole batch that these examples are a part of. With
    r = log π(y|x) − log π_ref(y|x):
    desirable `ℓ = λ_D·(1 − σ(β·(r − z₀)))`, undesirable `ℓ = λ_U·(1 − σ(β·(z₀ − r)))`.

    Args:
        logps: [N] summed response log-probs of each example under the policy.
        ref_logps: [N] the same under the reference.
        desirable: [N] bool, the example's label.
        kl_logps: [M] summed log-probs of the mismatched pairs that estimate z₀, policy
            (unless `z0` is given).
        ref_kl_logps: [M] the same under the reference.
        z0: the reference point, already reduced (≥ 0); overrides `kl_logps`.
        beta: β.
        desirable_weight: λ_D.
        undesirable_weight: λ_U.

    Returns:
        Per-example losses [N] (in the input order) and stats: `kl` (z₀),
        `rewards/chosen` / `rewards/rejected` (mean β·r of desirable / undesirable examples;
        0 when there are none).

    Raises:
        ValueError: if `beta` ≤ 0 or the weights are negative, or neither `z0` nor both
            mismatched log-prob tensors are given.
    """
    if beta <= 0 or desirable_weight < 0 or undesirable_weight < 0:
        raise ValueError("beta must be > 0 and the weights >= 0")
    if z0 is None:
        if kl_logps is None or ref_kl_logps is None:
            raise ValueError("kto_loss needs z0 or the mismatched pairs' kl_logps and ref_kl_logps")
        z0 = kto_reference_point(kl_logps, ref_kl_logps)
    z0 = torch.as_tensor(z0, dtype=logps.dtype, device=logps.device).detach()
    r = logps - ref_logps
    desirable = desirable.bool()
    chosen = desirable_weight * (1 - torch.sigmoid(beta * (r - z0)))
    rejected = undesirable_weight * (1 - torch.sigmoid(beta * (z0 - r)))
    losses = torch.where(desirable, chosen, rejected)
    rd = (beta * r).detach()
    stats = {
        "kl": float(z0),
        "rewards/chosen": float(rd[desirable].mean()) if desirable.any() else 0.0,
        "rewards/rejected": float(rd[~desirable].mean()) if (~desirable).any() else 0.0,
    }
    return losses, stats


def simpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    *,
    beta: float = 2.0,
    gamma: float = 1.0,
    label_smoothing: float = 0.0,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SimPO (Meng et al. 2024, arXiv:2405.14734, eq. 6): reference-free, length-normalised, margin γ.

    With the average log-probabilities of the responses as rewards:
    `ℓ = −log σ(β·(avg log π(y_w) − avg log π(y_l)) − γ)` (label smoothing as in `dpo_loss`).

    Args:
        chosen_avg_logps: [B] mean response-token log-probs of the chosen responses.
        rejected_avg_logps: [B] the same for the rejected responses.
        beta: β (SimPO uses 2 to 10).
        gamma: the target reward margin γ.
        label_smoothing: ε in [0, 0.5).

    Returns:
        Per-pair losses [B] and stats with rewards β·avg log π.

    Raises:
        ValueError: if `beta` ≤ 0 or `label_smoothing` is not in [0, 0.5).
    """
    if beta <= 0 or not 0.0 <= label_smoothing < 0.5:
        raise ValueError("beta must be > 0 and label_smoothing in [0, 0.5)")
    z = beta * (chosen_avg_logps - rejected_avg_logps) - gamma
    losses = -(1 - label_smoothing) * logsigmoid(z) - label_smoothing * logsigmoid(-z)
    return losses, _pair_stats(beta * chosen_avg_logps.detach(), beta * rejected_avg_logps.detach())


def orpo_loss(
    chosen_avg_logps: torch.Tensor,
    rejected_avg_logps: torch.Tensor,
    chosen_nll: torch.Tensor,
    *,
    lam: float = 0.1,
) -> tuple[torch.Tensor, dict[str, float]]:
    """ORPO (Hong et al. 2024, arXiv:2403.07691, eqs. 6–7): SFT on the chosen plus an odds-ratio term.

    With p = exp(avg log π(y)) and odds(y) = p/(1 − p):
    `ℓ = NLL(y_w) − λ·log σ(log odds(y_w) − log odds(y_l))`, no reference model.

    Args:
        chosen_avg_logps: [B] mean response-token log-probs of the chosen responses (< 0).
        rejected_avg_logps: [B] the same for the rejected responses.
        chosen_nll: [B] the SFT loss of the chosen response (mean token negative log-likelihood).
        lam: λ, the weight of the odds-ratio term.

    Returns:
        Per-pair losses [B] and stats: `log_odds_ratio` (mean), `rewards/*` with rewards
        λ·avg log π, `nll`.

    Raises:
        ValueError: if `lam` < 0.
    """
    if lam < 0:
        raise ValueError(f"lam must be >= 0, got {lam}")
    c, r = chosen_avg_logps.float(), rejected_avg_logps.float()
    # log(1 − e^x) for x < 0, computed stably
    log1mexp_c = torch.log(-torch.expm1(c.clamp(max=-1e-7)))
    log1mexp_r = torch.log(-torch.expm1(r.clamp(max=-1e-7)))
    log_odds = (c - r) - (log1mexp_c - log1mexp_r)
    losses = chosen_nll - lam * logsigmoid(log_odds)
    stats = _pair_stats(lam * c.detach(), lam * r.detach())
    stats["log_odds_ratio"] = float(log_odds.detach().mean())
    stats["nll"] = float(chosen_nll.detach().mean())
    return losses, stats


# --- the pair losses by name (one call site in each preference trainer) ---------------------
@dataclass(frozen=True)
class PairLossInputs:
    """What a pair loss reads: one row per (chosen, rejected) pair.

    Attributes:
        chosen_logps: [B] summed response-token log-probs of the chosen responses (policy).
        rejected_logps: [B] the same for the rejected responses.
        chosen_lengths: [B] response tokens of each chosen response.
        rejected_lengths: [B] the same for the rejected.
        ref_chosen_logps: [B] the chosen responses under the reference, or None (SimPO, ORPO).
        ref_rejected_logps: [B] the rejected responses under the reference, or None.
        beta: β; label_smoothing: ε (DPO, SimPO); simpo_gamma: SimPO's margin γ;
        orpo_lambda: ORPO's λ.
    """

    chosen_logps: torch.Tensor
    rejected_logps: torch.Tensor
    chosen_lengths: torch.Tensor
    rejected_lengths: torch.Tensor
    ref_chosen_logps: torch.Tensor | None
    ref_rejected_logps: torch.Tensor | None
    beta: float
    label_smoothing: float = 0.0
    simpo_gamma: float = 1.0
    orpo_lambda: float = 0.1

    def references(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The reference log-probs ([B], [B]).

        Raises:
            ValueError: when they are missing.
        """
        if self.ref_chosen_logps is None or self.ref_rejected_logps is None:
            raise ValueError("this loss needs the reference's log-probs of both responses")
        return self.ref_chosen_logps, self.ref_rejected_logps

    def averages(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Mean response-token log-probs of the chosen and rejected responses ([B], [B])."""
        return (
            self.chosen_logps / self.chosen_lengths.clamp(min=1),
            self.rejected_logps / self.rejected_lengths.clamp(min=1),
        )


PairLossFn = Callable[[PairLossInputs], tuple[torch.Tensor, dict[str, float]]]
"""A pair loss: `PairLossInputs` in, `(per-pair losses [B], stats)` out."""

PAIR_LOSSES: Registry[PairLossFn] = Registry(
    "pair loss", "loss", "@register_pair_loss from textgym.algorithms.preference_losses"
)
"""Name → pair loss: "dpo", "ipo", "simpo", "orpo" (KTO is unpaired: `kto_loss`)."""


def register_pair_loss(name: str, *, replace: bool = False) -> Callable[[PairLossFn], PairLossFn]:
    """Decorator: register a pair loss under `name` (`PAIR_LOSSES.register`).

    Args:
        name: the value of the preference stage's `loss` that selects it.
        replace: allow replacing a loss already registered under `name`.

    Raises:
        ValueError: if `name` is empty or taken (and `replace` is False).
    """
    return PAIR_LOSSES.register(name, replace=replace)


def pair_loss(name: str, x: PairLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-pair losses [B] and stats of the registered pair loss `name`.

    Raises:
        UnknownNameError: an unregistered name (a `KeyError`; the message lists the registered ones).
        ValueError: a reference-based loss (DPO, IPO) without reference log-probs.
    """
    return PAIR_LOSSES.get(name)(x)


@register_pair_loss("dpo")
def _dpo(x: PairLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    ref_c, ref_r = x.references()
    return dpo_loss(
        x.chosen_logps, x.rejected_logps, ref_c, ref_r, beta=x.beta, label_smoothing=x.label_smoothing
    )


@register_pair_loss("ipo")
def _ipo(x: PairLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    ref_c, ref_r = x.references()
    return ipo_loss(
        x.chosen_logps, x.rejected_logps, ref_c, ref_r, x.chosen_lengths, x.rejected_lengths, beta=x.beta
    )


@register_pair_loss("simpo")
def _simpo(x: PairLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    avg_c, avg_r = x.averages()
    return simpo_loss(avg_c, avg_r, beta=x.beta, gamma=x.simpo_gamma, label_smoothing=x.label_smoothing)


@register_pair_loss("orpo")
def _orpo(x: PairLossInputs) -> tuple[torch.Tensor, dict[str, float]]:
    avg_c, avg_r = x.averages()
    return orpo_loss(avg_c, avg_r, -avg_c, lam=x.orpo_lambda)
