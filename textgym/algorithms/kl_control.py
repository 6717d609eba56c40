"""KL coefficient controllers for a KL penalty in the reward (PPO-KLPEN style).

`FixedKLController` keeps β constant. `AdaptiveKLController` steers the measured KL
towards a target (Ziegler et al. 2019, "Fine-Tuning Language Models from Human
Preferences", arXiv:1909.08593, §2.2, after Schulman et al. 2017's adaptive KL penalty):

    e_t = clip(KL_t / KL_target − 1, −0.2, 0.2)
    β_{t+1} = β_t · (1 + K_β · e_t),  K_β = n_t / horizon

where KL_t is the mean per-sequence KL of the step's rollouts (nats) and n_t the number
of sequences in it.

A trainer holds one controller for the run: its β weights the KL term of an iteration; the
iteration records the KL it measured (`measure`) and, once its update is done, `commit`s it,
so that β moves for the next iteration. The controller's checkpoint state is its own
(`checkpoint_state`, `load_checkpoint_state`): a fixed β has none (the config holds it).
"""

from __future__ import annotations


class FixedKLController:
    """A constant β.

    Args:
        kl_coef: β ≥ 0.
    """

    def __init__(self, kl_coef: float):
        self.value = float(kl_coef)
        self.measured: tuple[float, int] | None = None
        """This iteration's (KL per sequence in nats, sequences), until `commit`."""

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (β is fixed)."""

    def measure(self, current_kl: float, n_steps: int) -> None:
        """Record the iteration's mean per-sequence KL over `n_steps` sequences, for `commit`."""
        self.measured = (float(current_kl), int(n_steps))

    def commit(self, policy_moved: bool = True) -> None:
        """After the iteration's update: move β from the KL `measure`d (if any), then forget it.

        β stays as it is when the policy took no step (a critic's warm-up): its KL to the
        reference is then 0 and would drive an adaptive β down for nothing.
        """
        if self.measured is not None and policy_moved:
            self.update(*self.measured)
        self.measured = None

    def checkpoint_state(self) -> dict[str, float]:
        """What a checkpoint keeps of the controller: nothing for a fixed β (the config holds it)."""
        return {}

    def load_checkpoint_state(self, state: dict[str, object]) -> None:
        """Restore β from a checkpoint's state when it holds one (`kl_coef`)."""
        if "kl_coef" in state:
            self.value = float(state["kl_coef"])  # type: ignore[arg-type]

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

    def checkpoint_state(self) -> dict[str, float]:
        """β as it has moved so far (`kl_coef`), for a resumed run to continue from."""
        return {"kl_coef": self.value}
