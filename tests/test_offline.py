"""The trajectory store, `rollouts collect` (with SIGKILL mid-run), pairs and the preference trainer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from conftest import WARM_ENV

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams
from textgym.agents.trajectory import Trajectory
from textgym.config import PreferenceConfig, load_config
from textgym.models import load_model
from textgym.offline import UNPAIRED_SCHEMA, build_pairs, collect_rollouts, read_pairs, write_pairs
from textgym.store import (
    SCHEMA,
    TrajectoryStoreError,
    TrajectoryWriter,
    read_trajectories,
    shard_paths,
    trajectory_row,
)
from textgym.trainers.preference import PreferenceTrainer


def _traj(prompt: list[int], response: list[int], reward: float, task: int = 0) -> Trajectory:
    ids = prompt + response
    return Trajectory(
        token_ids=torch.tensor(ids),
        loss_mask=torch.tensor([0.0] * len(prompt) + [1.0] * len(response)),
        logprobs=torch.tensor([0.0] * len(prompt) + [-0.5] * len(response)),
        token_rewards=torch.zeros(len(ids)),
        prompt_length=len(prompt),
        messages=[{"role": "user", "content": f"task {task}"}],
        reward=reward,
        reward_terms={"reward/correct": reward},
        task_index=task,
        task_id=f"t/{task}",
        env_id="textgym/Arithmetic-v0",
    )


def test_store_round_trip_and_datasets_reads_it(tmp_path):
    trajs = [_traj([1, 2, 3], [7, 8, 2], 1.0, 0), _traj([1, 2, 4], [9, 2], 0.0, 1)]
    with TrajectoryWriter(tmp_path / "store") as w:
        w.append(trajectory_row(t, env_kwargs={"digits": 2}, sample=0, policy="p", seed=3) for t in trajs)
        assert w.flush() is not None
        w.append([trajectory_row(trajs[0], sample=1, policy="p")])
    assert len(shard_paths(tmp_path / "store")) == 2
    (tmp_path / "store" / ".shard-x.parquet.tmp").write_bytes(b"half a shard")  # a killed writer's leftover
    t = read_trajectories(tmp_path / "store")
    assert t.schema == SCHEMA and t.num_rows == 3
    row = t.slice(0, 1).to_pylist()[0]
    assert row["token_ids"] == [1, 2, 3, 7, 8, 2] and row["loss_mask"] == [0, 0, 0, 1, 1, 1]
    assert row["logprobs"] == [0.0, 0.0, 0.0, -0.5, -0.5, -0.5] and row["prompt_length"] == 3
    assert json.loads(row["reward_terms"]) == {"reward/correct": 1.0} and row["env_version"] == 0
    assert json.loads(row["env_kwargs"]) == {"digits": 2} and row["seed"] == 3
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("parquet", data_files=str(tmp_path / "store" / "*.parquet"), split="train")
    assert len(ds) == 3 and sorted(ds["reward"]) == [0.0, 1.0, 1.0]


def test_corrupt_and_foreign_files_are_named(tmp_path):
    store = tmp_path / "store"
    with TrajectoryWriter(store) as w:
        w.append([trajectory_row(_traj([1], [2], 1.0))])
    (store / "zz-corrupt.parquet").write_bytes(b"PAR1 this is not parquet")
    with pytest.raises(TrajectoryStoreError, match=r"zz-corrupt\.parquet: not a readable Parquet file"):
        read_trajectories(store)
    (store / "zz-corrupt.parquet").unlink()
    pq.write_table(pa.table({"question": ["2+2"], "answer": ["4"]}), store / "zz-foreign.parquet")
    with pytest.raises(
        TrajectoryStoreError, match=r"zz-foreign\.parquet: not a textgym trajectory shard \(missing"
    ):
        read_trajectories(store)


def test_build_pairs_modes_margin_cap_and_dedup():
    p, q = [1, 2], [1, 3]
    trajs = [
        _traj(p, [5, 2], 1.0),
        _traj(p, [5, 2], 1.0),  # duplicate response
        _traj(p, [6, 2], 0.0),
        _traj(p, [7, 2], 0.25),
        _traj(q, [8, 2], 0.0, 1),
        _traj(q, [9, 2], 0.0, 1),  # no reward difference: no pair
    ]
    table = pa.Table.from_pylist([trajectory_row(t) for t in trajs], schema=SCHEMA)
    pairs, unpaired, stats = build_pairs(table, margin=0.5)
    assert stats.duplicates_dropped == 1 and stats.prompts == 2 and stats.prompts_with_pairs == 1
    assert pairs.num_rows == 1
    row = pairs.to_pylist()[0]
    assert (row["chosen_ids"], row["rejected_ids"], row["prompt_ids"]) == ([5, 2], [6, 2], p)
    assert row["chosen_mask"] == [1, 1]
    assert unpaired.num_rows == 5 and stats.desirable == 1 and stats.undesirable == 4
    pairs, _, _ = build_pairs(table, margin=0.3, mode="all")
    assert sorted((r["chosen_reward"], r["rejected_reward"]) for r in pairs.to_pylist()) == [
        (1.0, 0.0),
        (1.0, 0.25),
    ]
    pairs, _, _ = build_pairs(table, margin=0.0, mode="all", max_per_prompt=2)
    assert pairs.num_rows == 2  # p's 3 pairs capped at 2; q's responses tie, so never a pair
    pairs, _, stats = build_pairs(table, margin=0.5, dedup=False)
    assert stats.duplicates_dropped == 0 and pairs.num_rows == 1
    with pytest.raises(ValueError, match="margin"):
        build_pairs(table, margin=-1.0)


def test_collect_resumes_without_duplicates(tiny_model_dir, tmp_path):
    agent = LLMAgent.from_pretrained(tiny_model_dir)
    params = SamplingParams(temperature=1.0, max_new_tokens=4)
    kw = {"operators": "+", "digits": 1, "instruction": ""}
    run = dict(env_kwargs=kw, samples=2, params=params, batch_size=4, policy="tiny")
    res = collect_rollouts(agent, "textgym/Arithmetic-v0", tmp_path, n=6, **run)
    assert (res.new_tasks, res.rows_written, res.shards_written) == (6, 12, 3)
    res = collect_rollouts(agent, "textgym/Arithmetic-v0", tmp_path, n=8, **run)
    assert (res.skipped_tasks, res.new_tasks, res.rows_written) == (6, 2, 4)
    t = read_trajectories(tmp_path)
    keys = list(zip(t.column("task_index").to_pylist(), t.column("sample").to_pylist(), strict=True))
    assert sorted(keys) == [(i, s) for i in range(8) for s in range(2)]


def test_sigkill_mid_collect_leaves_complete_shards_and_a_rerun_completes(tiny_model_dir, tmp_path):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "textgym", "rollouts", "collect", "--model", str(tiny_model_dir),
           "--env", "textgym/Arithmetic-v0", "--env-kwargs", "digits=1", "--out", str(store),
           "--n", "40", "--samples", "2", "--batch-size", "8", "--max-new-tokens", "48"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and len(shard_paths(store) if store.exists() else []) < 2:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    shards = shard_paths(store)
    assert 2 <= len(shards) < 10, "the kill should land mid-run"
    first = read_trajectories(store)  # every published shard is complete and readable
    assert first.num_rows == 8 * len(shards)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    t = read_trajectories(store)
    keys = list(zip(t.column("task_index").to_pylist(), t.column("sample").to_pylist(), strict=True))
    assert len(keys) == 80 and len(set(keys)) == 80


@pytest.fixture(scope="module")
def warm_pairs(warm_model_dir, tmp_path_factory):
    """Pairs from 48 tasks × 4 samples of the warm model, collected once for this module."""
    tmp = tmp_path_factory.mktemp("pairs")
    agent = LLMAgent.from_pretrained(warm_model_dir)
    torch.manual_seed(0)
    collect_rollouts(agent, WARM_ENV["id"], tmp / "traj", env_kwargs=WARM_ENV["kwargs"], n=48, samples=4,
                     params=SamplingParams(temperature=1.0, max_new_tokens=8), policy="warm")  # fmt: skip
    pairs, unpaired, stats = build_pairs(read_trajectories(tmp / "traj"), margin=0.5)
    paths = write_pairs(pairs, unpaired, tmp / "pairs")
    return read_pairs(paths["pairs"]), read_pairs(paths["unpaired"], UNPAIRED_SCHEMA), stats


@pytest.mark.learning
def test_dpo_raises_the_preference_accuracy_with_a_cached_reference(warm_model_dir, warm_pairs, tmp_path):
    pairs, unpaired, stats = warm_pairs
    assert stats.pairs >= 8
    model, tok = load_model(warm_model_dir)
    cfg = PreferenceConfig.model_validate(
        {"env": WARM_ENV, "loss": "dpo", "beta": 0.5, "epochs": 4, "batch_size": 16, "optim": {"lr": 1e-3}}
    )
    trainer = PreferenceTrainer(cfg, model, tok, tmp_path / "dpo", pairs, unpaired)
    assert (tmp_path / "dpo" / "reference_logps.pt").is_file()
    first = trainer.train_step()
    # At step 0 the policy is the reference: implicit rewards are 0 and the loss is log 2.
    assert abs(first["loss/dpo"] - 0.693147) < 1e-4 and abs(first["rewards/margin"]) < 1e-4
    for _ in range(trainer.total_steps - 1):
        last = trainer.train_step()
    assert last["rewards/margin"] > 0.1 and last["rewards/accuracy"] >= 0.75


@pytest.mark.learning
@pytest.mark.parametrize("loss", ["ipo", "kto", "simpo", "orpo"])
def test_every_preference_loss_trains(warm_model_dir, warm_pairs, tmp_path, loss):
    pairs, unpaired, _ = warm_pairs
    model, tok = load_model(warm_model_dir)
    cfg = PreferenceConfig.model_validate(
        {"env": WARM_ENV, "loss": loss, "beta": 1.0, "epochs": 8, "batch_size": 16, "optim": {"lr": 1e-4}}
    )
    trainer = PreferenceTrainer(cfg, model, tok, tmp_path / loss, pairs, unpaired)
    assert (tmp_path / loss / "reference_logps.pt").is_file() == (loss in ("ipo", "kto"))

    @torch.no_grad()
    def loss_on_every_example() -> float:
        # The objective on the whole training set (not one batch's noisy value), in eval mode.
        every = list(range(len(trainer.examples)))
        z0 = trainer._kto_reference_point(every) if trainer.kto else None
        trainer.model.eval()
        return float(trainer._loss(every, z0)[0].mean())

    before = loss_on_every_example()
    losses = [trainer.train_step()[f"loss/{loss}"] for _ in range(trainer.total_steps)]
    assert all(torch.isfinite(torch.tensor(losses)))
    after = loss_on_every_example()
    # Lowered by at least 5% (measured 9-68% across the four losses and three kernel sets).
    assert after < 0.95 * before, (before, after)


def test_dpo_stage_of_a_run(warm_model_dir, tmp_path):
    from textgym.pipeline import run

    cfg_path = tmp_path / "run.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "name": "dpo_test",
                "out_dir": str(tmp_path),
                "model": {"path": str(warm_model_dir)},
                "dpo": {
                    "env": WARM_ENV,
                    "rounds": 2,
                    "collect": {"n": 24, "samples": 4, "sampling": {"max_new_tokens": 8}},
                    "beta": 0.5,
                    "batch_size": 16,
                    "optim": {"lr": 1e-4},
                },
                "eval": {"env": WARM_ENV, "n": 16, "sampling": {"temperature": 0.0, "max_new_tokens": 8}},
            }
        )
    )
    summary = run(load_config(cfg_path), echo=lambda s: None)
    rounds = summary["dpo_rounds"]
    assert [r["round"] for r in rounds] == [0, 1] and all(r["rollouts"] == 96 for r in rounds)
    # round 1 collected fresh tasks with the round-0 model
    t0 = read_trajectories(tmp_path / "dpo_test" / "dpo" / "round_0" / "trajectories")
    t1 = read_trajectories(tmp_path / "dpo_test" / "dpo" / "round_1" / "trajectories")
    assert set(t0.column("task_index").to_pylist()).isdisjoint(t1.column("task_index").to_pylist())
    assert t1.column("policy").to_pylist()[0].endswith("round_0/train/final")
    assert summary["models_in_memory"] == ["policy"] and "accuracy_after" in summary


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
    from textgym.trainers.env_factory import make_env
    from textgym.trainers.reward_model import RewardModelVerifier, train_reward_model
    from textgym.types import Task

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


def test_grpo_logs_its_rollouts_and_a_resume_keeps_the_store_consistent(warm_model_dir, tmp_path):
    import shutil

    from textgym.config import GRPOConfig
    from textgym.trainers.grpo import GRPOTrainer

    cfg = GRPOConfig.model_validate(
        {"env": WARM_ENV, "steps": 3, "prompts_per_step": 4, "group_size": 2, "checkpoint_every": 2,
         "keep_checkpoints": 5, "sampling": {"max_new_tokens": 6}, "log_trajectories": True}
    )  # fmt: skip
    model, tok = load_model(warm_model_dir)
    GRPOTrainer(cfg, model, tok, tmp_path).train()
    t = read_trajectories(tmp_path / "trajectories")
    assert t.num_rows == 3 * 8 and sorted(set(t.column("policy_version").to_pylist())) == [0, 1, 2]
    assert set(t.column("source").to_pylist()) == {"train"}
    # Simulate a kill after step 3's rollouts but before its checkpoint: resume from step 2.
    shutil.rmtree(tmp_path / "checkpoints" / "step_3")
    model, tok = load_model(warm_model_dir)
    trainer = GRPOTrainer(cfg, model, tok, tmp_path, resume=True)
    assert trainer.step == 2 and read_trajectories(tmp_path / "trajectories").num_rows == 2 * 8
    trainer.train()
    t = read_trajectories(tmp_path / "trajectories")
    assert (
        t.num_rows == 3 * 8 and sorted(t.column("policy_version").to_pylist()) == [0] * 8 + [1] * 8 + [2] * 8
    )


def test_eval_logs_trajectories(warm_model_dir, tmp_path):
    from typer.testing import CliRunner

    from textgym.cli import app

    args = ["eval", "--env", WARM_ENV["id"], "--env-kwargs", "digits=1", "--env-kwargs", "instruction=",
            "--model", str(warm_model_dir), "--n", "6", "--max-new-tokens", "8", "--out", str(tmp_path),
            "--log-trajectories", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args, catch_exceptions=False)
    assert res.exit_code == 0, res.output
    t = read_trajectories(tmp_path / "trajectories")
    assert t.num_rows == 6 and set(t.column("source").to_pylist()) == {"eval"}
    assert (
        json.loads(res.stdout.strip().splitlines()[-1])["accuracy"] == sum(t.column("reward").to_pylist()) / 6
    )


def chosen_nll(rm, head, rows, starts, masks) -> float:
    """Token-mean NLL of the response tokens under the reward model's regulariser (`RewardNet`)."""
    from textgym.trainers.reward_model import RewardNet, _pad, nll_targets

    ids, attention = _pad(rows, 0)
    targets = nll_targets(rows, starts, masks, ids.shape[1])
    _, total = RewardNet(rm, head)(ids, attention, targets)
    return float(total / (targets != -100).sum())


@pytest.mark.parametrize("tied", [True, False])
def test_reward_model_lm_regulariser_equals_the_causal_lm_loss(tiny_model_dir, tmp_path, tied):
    """The regulariser's NLL (the trained `RewardNet`'s forward) is the causal LM's own loss on the
    response tokens."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    from textgym.trainers.reward_model import _output_embeddings

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
    from textgym.trainers.reward_model import _output_embeddings, train_reward_model

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


def test_dpo_with_lora_trains_adapters_against_the_base_models_log_probs(
    warm_model_dir, warm_pairs, tmp_path
):
    from textgym.trainers.lora import is_lora

    pairs, unpaired, _ = warm_pairs
    base = {
        "env": WARM_ENV, "loss": "dpo", "beta": 0.5, "epochs": 4, "batch_size": 16, "optim": {"lr": 1e-2},
    }  # fmt: skip
    model, tok = load_model(warm_model_dir)
    plain = PreferenceTrainer(
        PreferenceConfig.model_validate(base), model, tok, tmp_path / "plain", pairs, unpaired
    )
    model, tok = load_model(warm_model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cfg = PreferenceConfig.model_validate({**base, "epochs": 10, "lora": {"r": 4, "alpha": 8}})
    trainer = PreferenceTrainer(cfg, model, tok, tmp_path / "lora", pairs, unpaired)
    assert is_lora(trainer.model)
    # The cached reference is the base model's (the adapters start at B = 0).
    assert trainer.reference.keys() == plain.reference.keys()
    for k in plain.reference:
        torch.testing.assert_close(trainer.reference[k], plain.reference[k], rtol=0, atol=1e-6)
    final = trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "lora" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["rewards/margin"] > 0.1 and rows[-1]["rewards/accuracy"] >= 0.75
    for k, v in trainer.model.get_base_model().state_dict().items():
        if ".lora_" not in k:
            torch.testing.assert_close(v, before[k.replace(".base_layer.", ".")], rtol=0, atol=0, msg=k)
    assert (tmp_path / "lora" / "final_adapter" / "adapter_config.json").is_file()
    merged, _ = load_model(final)
    assert not is_lora(merged)
    assert any(not torch.equal(v, before[k]) for k, v in merged.state_dict().items())


def _unpaired_table(tok, n=8, seed=0):
    """`n` synthetic KTO examples (random prompt and completion ids, alternating labels)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(10, 200)  # ordinary BPE ids of the tiny tokenizer
    rows = []
    for i in range(n):
        prompt = ids[torch.randint(len(ids), (3 + i % 3,), generator=g)].tolist()
        completion = [*ids[torch.randint(len(ids), (2 + i % 4,), generator=g)].tolist(), tok.eos_token_id]
        rows.append(
            {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": prompt, "completion_ids": completion,
             "completion_mask": [1] * len(completion), "reward": float(i % 2), "desirable": bool(i % 2)}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=UNPAIRED_SCHEMA)


def test_kto_gradient_does_not_depend_on_the_micro_batch_size(tiny_model_dir, tmp_path):
    """KTO's z₀ is the whole optimizer batch's: 1 micro-batch of 8 == 4 micro-batches of 2."""
    grads, kls = [], []
    for micro in (8, 2):
        model, tok = load_model(tiny_model_dir)
        cfg = PreferenceConfig.model_validate(
            {"env": WARM_ENV, "loss": "kto", "beta": 1.0, "batch_size": 8, "micro_batch_size": micro,
             "optim": {"lr": 1e-3, "max_grad_norm": None}}
        )  # fmt: skip
        trainer = PreferenceTrainer(cfg, model, tok, tmp_path / str(micro), unpaired=_unpaired_table(tok))
        with torch.no_grad():  # move the policy away from the reference (r = 0, z₀ = 0 at the start)
            g = torch.Generator().manual_seed(0)
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
        # and make the mismatched pairs' log π − log π_ref differ by example, positive on the whole
        # batch but not in every micro-batch: per-micro-batch z₀ would then differ from the batch's
        trainer.reference["second"] -= torch.linspace(-2.0, 8.0, 8)
        metrics = trainer.train_step()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        kls.append(metrics["kl"])
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
    assert kls[0] > 0 and kls[1] == pytest.approx(kls[0], rel=1e-6)


@pytest.mark.parametrize(("loss", "beta"), [("dpo", 0.1), ("ipo", 0.1), ("kto", 0.1), ("simpo", 2.0)])
def test_beta_defaults_to_each_losss_paper(loss, beta):
    cfg = PreferenceConfig.model_validate({"env": WARM_ENV, "loss": loss})
    assert cfg.beta == beta  # SimPO: Meng et al. 2024 use 2.0-2.5; 0.1 elsewhere
    assert PreferenceConfig.model_validate({"env": WARM_ENV, "loss": loss, "beta": 0.7}).beta == 0.7
    assert load_config(None, [f"dpo.loss={loss}"], name="x", model={"init_preset": "tiny"},
                       dpo={"env": WARM_ENV}).dpo.beta == beta  # fmt: skip


def _pair_table(tok, n=6, seed=0):
    """`n` synthetic preference pairs (random prompt, chosen and rejected ids)."""
    from textgym.offline import PAIR_SCHEMA

    g = torch.Generator().manual_seed(seed)
    ids = torch.arange(10, 200)

    def some(k):
        return [*ids[torch.randint(len(ids), (k,), generator=g)].tolist(), tok.eos_token_id]

    rows = []
    for i in range(n):
        chosen, rejected = some(2 + i % 3), some(3 + i % 2)
        rows.append(
            {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": some(3)[:-1], "chosen_ids": chosen,
             "chosen_mask": [1] * len(chosen), "rejected_ids": rejected, "rejected_mask": [1] * len(rejected),
             "chosen_reward": 1.0, "rejected_reward": 0.0}
        )  # fmt: skip
    return pa.Table.from_pylist(rows, schema=PAIR_SCHEMA)


def test_cached_reference_logps_are_reused_only_for_the_same_pairs_and_start_model(
    tiny_model_dir, tmp_path, monkeypatch
):
    cfg = PreferenceConfig.model_validate({"env": WARM_ENV, "loss": "dpo", "batch_size": 4})
    computed = []
    compute = PreferenceTrainer._reference_logps

    def counted(self):
        computed.append(1)
        return compute(self)

    monkeypatch.setattr(PreferenceTrainer, "_reference_logps", counted)

    def trainer(pairs, stage="stage", perturb=False):
        model, tok = load_model(tiny_model_dir)
        if perturb:
            with torch.no_grad():
                next(model.parameters()).add_(0.01)
        return PreferenceTrainer(cfg, model, tok, tmp_path / stage, pairs)

    tok = load_model(tiny_model_dir)[1]
    first, other = _pair_table(tok, seed=0), _pair_table(tok, seed=1)
    a = trainer(first)  # computes and caches
    c = trainer(other)  # other pairs, same stage folder: the cache is not theirs
    fresh = trainer(other, stage="clean")
    for k in ("first", "second"):
        torch.testing.assert_close(c.reference[k], fresh.reference[k], rtol=0, atol=0)
    assert len(computed) == 3
    b = trainer(other)  # the same pairs and start model as the cache now: reused
    assert len(computed) == 3 and all(torch.equal(b.reference[k], c.reference[k]) for k in b.reference)
    e = trainer(other, perturb=True)  # another start model: recomputed
    assert len(computed) == 4 and not torch.equal(e.reference["first"], c.reference["first"])
    assert not torch.equal(a.reference["first"], c.reference["first"])
    assert json.loads((tmp_path / "stage" / "reference_logps.json").read_text())["fingerprint"]
