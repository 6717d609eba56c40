"""The reward-model trainer in one process: a learnable preference, scoring in an env, the LM regulariser."""

from __future__ import annotations

import pyarrow as pa
import pytest
import torch
from conftest import WARM_ENV

import textgym  # noqa: F401


def _synthetic_pairs(n: int = 96) -> pa.Table:
    """Pairs whose chosen response ends in token 40 and rejected in token 41 before EOS (learnable)."""
    rows = []
    for i in range(n):
        prompt = [5 + (i % 23), 6 + (i % 7), 9]
        rows.append(
            {
                "env_id": "e",
                "task_id": f"t/{i}",
                "prompt_ids": prompt,
                "chosen_ids": [30 + i % 5, 40, 2],
                "chosen_mask": [1, 1, 1],
                "rejected_ids": [30 + i % 5, 41, 2],
                "rejected_mask": [1, 1, 1],
                "chosen_reward": 1.0,
                "rejected_reward": 0.0,
            }
        )
    from textgym.offline import PAIR_SCHEMA

    return pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)


@pytest.mark.learning
def test_reward_model_learns_a_separable_preference_and_scores_in_an_env(tiny_model_dir, tmp_path):
    from textgym.config import EnvConfig, OptimConfig, RewardModelConfig, validate_runtime
    from textgym.trainers.reward.bradley_terry import train_reward_model
    from textgym.training.envs import make_env
    from textgym.types import Task
    from textgym.verifiers.reward_model import RewardModelVerifier

    cfg = RewardModelConfig(epochs=3, batch_size=16, eval_fraction=0.25, optim=OptimConfig(lr=1e-3))
    res = train_reward_model(_synthetic_pairs(), tiny_model_dir, tmp_path / "rm", cfg)
    assert res["heldout_pairs"] > 0 and res["heldout_accuracy"] >= 0.95
    assert res["train_loss"] < 0.3
    rm = RewardModelVerifier(tmp_path / "rm")
    s = rm("4", Task("t", "2+2="))
    assert isinstance(s.reward, float) and s.details["reward_model"] == s.reward
    # In an env: the reward is the model's score, the env's own terms stay as the true measure.
    env = make_env(EnvConfig.model_validate({**WARM_ENV, "reward_model": str(tmp_path / "rm")}))
    messages, _ = env.reset(options={"task_index": 0})
    answer = env.unwrapped.task.solution
    _, reward, terminated, _, info = env.step(answer)
    expected = rm.score_messages([[*messages, {"role": "assistant", "content": answer}]])[0]
    assert terminated and abs(float(reward) - expected) < 1e-5 and info["reward/rm"] == float(reward)
    assert info["reward/correct"] == 1.0
    with pytest.raises(ValueError, match=r"has no config\.json"):
        validate_runtime(EnvConfig.model_validate({**WARM_ENV, "reward_model": str(tmp_path / "missing")}))


def chosen_nll(rm, head, rows, starts, masks) -> float:
    """Token-mean NLL of the response tokens under the reward model's regulariser (`RewardNet`)."""
    from textgym.trainers.reward.bradley_terry import _pad
    from textgym.trainers.reward.bradley_terry_forward import RewardNet, nll_targets

    ids, attention = _pad(rows, 0)
    targets = nll_targets(rows, starts, masks, ids.shape[1])
    _, total = RewardNet(rm, head)(ids, attention, targets)
    return float(total / (targets != -100).sum())


@pytest.mark.parametrize("tied", [True, False])
def test_reward_model_lm_regulariser_equals_the_causal_lm_loss(tiny_model_dir, tmp_path, tied):
    """The regulariser's NLL (the trained `RewardNet`'s forward) is the causal LM's own loss on the
    response tokens."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from textgym.trainers.reward.bradley_terry import _output_embeddings

    folder = tiny_model_dir
    if not tied:
        lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
        torch.manual_seed(1)
        lm.lm_head.weight = torch.nn.Parameter(torch.randn_like(lm.lm_head.weight) * 0.05)
        folder = tmp_path / "untied"
        lm.save_pretrained(folder)
        AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    lm = AutoModelForCausalLM.from_pretrained(folder).eval()
    rm = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1).eval()
    head = _output_embeddings(folder, rm)
    rows = [[5, 6, 7, 30, 31, 2], [8, 9, 30, 32, 33, 34, 2]]
    starts = [3, 2]
    masks = [[1, 1, 1], [1, 0, 1, 1, 1]]  # the second row's 2nd response token is not the policy's
    with torch.no_grad():
        ours = chosen_nll(rm, head, rows, starts, masks)
        labels = torch.full((2, 7), -100)
        labels[0, 3:6] = torch.tensor([30, 31, 2])
        labels[1, 2:7] = torch.tensor([30, -100, 33, 34, 2])
        ids = torch.tensor([rows[0] + [0], rows[1]])
        attn = torch.tensor([[1] * 6 + [0], [1] * 7])
        ref = float(lm(input_ids=ids, attention_mask=attn, labels=labels).loss)
    assert abs(ours - ref) < 1e-5


def test_reward_model_lm_regulariser_teaches_the_backbone_the_chosen_responses(tiny_model_dir, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from textgym.config import OptimConfig, RewardModelConfig
    from textgym.trainers.reward.bradley_terry import _output_embeddings, train_reward_model

    pairs = _synthetic_pairs()
    rows = [
        p + c
        for p, c in zip(
            pairs.column("prompt_ids").to_pylist(), pairs.column("chosen_ids").to_pylist(), strict=True
        )
    ]
    starts = [3] * len(rows)
    masks = [[1, 1, 1]] * len(rows)

    def folder_nll(folder):
        rm = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=1).eval()
        with torch.no_grad():
            return chosen_nll(rm, _output_embeddings(folder, rm), rows, starts, masks)

    nll = {}
    for coef in (0.0, 1.0):
        cfg = RewardModelConfig(
            epochs=3, batch_size=16, eval_fraction=0.25, optim=OptimConfig(lr=1e-3), lm_coef=coef
        )
        res = train_reward_model(pairs, tiny_model_dir, tmp_path / f"rm{coef}", cfg)
        assert res["heldout_accuracy"] >= 0.95
        nll[coef] = folder_nll(tmp_path / f"rm{coef}")
    # BT training alone leaves the LM head where the random init put it (~log V = 7 nats per
    # token here); the regulariser learns `40, EOS` exactly and the first token (one of 5) partly:
    # measured 7.05 vs 1.44 nats.
    assert nll[1.0] < 2.0 and nll[0.0] > 5.0
