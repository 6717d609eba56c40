"""LoRA through peft: adapters only train, the reference is the base with adapters off, merged weights."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.agents.weight_sync import is_lora, merged_state_dict
from textgym.config import GRPOConfig, LoraSettings, PPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.trainers.rl.ppo import PPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.checkpoint import latest_checkpoint
from textgym.training.logprobs import sequence_logprobs
from textgym.training.lora import apply_lora, reference_of
from textgym.training.seeding import seed_everything

SAMPLING = {"temperature": 1.0, "max_new_tokens": 8}
LORA = {"r": 4, "alpha": 8}


def _batch(model, tok):
    """A 8-row batch of the model's own sampled rollouts (2 tasks x 4 samples)."""
    import gymnasium as gym

    from textgym.agents import LLMAgent, SamplingParams
    from textgym.agents.rollout import rollout

    torch.manual_seed(3)
    envs = [gym.make(ENV["id"], **ENV["kwargs"]) for _ in range(8)]
    trajs = rollout(LLMAgent(model, tok), envs, [0, 1], SamplingParams(max_new_tokens=8), group_size=4)
    return RolloutBatch.from_trajectories(trajs, tok.pad_token_id)


def _perturb_adapters(model, seed=0):
    """Give every lora_B a random value, so the adapters change the function (B starts at 0)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)


def test_adapters_start_at_the_base_model_and_only_they_train(warm_model_dir):
    base, tok = load_model(warm_model_dir)
    batch = _batch(base, tok)
    with torch.no_grad():
        ref = sequence_logprobs(base, batch)[0]
    n_base = sum(p.numel() for p in base.parameters())
    policy = apply_lora(copy.deepcopy(base), LoraSettings(**LORA))
    assert is_lora(policy)
    trainable = {n for n, p in policy.named_parameters() if p.requires_grad}
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    n_train = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    assert n_train < 0.2 * n_base
    with torch.no_grad():
        torch.testing.assert_close(sequence_logprobs(policy, batch)[0], ref, rtol=0, atol=0)
        _perturb_adapters(policy)
        moved = sequence_logprobs(policy, batch)[0]
        assert (moved - ref).abs().max() > 1e-3
        with reference_of(policy) as r:
            torch.testing.assert_close(sequence_logprobs(r, batch)[0], ref, rtol=0, atol=0)
    with pytest.raises(TypeError, match="LoRA policy"):
        merged_state_dict(base)


def test_merged_weights_equal_peft_merge_and_give_the_same_function(warm_model_dir, tmp_path):
    from textgym.training.lora import save_merged

    base, tok = load_model(warm_model_dir)
    policy = apply_lora(base, LoraSettings(**LORA))
    _perturb_adapters(policy, seed=1)
    batch = _batch(policy, tok)
    merged = merged_state_dict(policy)
    # peft's own merge, on a copy, is the oracle for the names and the values.
    theirs = copy.deepcopy(policy).merge_and_unload().state_dict()
    assert set(merged) == set(theirs)
    for k, v in theirs.items():
        torch.testing.assert_close(merged[k], v, rtol=0, atol=1e-6, msg=k)
    save_merged(policy, tok, tmp_path / "merged")
    plain, _ = load_model(tmp_path / "merged")
    assert not is_lora(plain)
    with torch.no_grad():
        torch.testing.assert_close(
            sequence_logprobs(plain, batch)[0], sequence_logprobs(policy, batch)[0], rtol=0, atol=1e-5
        )


def grpo_cfg(**over):
    base = {"env": ENV, "steps": 2, "prompts_per_step": 4, "group_size": 4, "sampling": SAMPLING,
            "optim": {"lr": 5e-3}, "lora": LORA, "kl_coef": 0.1, "kl_estimator": "k3"}  # fmt: skip
    base.update(over)
    return GRPOConfig.model_validate(base)


@pytest.mark.learning
def test_lora_grpo_trains_adapters_only_with_the_base_as_reference(warm_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    base_before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = GRPOTrainer(grpo_cfg(checkpoint_every=1), model, tok, tmp_path)
    assert trainer.reference is None  # no copy: the reference is the policy with adapters off
    batch = _batch(model, tok)
    fresh, _ = load_model(warm_model_dir)
    with torch.no_grad():
        want = sequence_logprobs(fresh, batch)[0]
    trainer.train()
    # The base weights never moved; the adapters did, so the policy differs from the reference.
    for k, v in trainer.policy.get_base_model().state_dict().items():
        if ".lora_" not in k:
            torch.testing.assert_close(v, base_before[k.replace(".base_layer.", ".")], rtol=0, atol=0, msg=k)
    got_ref = trainer.updater.reference_logprobs(batch)
    torch.testing.assert_close(got_ref, want, rtol=0, atol=1e-6)
    with torch.no_grad():
        assert (sequence_logprobs(trainer.policy, batch)[0] - want).abs().max() > 1e-3
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(rows) == 2 and all(r["kl/rollout_k3"] >= 0 for r in rows)
    assert rows[1]["kl/rollout_k3"] > 0  # after one update the policy is no longer the reference
    # Checkpoints hold the adapter; final/ is the merged model, final_adapter/ the adapter.
    ckpt = latest_checkpoint(tmp_path)
    assert (ckpt / "adapter_model.safetensors").is_file() and not (ckpt / "model.safetensors").is_file()
    assert (tmp_path / "final_adapter" / "adapter_config.json").is_file()
    merged, _ = load_model(tmp_path / "final")
    with torch.no_grad():
        torch.testing.assert_close(
            sequence_logprobs(merged, batch)[0],
            sequence_logprobs(trainer.policy, batch)[0],
            rtol=0,
            atol=1e-5,
        )


def test_lora_grpo_resume_restores_the_adapters(warm_model_dir, tmp_path):
    # Partial credit (digit match) gives the steps reward variance whatever the draws, so the
    # adapters move (with 0/1 rewards some seeds draw all-equal groups: no gradient at all).
    env = {**ENV, "kwargs": {**ENV["kwargs"], "digit_match_weight": 1.0}}

    def fresh(steps, resume=False):
        seed_everything(0)
        model, tok = load_model(warm_model_dir)
        return GRPOTrainer(
            grpo_cfg(steps=steps, checkpoint_every=1, env=env), model, tok, tmp_path / "b", resume=resume
        )

    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    straight = GRPOTrainer(grpo_cfg(steps=2, checkpoint_every=1, env=env), model, tok, tmp_path / "a")
    straight.train()
    fresh(1).train()
    resumed = fresh(2, resume=True)
    assert resumed.step == 1
    resumed.train()
    a = dict(straight.policy.named_parameters())
    b = dict(resumed.policy.named_parameters())
    for k, v in a.items():
        torch.testing.assert_close(v, b[k], rtol=0, atol=1e-6, msg=k)
    assert any((v - 0).abs().max() > 0 for k, v in a.items() if "lora_B" in k)


def test_lora_ppo_builds_its_critic_from_the_base_and_trains(warm_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    backbone = {k: v.clone() for k, v in model.model.state_dict().items()}
    cfg = PPOConfig.model_validate(
        {"env": ENV, "steps": 1, "prompts_per_step": 4, "group_size": 2, "sampling": SAMPLING,
         "optim": {"lr": 1e-3}, "critic": {"optim": {"lr": 1e-3}}, "lora": LORA, "kl_coef": 0.05}
    )  # fmt: skip
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    for k, v in trainer.critic.model.base_model.state_dict().items():
        torch.testing.assert_close(v, backbone[k], rtol=0, atol=0, msg=k)
    trainer.train()
    assert (tmp_path / "final" / "model.safetensors").is_file()


def test_reference_placement_is_validated_and_used(warm_model_dir, tmp_path):
    with pytest.raises(ValueError, match="with LoRA the reference is the policy"):
        grpo_cfg(reference_device="cpu")
    with pytest.raises(ValueError, match="is not a torch device"):
        grpo_cfg(lora=None, reference_device="gpu7")
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    batch = _batch(model, tok)
    trainer = GRPOTrainer(grpo_cfg(lora=None, reference_device="cpu", steps=1), model, tok, tmp_path)
    assert trainer.reference is not None and trainer.reference is not trainer.policy
    assert {p.device.type for p in trainer.reference.parameters()} == {"cpu"}
    fresh, _ = load_model(warm_model_dir)
    trainer.train()
    with torch.no_grad():
        want = sequence_logprobs(fresh, batch)[0]
    # After a step the policy moved; the placed reference still computes the start model.
    torch.testing.assert_close(trainer.updater.reference_logprobs(batch), want, rtol=0, atol=1e-6)
    assert (sequence_logprobs(trainer.policy, batch)[0] - want).abs().max() > 1e-3


@pytest.mark.learning
def test_lora_sft_trains_adapters_and_resumes_to_the_same_weights(tiny_model_dir, tmp_path):
    """SFT with adapters: the loss falls while the base stays put; `final/` (merged, what the next
    stage loads) computes what the adapted model computes; a run stopped at its step-3
    checkpoint and resumed ends where the uninterrupted run does."""
    from safetensors.torch import load_file

    from textgym.config import SFTConfig
    from textgym.trainers.sft import SFTTrainer

    cfg = {"env": ENV, "steps": 6, "batch_size": 8, "micro_batch_size": 4, "log_every": 1,
           "optim": {"lr": 1e-2}, "lora": LORA, "checkpoint_every": 3}  # fmt: skip

    def run(stage, steps, resume=False):
        seed_everything(0)
        model, tok = load_model(tiny_model_dir)
        trainer = SFTTrainer(
            SFTConfig.model_validate({**cfg, "steps": steps}), model, tok, stage, resume=resume
        )
        return trainer, trainer.train()

    base = load_file(str(tiny_model_dir / "model.safetensors"))
    trainer, final = run(tmp_path / "full", 6)
    assert is_lora(trainer.model)
    rows = [json.loads(x) for x in (tmp_path / "full" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss/sft"] < 0.85 * rows[0]["loss/sft"]  # 6.9 -> 5.6 nats/token
    for k, v in trainer.model.get_base_model().state_dict().items():
        name = k.replace(".base_layer.", ".")
        if ".lora_" not in k and name in base:  # (the tied lm_head is not in the file)
            torch.testing.assert_close(v, base[name], rtol=0, atol=0, msg=k)
    assert (tmp_path / "full" / "final_adapter" / "adapter_config.json").is_file()
    plain, tok = load_model(final)
    batch = _batch(plain, tok)
    with torch.no_grad():
        torch.testing.assert_close(
            sequence_logprobs(plain, batch)[0], sequence_logprobs(trainer.model, batch)[0], rtol=0, atol=1e-5
        )
    run(tmp_path / "cut", 3)  # stops after its step-3 checkpoint
    assert latest_checkpoint(tmp_path / "cut").name == "step_3"
    _, resumed = run(tmp_path / "cut", 6, resume=True)
    want, got = load_file(str(final / "model.safetensors")), load_file(str(resumed / "model.safetensors"))
    for k, v in want.items():
        torch.testing.assert_close(got[k], v, rtol=0, atol=1e-6, msg=k)
