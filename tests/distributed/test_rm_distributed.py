"""The reward-model trainer (`textgym rm train`) on 2 ranks (torchrun, gloo on CPU) against 1 process;
micro-batches against whole batches; a resumed run against an uninterrupted one.

The pairs (41, of random lengths, 31 for training after the held-out split) are cut into
batches of 5 with micro-batches of 2: each batch splits 3 + 2 over the ranks, so rank 1 runs a
weight-0 filler micro-batch to match rank 0's two forward calls, and each epoch's last batch
holds one pair, so rank 1 runs nothing but a filler. The GRM regulariser is on (`--lm-coef`),
with the tiny model's tied LM head and with an untied one (an extra parameter in the sharded
root unit). Tolerances are those of tests/distributed/test_distributed.py (see its docstring): parameters
‖θ₂ − θ₁‖ ≤ 5e-3·‖θ₁ − θ₀‖, and every logged step metric (losses, the pre-clip `grad_norm`,
whose size AdamW would otherwise hide) to 5e-3 relative.
"""

from __future__ import annotations

import json
import random
import shutil
import time
from pathlib import Path

import pyarrow as pa
import pytest
import torch
from safetensors.torch import load_file
from test_distributed import METRIC_RTOL, PARAM_RTOL, records, relative_distance, textgym
from test_distributed import params as weights

from textgym import distributed
from textgym.config import OptimConfig, RewardModelConfig
from textgym.offline import PAIR_SCHEMA, UNPAIRED_SCHEMA, write_pairs
from textgym.trainers.reward.bradley_terry import train_reward_model
from textgym.training.batch import rank_micro_batches

STEP_KEYS = ("loss/rm", "loss/bt", "loss/lm", "grad_norm", "rewards/margin", "rewards/accuracy")


def make_pairs(n: int = 41, seed: int = 0) -> pa.Table:
    """Pairs with random prompts and response bodies; chosen end in token 40, rejected in 41.

    Some chosen responses have a token outside the loss mask (not the policy's).
    """
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        prompt = [rng.randrange(5, 200) for _ in range(rng.randint(3, 8))]
        chosen = [rng.randrange(30, 60) for _ in range(rng.randint(1, 6))] + [40, 2]
        rejected = [rng.randrange(30, 60) for _ in range(rng.randint(1, 6))] + [41, 2]
        mask = [0 if j == 1 and len(chosen) > 3 else 1 for j in range(len(chosen))]
        rows.append(
            {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": prompt, "chosen_ids": chosen,
             "chosen_mask": mask, "rejected_ids": rejected, "rejected_mask": [1] * len(rejected),
             "chosen_reward": 1.0, "rejected_reward": 0.0}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("rm_pairs")
    write_pairs(make_pairs(), pa.Table.from_pylist([], schema=UNPAIRED_SCHEMA), folder)
    return folder


@pytest.fixture(scope="module")
def untied_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The tiny model with its own (untied, random) LM head."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    lm = AutoModelForCausalLM.from_pretrained(tiny_model_dir, tie_word_embeddings=False)
    torch.manual_seed(1)
    lm.lm_head.weight = torch.nn.Parameter(torch.randn_like(lm.lm_head.weight) * 0.05)
    folder = tmp_path_factory.mktemp("models") / "untied"
    lm.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tiny_model_dir).save_pretrained(folder)
    return folder


ARGS = ("--epochs", "2", "--batch-size", "5", "--micro-batch-size", "2", "--lr", "1e-3",
        "--eval-fraction", "0.25", "--lm-coef", "0.5")  # fmt: skip


def rm_train(pairs: Path, model: Path, out: Path, ranks: int, *extra: str) -> float:
    """`textgym rm train` in a subprocess on 1 process or `ranks` under torchrun; returns wall seconds."""
    args = ["rm", "train", "--pairs", str(pairs), "--model", str(model), "--out", str(out), *ARGS, *extra]
    t = time.perf_counter()
    # A rank that skips a collective (a missing filler) fails within 2 minutes instead of hanging.
    textgym(args, ranks, timeout=300, TEXTGYM_DIST_TIMEOUT_MIN="2")
    return time.perf_counter() - t


@pytest.fixture(scope="module")
def runs(pairs_dir, tiny_model_dir, untied_model_dir, tmp_path_factory):
    """1 process and 2 ranks, tied and untied LM head; the untied runs checkpoint every 4 steps."""
    out = tmp_path_factory.mktemp("rm_runs")
    models = {"tied": tiny_model_dir, "untied": untied_model_dir}
    times = {}
    for head, model in models.items():
        extra = ("--checkpoint-every", "4", "--keep-checkpoints", "10") if head == "untied" else ()
        for ranks in (1, 2):
            times[head, ranks] = rm_train(pairs_dir, model, out / f"{head}{ranks}", ranks, *extra)
    return out, models, times


@pytest.mark.multiproc
@pytest.mark.parametrize("head", ["tied", "untied"])
def test_rm_on_two_ranks_matches_one_process(runs, head):
    out, models, times = runs
    one, two = out / f"{head}1", out / f"{head}2"
    start = weights(models[head])
    a, b = weights(one), weights(two)
    assert set(a) == set(b) == set(start) - {"lm_head.weight"} | {"score.weight"}
    # the score head is new (its start is the seeded initialisation, compared as moved from 0)
    rel, moved = relative_distance(a, b, {**start, "score.weight": torch.zeros_like(a["score.weight"])})
    print(f"rm ({head} LM head) 1 vs 2 ranks: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}, wall {times}")
    assert moved > 1.0 and rel < PARAM_RTOL
    one_rec, two_rec = records(one), records(two)
    assert [r["step"] for r in one_rec] == [r["step"] for r in two_rec] == list(range(1, 15))
    for r1, r2 in zip(one_rec, two_rec, strict=True):
        for k in STEP_KEYS:
            assert r1[k] == pytest.approx(r2[k], rel=METRIC_RTOL, abs=1e-6), (r1["step"], k, r1[k], r2[k])
        assert r1.get("eval/heldout_accuracy") == r2.get("eval/heldout_accuracy")  # after each epoch
    assert one_rec[-1]["loss/bt"] < one_rec[0]["loss/bt"] and one_rec[-1]["loss/lm"] < one_rec[0]["loss/lm"]
    res1, res2 = (json.loads((d / "textgym.json").read_text()) for d in (one, two))
    assert res1["train_pairs"] == 31 and res2["ranks"] == 2
    for k in ("heldout_accuracy_before", "heldout_accuracy", "heldout_pairs", "steps"):
        assert res1[k] == res2[k], k
    # rank 0 alone wrote one folder, the one-process layout, loadable as a sequence classifier
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert json.loads((two / "config.json").read_text()) == json.loads((one / "config.json").read_text())
    assert {k: (v.dtype, v.shape) for k, v in b.items()} == {k: (v.dtype, v.shape) for k, v in a.items()}
    from transformers import AutoModelForSequenceClassification

    rm = AutoModelForSequenceClassification.from_pretrained(two)
    assert rm.config.num_labels == 1 and type(rm).__name__ == "Qwen2ForSequenceClassification"
    memory = json.loads((two / "memory.json").read_text())["reward_model"]
    full = json.loads((one / "memory.json").read_text())["reward_model"]
    assert memory["param_mib"] == pytest.approx(full["param_mib"] / 2, rel=0.05)


@pytest.mark.multiproc
def test_a_resumed_two_rank_run_ends_where_the_uninterrupted_one_does(runs, pairs_dir, tmp_path):
    """Killed after step 8's checkpoint (mid-epoch 2), resumed on 2 ranks: the same weights and metrics."""
    out, models, _ = runs
    done = out / "untied2"
    ckpt = done / "checkpoints" / "step_8"
    assert (ckpt / "lm_head.safetensors").is_file()  # the untied head is checkpointed, not in the model
    assert not (done / "lm_head.safetensors").exists()
    resumed = tmp_path / "resumed"
    shutil.copytree(ckpt, resumed / "checkpoints" / "step_8")
    (resumed / "metrics.jsonl").write_text((done / "metrics.jsonl").read_text())  # with steps 9-14
    t = rm_train(pairs_dir, models["untied"], resumed, 2, "--checkpoint-every", "4", "--resume")
    a, b = weights(done), weights(resumed)
    worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)
    print(f"rm resumed at step 8 of 14 on 2 ranks: max relative difference {worst:.1e}, {t:.0f}s")
    assert worst <= 1e-6
    head = "lm_head.weight"
    last = [
        load_file(str(d / "checkpoints" / "step_12" / "lm_head.safetensors"))[head] for d in (done, resumed)
    ]
    torch.testing.assert_close(last[1], last[0], rtol=1e-6, atol=0)
    assert [r["step"] for r in records(resumed)] == list(range(1, 15))  # steps 9-14 dropped, then redone
    for r1, r2 in zip(records(done)[8:], records(resumed)[8:], strict=True):
        for k in (*STEP_KEYS, "lr"):
            assert r1[k] == pytest.approx(r2[k], rel=1e-6), (r1["step"], k)
        assert r1.get("eval/heldout_accuracy") == r2.get("eval/heldout_accuracy")
    res_done, res_resumed = (json.loads((d / "textgym.json").read_text()) for d in (done, resumed))
    for k in ("heldout_accuracy_before", "heldout_accuracy", "train_loss", "steps"):
        assert res_done[k] == pytest.approx(res_resumed[k], rel=1e-6), k


# --- in-process checks ------------------------------------------------------------------------
def one_process(pairs: pa.Table, model: Path, out: Path, **cfg) -> dict:
    base = {
        "epochs": 2,
        "batch_size": 5,
        "eval_fraction": 0.25,
        "lm_coef": 0.5,
        "optim": OptimConfig(lr=1e-3),
    }
    return train_reward_model(pairs, model, out, RewardModelConfig(**{**base, **cfg}))


def test_micro_batches_give_the_whole_batch_result(tiny_model_dir, tmp_path):
    pairs = make_pairs()
    whole = one_process(pairs, tiny_model_dir, tmp_path / "whole")
    micro = one_process(pairs, tiny_model_dir, tmp_path / "micro", micro_batch_size=2)
    start = {**weights(tiny_model_dir)}
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "micro")
    rel, moved = relative_distance(a, b, {**start, "score.weight": torch.zeros_like(a["score.weight"])})
    print(f"rm micro-batches of 2 vs whole batches of 5: ‖Δθ‖/‖θ−θ0‖ = {rel:.2e}, ‖θ−θ0‖ = {moved:.3f}")
    assert moved > 1.0 and rel < PARAM_RTOL
    for r1, r2 in zip(records(tmp_path / "whole"), records(tmp_path / "micro"), strict=True):
        for k in STEP_KEYS:
            assert r1[k] == pytest.approx(r2[k], rel=METRIC_RTOL, abs=1e-6), (r1["step"], k)
    assert whole["heldout_accuracy"] == micro["heldout_accuracy"]


def test_a_resumed_run_ends_where_the_uninterrupted_one_does(untied_model_dir, tmp_path):
    """One process, untied LM head: stopped after step 5's checkpoint (mid-epoch 1), resumed."""
    pairs = make_pairs()
    done = one_process(pairs, untied_model_dir, tmp_path / "done", checkpoint_every=5)
    assert sorted(p.name for p in (tmp_path / "done" / "checkpoints").iterdir()) == ["step_10", "step_5"]
    shutil.copytree(
        tmp_path / "done" / "checkpoints" / "step_5", tmp_path / "resumed" / "checkpoints" / "step_5"
    )
    cfg = RewardModelConfig(
        epochs=2,
        batch_size=5,
        eval_fraction=0.25,
        lm_coef=0.5,
        optim=OptimConfig(lr=1e-3),
        checkpoint_every=5,
    )
    resumed = train_reward_model(pairs, untied_model_dir, tmp_path / "resumed", cfg, resume=True)
    a, b = weights(tmp_path / "done"), weights(tmp_path / "resumed")
    worst = max(float((a[k] - b[k]).abs().max() / a[k].abs().max()) for k in a)
    print(f"rm resumed at step 5 of 14 on 1 process: max relative difference {worst:.1e}")
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=1e-6, atol=0, msg=k)
    for k in ("heldout_accuracy_before", "heldout_accuracy", "train_loss", "steps"):
        assert done[k] == pytest.approx(resumed[k], rel=1e-6), k
    assert [r["step"] for r in records(tmp_path / "resumed")] == list(range(6, 15))


def test_without_resume_an_old_runs_checkpoints_and_metrics_are_removed(tiny_model_dir, tmp_path):
    pairs = make_pairs(12)
    one_process(pairs, tiny_model_dir, tmp_path, epochs=1, checkpoint_every=1)
    assert (tmp_path / "checkpoints" / "step_2").is_dir()
    one_process(pairs, tiny_model_dir, tmp_path, epochs=1)
    assert not (tmp_path / "checkpoints").exists() and len(records(tmp_path)) == 2


def test_rank_slices_and_filler_micro_batches(monkeypatch):
    rows = [7, 3, 9, 1, 4]
    slices = {}
    for rank in (0, 1):
        monkeypatch.setattr(
            distributed.process_group, "_WORLD", distributed.World(rank=rank, size=2, backend="gloo")
        )
        slices[rank] = rank_micro_batches(rows, 2)
    assert slices[0] == [([7, 3], False), ([9], False)]
    assert slices[1] == [([1, 4], False), ([7], True)]  # the same number of forward calls
    monkeypatch.setattr(
        distributed.process_group, "_WORLD", distributed.World(rank=1, size=2, backend="gloo")
    )
    assert rank_micro_batches([5], 2) == [([5], True)]  # nothing left for rank 1: a filler only
    monkeypatch.setattr(distributed.process_group, "_WORLD", distributed.World())
    assert rank_micro_batches(rows, 2) == [([7, 3], False), ([9, 1], False), ([4], False)]


def test_only_train_and_rm_train_start_under_torchrun_with_several_ranks(monkeypatch):
    from textgym.cli import _refuse_ranks_outside_train

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    _refuse_ranks_outside_train(["train", "cfg.yaml"])
    _refuse_ranks_outside_train(["rm", "train", "--pairs", "p", "--model", "m", "--out", "o"])
    for args in (["eval", "--env", "x"], ["rm"], ["pairs", "build"]):
        with pytest.raises(SystemExit) as e:
            _refuse_ranks_outside_train(args)
        assert e.value.code == 2
