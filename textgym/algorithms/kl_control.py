"""KL coefficient controllers for a KL penalty in the reward (PPO-KLPEN style).

`FixedKLController` keeps β constant. `AdaptiveKLController` steers the measured KL
towards a target (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
Preferences", arXiv:1909.08593, §2.2, after Schulman et al. 2017's adaptive KL penalty):

    e_t = clip(KL_t / KL_target − 1, −0.2, 0.2)
    β_{t+1} = β_t · (1 + K_β · e_t),  K_β = n_t / horizon

where KL_t is the mean per-sequence KL of the step's rollouts (nats) and n_t the number
of sequences in it.
"""

from __future__ import annotations


class FixedKLController:
    """A constant β.

    Args:
        kl_coef: β ≥ 0.
    """

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (β is fixed)."""

    def state_dict(self) -> dict[str, float]:
        """β, for checkpoints."""
        return {"value": self.value}

    def load_state_dict(self, state: dict[str, float]) -> None:
        """Restore β from a checkpoint."""
        self.value = float(state["value"])


class AdaptiveKLController(FixedKLController):
    """β adapted so that the per-sequence KL tracks `target` (Ziegler et al. 2019, §2.2).

    Args:
        init_kl_coef: β_0 > 0.
        target: KL_target in nats per sequence.
        horizon: the number of sequences over which β may change by a factor e^{±0.2}.

    Raises:
        ValueError: if target or horizon is not positive.
    """

    def __init__(self, init_kl_coef: float, target: float, horizon: int):
        if target <= 0 or horizon <= 0:
            raise ValueError(f"target and horizon must be > 0, got {target}, {horizon}")
        super().__init__(init_kl_coef)
        self.target, self.horizon = float(target), int(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Move β from the KL measured over `n_steps` sequences."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon
