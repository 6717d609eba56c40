"""Compute precision on one device (`textgym.training.precision`): bf16 autocast over fp32 weights.

On this CPU (bf16 autocast runs oneDNN's bf16 matmuls) a bf16 step of the tiny model must run
its Linear layers in bf16, keep parameters, gradients and AdamW state in fp32, and land close to
the fp32 step; `mixed_precision: fp32` must be exactly the code path without any precision
handling. Tolerances were measured under `ATEN_CPU_CAPABILITY=default` and `avx2` (and this
machine's avx512), with 1 and 2 threads (`TEXTGYM_TEST_THREADS`), on 2026-11-23; each states
the largest value seen and the margin kept.
"""

from __future__ import annotations

import contextlib
import copy
import math

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym import distributed
from textgym.config import ConfigError, GRPOConfig, ParallelConfig, load_config
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training import precision
from textgym.training.precision import (
    compute_autocast,
    compute_dtype,
    resolve_compute_dtype,
    set_cudnn_attention,
    set_precision,
    set_tf32,
)
from textgym.training.seeding import seed_everything


def grpo_cfg(**over):
    base = {
        "env": ENV,
        "steps": 1,
        "prompts_per_step": 2,
        "group_size": 4,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "optim": {"lr": 1e-3},
        "kl_coef": 0.05,
    }
    base.update(over)
    return GRPOConfig.model_validate(base)


class DtypeProbe:
    """Records (output dtype, autocast on for its device?) of every forward of one Linear layer."""

    def __init__(self, model: torch.nn.Module):
        self.seen: set[tuple[torch.dtype, bool]] = set()
        layer = model.model.layers[0].mlp.down_proj
        self.handle = layer.register_forward_hook(
            lambda mod, inp, out: self.seen.add((out.dtype, torch.is_autocast_enabled(out.device.type)))
        )


# --- the mechanism ---------------------------------------------------------------------------
def test_resolve_compute_dtype():
    assert resolve_compute_dtype("auto", "cpu") == torch.float32
    assert resolve_compute_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_compute_dtype("bf16", "cpu") == torch.bfloat16
    assert resolve_compute_dtype("fp32", "cuda") == torch.float32
    with pytest.raises(ValueError, match="mixed_precision"):
        resolve_compute_dtype("fp16", "cpu")


def test_compute_autocast_follows_the_record():
    torch.manual_seed(0)
    layer = torch.nn.Linear(8, 8)
    x = torch.randn(2, 8)
    assert compute_dtype(layer) == torch.float32  # nothing recorded: fp32, no autocast
    assert isinstance(compute_autocast(layer), contextlib.nullcontext)
    set_precision(layer, "bf16", "cpu")
    assert compute_dtype(layer) == torch.bfloat16
    with compute_autocast(layer):
        assert layer(x).dtype == torch.bfloat16
    assert layer.weight.dtype == torch.float32  # weights are not cast
    set_precision(layer, "fp32", "cpu")
    assert isinstance(compute_autocast(layer), contextlib.nullcontext)
    with compute_autocast(layer):
        assert layer(x).dtype == torch.float32


def test_under_torchrun_fsdp_owns_the_precision(monkeypatch):
    """With a process group up, `set_precision` records fp32: FSDP2's policy casts, no autocast on top."""
    monkeypatch.setattr(precision.distributed, "world", lambda: distributed.World(backend="gloo"))
    layer = torch.nn.Linear(4, 4)
    set_precision(layer, "bf16", "cpu")
    assert compute_dtype(layer) == torch.float32
    assert isinstance(compute_autocast(layer), contextlib.nullcontext)


def test_tf32_is_set_on_cuda_only():
    before = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
    try:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        set_tf32(True, "cpu")
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
        set_tf32(True, "cuda")  # the flags are process-wide; they are writable on a CPU build too
        assert torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
        set_tf32(False, torch.device("cuda", 0))
        assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before


def test_cudnn_attention_is_off_on_cuda_by_default_and_untouched_on_cpu():
    # cuDNN's SDPA backward gives NaN query gradients on masked, left-padded batches on H100/H200
    # (pytorch/pytorch#196678): placing a model on CUDA turns it off unless the config allows it
    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        set_precision(torch.nn.Linear(2, 2), "auto", "cpu")
        assert torch.backends.cuda.cudnn_sdp_enabled()  # CPU: the process-wide flag is left alone
        set_precision(torch.nn.Linear(2, 2), "auto", "cuda")  # writable on a CPU build too
        assert not torch.backends.cuda.cudnn_sdp_enabled()
        set_cudnn_attention(True, torch.device("cuda", 0))
        assert torch.backends.cuda.cudnn_sdp_enabled()
        assert ParallelConfig().cudnn_attention is False
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)


# --- config ----------------------------------------------------------------------------------
def test_parallel_precision_fields_are_validated():
    assert ParallelConfig().mixed_precision == "auto" and ParallelConfig().tf32 is True
    base = {"name": "p", "model": {"init_preset": "tiny"}, "sft": {"env": ENV}}
    cfg = load_config(values={"parallel.mixed_precision": "bf16", "parallel.tf32": False}, **base)
    assert cfg.parallel.mixed_precision == "bf16" and cfg.parallel.tf32 is False
    with pytest.raises(ConfigError, match=r"parallel\.mixed_precision"):
        load_config(values={"parallel.mixed_precision": "fp16"}, **base)
    with pytest.raises(ConfigError, match=r"parallel\.tf32"):
        load_config(values={"parallel.tf32": "sometimes"}, **base)


# --- a GRPO step -----------------------------------------------------------------------------
def test_a_bf16_grpo_step_computes_in_bf16_over_fp32_state(tiny_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    probe = DtypeProbe(model)
    trainer = GRPOTrainer(grpo_cfg(), model, tok, tmp_path, parallel=ParallelConfig(mixed_precision="bf16"))
    assert compute_dtype(trainer.policy) == torch.bfloat16
    assert trainer.reference is not None and compute_dtype(trainer.reference) == torch.bfloat16
    metrics = trainer.train_step()
    assert math.isfinite(metrics["loss/total"])
    # rollouts and the update both ran the Linear in bf16 under autocast, never in fp32
    assert probe.seen == {(torch.bfloat16, True)}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert {p.grad.dtype for p in model.parameters() if p.grad is not None} <= {torch.float32}
    state = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {v.dtype for v in state} == {torch.float32}
    assert not torch.is_autocast_enabled("cpu")  # the context did not leak


def _update_on_a_fixed_batch(model, tok, tmp_path, mixed_precision):
    """Loss and flat gradient of one GRPO update on a fixed batch with fixed advantages."""
    from test_grpo import _batch_and_advantages

    batch, adv = _batch_and_advantages(model, tok, n_tasks=1, group=4)
    m = copy.deepcopy(model)
    cfg = grpo_cfg(prompts_per_step=1, optim={"lr": 1e-3, "max_grad_norm": None})
    trainer = GRPOTrainer(
        cfg, m, tok, tmp_path / mixed_precision, parallel=ParallelConfig(mixed_precision=mixed_precision)
    )
    torch.manual_seed(0)
    stats = trainer.update(batch, adv)
    grad = torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None])
    return stats["loss/total"], grad


def test_the_bf16_update_is_close_to_the_fp32_one(tiny_model_dir, tmp_path):
    """Same batch, same advantages: the loss and the gradient agree with fp32's.

    Measured (default, avx2, avx512 kernels; 1 and 2 threads): |Δloss| ≤ 2.1e-4 (the loss is
    ~0: group advantages sum to 0 at ratio 1), ‖g_bf16 − g_fp32‖ / ‖g_fp32‖ ≤ 0.0087.
    """
    model, tok = load_model(tiny_model_dir)
    loss32, g32 = _update_on_a_fixed_batch(model, tok, tmp_path, "fp32")
    loss16, g16 = _update_on_a_fixed_batch(model, tok, tmp_path, "bf16")
    rel = float((g16.double() - g32.double()).norm() / g32.double().norm())
    print(f"MEASURE update dloss={abs(loss16 - loss32):.3g} grad_rel={rel:.4g}")
    assert not torch.equal(g16, g32)  # bf16 really computed something else
    assert abs(loss16 - loss32) < 2e-3
    assert rel < 0.05


# --- SFT: the fp32 path is the code without precision handling; bf16 is close to it ---------
def _sft_losses(model_dir, tmp_path, mixed_precision, steps=2, patch=None):
    from textgym.config import SFTConfig
    from textgym.trainers.sft import SFTTrainer

    seed_everything(0)
    model, tok = load_model(model_dir)
    probe = DtypeProbe(model)
    cfg = SFTConfig.model_validate({"env": ENV, "steps": steps, "batch_size": 8, "optim": {"lr": 3e-3}})
    with patch or contextlib.nullcontext():
        trainer = SFTTrainer(
            cfg,
            model,
            tok,
            tmp_path / mixed_precision,
            parallel=ParallelConfig(mixed_precision=mixed_precision),
        )
        losses = [trainer.train_step()["loss/sft"] for _ in range(steps)]
    return losses, model, probe.seen


def test_fp32_sft_is_bit_identical_to_the_code_without_precision(tiny_model_dir, tmp_path, monkeypatch):
    """`mixed_precision: fp32` enters no autocast: two steps equal, bit for bit, those of a run
    whose `set_precision` is a no-op (the trainers before `textgym.training.precision`)."""
    losses, model, seen = _sft_losses(tiny_model_dir, tmp_path, "fp32")
    assert seen == {(torch.float32, False)}

    @contextlib.contextmanager
    def no_precision():
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("textgym.training.placement.set_precision", lambda *a, **k: None)
            yield

    losses0, model0, seen0 = _sft_losses(tiny_model_dir, tmp_path / "none", "bf16", patch=no_precision())
    assert seen0 == {(torch.float32, False)}  # nothing recorded: no autocast even for "bf16"
    assert losses == losses0
    for (k, a), b in zip(model.state_dict().items(), model0.state_dict().values(), strict=True):
        assert torch.equal(a, b), k


def test_a_bf16_sft_step_is_close_to_the_fp32_one(tiny_model_dir, tmp_path):
    """The first step's loss (same batch, same start weights). Measured: |Δ| / loss from 2.2e-5
    (default kernels) to 6e-5 (avx2, avx512), loss ≈ 6.905."""
    (l32,), _, _ = _sft_losses(tiny_model_dir, tmp_path, "fp32", steps=1)
    (l16,), model, seen = _sft_losses(tiny_model_dir, tmp_path, "bf16", steps=1)
    rel = abs(l16 - l32) / l32
    print(f"MEASURE sft l32={l32:.6g} l16={l16:.6g} rel={rel:.3g}")
    assert seen == {(torch.bfloat16, True)}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert 0 < rel < 1e-3


# --- sampler vs trainer: the mismatch metrics -------------------------------------------------
def _mismatch(model_dir, tmp_path, mixed_precision, sampler_fp32=False):
    """`mismatch/*` of one GRPO step with monitoring-only TIS on the transformers backend."""
    seed_everything(0)
    model, tok = load_model(model_dir)
    cfg = grpo_cfg(rollout={"tis": True}, kl_coef=0.0)
    parallel = ParallelConfig(mixed_precision=mixed_precision)
    trainer = GRPOTrainer(cfg, model, tok, tmp_path / f"{mixed_precision}{sampler_fp32}", parallel=parallel)
    with pytest.MonkeyPatch.context() as mp:
        if sampler_fp32:  # the rollouts in fp32 while the trainer computes π_old in bf16
            mp.setattr("textgym.trainers.rl.on_policy.compute_autocast", lambda m: contextlib.nullcontext())
        return trainer.train_step()


def test_sampling_under_the_trainers_precision_keeps_the_mismatch_small(tiny_model_dir, tmp_path):
    """KL(π_rollout ‖ π_old) per token (`mismatch/k3`): fp32 sampler and trainer agree to
    rounding; bf16 adds the KV-cached decode's rounding vs the padded forward's; a sampler in
    fp32 under a bf16 trainer adds the whole fp32-vs-bf16 gap. Measured (tiny model, 8 samples
    of 8 tokens): fp32 ≤ 7.1e-14; bf16 5.4e-7 (avx512), 3.2e-7 (avx2), 1.4e-14 (default kernels,
    whose bf16 matmuls round alike at every shape); fp32 sampler under bf16 1.73e-6 to 1.75e-6.
    With the inverse-CDF sampler's draws (other tokens): bf16 5.7e-7 vs 1.0e-6 (avx512), so
    how much of the gap goes depends on the tokens drawn; that some goes is asserted."""
    k32 = _mismatch(tiny_model_dir, tmp_path, "fp32")["mismatch/k3"]
    k16 = _mismatch(tiny_model_dir, tmp_path, "bf16")["mismatch/k3"]
    kx = _mismatch(tiny_model_dir, tmp_path, "bf16", sampler_fp32=True)["mismatch/k3"]
    print(f"MEASURE mismatch k32={k32:.3g} k16={k16:.3g} kx={kx:.3g}")
    assert k32 < 1e-9
    assert kx > 1e-7  # the gap a sampler outside the trainer's precision adds
    assert k16 < kx  # sampling under the same autocast removes part (40 % to all) of it


# --- PPO's critic and the reward-model trainer ------------------------------------------------
def test_the_critic_computes_in_bf16_and_returns_fp32_values(tiny_model_dir):
    from test_grpo import _batch_and_advantages

    from textgym.trainers.rl.critic import build_critic, sequence_values

    model, tok = load_model(tiny_model_dir)
    batch, _ = _batch_and_advantages(model, tok, n_tasks=1, group=4)
    critic = build_critic(model)
    torch.nn.init.normal_(critic.score.weight, std=0.1)  # the zero-initialised head gives all-0 values
    with torch.no_grad():
        v32 = sequence_values(critic, batch)
        set_precision(critic, "bf16", "cpu")
        probe = DtypeProbe(critic)
        v16 = sequence_values(critic, batch)
    print(f"MEASURE critic max|dv|={float((v16 - v32).abs().max()):.3g} max|v|={float(v32.abs().max()):.3g}")
    assert probe.seen == {(torch.bfloat16, True)}
    assert v16.dtype == torch.float32 and v16.shape == v32.shape
    assert not torch.equal(v16, v32)
    # measured: max |Δv| = 0.0139 with max |v| = 2.61 (0.5 %), the same under every kernel set
    torch.testing.assert_close(v16, v32, rtol=0, atol=0.05 * float(v32.abs().max()))


def test_a_bf16_reward_model_step(tiny_model_dir, tmp_path):
    from test_reward_model import _synthetic_pairs

    from textgym.config import OptimConfig, RewardModelConfig
    from textgym.trainers.reward.bradley_terry import RewardModelTrainer

    cfg = RewardModelConfig(epochs=1, batch_size=8, eval_fraction=0.25, optim=OptimConfig(lr=1e-3))
    trainer = RewardModelTrainer(
        _synthetic_pairs(16),
        tiny_model_dir,
        tmp_path / "rm",
        cfg,
        parallel=ParallelConfig(mixed_precision="bf16"),
    )
    probe = DtypeProbe(trainer.net)
    metrics = trainer.train_step()
    assert all(math.isfinite(v) for v in metrics.values())
    assert probe.seen == {(torch.bfloat16, True)}
    assert {p.dtype for p in trainer.net.parameters()} == {torch.float32}
    state = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {v.dtype for v in state} == {torch.float32}


# --- the vLLM engine's dtype -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("mixed_precision", "dtype", "expected"),
    [
        ("bf16", "auto", "bfloat16"),
        ("fp32", "auto", None),  # `for_policy` then takes the parameters' dtype (float32)
        ("bf16", "float32", "float32"),  # an explicit dtype wins
    ],
)
def test_the_vllm_engine_dtype_follows_bf16_compute(monkeypatch, mixed_precision, dtype, expected):
    from textgym.agents.vllm_backend import VLLMBackend
    from textgym.training.sources.vllm_engine import build_engine

    got = {}
    monkeypatch.setattr(VLLMBackend, "for_policy", classmethod(lambda cls, *a, **kw: got.update(kw)))
    policy = torch.nn.Linear(2, 2)
    set_precision(policy, mixed_precision, "cpu")
    cfg = grpo_cfg(rollout={"backend": "vllm", "vllm": {"dtype": dtype}})
    build_engine(cfg, policy, None, [0], seed=0)
    assert got.get("dtype") == expected


# --- model.dtype: bf16 storage ------------------------------------------------------------------
def test_model_dtype_is_validated():
    base = {"name": "p", "model": {"init_preset": "tiny"}, "sft": {"env": ENV}}
    assert load_config(**base).model.dtype == "float32"
    assert load_config(values={"model.dtype": "bfloat16"}, **base).model.dtype == "bfloat16"
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(values={"model.dtype": "float16"}, **base)


def test_a_grpo_step_on_bf16_weights_keeps_bf16_state(tiny_model_dir, tmp_path):
    """`model.dtype: bfloat16`: weights, gradients and AdamW state all bf16 (no fp32 master)."""
    seed_everything(0)
    model, tok = load_model(tiny_model_dir, dtype=torch.bfloat16)
    probe = DtypeProbe(model)
    trainer = GRPOTrainer(grpo_cfg(), model, tok, tmp_path, parallel=ParallelConfig(mixed_precision="fp32"))
    metrics = trainer.train_step()
    assert math.isfinite(metrics["loss/total"])
    assert probe.seen == {(torch.bfloat16, False)}  # bf16 weights compute in bf16 without autocast
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    state = [v for s in trainer.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert state and {v.dtype for v in state} == {torch.bfloat16}


def test_the_pipeline_loads_each_stage_in_model_dtype(tmp_path):
    from safetensors.torch import load_file

    from textgym.pipeline import run

    cfg = load_config(
        name="bf16",
        out_dir=str(tmp_path),
        device="cpu",
        log_with=[],
        model={"init_preset": "tiny", "dtype": "bfloat16"},
        sft={"env": ENV, "steps": 1, "batch_size": 4, "checkpoint_every": 0},
    )
    run(cfg, echo=lambda line: None)
    weights = load_file(tmp_path / "bf16" / "sft" / "final" / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.bfloat16}
