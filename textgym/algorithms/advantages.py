"""Advantage estimators: pure tensor functions returning `(advantages, detached_stats)`.

Shapes: B = sequences in the batch, G = samples per group (B = num_groups × G),
L = response columns of a `RolloutBatch`.

The estimators the GRPO trainer selects by name (`advantage_estimator: grpo | rloo |
reinforce_pp | grpo_process`) are registered at the end of this module with `@register_advantage`
(`textgym.algorithms.registry`); a new one is one decorated function.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import torch

from textgym.algorithms.kl import KLEstimator, kl_estimate
from textgym.algorithms.registry import AdvantageInputs, register_advantage

ScaleMode = Literal["group", "batch", "none"]
Reduce = Callable[[torch.Tensor], torch.Tensor]
"""Sums a tensor over data-parallel ranks (`textgym.distributed.all_reduce_sum`), so that a batch
statistic covers every rank's rows; None: the local batch alone."""


def group_advantages(
    rewards: torch.Tensor, group_size: int, scale: ScaleMode = "group", eps: float = 1e-4
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group-relative advantages of GRPO (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.2).

    With outcome supervision every token of sample i in group g gets
    `Â_i = (r_i − mean(r_g)) / (std(r_g) + eps)`; the std is the unbiased sample std over
    the G rewards of the group (as TRL and veRL compute it).

    Args:
        rewards: [B] episode rewards, grouped contiguously (rows g·G … g·G+G−1 share a task).
        group_size: G ≥ 1.
        scale: "group" divides by each group's std (GRPO); "batch" by the std of all B
            rewards; "none" only centres (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783, §3.1).
        eps: added to the std in the denominator.

    Returns:
        advantages [B] and stats: `adv/mean`, `adv/std`, `rollout/zero_std_frac` (fraction of
        groups whose rewards are all equal, hence zero advantage).

    Raises:
        ValueError: if B is not a multiple of G or `scale` is unknown.
    """
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [B] with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}"
        )
    r = rewards.float().view(-1, group_size)  # [num_groups, G]
    centred = r - r.mean(dim=1, keepdim=True)
    group_std = r.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(r[:, :1])
    if scale == "group":
        # A group with equal rewards has centred == 0: its advantage is 0 even when eps == 0.
        adv = torch.where(group_std > 0, centred / (group_std + eps), torch.zeros_like(centred))
    elif scale == "batch":
        batch_std = rewards.float().std() if rewards.numel() > 1 else torch.tensor(0.0)
        adv = centred / (batch_std + eps) if batch_std > 0 else torch.zeros_like(centred)
    elif scale == "none":
        adv = centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    adv = adv.reshape(-1)
    stats = {
        "adv/mean": float(adv.mean()),
        "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "rollout/zero_std_frac": float((group_std.squeeze(1) == 0).float().mean()),
    }
    return adv, stats


def rloo_advantages(rewards: torch.Tensor, group_size: int) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE Leave-One-Out advantages (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740, eq. 6).

    `Â_i = r_i − (1/(G−1)) Σ_{j≠i} r_j = G/(G−1) · (r_i − mean(r_g))`: each sample's
    baseline is the mean reward of the other samples of its task, so the baseline does not
    depend on the sample it scores (unbiased).

    Args:
        rewards: [B] episode rewards, grouped contiguously (B = num_groups × G).
        group_size: G ≥ 2.

    Returns:
        advantages [B] and stats `adv/mean`, `adv/std`, `rollout/zero_std_frac`.

    Raises:
        ValueError: if G < 2 or B is not a multiple of G.
    """
    if group_size < 2:
        raise ValueError(f"RLOO needs group_size >= 2, got {group_size}")
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(
            f"rewards must be [B] with B a multiple of group_size={group_size}, got {tuple(rewards.shape)}"
        )
    r = rewards.float().view(-1, group_size)
    baseline = (r.sum(dim=1, keepdim=True) - r) / (group_size - 1)
    adv = (r - baseline).reshape(-1)
    stats = {
        "adv/mean": float(adv.mean()),
        "adv/std": float(adv.std()) if adv.numel() > 1 else 0.0,
        "rollout/zero_std_frac": float((r.std(dim=1) == 0).float().mean()),
    }
    return adv, stats


def token_level_rewards(
    token_rewards: torch.Tensor,
    mask: torch.Tensor,
    logprobs: torch.Tensor | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    estimator: KLEstimator = "k1",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Per-token rewards with the KL penalty folded in: `r_t = R_t − β·KL_est_t` on policy tokens.

    `R_t` holds each turn's reward on that turn's last policy token (`RolloutBatch.token_rewards`);
    the KL estimate is computed from the rollout's log-probabilities, without gradient, as in
    RLHF (Ziegler et al. 2019, arXiv:1909.08593, eq. 2; Ouyang et al. 2022, eq. 2). In the
    reward, k1 = log π/π_ref gives an unbiased estimate of the KL-regularised objective's
    gradient; k3 in the reward is biased and has been seen to collapse training (Shah et al.
    2026, table in docs/maths.md, "KL estimators and where they go"); k2 sits between.

    Args:
        token_rewards: [B, L] turn rewards on each turn's last policy token.
        mask: [B, L] 1.0 on policy tokens.
        logprobs: [B, L] log π_old of the sampled tokens (needed when kl_coef > 0).
        ref_logprobs: [B, L] log π_ref of the same tokens (needed when kl_coef > 0).
        kl_coef: β ≥ 0.
        estimator: "k1", "k2" or "k3".

    Returns:
        rewards [B, L] (0 off the mask) and stats `kl/ref` (masked token mean of the estimate),
        `kl/ref_seq` (mean per-sequence sum), `reward/kl_penalty` (mean per-sequence −β·Σ KL).

    Raises:
        ValueError: if kl_coef > 0 and either log-prob tensor is missing.
    """
    rewards = token_rewards.float() * mask
    stats: dict[str, float] = {}
    if kl_coef > 0:
        if logprobs is None or ref_logprobs is None:
            raise ValueError("a KL penalty in the reward needs logprobs and ref_logprobs")
        with torch.no_grad():
            kl = kl_estimate(logprobs.float(), ref_logprobs.float(), estimator) * mask
        rewards = rewards - kl_coef * kl
        n = mask.sum().clamp(min=1.0)
        seq = kl.sum(-1)
        # k3 ≥ 0 in exact arithmetic may round a few ulps below 0: its metric is clamped.
        kl_metric = kl.clamp(min=0.0) if estimator == "k3" else kl
        stats = {
            "kl/ref": float(kl_metric.sum() / n),
            "kl/ref_seq": float(seq.mean()),
            "reward/kl_penalty": float(-kl_coef * seq.mean()),
        }
    return rewards, stats


def masked_mean(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None) -> torch.Tensor:
    """Σ m·x / Σ m (0 for an empty mask); with `reduce`, both sums run over every rank's batch."""
    sums = torch.stack([(x * mask).sum(), mask.sum().to(x.dtype)])
    if reduce is not None:
        sums = reduce(sums)
    return sums[0] / sums[1].clamp(min=1.0)


def masked_var(x: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None) -> torch.Tensor:
    """Unbiased variance of the masked entries (0 when fewer than two); over every rank with `reduce`.

    Two passes (mean, then the sum of squared deviations), each summed over ranks by `reduce`.
    """
    n = mask.sum()
    mean = masked_mean(x, mask, reduce)
    sums = torch.stack([((x - mean).pow(2) * mask).sum(), n.to(x.dtype)])
    if reduce is not None:
        sums = reduce(sums)
    ss, n = sums[0], sums[1]
    return ss / (n - 1) if n > 1 else torch.zeros((), dtype=x.dtype, device=x.device)


def whiten(
    x: torch.Tensor,
    mask: torch.Tensor,
    shift_mean: bool = True,
    eps: float = 1e-8,
    reduce: Reduce | None = None,
) -> torch.Tensor:
    """Normalise the masked entries of `x` to unit variance (and zero mean when `shift_mean`).

    Used for PPO's advantage whitening and REINFORCE++'s global batch normalisation
    (Hu 2025, arXiv:2501.03262, eq. 9). Entries off the mask are returned as 0.

    Args:
        x: [B, L] values.
        mask: [B, L] 1.0 where the entry counts.
        shift_mean: subtract the masked mean (otherwise only divide by the std).
        eps: added to the variance before the square root.
        reduce: sum statistics over ranks (the mean and variance of the global batch).
    """
    inv_std = torch.rsqrt(masked_var(x, mask, reduce) + eps)
    out = (x - masked_mean(x, mask, reduce)) * inv_std if shift_mean else x * inv_std
    return out * mask


def discounted_returns(rewards: torch.Tensor, mask: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Rewards-to-go over policy tokens: `G_t = Σ_{s ≥ t, s policy} γ^{k(s)−k(t)} r_s`.

    k counts policy tokens only (environment tokens of a multi-turn episode are not time
    steps). This is REINFORCE++'s return (Hu 2025, arXiv:2501.03262, eq. 8) and GAE with
    λ = 1 and V = 0.

    Args:
        rewards: [B, L] per-token rewards (0 off the mask).
        mask: [B, L] 1.0 on policy tokens.
        gamma: discount per policy token.

    Returns:
        [B, L] returns, 0 off the mask.
    """
    zeros = torch.zeros_like(rewards)
    adv, _ = gae(rewards, zeros, mask, gamma=gamma, lam=1.0)
    return adv


def gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    *,
    gamma: float = 1.0,
    lam: float = 0.95,
    bootstrap: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized Advantage Estimation (Schulman et al. 2015, arXiv:1506.02438, eq. 16), over policy tokens.

    With k indexing a row's policy tokens in order (environment tokens skipped),
    `δ_k = r_k + γ·V_{k+1} − V_k` and `Â_k = δ_k + γλ·Â_{k+1}`, where after the row's last
    policy token `V_{K} = bootstrap` (the critic's value of the final state for a
    `truncated` episode, 0 for a `terminated` one) and `Â_{K} = 0`. Returns are
    `R_k = Â_k + V_k`, the critic's regression targets (with, for the kind of state a
    truncated episode bootstraps from, `turn_end_value_targets`).

    The recursion is vectorised over the batch: one pass over the L columns from right to
    left, each column updating only the rows whose token there is a policy token.

    Args:
        rewards: [B, L] per-token rewards (turn rewards on turn-final tokens, −β·KL on each).
        values: [B, L] V(s_t), the critic's value of the state before token t.
        mask: [B, L] 1.0 on policy tokens.
        gamma: discount per policy token.
        lam: GAE λ.
        bootstrap: [B] value after each row's last policy token (default 0).

    Returns:
        advantages [B, L] and returns [B, L], both 0 off the mask, in the promoted dtype of
        `rewards` and `values` (at least float32: float64 inputs are computed in float64).
    """
    B, L = rewards.shape
    # at least float32, float64 when the inputs are (the recursion is computed in that dtype)
    dtype = torch.promote_types(torch.promote_types(rewards.dtype, values.dtype), torch.float32)
    rewards, values, mask = rewards.to(dtype), values.to(dtype), mask.to(dtype)
    next_value = (
        torch.zeros(B, device=rewards.device, dtype=dtype)
        if bootstrap is None
        else bootstrap.to(dtype).clone()
    )
    next_adv = torch.zeros(B, device=rewards.device, dtype=dtype)
    adv = torch.zeros_like(rewards)
    for t in range(L - 1, -1, -1):
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a = delta + gamma * lam * next_adv
        adv[:, t] = a * m
        keep = m > 0
        next_adv = torch.where(keep, a, next_adv)
        next_value = torch.where(keep, values[:, t], next_value)
    returns = (adv + values) * mask
    return adv, returns


def turn_end_value_targets(mask: torch.Tensor, returns: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The critic's targets at the states that end a turn followed by another policy turn.

    Column t of the values is V(s_t), the state before response token t. The state after
    the last policy token of a turn (column c + 1 for a turn ending at policy column c) is
    the one a `truncated` episode bootstraps from (`gae`'s `bootstrap`, read at the end of
    the sequence). Mid-episode it is followed by the environment's tokens, which are not
    time steps (no reward, no discount), and then by the next turn's first policy token s';
    so V(after turn) = V(s') in expectation, and its regression target is the return of s'
    (`R_{s'} = Â_{s'} + V_{s'}`, the λ-return s' itself is trained towards). Training these
    states gives the critic examples of the kind of state the bootstrap reads, which the
    per-token value loss alone never trains. The final turn's end has no successor in the
    batch: it is not a target (a `terminated` episode bootstraps from 0 there, a `truncated`
    one from the critic's value, learnt from the mid-episode turn ends).

    Args:
        mask: [B, L] 1.0 on policy tokens.
        returns: [B, L] the GAE returns (`gae`), 0 off the mask.

    Returns:
        `ends` [B, L] 1.0 at column c + 1 of every turn that ends at policy column c and is
        followed by another policy token in its row (0 elsewhere; disjoint from `mask`), and
        `targets` [B, L]: there, the return of the next policy token; 0 elsewhere.
    """
    B, L = mask.shape
    on = mask > 0
    ends = torch.zeros_like(mask, dtype=torch.float32)
    targets = torch.zeros_like(returns, dtype=torch.float32)
    next_return = torch.zeros(B, device=mask.device)
    has_next = torch.zeros(B, dtype=torch.bool, device=mask.device)
    for t in range(L - 1, 0, -1):  # right to left: next_return is that of the first policy column > t
        end = ~on[:, t] & on[:, t - 1] & has_next
        ends[:, t] = end.float()
        targets[:, t] = torch.where(end, next_return, torch.zeros_like(next_return))
        next_return = torch.where(on[:, t], returns[:, t].float(), next_return)
        has_next = has_next | on[:, t]
    return ends, targets


def overlong_penalty(lengths: torch.Tensor, max_len: int, cache_len: int) -> torch.Tensor:
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13).

    `0` for `|y| ≤ max_len − cache_len`; `((max_len − cache_len) − |y|) / cache_len` inside the
    cache window (linear from 0 down to −1); `−1` beyond `max_len`.

    Args:
        lengths: [B] response lengths in tokens.
        max_len: L_max, the length at which the penalty reaches −1.
        cache_len: L_cache, the width of the linear window (1 ≤ cache_len ≤ max_len).

    Returns:
        [B] penalties in [−1, 0], added to the rewards.

    Raises:
        ValueError: if cache_len is not within [1, max_len].
    """
    if not 1 <= cache_len <= max_len:
        raise ValueError(f"cache_len must be in [1, max_len={max_len}], got {cache_len}")
    lengths = lengths.float()
    start = max_len - cache_len
    return ((start - lengths) / cache_len).clamp(-1.0, 0.0)


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor, reduce: Reduce | None = None
) -> float:
    """`1 − Var[R − V] / Var[R]` over the masked tokens: 1 = perfect critic, ≤ 0 = no better than a constant.

    Args:
        values: [B, L] predictions V.
        returns: [B, L] targets R.
        mask: [B, L] 1.0 on tokens that count.
        reduce: sum statistics over ranks (the global batch's explained variance).

    Returns:
        The explained variance (nan when Var[R] = 0).
    """
    var_r = masked_var(returns, mask, reduce)
    if float(var_r) == 0.0:
        return float("nan")
    return float(1.0 - masked_var(returns - values, mask, reduce) / var_r)


# --- the estimators the GRPO trainer selects by name (`advantage_estimator`) ---------------
@register_advantage("grpo")
def grpo_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's group-relative advantages [N] (`group_advantages`, scaled by `x.scale_rewards`)."""
    return group_advantages(x.rewards, x.group_size, x.scale_rewards)  # type: ignore[arg-type]


@register_advantage("rloo")
def rloo_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """RLOO's leave-one-out advantages [N] (`rloo_advantages`)."""
    return rloo_advantages(x.rewards, x.group_size)


@register_advantage("reinforce_pp")
def reinforce_pp_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): rewards-to-go (γ = 1) whitened over the batch, [B, L].

    The per-token rewards carry −β·KL_t with `kl_placement: reward`; the mean and variance of
    the whitening cover every rank's tokens (`x.reduce`). Stats: `adv/std` after whitening.
    """
    returns = discounted_returns(x.token_rewards, x.mask, gamma=1.0)
    adv = whiten(returns, x.mask, reduce=x.reduce)
    return adv, {"adv/std": float(masked_var(adv, x.mask, reduce=x.reduce).sqrt())}


def process_advantages(
    token_rewards: torch.Tensor,
    step_mask: torch.Tensor,
    mask: torch.Tensor,
    group_size: int,
    scale: ScaleMode = "group",
    eps: float = 1e-4,
    reduce: Reduce | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO with process supervision (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300, §4.1.3).

    Each sample i of a group has reward events (step ends, and the outcome with
    `reward_source: both`) at tokens index(j) with rewards r_i^(j). Over the group's set
    R = {r_i^(j)} of every event of its G samples, each reward is normalised,
    `r̃_i^(j) = (r_i^(j) − mean(R)) / (std(R) + eps)`, and a token's advantage is the sum of the
    normalised rewards of the events at or after it: `Â_{i,t} = Σ_{index(j) ≥ t} r̃_i^(j)`. So
    the tokens of a step are credited with that step's normalised reward and every later one.
    std is the unbiased sample std over the |R| rewards (0 when |R| < 2 or all are equal: the
    group's advantages are then 0, as in `group_advantages`). With one event per sample (the
    outcome alone) this is GRPO's outcome advantage on every token up to the last.

    Args:
        token_rewards: [B, L] per-token rewards; only the event positions are read.
        step_mask: [B, L] 1.0 on the event tokens (`RolloutBatch.with_reward_source`).
        mask: [B, L] 1.0 on policy tokens (advantages are 0 elsewhere).
        group_size: G; rows g·G … g·G+G−1 share a task (a rank holds whole groups).
        scale: "group" (the group's std, as above), "batch" (centre per group, divide by the std
            of every event reward in the batch, over every rank with `reduce`) or "none" (centre
            only, Dr. GRPO's choice).
        eps: added to the std.
        reduce: sums statistics over ranks (for `scale="batch"`).

    Returns:
        advantages [B, L] and stats `adv/mean`, `adv/std` (over policy tokens),
        `rollout/zero_std_frac` (groups whose event rewards are all equal),
        `rollout/events_per_seq` (mean reward events per sequence).

    Raises:
        ValueError: if B is not a multiple of G or `scale` is unknown.
    """
    B, L = token_rewards.shape
    if B % group_size:
        raise ValueError(f"rows must be a multiple of group_size={group_size}, got {B}")
    m = step_mask.float()
    r = token_rewards.float() * m
    rg, mg = r.reshape(-1, group_size * L), m.reshape(-1, group_size * L)  # [num_groups, G·L]
    n = mg.sum(1, keepdim=True)
    mean = rg.sum(1, keepdim=True) / n.clamp(min=1.0)
    centred = (rg - mean) * mg
    var = centred.pow(2).sum(1, keepdim=True) / (n - 1).clamp(min=1.0)
    std = torch.where(n > 1, var.sqrt(), torch.zeros_like(var))
    if scale == "group":
        norm = torch.where(std > 0, centred / (std + eps), torch.zeros_like(centred))
    elif scale == "batch":
        batch_std = masked_var(r, m, reduce).sqrt()
        norm = centred / (batch_std + eps) if batch_std > 0 else torch.zeros_like(centred)
    elif scale == "none":
        norm = centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    # Σ over the events at or after each token: a reversed cumulative sum along the row
    adv = norm.reshape(B, L).flip(-1).cumsum(-1).flip(-1) * mask
    stats = {
        "adv/mean": float(masked_mean(adv, mask)),
        "adv/std": float(masked_var(adv, mask).sqrt()),
        "rollout/zero_std_frac": float((std.squeeze(1) == 0).float().mean()),
        "rollout/events_per_seq": float(m.sum() / max(B, 1)),
    }
    return adv, stats


@register_advantage("grpo_process")
def grpo_process_estimator(x: AdvantageInputs) -> tuple[torch.Tensor, dict[str, float]]:
    """GRPO's process supervision [B, L] (`process_advantages`) over the reward events of `x.step_mask`.

    Raises:
        ValueError: without `x.step_mask` (the trainer passes it: `reward_source` decides the events).
    """
    if x.step_mask is None:
        raise ValueError("grpo_process needs the reward events (AdvantageInputs.step_mask)")
    return process_advantages(
        x.token_rewards,
        x.step_mask,
        x.mask,
        x.group_size,
        x.scale_rewards,  # type: ignore[arg-type]
        reduce=x.reduce,
    )
