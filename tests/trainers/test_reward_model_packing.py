"""The reward model's packed forwards and token-budget micro-batches: the padded whole batch's
gradient and held-out accuracy; the chunked NLL regulariser equals the full-logits cross-entropy."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from textgym import distributed
from textgym.config import ConfigError, OptimConfig, RewardModelConfig
from textgym.offline import PAIR_SCHEMA
from textgym.trainers.reward.bradley_terry import RewardModelTrainer
from textgym.trainers.reward.bradley_terry_forward import (
    RewardNet,
    nll_targets,
    pack_sequences,
    packed_nll_targets,
)
from textgym.verifiers.reward_model import pad_rows

# (micro_batch_size, micro_batch_tokens, packing) against the whole batch in one padded pass
LAYOUTS = [(None, 40, True), (None, 40, False), (None, 10**6, True), (3, None, True)]


def _pairs(n: int = 16, seed: int = 0) -> pa.Table:
    """Pairs of ragged prompts and responses; some chosen tokens outside the loss mask."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = [rng.randrange(5, 200) for _ in range(rng.randint(2, 8))]
        chosen = [rng.randrange(30, 60) for _ in range(rng.randint(1, 9))] + [40, 2]
        rejected = [rng.randrange(30, 60) for _ in range(rng.randint(1, 9))] + [41, 2]
        mask = [0 if j == 1 and len(chosen) > 3 else 1 for j in range(len(chosen))]
        rows.append(
            {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": prompt, "chosen_ids": chosen,
             "chosen_mask": mask, "rejected_ids": rejected, "rejected_mask": [1] * len(rejected),
             "chosen_reward": 1.0, "rejected_reward": 0.0}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)


def _grad(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def _trainer(model_dir, out, micro, tokens, packing) -> RewardModelTrainer:
    cfg = RewardModelConfig(
        batch_size=12,
        eval_fraction=0.25,
        micro_batch_size=micro,
        micro_batch_tokens=tokens,
        packing=packing,
        lm_coef=0.5,
        optim=OptimConfig(lr=1e-3, max_grad_norm=None),
    )
    return RewardModelTrainer(_pairs(), model_dir, out, cfg, device="cpu", log_with=())


@pytest.mark.parametrize(("micro", "tokens", "packing"), LAYOUTS)
def test_rm_step_gradient_is_the_padded_one(tiny_model_dir, tmp_path, micro, tokens, packing):
    """Bradley–Terry + α·NLL on one step: packed and/or token-budget micro-batches give the padded
    whole-batch gradient (rel 1e-6), the same metrics, and the same held-out verdicts."""
    grads, metrics, accuracy, rewards = [], [], [], []
    for layout in [(None, None, False), (micro, tokens, packing)]:
        trainer = _trainer(tiny_model_dir, tmp_path / f"{layout}", *layout)
        if layout[1] is not None and layout[1] < 100:
            assert len(trainer._micro_batches(trainer.train_idx[:12], 12)) > 2  # several micro-batches
        with torch.no_grad():
            rewards.append(torch.cat(trainer._forward(trainer.test_idx, with_nll=False)[:2]))
        accuracy.append(trainer.heldout_accuracy())
        metrics.append(trainer.train_step())
        grads.append(_grad(trainer.net))
    assert grads[0].abs().max() > 0 and metrics[0]["loss/lm"] > 0
    assert _rel(grads[1], grads[0]) < 1e-6
    for key in ("loss/rm", "loss/bt", "loss/lm", "rewards/accuracy", "rewards/margin"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-6, abs=1e-7)
    assert torch.allclose(rewards[1], rewards[0], rtol=1e-5, atol=1e-5)
    assert accuracy[1] == accuracy[0]


@pytest.mark.parametrize("tied", [True, False])
def test_chunked_nll_equals_the_full_logits_cross_entropy(tiny_model_dir, tied):
    """The regulariser through `head_logprobs` in several chunks of 3 tokens: the value and the
    gradients of the full [k, T, V] logits' cross-entropy (the former implementation) to 1e-5,
    padded and packed."""
    torch.manual_seed(0)
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1)
    V, H = rm.model.embed_tokens.weight.shape
    head = rm.model.embed_tokens.weight if tied else torch.randn(V, H) * 0.05
    net = RewardNet(rm, head)
    net.chunk_elements = 3 * V  # 3 tokens per chunk: 12 target tokens make 4 chunks
    rows = [[5, 6, 7, 30, 31, 2], [8, 9, 30, 32, 33, 34, 2], [11, 12, 13, 14, 35, 2]]
    starts, masks = [3, 2, 4], [[1, 1, 1], [1, 0, 1, 1, 1], [1, 1]]
    ids, attention = pad_rows(rows, 0)
    targets = nll_targets(rows[:2] + rows[2:], starts, masks, ids.shape[1])
    assert int((targets != -100).sum()) == 9

    def grads() -> torch.Tensor:
        g = torch.cat([p.grad.flatten() for p in net.parameters() if p.grad is not None])
        net.zero_grad(set_to_none=True)
        return g

    _, ours = net(ids, attention, targets)
    assert ours is not None
    ours.backward()
    g_ours = grads()
    hidden = net.model(input_ids=ids, attention_mask=attention).last_hidden_state
    w = net.model.embed_tokens.weight if net.lm_head is None else net.lm_head.weight
    logits = (hidden @ w.T).float()
    ref = torch.nn.functional.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="sum")
    ref.backward()
    g_ref = grads()
    assert float(ours.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert _rel(g_ours, g_ref) < 1e-5
    # packed: the same rows in one padding-free row, the NLL of the same tokens
    packed, positions, last = pack_sequences(rows)
    _, nll = net(packed, None, packed_nll_targets(rows, starts, masks, packed.shape[1]), positions, last)
    assert nll is not None
    nll.backward()
    assert float(nll.detach()) == pytest.approx(float(ref.detach()), rel=1e-5)
    assert _rel(grads(), g_ref) < 1e-5


def test_pack_sequences_layout_and_forward_argument_checks(tiny_model_dir):
    ids, positions, last = pack_sequences([[7, 8, 9], [4], [5, 6]])
    assert ids.tolist() == [[7, 8, 9, 4, 5, 6]]
    assert positions.tolist() == [[0, 1, 2, 0, 0, 1]]
    assert last.tolist() == [2, 3, 5]
    targets = packed_nll_targets([[7, 8, 9], [4, 5]], [1, 1], [[1, 1], [1]], 6)
    assert targets.tolist() == [[8, 9, -100, 5, -100, -100]]
    with pytest.raises(ValueError, match="empty"):
        pack_sequences([[1], []])
    net = RewardNet(AutoModelForSequenceClassification.from_pretrained(tiny_model_dir, num_labels=1))
    with pytest.raises(ValueError, match="padded"):
        net(ids, None, None, positions)


def test_rm_config_batching_validation(tiny_model_dir, tmp_path, monkeypatch):
    cfg = RewardModelConfig(micro_batch_tokens=256, packing=True)
    assert cfg.micro_batch_tokens == 256 and cfg.packing and not RewardModelConfig().packing
    with pytest.raises(ValueError, match="micro_batch_size or micro_batch_tokens, not both"):
        RewardModelConfig(micro_batch_size=2, micro_batch_tokens=64)
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        RewardModelConfig(micro_batch_tokens=0)
    monkeypatch.setattr(distributed, "world", lambda: distributed.World(size=2, backend="gloo"))
    with pytest.raises(ConfigError, match="micro_batch_tokens=64 runs in one process only"):
        RewardModelTrainer(
            _pairs(), tiny_model_dir, tmp_path, RewardModelConfig(micro_batch_tokens=64), device="cpu"
        )
