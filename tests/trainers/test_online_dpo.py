"""Online DPO on a real tiny model: one step's loss against a hand computation, pairs sampled from the
current policy, the reward-model scorer, resume, the stage in a run, config validation."""

from __future__ import annotations

import copy
import json
import math

import pyarrow as pa
import pytest
import torch
from conftest import WARM_ENV

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams, rollout
from textgym.agents.sampling import derive_seed
from textgym.config import ConfigError, OnlineDPOConfig, load_config, validate_runtime
from textgym.models import load_model
from textgym.trainers.preference.online import OnlineDPOTrainer
from textgym.trainers.preference.online_pairs import best_vs_worst
from textgym.training.checkpoint import latest_checkpoint
from textgym.training.envs import make_env
from textgym.training.sampler import TaskSampler
from textgym.training.seeding import seed_everything

SEED = 1
"""Seed of the tests that need pairs. The warm model is right on ~8 % of its T = 1 samples of
1-digit sums, so about half of the tasks get a right and a wrong answer among 8 samples, and a
step of 16 tasks has none with probability ~0.5^16; the tests assert that there are pairs
rather than assume it."""


def odpo_cfg(**over) -> OnlineDPOConfig:
    base = {
        "env": WARM_ENV,
        "steps": 2,
        "prompts_per_step": 16,
        "samples_per_prompt": 8,
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "optim": {"lr": 1e-3},
    }
    base.update(over)
    return OnlineDPOConfig.model_validate(base)


def test_best_vs_worst_pairs_each_group_by_hand():
    rewards = [0.0, 1.0, 1.0, 0.2, 0.5, 0.5, 0.5, 0.5, 0.3, 0.0, 0.8, 0.55]
    assert best_vs_worst(rewards, 4) == ([(1, 0), (10, 9)], 1)  # ties: the first best / worst
    assert best_vs_worst(rewards, 4, margin=0.8) == ([(1, 0), (10, 9)], 1)  # gap == margin is kept
    assert best_vs_worst(rewards, 4, margin=0.81) == ([(1, 0)], 2)
    assert best_vs_worst(rewards, 2) == ([(1, 0), (2, 3), (8, 9), (10, 11)], 2)
    with pytest.raises(ValueError, match="N % G"):
        best_vs_worst(rewards, 5)


def _sequence_logp(model, traj) -> tuple[float, float]:
    """Σ log π(token | prefix) over the policy tokens of one trajectory: one unpadded forward, by hand.

    Also the sequence's float32 rounding scale, Σ_t (|z_t| + |logsumexp_t|) · ε₃₂ over its policy
    tokens: the trainer computes each token's log π = z_t − logsumexp_t in float32 (from logits
    of a padded batch), so its rounding is of the order of ε₃₂ times those magnitudes.
    """
    ids = traj.token_ids[None]
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, :-1].double()
    z = logits.gather(-1, ids[0, 1:, None])[:, 0]
    lse = logits.logsumexp(-1)
    mask = traj.loss_mask[1:].double()
    eps32 = torch.finfo(torch.float32).eps
    return float(((z - lse) * mask).sum()), float(((z.abs() + lse.abs()) * mask).sum()) * eps32


@pytest.mark.parametrize("loss", ["dpo", "ipo", "simpo"])
def test_one_step_loss_equals_the_hand_computation(warm_model_dir, tmp_path, loss):
    """Step 2 (after step 1 moved the policy off the reference): its loss from the pairs it sampled."""
    seed_everything(SEED)
    model, tok = load_model(warm_model_dir)
    cfg = odpo_cfg(loss=loss, beta={"dpo": 0.5, "ipo": 0.5, "simpo": 2.0}[loss])
    trainer = OnlineDPOTrainer(cfg, model, tok, tmp_path)
    first = trainer.train_step()
    assert first["pairs/count"] >= 1
    policy = copy.deepcopy(trainer.policy).eval()  # π at the start of step 2
    m = trainer.train_step()
    trajs, pairs = trainer.trajectories, trainer.pairs
    assert len(trajs) == 128 and m["pairs/count"] == len(pairs) >= 1
    assert m["pairs/count"] + m["pairs/skipped_prompts"] == 16
    # the pairs are each task's best vs worst response by the env's reward
    for c, r in pairs:
        group = [t.reward for t in trajs[c // 8 * 8 : c // 8 * 8 + 8]]
        assert r // 8 == c // 8 and trajs[c].reward == max(group) > trajs[r].reward == min(group)
    reference, _ = load_model(warm_model_dir)
    hand, kl, rounding = [], [], []
    beta = cfg.beta
    for c, r in pairs:
        (pc, ec), (pr, er) = _sequence_logp(policy, trajs[c]), _sequence_logp(policy, trajs[r])
        (rc, fc), (rr, fr) = _sequence_logp(reference, trajs[c]), _sequence_logp(reference, trajs[r])
        nc, nr = float(trajs[c].loss_mask.sum()), float(trajs[r].loss_mask.sum())
        kl += [pc - rc, pr - rr]
        rounding += [ec + fc, er + fr]
        if loss == "dpo":  # −log σ(β((π_c − ref_c) − (π_r − ref_r)))
            hand.append(math.log1p(math.exp(-beta * ((pc - rc) - (pr - rr)))))
        elif loss == "ipo":  # ((π_c − ref_c)/|y_c| − (π_r − ref_r)/|y_r| − 1/(2τ))²
            hand.append(((pc - rc) / nc - (pr - rr) / nr - 1 / (2 * beta)) ** 2)
        else:  # −log σ(β(π_c/|y_c| − π_r/|y_r|) − γ), γ = 1
            hand.append(math.log1p(math.exp(-(beta * (pc / nc - pr / nr) - 1.0))))
    expected = sum(hand) / len(hand)
    # The float32 rounding of a mean of sequence log-prob differences is at most the mean of the
    # sequences' rounding scales (`_sequence_logp`, ~3.5e-5 here); the differences measured
    # were 1-2 % of it on an AVX2 EPYC (own and portable kernels) and 3 % on an AVX-512 Xeon
    # (1.1e-6 for DPO's `kl/ref`). A loss moves by at most its slope (≤ β for DPO and SimPO's
    # log-sigmoid; bounded by the margin for IPO's square) times the margin's rounding.
    scale = sum(rounding) / len(rounding)
    print(f"{loss}: float32 rounding scale {scale:.2e}, loss {m[f'loss/{loss}'] - expected:+.2e}", end="")
    assert m[f"loss/{loss}"] == pytest.approx(expected, abs=max(1.0, beta) * scale, rel=0)
    if loss != "simpo":  # the policy has moved: the loss is not its value at π = π_ref
        assert max(abs(k) for k in kl) > 1e-3
        print(f", kl {m['kl/ref'] - sum(kl) / len(kl):+.2e}")
        assert m["kl/ref"] == pytest.approx(sum(kl) / len(kl), abs=scale, rel=0)
    else:
        assert "kl/ref" not in m and trainer.reference is None


def test_pairs_are_sampled_from_the_current_policy(warm_model_dir, tmp_path):
    """Step 2's stored samples are what the policy after step 1 samples with the step's seeds, and
    not what the start model samples with them."""
    seed_everything(SEED)
    model, tok = load_model(warm_model_dir)
    cfg = odpo_cfg(rollout={"per_sequence_seeds": True}, log_trajectories=True, checkpoint_every=1)
    trainer = OnlineDPOTrainer(cfg, model, tok, tmp_path, seed=7)
    assert trainer.train_step()["pairs/count"] >= 1
    after_one = copy.deepcopy(trainer.policy)
    trainer.train_step()
    stored = [t.token_ids.tolist() for t in trainer.trajectories]

    # the tasks of step 2: the trainer's seed-7 task stream after step 1's 16 prompts
    stream = TaskSampler(trainer.sampler.n, 7)
    stream.next(16)
    step_two = stream.next(16)

    def resample(policy):
        envs = [make_env(cfg.env) for _ in range(128)]
        seeds = [derive_seed(7, 1, 0, g, j) for g in range(16) for j in range(8)]
        agent = LLMAgent(policy, tok, batch_size=128)
        params = SamplingParams(temperature=1.0, max_new_tokens=8)
        trajs = rollout(agent, envs, step_two, params, group_size=8, seeds=seeds)
        return [t.token_ids.tolist() for t in trajs], [t.reward for t in trajs]

    ids, rewards = resample(after_one)
    assert ids == stored and rewards == [t.reward for t in trainer.trajectories]
    start_ids, _ = resample(load_model(warm_model_dir)[0])
    assert sum(a != b for a, b in zip(start_ids, stored, strict=True)) >= 1
    # the trajectory store holds the same samples, one shard per step
    from textgym.offline.store import read_trajectories

    table = read_trajectories(tmp_path / "trajectories")
    assert table.num_rows == 256 and sorted(set(table.column("policy_version").to_pylist())) == [0, 1]


def _tiny_reward_model(model_dir, out) -> None:
    """A Bradley–Terry reward model trained (one epoch) on synthetic pairs of the tiny model's tokens."""
    from textgym.config import OptimConfig, RewardModelConfig
    from textgym.offline import PAIR_SCHEMA
    from textgym.trainers.reward.bradley_terry import train_reward_model

    rows = [
        {"env_id": "e", "task_id": f"t/{i}", "prompt_ids": [5 + i % 23, 9], "chosen_ids": [30 + i % 5, 40, 2],
         "chosen_mask": [1, 1, 1], "rejected_ids": [30 + i % 5, 41, 2], "rejected_mask": [1, 1, 1],
         "chosen_reward": 1.0, "rejected_reward": 0.0}
        for i in range(32)
    ]  # fmt: skip
    cfg = RewardModelConfig(epochs=1, batch_size=16, eval_fraction=0.0, optim=OptimConfig(lr=1e-3))
    train_reward_model(pa.Table.from_pylist(rows, schema=PAIR_SCHEMA), model_dir, out, cfg, log_with=[])


def test_the_reward_model_scores_the_pairs(tiny_model_dir, tmp_path):
    from textgym.trainers.preference.online import models_in_memory
    from textgym.verifiers.reward_model import RewardModelVerifier

    _tiny_reward_model(tiny_model_dir, tmp_path / "rm")
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = odpo_cfg(
        prompts_per_step=3, samples_per_prompt=3, scorer="reward_model", reward_model=str(tmp_path / "rm")
    )
    trainer = OnlineDPOTrainer(cfg, model, tok, tmp_path / "odpo")
    assert "reward_model" in trainer.memory and models_in_memory(cfg)[-1] == "reward model"
    m = trainer.train_step()
    rm = RewardModelVerifier(tmp_path / "rm")
    trajs = trainer.trajectories
    scores = rm.score_messages([t.messages for t in trajs])
    for t, s in zip(trajs, scores, strict=True):  # the score is the reward; the env's terms stay
        assert t.reward == pytest.approx(s, abs=1e-5) and t.reward_terms["reward/rm"] == t.reward
        assert "reward/correct" in t.reward_terms
    assert trainer.pairs == best_vs_worst([t.reward for t in trajs], 3)[0] and len(trainer.pairs) >= 1
    assert m["pairs/score_chosen"] > m["pairs/score_rejected"]
    assert math.isfinite(m["loss/dpo"]) and m["loss/dpo"] == pytest.approx(math.log(2), abs=1e-5)  # π = π_ref


def test_resume_gives_the_same_next_step(warm_model_dir, tmp_path):
    def fresh(steps, stage_dir, resume=False):
        seed_everything(SEED)
        model, tok = load_model(warm_model_dir)
        cfg = odpo_cfg(steps=steps, prompts_per_step=8, checkpoint_every=1, micro_batch_size=2)
        return OnlineDPOTrainer(cfg, model, tok, stage_dir, resume=resume)

    straight = fresh(2, tmp_path / "a")
    straight.train()
    interrupted = fresh(1, tmp_path / "b")
    interrupted.train()
    resumed = fresh(2, tmp_path / "b", resume=True)
    assert resumed.step == 1 and resumed.sampler.cursor == interrupted.sampler.cursor == 8
    resumed.train()

    def step2(d):
        rows = [json.loads(line) for line in (d / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2]  # logs intact, no duplicate rows
        return {k: v for k, v in rows[1].items() if not k.startswith(("time", "throughput"))}

    a, b = step2(tmp_path / "a"), step2(tmp_path / "b")
    assert a.keys() == b.keys() and a["pairs/count"] >= 1 and a["grad_norm"] > 0
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k
    for (name, p), q in zip(straight.policy.named_parameters(), resumed.policy.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-6, msg=name)
    assert latest_checkpoint(tmp_path / "b").name == "step_2"


def test_micro_batches_give_the_gradient_of_the_whole_step(warm_model_dir, tmp_path):
    """1 micro-batch of every pair == micro-batches of 1 pair (one optimizer step, same pairs)."""
    grads, trajectories = [], None
    pairs = [(0, 1), (8, 10), (17, 16), (31, 24)]  # (chosen, rejected) rows of groups 0 to 3, by hand
    for micro in (None, 1):
        seed_everything(SEED)
        model, tok = load_model(warm_model_dir)
        cfg = odpo_cfg(
            steps=1, prompts_per_step=4, micro_batch_size=micro, optim={"lr": 1e-3, "max_grad_norm": None}
        )
        trainer = OnlineDPOTrainer(cfg, model, tok, tmp_path / str(micro))
        trajectories = trajectories or trainer.sample()
        trainer.trajectories, trainer.pairs = trajectories, pairs
        m = trainer.update()  # at π = π_ref the DPO gradient is −β/2 · ∇h per pair, not 0
        assert m["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6)
        grads.append(torch.cat([p.grad.flatten() for p in trainer.policy.parameters() if p.grad is not None]))
    assert grads[0].abs().max() > 0
    assert float((grads[1] - grads[0]).norm() / grads[0].norm()) < 1e-5


def test_lora_reference_is_the_policy_with_its_adapters_off(warm_model_dir, tmp_path):
    """With LoRA no reference copy is kept: at the start (B = 0) the loss is log 2 and the KL 0;
    a second update on the same pairs has moved the adapters, and the adapters-off log-probs with them not."""
    from textgym.trainers.preference.online import models_in_memory

    seed_everything(SEED)
    model, tok = load_model(warm_model_dir)
    cfg = odpo_cfg(prompts_per_step=2, lora={"r": 4, "alpha": 8}, optim={"lr": 1e-2})
    trainer = OnlineDPOTrainer(cfg, model, tok, tmp_path)
    assert trainer.reference is None and models_in_memory(cfg)[1] == "reference (policy, adapters off)"
    trainer.trajectories, trainer.pairs = trainer.sample(), [(0, 1), (8, 9)]
    first = trainer.update()
    assert first["loss/dpo"] == pytest.approx(math.log(2), abs=1e-6) and abs(first["kl/ref"]) < 1e-6
    second = trainer.update()
    assert abs(second["kl/ref"]) > 1e-3 and second["loss/dpo"] < first["loss/dpo"]
    final = trainer.train()  # the stage's 2 steps, then the merged model and the adapter
    assert (final / "config.json").is_file() and (tmp_path / "final_adapter").is_dir()


def test_a_run_with_an_online_dpo_stage(warm_model_dir, tmp_path):
    from textgym.pipeline import run

    cfg = load_config(
        values={
            "name": "odpo",
            "out_dir": str(tmp_path),
            "model": {"path": str(warm_model_dir)},
            "online_dpo": odpo_cfg(steps=2, prompts_per_step=4, eval_every=2).model_dump(),
            "eval": {"env": WARM_ENV, "n": 8, "sampling": {"temperature": 0.0, "max_new_tokens": 8}},
            "log_with": [],
        }
    )
    summary = run(cfg, echo=lambda line: None)
    assert set(summary["stage_times_s"]) == {"online_dpo"} and summary["n_eval"] == 8
    assert summary["models_in_memory"] == ["policy", "reference"]
    rows = [
        json.loads(x) for x in (tmp_path / "odpo" / "online_dpo" / "metrics.jsonl").read_text().splitlines()
    ]
    assert [r["step"] for r in rows] == [1, 2] and "eval/accuracy" in rows[1]
    assert (tmp_path / "odpo" / "online_dpo" / "final" / "config.json").is_file()


def test_config_errors_name_the_field(tmp_path):
    def bad(match, **stage):
        base = {"name": "x", "model": {"init_preset": "tiny"}, "online_dpo": {"env": WARM_ENV, **stage}}
        with pytest.raises(ConfigError, match=match):
            load_config(values=base)

    bad(r"online_dpo\.samples_per_prompt: Input should be greater than or equal to 2", samples_per_prompt=1)
    bad(r"online_dpo\.loss: Input should be 'dpo', 'ipo', 'simpo' or 'orpo'", loss="kto")
    bad(r"online_dpo\.group_size: Extra inputs are not permitted", group_size=4)
    bad(r"scorer 'reward_model' needs reward_model", scorer="reward_model")
    bad(r"reward_model is set but scorer is 'env'", reward_model=str(tmp_path))
    bad(r"rollout\.tis", rollout={"tis": True})
    with pytest.raises(ConfigError, match=r"at most one of the grpo, ppo, dpo(, rft)? and online_dpo stages"):
        load_config(values={"name": "x", "model": {"init_preset": "tiny"}, "online_dpo": {"env": WARM_ENV},
                            "grpo": {"env": WARM_ENV}})  # fmt: skip
    assert (
        OnlineDPOConfig(env=WARM_ENV, loss="simpo").beta == 2.0 and OnlineDPOConfig(env=WARM_ENV).beta == 0.1
    )
    stage = {"env": WARM_ENV, "scorer": "reward_model", "reward_model": str(tmp_path / "rm")}
    cfg = load_config(values={"name": "x", "model": {"init_preset": "tiny"}, "online_dpo": stage})
    assert cfg.trains_in_pipeline and cfg.online_dpo is not None
    assert cfg.online_dpo.scorer_env.reward_model == str(tmp_path / "rm")
    with pytest.raises(ConfigError, match=r"online_dpo\.reward_model: .*has no config\.json"):
        validate_runtime(cfg)
