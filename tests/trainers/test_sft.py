"""The SFT trainer on a real tiny model: it learns the gold solutions, stops on a probe target, accumulates
gradients."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import WARM_ENV as ENV

from textgym.agents import SamplingParams, rollout
from textgym.config import SFTConfig
from textgym.models import load_model
from textgym.trainers.sft import SFTTrainer
from textgym.training.checkpoint import latest_checkpoint
from textgym.training.seeding import seed_everything


@pytest.mark.learning
def test_sft_learns_the_gold_solutions(tiny_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = SFTConfig.model_validate(
        {
            "env": ENV,
            "steps": 30,
            "batch_size": 32,
            "micro_batch_size": 16,
            "optim": {"lr": 3e-3, "warmup_steps": 5},
            "log_every": 1,
        }
    )
    trainer = SFTTrainer(cfg, model, tok, tmp_path)
    ex = trainer.example(0)
    n = ex.prompt_length
    assert tok.decode(ex.token_ids[n:].tolist()) == ex_solution(trainer) + "<|im_end|>"
    trainer.train()
    losses = [json.loads(line)["loss/sft"] for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert losses[-1] < 0.5 * losses[0]


def _probe_accuracy(model_dir, indices, max_new_tokens):
    """Greedy accuracy of a saved model on Arithmetic tasks, computed independently of the trainer."""
    import gymnasium as gym

    from textgym.agents import LLMAgent

    model, tok = load_model(model_dir)
    envs = [gym.make(ENV["id"], **ENV["kwargs"]) for _ in indices]
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    trajs = rollout(LLMAgent(model, tok), envs, indices, params)
    return sum(t.reward_terms["reward/correct"] >= 1.0 for t in trajs) / len(trajs)


@pytest.mark.learning
def test_sft_stops_at_the_first_probe_that_reaches_its_target(warm_model_dir, tmp_path):
    from textgym.trainers.sft import probe_indices

    target = {"accuracy": 0.05, "every": 3, "n": 40, "max_new_tokens": 8}
    seed_everything(0)
    model, tok = load_model(warm_model_dir)
    cfg = SFTConfig.model_validate(
        {"env": ENV, "steps": 50, "batch_size": 8, "optim": {"lr": 1e-4}, "target": target}
    )
    trainer = SFTTrainer(cfg, model, tok, tmp_path)
    assert trainer.probe_indices == probe_indices(2**63, 40, 0) == list(range(2**40, 2**40 + 40))
    final = trainer.train()
    # The warm model is already above 0.05: the first probe (after step 3) ends the stage.
    assert trainer.step == 3 and trainer.target_reached
    outcome = json.loads((tmp_path / "target.json").read_text())
    assert outcome["steps"] == 3 and outcome["target_reached"] and outcome["probe_n"] == 40
    # The recorded probe accuracy is the saved model's greedy accuracy on those tasks, exactly.
    assert outcome["probe_accuracy"] == _probe_accuracy(final, trainer.probe_indices, 8) >= 0.05
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert records[-1]["step"] == 3 and records[-1]["probe/accuracy"] == outcome["probe_accuracy"]


def test_sft_target_out_of_reach_uses_the_budget_and_fails_when_required(warm_model_dir, tmp_path):
    from textgym.trainers.sft import SFTTargetNotReachedError, probe_indices

    # A finite task set: the probe is a seeded subset of it.
    assert probe_indices(25, 10, 0) == probe_indices(25, 10, 0) != probe_indices(25, 10, 1)
    assert len(set(probe_indices(25, 10, 0))) == 10 and max(probe_indices(25, 10, 0)) < 25
    assert probe_indices(5, 10, 0) == [0, 1, 2, 3, 4]
    target = {"accuracy": 1.0, "every": 2, "n": 16, "max_new_tokens": 2}  # 2 tokens: never right
    for required in (False, True):
        seed_everything(0)
        model, tok = load_model(warm_model_dir)
        cfg = SFTConfig.model_validate(
            {
                "env": ENV,
                "steps": 4,
                "batch_size": 8,
                "optim": {"lr": 1e-4},
                "target": {**target, "required": required},
            }
        )
        trainer = SFTTrainer(cfg, model, tok, tmp_path / str(required))
        if required:
            with pytest.raises(SFTTargetNotReachedError, match=r"probe accuracy 0\.0 < 1\.0"):
                trainer.train()
        else:
            trainer.train()
            assert json.loads((tmp_path / "False" / "target.json").read_text())["target_reached"] is False
        assert trainer.step == 4 and not trainer.target_reached
        assert latest_checkpoint(tmp_path / str(required)).name == "step_4"


def test_probing_leaves_the_training_run_unchanged_and_every_probe_is_logged(tiny_model_dir, tmp_path):
    """A probe (greedy, no random draws) between steps changes no loss, however often it runs;
    each probe's accuracy reaches metrics.jsonl, also at steps off the `log_every` cadence."""
    runs = {}
    for every in (None, 3):
        seed_everything(0)
        model, tok = load_model(tiny_model_dir)
        cfg = {"env": ENV, "steps": 8, "batch_size": 16, "optim": {"lr": 1e-3}, "log_every": 4}
        if every:
            cfg["target"] = {"accuracy": 1.0, "every": every, "n": 8, "max_new_tokens": 4}
        trainer = SFTTrainer(SFTConfig.model_validate(cfg), model, tok, tmp_path / str(every))
        trainer.train()
        lines = (tmp_path / str(every) / "metrics.jsonl").read_text().splitlines()
        runs[every] = {r["step"]: r for r in map(json.loads, lines)}
    assert sorted(runs[None]) == [4, 8]
    assert sorted(runs[3]) == [3, 4, 6, 8]  # the log cadence and the probes at 3 and 6
    assert [s for s, r in runs[3].items() if "probe/accuracy" in r] == [3, 6]
    assert all(runs[3][s]["loss/sft"] == runs[None][s]["loss/sft"] for s in (4, 8))


def ex_solution(trainer):
    return trainer.env.unwrapped.tasks[0].solution


def test_sft_accumulation_is_invariant(tiny_model_dir, tmp_path):
    grads = []
    for micro in (8, 2):
        seed_everything(0)
        model, tok = load_model(tiny_model_dir)
        cfg = SFTConfig.model_validate(
            {
                "env": ENV,
                "steps": 1,
                "batch_size": 8,
                "micro_batch_size": micro,
                "optim": {"lr": 1e-3, "max_grad_norm": None},
            }
        )
        SFTTrainer(cfg, model, tok, tmp_path / str(micro)).train_step()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-7)
