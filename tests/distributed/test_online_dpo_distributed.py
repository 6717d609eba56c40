"""Online DPO on 2 ranks (torchrun, gloo on CPU) against 1 process.

Both runs sample the very same responses (`rollout.per_sequence_seeds`), so they build the same
pairs; each rank trains its half of them in micro-batches of 2, with a weight-0 filler
micro-batch on the rank with fewer pairs when the count is odd. Tolerances are those of
tests/distributed/test_distributed.py (see its docstring): parameters ‖θ₂ − θ₁‖ ≤ 5e-3·‖θ₁ − θ₀‖,
and every logged step metric (the loss, the pre-clip `grad_norm`, whose size AdamW would
otherwise hide) to 5e-3 relative.
"""

from __future__ import annotations

import pytest
from conftest import WARM_ENV
from test_distributed import (
    PARAM_RTOL,
    assert_same_metrics,
    params,
    records,
    relative_distance,
    train,
    write_config,
)


@pytest.mark.multiproc
def test_online_dpo_on_two_ranks_matches_one_process(warm_model_dir, tmp_path):
    stage = {
        "env": WARM_ENV,
        "steps": 3,
        "prompts_per_step": 8,
        "samples_per_prompt": 8,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "rollout": {"per_sequence_seeds": True},
        "micro_batch_size": 2,
        "optim": {"lr": 1e-3},
    }
    config = write_config(tmp_path / "odpo.yaml", warm_model_dir, tmp_path, online_dpo=stage)
    for ranks in (1, 2):
        train(config, f"r{ranks}", ranks)
    one, two = (tmp_path / f"r{n}" / "online_dpo" for n in (1, 2))
    rel, moved = relative_distance(params(one / "final"), params(two / "final"), params(warm_model_dir))
    print(f"online DPO 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}")
    assert moved > 0.1 and rel < PARAM_RTOL
    rows = records(one)
    assert sum(r["pairs/count"] for r in rows) >= 3
    # every logged metric (the loss, grad_norm, kl/ref, ... of steps with pairs) is compared
    assert_same_metrics(rows, records(two), ("rollout/reward_mean", "pairs/count"))
