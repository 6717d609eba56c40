"""Async RL with a staleness bound (`rollout.max_staleness`, `textgym.training.sources.async_producer`):
k = 0 is the synchronous trainer bit for bit; k = 1 runs one batch ahead, tags every trajectory with
the version that sampled it (in the trajectory store too), and keeps the bound across kill -9."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pydantic
import pytest
import torch
from conftest import WARM_ENV as ENV
from conftest import watch_pending_jobs

from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.seeding import seed_everything
from textgym.training.sources.async_producer import StalenessError

SIGNAL_SEED = 1
"""As in test_grpo.py: a seed whose first steps have a learning signal on the warm model."""


def grpo_cfg(**over):
    base = {
        "env": ENV,
        "steps": 3,
        "prompts_per_step": 2,
        "group_size": 4,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "optim": {"lr": 1e-3},
    }
    base.update(over)
    return GRPOConfig.model_validate(base)


def records(stage: Path) -> list[dict]:
    return [json.loads(line) for line in (stage / "metrics.jsonl").read_text().splitlines()]


def store_versions(stage: Path) -> dict[int, set[int]]:
    """Trained step (1-based, from the shard's name) → the `policy_version`s of its rows."""
    out: dict[int, set[int]] = {}
    for shard in sorted((stage / "trajectories").glob("step-*.parquet")):
        step = int(shard.name.split("-")[1])
        versions = pq.read_table(shard, columns=["policy_version"]).column(0).to_pylist()
        out.setdefault(step, set()).update(versions)
    return out


def test_k0_reproduces_the_synchronous_trainer_exactly(warm_model_dir, tmp_path):
    finals = []
    for name, over in (("sync", {}), ("k0", {"rollout": {"max_staleness": 0}})):
        seed_everything(SIGNAL_SEED)
        model, tok = load_model(warm_model_dir)
        before = [p.detach().clone() for p in model.parameters()]
        trainer = GRPOTrainer(grpo_cfg(prompts_per_step=4, **over), model, tok, tmp_path / name)
        assert trainer.async_rollouts is None
        trainer.train()
        finals.append([p.detach().clone() for p in model.parameters()])
    assert any(not torch.equal(p, q) for p, q in zip(before, finals[0], strict=True))  # it learned
    for p, q in zip(*finals, strict=True):
        assert torch.equal(p, q)


def test_k1_runs_one_batch_ahead_and_tags_versions(warm_model_dir, tmp_path):
    seed_everything(SIGNAL_SEED)
    model, tok = load_model(warm_model_dir)
    cfg = grpo_cfg(steps=4, rollout={"max_staleness": 1}, log_trajectories=True)
    assert cfg.rollout.use_tis  # on by default once rollouts may be stale
    trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    pending = watch_pending_jobs(trainer)  # while batch s trains, batch s + 1 is with the producer
    trainer.train()
    assert pending == [[(1, 0)], [(2, 1)], [(3, 2)], []]
    rows = records(tmp_path)
    assert [r["rollout/staleness_max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert [r["rollout/staleness_mean"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert all("mismatch/kl" in r for r in rows)  # TIS recomputed π_old and corrected the gap
    assert store_versions(tmp_path) == {1: {0}, 2: {0}, 3: {1}, 4: {2}}


def test_k1_first_batch_equals_a_seeded_synchronous_batch(warm_model_dir, tmp_path):
    """The producer samples with `per_sequence_seeds`' seeds: batch 0 (version 0) is the sync run's."""
    batches = []
    for name, rollout in (("sync", {"per_sequence_seeds": True}), ("k1", {"max_staleness": 1})):
        seed_everything(0)
        model, tok = load_model(warm_model_dir)
        trainer = GRPOTrainer(grpo_cfg(steps=2, rollout=rollout), model, tok, tmp_path / name)
        batches.append(trainer.sample({}).trajs)
        trainer.close()
    for a, b in zip(*batches, strict=True):
        assert torch.equal(a.token_ids, b.token_ids) and a.policy_version == b.policy_version == 0
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)


def test_decoupled_correction_drops_tokens_above_the_cap(warm_model_dir, tmp_path, monkeypatch):
    """`off_policy_correction: decoupled` weights by π_prox/π_behav, 0 above the cap (AReaL eq. 5)."""
    import textgym.trainers.rl.update as on_policy  # the update recomputes π_old and weights it

    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    rollout = {"max_staleness": 1, "off_policy_correction": "decoupled", "tis_cap": 1.05}
    trainer = GRPOTrainer(grpo_cfg(steps=2, rollout=rollout), model, tok, tmp_path)
    seen, correction = [], on_policy.rollout_correction

    def recorded(trainer_lp, rollout_lp, mask, **kw):
        out = correction(trainer_lp, rollout_lp, mask, **kw)
        seen.append((trainer_lp, rollout_lp, mask, kw, out[0]))
        return out

    monkeypatch.setattr(on_policy, "rollout_correction", recorded)
    trainer.train()
    assert len(seen) == 2
    for trainer_lp, rollout_lp, mask, kw, w in seen:
        assert kw == {"cap": 1.05, "drop_above_cap": True}
        ratio = (trainer_lp - rollout_lp).exp()
        want = torch.where(ratio <= 1.05, ratio, torch.zeros_like(ratio)) * mask
        torch.testing.assert_close(w, want, rtol=0, atol=1e-6)
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_a_batch_past_the_bound_raises(warm_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    trainer = GRPOTrainer(grpo_cfg(steps=3, rollout={"max_staleness": 1}), model, tok, tmp_path)
    trainer.train_step()  # batch 1 (version 0) is now pending
    trainer.train_step()  # trains batch 1 at version 1; batch 2 (version 1) pending
    trainer.async_rollouts.k = 0  # a bound the pending batch 2 breaks at version 2
    with pytest.raises(StalenessError, match=r"staleness 1 exceeds rollout\.max_staleness=0"):
        trainer.train_step()
    trainer.close()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"rollout": {"max_staleness": 1, "backend": "vllm"}}, "needs backend 'transformers'"),
        ({"rollout": {"max_staleness": 1}, "dynamic_sampling": True}, "dynamic_sampling is not supported"),
        ({"rollout": {"max_staleness": -1}}, "greater than or equal to 0"),
    ],
)
def test_unsupported_settings_fail_at_validation(over, message):
    with pytest.raises(pydantic.ValidationError, match=message):
        grpo_cfg(**over)


def test_several_ranks_are_refused():
    """Under torchrun the producer would need every rank's sampler in step: a ConfigError, not a hang."""

    from textgym.config.base import ConfigError
    from textgym.training.sources.async_producer import AsyncRollouts

    cfg = grpo_cfg(rollout={"max_staleness": 1})
    with pytest.raises(ConfigError, match=r"max_staleness=1: async rollouts run in one process"):
        AsyncRollouts.check("grpo", cfg, ranks=2, has_engine=False)
    AsyncRollouts.check("grpo", cfg, ranks=1, has_engine=False)
    with pytest.raises(ConfigError, match=r"needs rollout\.backend: transformers"):
        AsyncRollouts.check("grpo", cfg, ranks=1, has_engine=True)


RUN = textwrap.dedent(
    """
    import sys, time
    import torch
    from textgym.config import GRPOConfig
    from textgym.models import load_model
    from textgym.training.seeding import seed_everything
    from textgym.trainers.rl.grpo import GRPOTrainer

    torch.set_num_threads(1)
    model_dir, stage, resume = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
    seed_everything(0)
    model, tok = load_model(model_dir)
    cfg = GRPOConfig.model_validate({
        "env": {"id": "textgym/Arithmetic-v0",
                "kwargs": {"operators": "+", "digits": 1, "instruction": "", "step_latency_s": 0.02}},
        "steps": 6, "prompts_per_step": 2, "group_size": 4, "checkpoint_every": 1,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8}, "optim": {"lr": 1e-3},
        "rollout": {"max_staleness": 1}, "log_trajectories": True,
    })
    trainer = GRPOTrainer(cfg, model, tok, stage, resume=resume)
    update = trainer.update
    def slow_update(*args, **kwargs):  # an update slower than a rollout: the producer waits ahead
        time.sleep(0.3)
        return update(*args, **kwargs)
    trainer.update = slow_update
    trainer.train()
    """
)


@pytest.mark.multiproc
def test_kill_9_and_resume_keep_the_bound(warm_model_dir, tmp_path):
    script, stage = tmp_path / "run.py", tmp_path / "stage"
    script.write_text(RUN)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script), str(warm_model_dir), str(stage), "0"], env=env)
    try:
        deadline = time.monotonic() + 300
        while not (stage / "checkpoints" / "step_3" / "state.json").is_file():
            assert proc.poll() is None, "the run ended before its third checkpoint"
            assert time.monotonic() < deadline, "no third checkpoint in 300 s"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert not (stage / "final").exists()  # killed mid-run
    resume = [sys.executable, str(script), str(warm_model_dir), str(stage), "1"]
    done = subprocess.run(resume, env=env, timeout=300)
    assert done.returncode == 0
    rows = records(stage)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6]
    assert all(r["rollout/staleness_max"] <= 1 for r in rows)
    versions = store_versions(stage)
    assert sorted(versions) == [1, 2, 3, 4, 5, 6]
    for step, vs in versions.items():  # trained by version step - 1, sampled by step - 2 or step - 1
        assert all(0 <= (step - 1) - v <= 1 for v in vs), (step, vs)
