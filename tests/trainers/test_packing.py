"""Padding-free packing and token-budget micro-batches: the same gradients as padded batches,
for the RL update, SFT and the DPO family."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from conftest import WARM_ENV

from textgym.agents.trajectory import Trajectory
from textgym.config import ConfigError, GRPOConfig, PreferenceConfig, SFTConfig
from textgym.models import load_model
from textgym.offline import PAIR_SCHEMA
from textgym.trainers.preference.offline import PreferenceTrainer
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.trainers.sft import SFTTrainer
from textgym.training.batch import (
    RolloutBatch,
    group_token_budget_micro_batches,
    no_token_budget_under_torchrun,
    token_budget_micro_batches,
)
from textgym.training.logprobs import sequence_logprobs

# (micro_batch_size, micro_batch_tokens, packing) against the whole batch in one padded pass
LAYOUTS = [(None, 40, True), (None, 40, False), (None, 10**6, True)]


def _grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def test_token_budget_micro_batches_cut_sorted_lengths_under_the_budget():
    prompt = [4, 4, 4, 4, 4, 4]
    response = [2, 10, 3, 9, 30, 1]
    rows = list(range(6))
    packed = token_budget_micro_batches(prompt, response, rows, 20, packed=True)
    assert sorted(i for m in packed for i in m) == rows
    assert packed[0] == [4]  # 34 tokens: over the budget by itself, alone
    for m in packed[1:]:
        assert sum(prompt[i] + response[i] for i in m) <= 20
    assert packed == [[4], [1], [3, 2], [0, 5]]  # longest first, greedy: 14 | 13 + 7 | 6 + 5
    padded = token_budget_micro_batches(prompt, response, rows, 30, packed=False)
    assert padded == [[4], [1, 3], [2, 0, 5]]  # 2 × 14 = 28; 3 × 7 = 21 tokens with padding
    with pytest.raises(ValueError, match="max_tokens"):
        token_budget_micro_batches(prompt, response, rows, 0, packed=True)


def test_group_token_budget_micro_batches_keep_groups_whole_and_count_a_prompt_once():
    # three groups of 3 rows: prompts 10, 10, 40; responses short, short, long
    prompt = [10] * 3 + [10] * 3 + [40] * 3
    response = [2, 3, 4, 1, 1, 2, 30, 20, 25]
    groups = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    rows = [8, 0, 4, 1, 2, 3, 5, 6, 7]  # a shuffled minibatch
    # group costs: 10 + 9 = 19, 10 + 4 = 14, 40 + 75 = 115 (over 60: cut into runs of its rows)
    cut = group_token_budget_micro_batches(prompt, response, groups, rows, 60)
    assert cut == [[0, 1, 2, 3, 4, 5], [6], [7], [8]]  # 19 + 14 = 33; then 70, 60, 65: each alone
    assert sorted(i for m in cut for i in m) == sorted(rows)
    assert group_token_budget_micro_batches(prompt, response, groups, rows, 10**6) == [sorted(rows)]
    # fewer tokens per answer: more groups per micro-batch, at the same budget
    short = group_token_budget_micro_batches(prompt, [1] * 9, groups, rows, 60)
    assert short == [[0, 1, 2, 3, 4, 5], [6, 7, 8]]  # 13 + 13 | 43
    with pytest.raises(ValueError, match="max_tokens"):
        group_token_budget_micro_batches(prompt, response, groups, rows, 0)


def test_token_budget_is_refused_under_torchrun_and_with_micro_batch_size():
    no_token_budget_under_torchrun(None, 4)
    no_token_budget_under_torchrun(64, 1)
    with pytest.raises(ConfigError, match="micro_batch_tokens=64 runs in one process only"):
        no_token_budget_under_torchrun(64, 2)
    with pytest.raises(ValueError, match="micro_batch_size or micro_batch_tokens, not both"):
        SFTConfig.model_validate({"env": WARM_ENV, "micro_batch_size": 2, "micro_batch_tokens": 64})


def _rollout_batch(model, n=8, seed=0) -> RolloutBatch:
    """`n` rows in groups of 4 with ragged prompts and responses; π_old = the model's own log-probs."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        prompt = torch.randint(10, 200, (3 + (i // 4) * 3,), generator=torch.Generator().manual_seed(i // 4))
        response = torch.randint(10, 200, (2 + (7 * i) % 9,), generator=g)
        ids = torch.cat([prompt, response])
        mask = torch.cat([torch.zeros(len(prompt)), torch.ones(len(response))])
        trajs.append(
            Trajectory(
                ids, mask, torch.zeros(len(ids)), torch.zeros(len(ids)), len(prompt), [], 0.0, group=i // 4
            )
        )
    batch = RolloutBatch.from_trajectories(trajs, pad_id=0)
    with torch.no_grad():
        batch.old_logprobs = sequence_logprobs(model.eval(), batch)[0] * batch.loss_mask
    return batch


# RL rows come in groups: a token budget cuts whole groups (40: one group each), or, under a
# group's own cost, runs of its rows (20)
@pytest.mark.parametrize(("micro", "tokens", "packing"), [*LAYOUTS, (None, 20, False)])
def test_rl_update_gradient_is_the_padded_one(tiny_model_dir, tmp_path, micro, tokens, packing):
    """GRPO's update (clipped surrogate, k3 KL to the reference in the loss) on one minibatch:
    packed and/or token-budget micro-batches give the padded whole-batch gradient (rel 1e-6)."""
    grads = []
    for layout in [(None, None, False), (micro, tokens, packing)]:
        model, tok = load_model(tiny_model_dir)
        batch = _rollout_batch(model)
        cfg = GRPOConfig.model_validate(
            {"env": WARM_ENV, "prompts_per_step": 2, "group_size": 4, "kl_coef": 0.05,
             "micro_batch_size": layout[0], "micro_batch_tokens": layout[1], "packing": layout[2],
             "optim": {"lr": 1e-3, "max_grad_norm": None}}
        )  # fmt: skip
        trainer = GRPOTrainer(cfg, model, tok, tmp_path / f"{layout}")
        with torch.no_grad():  # the policy moves off the reference, so the KL term has a gradient
            for p in model.parameters():
                p.add_(1e-2 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        adv = torch.tensor([1.0, -1.0, 0.5, -0.5, 0.2, -0.2, 1.5, -1.5])
        stats = trainer.update(batch, adv)
        grads.append(_grad(model))
        assert stats["kl/ref"] > 0
    assert grads[0].abs().max() > 0
    assert _rel(grads[1], grads[0]) < 1e-6


@pytest.mark.parametrize(("micro", "tokens", "packing"), LAYOUTS)
def test_sft_gradient_is_the_padded_one(tiny_model_dir, tmp_path, micro, tokens, packing):
    grads = []
    for layout in [(None, None, False), (micro, tokens, packing)]:
        model, tok = load_model(tiny_model_dir)
        cfg = SFTConfig.model_validate(
            {"env": {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+-", "digits": 3}},
             "steps": 1, "batch_size": 8, "micro_batch_size": layout[0], "micro_batch_tokens": layout[1],
             "packing": layout[2], "optim": {"lr": 1e-3, "max_grad_norm": None}}
        )  # fmt: skip
        trainer = SFTTrainer(cfg, model, tok, tmp_path / f"{layout}", seed=0)
        trainer.train_step()
        grads.append(_grad(model))
    assert _rel(grads[1], grads[0]) < 1e-6


def _pairs(tok, n=8, seed=0) -> pa.Table:
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(10, 200)

    def some(k):
        return [*ids[torch.randint(len(ids), (k,), generator=g)].tolist(), tok.eos_token_id]

    rows = []
    for i in range(n):
        chosen, rejected = some(2 + (5 * i) % 11), some(3 + (3 * i) % 7)
        rows.append(
            {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": some(3 + i % 4)[:-1], "chosen_ids": chosen,
             "chosen_mask": [1] * len(chosen), "rejected_ids": rejected, "rejected_mask": [1] * len(rejected),
             "chosen_reward": 1.0, "rejected_reward": 0.0}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)


@pytest.mark.parametrize(("micro", "tokens", "packing"), LAYOUTS)
def test_dpo_gradient_is_the_padded_one(tiny_model_dir, tmp_path, micro, tokens, packing):
    grads = []
    for layout in [(None, None, False), (micro, tokens, packing)]:
        model, tok = load_model(tiny_model_dir)
        cfg = PreferenceConfig.model_validate(
            {"env": WARM_ENV, "loss": "dpo", "batch_size": 8, "micro_batch_size": layout[0],
             "micro_batch_tokens": layout[1], "packing": layout[2],
             "optim": {"lr": 1e-3, "max_grad_norm": None}}
        )  # fmt: skip
        trainer = PreferenceTrainer(cfg, model, tok, tmp_path / f"{layout}", _pairs(tok))
        with torch.no_grad():  # off the reference: the sigmoid's slope differs by pair
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        trainer.train_step()
        grads.append(_grad(model))
    assert grads[0].abs().max() > 0
    assert _rel(grads[1], grads[0]) < 1e-6
