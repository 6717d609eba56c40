"""Data-parallel training on torch.distributed: 2 ranks (torchrun, gloo on CPU) against 1 process.

The same run config is trained by `python -m textgym train` and by
`python -m torch.distributed.run --nproc-per-node 2 -m textgym train`, from the same warm
model, with `rollout.per_sequence_seeds` so that both sample the very same rollouts, and one
minibatch per step (with several, which rows share a minibatch depends on the ranks).

Tolerances, and why. Two things differ between the runs, both fp32 rounding: the order in
which gradients are summed (the ranks' halves are reduced by FSDP instead of accumulated
in one process) and the padding of each batch (a rank pads to its own longest row). The
first step's gradients agree to ~2e-7 relative (L2; measured with `optimizer.step`
intercepted). AdamW then amplifies that for the few elements whose true gradient is ~0:
their gradient is rounding noise of size ~1e-9, comparable to Adam's ε = 1e-8, so their
update `lr·g/(|g|+ε)` can take any value up to ~lr. One process with micro_batch_size 4
against the same process with 8 (nothing but summation order) differs by as much: after 2
GRPO steps of 2 epochs from the warm model, ‖Δθ‖/‖θ − θ₀‖ = 5.6e-4 between micro-batch sizes
and 6.1e-4 between 1 and 2 ranks. Measured here: 6.4e-5 for SFT + GRPO, 2.5e-5 for PPO,
2.3e-5 for DPO. The parameter test asks for ‖θ₂ − θ₁‖ ≤ 5e-3·‖θ₁ − θ₀‖, ten times the
rounding floor, with ‖θ₁ − θ₀‖ ≈ 3-4 itself. It fails on real bugs: whitening PPO's
advantages per rank instead of over the batch gives 0.82, dividing the token-mean by the
rank's own token count 7.2e-2.
Adam is blind to a constant factor in the gradient (a loss divided by the world size once
too often), so the logged pre-clip `grad_norm`, the losses and the KL of every step must
also agree, to 5e-3 relative; such a factor moves them by 50 % or more.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from conftest import WARM_ENV
from safetensors.torch import load_file

from textgym import distributed
from textgym.config import ConfigError, GRPOConfig, SFTConfig
from textgym.models import load_model

PARAM_RTOL = 5e-3
METRIC_RTOL = 5e-3
# Per-micro-batch maxima averaged over micro-batches: they depend on which rows share a
# micro-batch, so they are not comparable across batch layouts by definition.
NOT_COMPARABLE = ("ratio/max",)


def write_config(path: Path, model_dir: Path, out_dir: Path, **stages: dict) -> Path:
    cfg = {"name": "run", "out_dir": str(out_dir), "threads": 1, "model": {"path": str(model_dir)}, **stages}
    path.write_text(yaml.safe_dump(cfg), encoding="utf-8")
    return path


def textgym(args: list[str], ranks: int, timeout: float = 600, **env: str) -> subprocess.CompletedProcess:
    """`textgym ARGS` in a subprocess: one process, or `ranks` processes under torchrun.

    One thread per process; `env` adds environment variables. Raises AssertionError with the
    output's tail when it exits non-zero.
    """
    launcher = [sys.executable, "-m", "textgym"]
    if ranks > 1:
        launcher = [
            sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={ranks}",
            "-m", "textgym",
        ]  # fmt: skip
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", **env}
    res = subprocess.run([*launcher, *args], capture_output=True, text=True, env=full_env, timeout=timeout)
    if res.returncode != 0:
        raise AssertionError(f"exit {res.returncode}\n{res.stdout[-3000:]}\n{res.stderr[-5000:]}")
    return res


def train(config: Path, name: str, ranks: int, *extra: str) -> subprocess.CompletedProcess:
    """`textgym train CONFIG name=NAME EXTRA...` on 1 process or `ranks` under torchrun."""
    return textgym(["train", str(config), f"name={name}", *extra], ranks)


def params(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def relative_distance(a: dict, b: dict, start: dict) -> tuple[float, float]:
    """(‖a − b‖ / ‖a − start‖, ‖a − start‖) over all parameters."""
    diff = torch.cat([(a[k] - b[k]).flatten() for k in a])
    moved = torch.cat([(a[k] - start[k]).flatten() for k in a])
    return float(diff.norm() / moved.norm()), float(moved.norm())


def records(stage_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (stage_dir / "metrics.jsonl").read_text().splitlines()]


# Shares of tokens past a threshold (a clip range): a token whose ratio or value lies on the
# boundary can fall either side under another reduction order, so these may differ by a few
# tokens (1 with AVX2 kernels, 1.5 on average over the epochs with the portable ones).
TOKEN_SHARES = ("clip/frac", "value/clip_frac", "mismatch/tis_clip_frac")


# DPO's implicit rewards β·(log π − log π_ref) are means over pairs of either sign, so a mean
# near 0 keeps no relative precision: on an AVX2 machine one step's `rewards/chosen` was 0.00163
# on one process and 0.00165 on two ranks (1.1 %), from rewards of about ±0.25 that agree to
# 2e-5. They are compared within METRIC_RTOL of the step's reward scale, max |chosen|, |rejected|.
IMPLICIT_REWARDS = ("rewards/chosen", "rewards/rejected", "rewards/margin")

# Absolute floors, from what each metric is rather than from one CPU's figures. Two batch
# layouts (1 process or 2 ranks, each padded to its own longest row) evaluate the same float32
# log-probabilities with different rounding: per token they differ by ~1e-7 (`ratio/mean` agrees
# to 1e-7 between the layouts; a policy and its identical reference, evaluated once by the
# KV-cached sampler and once by the padded forward, differ by 8.8e-7 per token on AVX2).
# - A policy-gradient loss is a mean of ratio·Â over tokens whose advantages are centred
#   (whitened, or group-normalised), so it can sit near 0 with no relative precision: on an
#   AVX-512 Xeon PPO's step-2 `loss/policy` was −5.0012e-06 on one process and −4.7907e-06 on
#   two ranks. The layouts move it by at most max|Â|·max|Δratio| ≈ 3 · 1e-7: floor 1e-6.
# - A KL to the reference is 0 in exact arithmetic at step 1 (policy = reference): its value is
#   the rounding above, so two layouts may differ by twice it, 2e-6 per token; the floor is
#   4e-6 per token, times `max_new_tokens` (8) for the per-sequence KL.
# - DPO's `rewards/accuracy` (the share of pairs whose implicit margin is > 0) counts signs of
#   rounding noise while the policy equals the reference (every margin is then β times a
#   log-prob difference of ~1e-5 nats): it is compared only at steps whose reward scale is
#   above REWARD_NOISE = 1e-4, ten times β = 0.1 times that difference; on the Xeon step 1 gave
#   0.0 on one process and 0.2 on two ranks.
# The policy loss is a near-zero sum (whitened advantages × ratios, ~1e-4 from terms ~1e-2). Within
# an epoch's later minibatches the two layouts' parameters differ by rounding (PPO: ‖Δθ‖/‖θ−θ0‖
# ~7e-6), which AdamW's normalised steps carry into the ratios: PPO's step-2 losses were 2.2e-6
# apart once micro-batches hold whole groups (rows ordered by task); the floor is 1e-5.
NOISE_FLOORS = {"loss/policy": 1e-5, "loss/total": 1e-5, "kl/ref": 4e-6, "kl/ref_seq": 8 * 4e-6}
REWARD_NOISE = 1e-4


def assert_same_metrics(
    one: list[dict], two: list[dict], keys: tuple[str, ...], rows: int = 0, atol: float = 1e-7
) -> None:
    """Equal steps and metrics (`keys` within `atol` or `METRIC_RTOL`, every other metric within
    1e-6 or `METRIC_RTOL`; both at least the metric's `NOISE_FLOORS` entry; `rewards/accuracy`
    not at a step whose implicit rewards are noise); `rows` (sequences per step), when given,
    lets the token shares differ by three tokens of the step's responses."""
    assert [r["step"] for r in one] == [r["step"] for r in two]
    for a, b in zip(one, two, strict=True):
        assert set(a) == set(b)
        scale = max((abs(a[k]) for k in IMPLICIT_REWARDS[:2] if k in a), default=None)
        noise = {"rewards/accuracy"} if scale is not None and scale <= REWARD_NOISE else set()
        for k in set(keys) - noise:
            tol = max(atol, NOISE_FLOORS.get(k, 0.0))
            if k in IMPLICIT_REWARDS:
                tol = max(tol, METRIC_RTOL * (scale or 0.0))
            assert a[k] == pytest.approx(b[k], rel=METRIC_RTOL, abs=tol), (a["step"], k, a[k], b[k])
        one_token = 1.0 / (rows * a["rollout/response_length_mean"]) if rows else 0.0
        for k in set(a) - noise:
            if k.startswith(("time", "throughput")) or k in NOT_COMPARABLE or not math.isfinite(a[k]):
                continue
            tol = 3.01 * one_token if k.startswith(TOKEN_SHARES) else max(1e-6, NOISE_FLOORS.get(k, 0.0))
            if k in IMPLICIT_REWARDS:
                tol = max(tol, METRIC_RTOL * (scale or 0.0))
            assert a[k] == pytest.approx(b[k], rel=METRIC_RTOL, abs=tol), (a["step"], k, a[k], b[k])


SAMPLING = {"temperature": 1.0, "max_new_tokens": 8}
SEEDED = {"per_sequence_seeds": True}


@pytest.fixture(scope="module")
def grpo_runs(warm_model_dir, tmp_path_factory):
    """A short SFT stage then 2 GRPO steps on 1 and 2 ranks.

    KL in the loss (a sharded reference, CPU-offloaded on 2 ranks), 2 epochs, micro-batches,
    DAPO's dynamic sampling (groups gathered across ranks), trajectory shards, an evaluation
    every step and around the stage (rank 0 alone).
    """
    out = tmp_path_factory.mktemp("dist_grpo")
    stages = {
        "sft": {"env": WARM_ENV, "steps": 3, "batch_size": 8, "micro_batch_size": 3, "log_every": 1},
        "grpo": {
            "env": WARM_ENV,
            "steps": 2,
            "prompts_per_step": 4,
            "group_size": 4,
            "epochs": 2,
            "micro_batch_size": 4,
            "kl_coef": 0.05,
            "sampling": SAMPLING,
            "rollout": SEEDED,
            "optim": {"lr": 1e-3},
            "checkpoint_every": 1,
            "dynamic_sampling": True,
            "max_sampling_tries": 2,
            "log_trajectories": True,
            "eval_every": 1,
        },
        "eval": {
            "env": {**WARM_ENV, "kwargs": {**WARM_ENV["kwargs"], "split": "test"}},
            "n": 8,
            "sampling": {"temperature": 0.0, "max_new_tokens": 8},
        },
    }
    config = write_config(out / "grpo.yaml", warm_model_dir, out, **stages)
    times = {}
    for ranks in (1, 2):
        t = time.perf_counter()
        # 2 ranks: the reference's shards offloaded to CPU memory (FSDP2's CPU offload; on this
        # CPU-only machine the same memory, but the offload path runs and must change nothing)
        train(config, f"r{ranks}", ranks, *(["grpo.reference_device=cpu"] if ranks == 2 else []))
        times[ranks] = time.perf_counter() - t
    return out, config, times


@pytest.mark.multiproc
def test_grpo_on_two_ranks_matches_one_process(grpo_runs, warm_model_dir):
    out, _, times = grpo_runs
    one, two = out / "r1", out / "r2"
    start = params(warm_model_dir)
    rel, moved = relative_distance(params(one / "grpo" / "final"), params(two / "grpo" / "final"), start)
    print(f"GRPO 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}, wall {times}")
    assert moved > 0.5  # SFT + GRPO moved the weights far beyond the tolerance
    assert rel < PARAM_RTOL
    keys = ("loss/policy", "grad_norm", "kl/ref", "rollout/reward_mean", "adv/std", "entropy")
    assert_same_metrics(records(one / "grpo"), records(two / "grpo"), keys)
    assert_same_metrics(records(one / "sft"), records(two / "sft"), ("loss/sft", "grad_norm"))
    assert (
        records(one / "grpo")[0]["rollout/reward_std"] > 0
    )  # groups with different rewards: a real gradient
    # rank 0 alone wrote the run directory: one set of files, the single-process layout
    assert sorted(p.name for p in (two / "grpo").iterdir()) == sorted(
        p.name for p in (one / "grpo").iterdir()
    )
    summary_one, summary_two = (json.loads((d / "summary.json").read_text()) for d in (one, two))
    assert summary_two["ranks"] == 2
    for k in ("accuracy_before", "accuracy_after", "mean_reward_after"):
        assert summary_one[k] == summary_two[k]  # greedy evaluation of (nearly) the same weights
    assert "eval/accuracy" in records(two / "grpo")[-1]
    assert records(two / "grpo")[0]["sampling/rounds"] >= 1
    from textgym.offline.store import read_trajectories

    cols = ["task_index", "group", "sample", "reward", "token_ids"]
    rows = [read_trajectories(d / "grpo" / "trajectories", columns=cols).to_pylist() for d in (one, two)]
    assert len(rows[0]) == 2 * 16 and rows[0] == rows[1]  # the same rollouts, one shard per step
    memory = json.loads((two / "grpo" / "memory.json").read_text())
    assert set(memory) == {"policy", "reference"}
    full = json.loads((one / "grpo" / "memory.json").read_text())
    assert memory["policy"]["param_mib"] == pytest.approx(full["policy"]["param_mib"] / 2, rel=0.05)


@pytest.mark.multiproc
def test_a_two_rank_checkpoint_resumes_on_one_process(grpo_runs):
    """The 2-rank checkpoint of step 2, continued for a third step on one process, lands where
    the 1-process run continued from its own step-2 checkpoint does."""
    out, config, _ = grpo_runs
    ckpt_one, ckpt_two = (
        out / "r1" / "grpo" / "checkpoints" / "step_2",
        out / "r2" / "grpo" / "checkpoints" / "step_2",
    )
    # the same files, in the same format: integer-keyed optimizer state, a plain HF folder
    assert sorted(p.name for p in ckpt_two.iterdir()) == sorted(p.name for p in ckpt_one.iterdir())
    opt_one, opt_two = (torch.load(c / "optimizer.pt", weights_only=False) for c in (ckpt_one, ckpt_two))
    assert list(opt_two["state"]) == list(opt_one["state"]) == list(range(len(opt_one["state"])))
    assert opt_two["param_groups"][0]["params"] == opt_one["param_groups"][0]["params"]
    assert len(torch.load(ckpt_two / "rng.pt", weights_only=False)["ranks"]) == 2
    assert json.loads((ckpt_two / "config.json").read_text())["architectures"] == ["Qwen2ForCausalLM"]
    for name in ("r1", "r2"):
        shutil.rmtree(out / name / "grpo" / "final")  # as if the run had stopped after its checkpoint
        train(config, name, 1, "grpo.steps=3", "--resume")
    one, two = records(out / "r1" / "grpo"), records(out / "r2" / "grpo")
    assert [r["step"] for r in two] == [1, 2, 3]
    assert_same_metrics(one[2:], two[2:], ("loss/policy", "grad_norm", "kl/ref", "rollout/reward_mean"))
    start = params(ckpt_one)
    rel, moved = relative_distance(
        params(out / "r1" / "grpo" / "final"), params(out / "r2" / "grpo" / "final"), start
    )
    print(f"resumed step 3: ‖Δθ‖/‖θ−θ2‖ = {rel:.2e}, ‖θ−θ2‖ = {moved:.3f}")
    assert rel < 10 * PARAM_RTOL  # the two step-2 checkpoints already differ by rounding (above)


@pytest.mark.multiproc
def test_ppo_on_two_ranks_matches_one_process(warm_model_dir, tmp_path):
    """PPO with its critic, a reference (KL in the reward, adaptive β), whitening and GAE.

    Partial credit (digit match) makes a first batch with no reward at all unlikely on any
    kernel: then the critic's values (a zero-initialised head) and the rewards are all 0, and
    the whitened advantages are the KL penalty's rounding noise scaled to unit size, which two
    batch layouts round differently (on an AVX-512 Xeon the step-2 policy losses differed by 4 %).
    With one reward in the batch, GAE's λ-discounting gives every token an advantage of its own."""
    ppo = {
        "env": {**WARM_ENV, "kwargs": {**WARM_ENV["kwargs"], "digit_match_weight": 1.0}},
        "steps": 2,
        "prompts_per_step": 4,
        "group_size": 2,
        "epochs": 2,
        "micro_batch_size": 2,
        "kl_coef": 0.05,
        "kl_target": 0.5,
        "sampling": SAMPLING,
        "rollout": SEEDED,
        "optim": {"lr": 1e-3},
        "critic": {"optim": {"lr": 1e-3}},
    }
    config = write_config(tmp_path / "ppo.yaml", warm_model_dir, tmp_path, ppo=ppo)
    times = {}
    for ranks in (1, 2):
        t = time.perf_counter()
        train(config, f"r{ranks}", ranks)
        times[ranks] = time.perf_counter() - t
    one, two = tmp_path / "r1" / "ppo", tmp_path / "r2" / "ppo"
    start = params(warm_model_dir)
    rel, moved = relative_distance(params(one / "final"), params(two / "final"), start)
    print(f"PPO 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}, wall {times}")
    assert moved > 0.5 and rel < PARAM_RTOL
    critic_one, critic_two = params(one / "critic"), params(two / "critic")
    head = "score.weight"
    assert float(critic_one[head].abs().max()) > 1e-3  # the zero-initialised value head learned
    assert float((critic_one[head] - critic_two[head]).abs().max()) < PARAM_RTOL * float(
        critic_one[head].norm()
    )
    keys = (
        "loss/policy",
        "loss/value",
        "grad_norm",
        "value/grad_norm",
        "kl/ref",
        "kl/coef",
        "rollout/reward_mean",
    )
    assert records(one)[0]["rollout/reward_mean"] > 0  # advantages that are not rounding noise
    assert_same_metrics(records(one), records(two), keys, rows=4 * 2)
    assert set(json.loads((two / "memory.json").read_text())) == {"policy", "reference", "critic"}


@pytest.mark.multiproc
@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
def test_dpo_on_two_ranks_matches_one_process(warm_model_dir, tmp_path, lora):
    """Rank 0 collects the rollouts and builds the pairs; both ranks train on their halves.

    Batches of 5 pairs split 3 + 2 over the ranks, micro-batches of 2: rank 1 runs a filler
    micro-batch (weight 0) so that both make the same forward calls; the epoch's last batch
    is ragged. With LoRA the sharded adapters train and the merged final is compared.
    How many pairs the rollouts give depends on the CPU's rounding (15 with the portable
    kernels here): when 5 divides it, the batch is 9 or 13 pairs instead, which split and
    fill the same way (2k + 1 over the ranks: k + 1 micro-batches on rank 0, k and a filler
    on rank 1).
    """
    dpo = {
        "env": WARM_ENV,
        "loss": "dpo",
        "collect": {"n": 32, "samples": 4, "sampling": SAMPLING},
        "epochs": 2,
        "batch_size": 5,
        "micro_batch_size": 2,
        "optim": {"lr": 1e-2 if lora else 1e-3},
        "log_every": 1,
        **({"lora": {"r": 8, "alpha": 16}} if lora else {}),
    }
    config = write_config(tmp_path / "dpo.yaml", warm_model_dir, tmp_path, dpo=dpo)
    train(config, "r1", 1)
    pairs = json.loads((tmp_path / "r1" / "summary.json").read_text())["dpo_rounds"][0]["pairs"]
    batch = next(b for b in (5, 9, 13) if pairs % b)
    if batch != 5:  # 5 divides the pairs: another batch size with a ragged last batch
        dpo["batch_size"] = batch
        config = write_config(tmp_path / "dpo.yaml", warm_model_dir, tmp_path, dpo=dpo)
        train(config, "r1", 1, "--overwrite")
    train(config, "r2", 2)
    one, two = (tmp_path / f"r{n}" / "dpo" / "round_0" for n in (1, 2))
    summary = json.loads((tmp_path / "r2" / "summary.json").read_text())
    assert summary["dpo_rounds"] == json.loads((tmp_path / "r1" / "summary.json").read_text())["dpo_rounds"]
    assert summary["dpo_rounds"][0]["pairs"] % batch != 0  # a ragged last batch
    rel, moved = relative_distance(
        params(one / "train" / "final"), params(two / "train" / "final"), params(warm_model_dir)
    )
    print(f"DPO ({'LoRA' if lora else 'full'}) 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}")
    assert (two / "train" / "final_adapter").is_dir() == lora
    assert moved > 0.5 and rel < PARAM_RTOL
    ref_one, ref_two = (torch.load(d / "train" / "reference_logps.pt") for d in (one, two))
    for k in ("first", "second"):
        torch.testing.assert_close(ref_two[k], ref_one[k], rtol=0, atol=1e-4)  # gathered from both ranks
    keys = ("loss/dpo", "grad_norm", "rewards/margin", "rewards/accuracy")
    assert_same_metrics(records(one / "train"), records(two / "train"), keys)


@pytest.mark.multiproc
def test_kto_on_two_ranks_matches_one_process(warm_model_dir, tmp_path):
    """KTO's reference point z₀ is reduced over every micro-batch and both ranks.

    Batches of 5 examples split 3 + 2 over the ranks, micro-batches of 2 (2 + 1 and 2 + a
    filler; 2 + 2 + 1 on one process): with a per-micro-batch z₀ the layouts train differently.
    """
    dpo = {
        "env": WARM_ENV,
        "loss": "kto",
        # T = 0.5: completions share their format, so raising the own ones raises the mismatched
        # ones too and z₀ > 0 (at T = 1 whether it does depends on the draws: it stayed 0 with
        # the inverse-CDF sampler's draws)
        "collect": {"n": 16, "samples": 4, "sampling": {**SAMPLING, "temperature": 0.5}},
        "pairs": {"desirable_threshold": 0.0},  # every example desirable: the policy moves towards
        "epochs": 1,  # all the completions, the mismatched ones too, so z₀ > 0
        "batch_size": 5,
        "micro_batch_size": 2,
        "optim": {"lr": 1e-3},
        "log_every": 1,
    }
    config = write_config(tmp_path / "kto.yaml", warm_model_dir, tmp_path, dpo=dpo)
    for ranks in (1, 2):
        train(config, f"r{ranks}", ranks)
    one, two = (tmp_path / f"r{n}" / "dpo" / "round_0" / "train" for n in (1, 2))
    rows_one = records(one)
    assert max(r["kl"] for r in rows_one) > 1e-3  # z₀ is not clamped to 0 all along
    # z₀ at step 1 is 0 in exact arithmetic (policy = reference); in float32 it is a difference
    # of sequence log-probs of about 10 nats computed in two batch layouts, resolved to ~1e-6
    # (measured: 4.8e-7 on one process, 0.0 on two ranks, AVX-512)
    assert_same_metrics(rows_one, records(two), ("loss/kto", "kl", "grad_norm"), atol=1e-6)
    rel, moved = relative_distance(params(one / "final"), params(two / "final"), params(warm_model_dir))
    print(f"KTO 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}")
    assert moved > 0.1 and rel < PARAM_RTOL


@pytest.mark.multiproc
def test_lora_grpo_on_two_ranks_matches_one_process(warm_model_dir, tmp_path):
    """LoRA adapters sharded with their frozen base; the KL reference is the policy with its
    adapters off (no copy). The merged final and the adapter agree with one process, and the
    2-rank adapter checkpoint resumes on one process where the 1-process one does.

    Partial credit (digit match) gives the first step a gradient on every kernel: with all
    advantages zero, the only gradient is the KL's rounding noise (policy = reference), which
    Adam scales up to real steps that differ between any two reduction orders."""
    grpo = {
        "env": {**WARM_ENV, "kwargs": {**WARM_ENV["kwargs"], "digit_match_weight": 1.0}},
        "steps": 2,
        "prompts_per_step": 4,
        "group_size": 4,
        "micro_batch_size": 4,
        "kl_coef": 0.05,
        "sampling": SAMPLING,
        "rollout": SEEDED,
        "optim": {"lr": 1e-2},
        "checkpoint_every": 1,
        "lora": {"r": 8, "alpha": 16},
    }
    config = write_config(tmp_path / "lora.yaml", warm_model_dir, tmp_path, grpo=grpo)
    for ranks in (1, 2):
        train(config, f"r{ranks}", ranks)
    one, two = tmp_path / "r1" / "grpo", tmp_path / "r2" / "grpo"
    start = params(warm_model_dir)
    rel, moved = relative_distance(params(one / "final"), params(two / "final"), start)
    adapter = [load_file(str(d / "final_adapter" / "adapter_model.safetensors")) for d in (one, two)]
    assert sorted(adapter[0]) == sorted(adapter[1]) and all(".lora_" in k for k in adapter[0])
    b_one = torch.cat([v.flatten() for k, v in sorted(adapter[0].items()) if "lora_B" in k])
    b_two = torch.cat([v.flatten() for k, v in sorted(adapter[1].items()) if "lora_B" in k])
    rel_b = float((b_one - b_two).norm() / b_one.norm())
    print(f"LoRA GRPO 1 vs 2 ranks: merged ‖Δθ‖/‖θ−θ0‖ = {rel:.2e} (‖θ−θ0‖ = {moved:.3f}), B: {rel_b:.2e}")
    assert moved > 1.0 and rel < PARAM_RTOL and rel_b < PARAM_RTOL  # moved 4.3
    assert records(one)[0]["rollout/reward_std"] > 0  # a real first step (see the docstring)
    keys = ("loss/policy", "grad_norm", "kl/ref", "rollout/reward_mean")
    assert_same_metrics(records(one), records(two), keys)
    assert records(one)[-1]["kl/ref"] > 0  # the adapters-off reference differs from the policy
    memory = [json.loads((d / "memory.json").read_text())["policy"] for d in (one, two)]
    assert memory[1]["grad_mib"] == pytest.approx(memory[0]["grad_mib"] / 2, rel=0.05)  # adapters only
    assert memory[0]["grad_mib"] < memory[0]["param_mib"] / 5
    ckpt = two / "checkpoints" / "step_2"
    assert sorted(p.name for p in ckpt.iterdir()) == sorted(
        p.name for p in (one / "checkpoints" / "step_2").iterdir()
    )
    assert (ckpt / "adapter_config.json").is_file() and not (ckpt / "model.safetensors").exists()
    for name in ("r1", "r2"):
        shutil.rmtree(tmp_path / name / "grpo" / "final")
        train(config, name, 1, "grpo.steps=3", "--resume")
    assert [r["step"] for r in records(two)] == [1, 2, 3]
    assert_same_metrics(records(one)[2:], records(two)[2:], keys)
    rel3, moved3 = relative_distance(params(one / "final"), params(two / "final"), start)
    print(f"resumed step 3 on one process: ‖Δθ‖/‖θ−θ0‖ = {rel3:.2e} (‖θ−θ0‖ = {moved3:.3f})")
    assert moved3 > moved and rel3 < PARAM_RTOL


# --- in-process checks ------------------------------------------------------------------------
@pytest.fixture
def two_rank_world(monkeypatch):
    """Pretend to be rank 0 of 2 (no process group: only checks that run before any collective)."""
    monkeypatch.setattr(
        distributed.process_group, "_WORLD", distributed.World(rank=0, size=2, local_rank=0, backend="gloo")
    )


def test_a_batch_that_does_not_split_over_the_ranks_is_a_config_error(
    two_rank_world, tiny_model_dir, tmp_path
):
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.trainers.sft import SFTTrainer

    model, tok = load_model(tiny_model_dir)
    cfg = GRPOConfig.model_validate({"env": WARM_ENV, "prompts_per_step": 3, "group_size": 2})
    with pytest.raises(
        ConfigError, match=r"prompts_per_step=3 must be a multiple of the number of ranks \(2\)"
    ):
        GRPOTrainer(cfg, model, tok, tmp_path)
    cfg = GRPOConfig.model_validate(
        {"env": WARM_ENV, "prompts_per_step": 2, "group_size": 3, "minibatch_size": 3}
    )
    with pytest.raises(ConfigError, match="minibatch_size=3 must be a multiple"):
        GRPOTrainer(cfg, model, tok, tmp_path)
    cfg = GRPOConfig.model_validate(
        {
            "env": WARM_ENV,
            "prompts_per_step": 2,
            "group_size": 2,
            "kl_coef": 0.1,
            "reference_device": "cuda:1",
        }
    )
    with pytest.raises(ConfigError, match=r"reference_device='cuda:1': on several ranks .* only \"cpu\""):
        GRPOTrainer(cfg, model, tok, tmp_path)
    with pytest.raises(ConfigError, match="batch_size=5 must be a multiple"):
        SFTTrainer(SFTConfig.model_validate({"env": WARM_ENV, "batch_size": 5}), model, tok, tmp_path)


def test_outside_torchrun_every_helper_is_the_identity():
    assert not distributed.world().active and distributed.is_main()
    x = torch.arange(3.0)
    assert distributed.all_reduce_sum(x) is x and distributed.all_gather_tensor(x) is x
    assert distributed.share(7.0) == 7.0 and distributed.all_gather_list([1, 2]) == [1, 2]
    metrics = {"a": 1.0, "time/x": 2.0}
    assert distributed.reduce_metrics(metrics, {"a": 5.0}) is metrics
    assert distributed.on_main(lambda: 4) == 4 and distributed.rank_seed(11) == 11
    assert distributed.metric_op("time/step_s") == "max" and distributed.metric_op("rollout/len_max") == "max"
    assert (
        distributed.metric_op("throughput/tokens_per_s") == "sum"
        and distributed.metric_op("loss/x") == "mean"
    )


def test_per_sequence_seeds_make_samples_independent_of_batching(tiny_model_dir):
    from textgym.agents.llm_agent import LLMAgent
    from textgym.agents.sampling import SamplingParams

    model, tok = load_model(tiny_model_dir)
    agent = LLMAgent(model, tok, batch_size=8)
    prompts = [tok(f"{i} + {i}")["input_ids"] for i in range(6)]  # different lengths: different padding
    params = SamplingParams(temperature=1.0, top_k=50, top_p=0.95, max_new_tokens=10)
    seeds = [1000 + i for i in range(6)]
    together = agent.generate(prompts, params, seeds=seeds)
    agent.backend.batch_size = 4  # other batches, reversed order
    apart = agent.generate(prompts[::-1], params, seeds=seeds[::-1])[::-1]
    assert [g.token_ids for g in together] == [g.token_ids for g in apart]
    for a, b in zip(together, apart, strict=True):
        torch.testing.assert_close(a.logprobs, b.logprobs, rtol=0, atol=1e-5)  # padding changes rounding only
    other = agent.generate(prompts, params, seeds=[s + 1 for s in seeds])
    assert [g.token_ids for g in other] != [g.token_ids for g in together]


def test_seeded_sampling_draws_the_softmax_even_in_the_far_tail():
    """One generator per row: 20000 seeded rows hit each token with probability softmax(s), and the
    draw's float64 CDF gives a token of probability ~e^-18 exactly its share of [0, 1), where float32
    Gumbel noise (uniforms clamped at 1 - 2^-23) drew it at 0.3% of its rate."""
    from textgym.agents.transformers_backend import SeededSample, inverse_cdf

    n, logits = 20000, torch.tensor([2.0, 1.0, 0.0, -1.0, -float("inf")])
    scores = logits.repeat(n, 1)
    drawn = SeededSample(list(range(n)), torch.device("cpu"))(torch.zeros(n, 1, dtype=torch.long), scores)
    assert bool((drawn.max(-1).values == 0).all()) and bool((drawn == 0).sum(-1).eq(1).all())  # one-hot
    freq = torch.bincount(drawn.argmax(-1), minlength=5).float() / n
    p = torch.softmax(logits, -1)
    assert freq[4] == 0  # a filtered token is never drawn
    assert torch.all((freq - p).abs() <= 4 * (p * (1 - p) / n).sqrt() + 1e-9)  # 4 standard errors
    again = SeededSample([7, 8], torch.device("cpu"))(torch.zeros(2, 1, dtype=torch.long), scores[:2])
    assert torch.equal(again, SeededSample([7, 8], torch.device("cpu"))(None, scores[:2]))  # type: ignore[arg-type]
    # The far tail: a draw is the token whose CDF interval holds u, so a token's chance is its
    # interval's width. Found by bisection over u, the interval of a p ≈ e^-18 token is its
    # probability to float64 rounding (float32 uniforms cannot resolve widths below 2^-24).
    probs = torch.softmax(torch.tensor([[0.0, -18.0, 0.0]]), -1)

    def token(u: float) -> int:
        return int(inverse_cdf(probs, torch.tensor([[u]], dtype=torch.float64)))

    def first_u_above(tok: int) -> float:
        lo, hi = 0.0, 1.0
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if token(mid) <= tok else (lo, mid)
        return hi

    start, end = first_u_above(0), first_u_above(1)
    assert token((start + end) / 2) == 1 and token(start - 1e-12) == 0 and token(end) == 2
    assert end - start == pytest.approx(float(probs[0, 1]), rel=1e-6)


def test_gradient_checkpointing_gives_the_same_gradients(tiny_model_dir):
    """Recomputing activations in backward changes no gradient (bit for bit on the same graph).

    Under checkpointing HF drops the KV cache, so `sequence_logprobs` no longer shares a
    group's prompt; against the shared-prompt default the gradients then differ by rounding.
    """
    from textgym.agents.trajectory import Trajectory
    from textgym.training.batch import RolloutBatch
    from textgym.training.logprobs import sequence_logprobs

    def batch() -> RolloutBatch:
        g = torch.Generator().manual_seed(0)
        trajs = []
        for i in range(4):  # two groups of two rows sharing their prompt
            prompt = torch.randint(3, 200, (5 + i // 2,), generator=torch.Generator().manual_seed(i // 2))
            ids = torch.cat([prompt, torch.randint(3, 200, (3 + i,), generator=g)])
            mask = torch.cat([torch.zeros(len(prompt)), torch.ones(len(ids) - len(prompt))])
            zeros = torch.zeros(len(ids))
            trajs.append(Trajectory(ids, mask, zeros, zeros.clone(), len(prompt), [], 0.0, group=i // 2))
        return RolloutBatch.from_trajectories(trajs, 0)

    def grads(checkpointing: bool, share_prompts: bool) -> dict[str, torch.Tensor]:
        model, _ = load_model(tiny_model_dir)
        if checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        b = batch()
        logprobs, _ = sequence_logprobs(model, b, share_prompts=share_prompts)
        ((logprobs * b.loss_mask).sum() / b.loss_mask.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    plain, checkpointed = grads(False, False), grads(True, False)
    assert max(float(g.abs().max()) for g in plain.values()) > 1e-2
    assert all(torch.equal(checkpointed[n], g) for n, g in plain.items())
    shared, checkpointed_default = grads(False, True), grads(True, True)
    assert all(torch.equal(checkpointed_default[n], g) for n, g in plain.items())  # sharing was turned off
    for n, g in shared.items():
        torch.testing.assert_close(checkpointed_default[n], g, rtol=1e-5, atol=1e-6, msg=n)


def test_memory_report_counts_parameters_gradients_and_adam_state(tiny_model_dir):
    from textgym.config import OptimConfig
    from textgym.training.optim import build_optimizer

    model, _ = load_model(tiny_model_dir)
    optimizer, _ = build_optimizer(model, OptimConfig(), 10)
    frozen, _ = load_model(tiny_model_dir)
    frozen.requires_grad_(False)
    report = distributed.memory_report({"policy": (model, optimizer), "reference": (frozen, None)})
    n = sum(p.numel() for p in model.parameters())
    assert report["policy"]["params_m"] == pytest.approx(n / 1e6)
    assert report["policy"]["param_mib"] == report["policy"]["grad_mib"] == pytest.approx(4 * n / 2**20)
    assert report["policy"]["optim_mib"] == pytest.approx(8 * n / 2**20)  # AdamW's two moments, before a step
    assert report["reference"]["grad_mib"] == report["reference"]["optim_mib"] == 0
    model(input_ids=torch.tensor([[1, 2, 3]]), labels=torch.tensor([[1, 2, 3]])).loss.backward()
    optimizer.step()
    stepped = distributed.memory_report({"policy": (model, optimizer)})["policy"]["optim_mib"]
    assert stepped == pytest.approx(8 * n / 2**20, rel=1e-3)  # the moments it now holds (+ step counters)


@pytest.mark.multiproc
def test_a_user_env_named_with_import_trains_on_two_ranks(tmp_path, tiny_model_dir):
    """`torchrun -m textgym --import plain_env train ...` from the folder holding the user's module:
    every rank imports it (the root option), and the stage trains on the plain Gymnasium env."""
    root = Path(__file__).resolve().parents[2]
    shutil.copy(root / "docs" / "snippets" / "plain_env.py", tmp_path / "plain_env.py")
    config = write_config(
        tmp_path / "echo.yaml",
        tiny_model_dir,
        tmp_path / "runs",
        grpo={
            "env": {"id": "plain/Echo-v0"},
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 2,
            "sampling": {"temperature": 1.0, "max_new_tokens": 4},
        },
    )
    launcher = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "TEXTGYM_IMPORTS": ""}
    res = subprocess.run(
        [*launcher, "-m", "textgym", "--import", "plain_env", "train", str(config)],
        capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    (row,) = records(tmp_path / "runs" / "run" / "grpo")
    assert row["step"] == 1 and "rollout/accuracy" in row
