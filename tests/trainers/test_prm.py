"""The process reward model: Monte-Carlo step labels, training at the step tokens only, save/load,
learning on a small set, the env wrapper, and `textgym prm label/train`."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch
import yaml
from typer.testing import CliRunner

import textgym  # noqa: F401
from textgym.config import EnvConfig, OptimConfig, PRMConfig
from textgym.envs.arithmetic import ArithmeticTasks, check_steps, evaluate, parse_expression
from textgym.offline.prm_labels import Answer, env_judge, mc_step_labels
from textgym.trainers.reward.prm import PRMTrainer, step_bce, train_prm
from textgym.verifiers.prm import PRMVerifier, aggregate_scores, encode_steps
from textgym.verifiers.steps import split_steps

WORKED = {"operators": "+*", "digits": 1, "n_terms": 3, "worked_steps": True, "instruction": ""}
TEST_ENV = EnvConfig(id="textgym/Arithmetic-v0", kwargs={**WORKED, "split": "test"})


def test_mc_labels_on_a_hand_case_with_a_scripted_sampler():
    """Task 2 is 2+6*3 = 20; the answer slips at its second step."""
    response = "6*3=18\n2+18=21\n\\boxed{21}"
    env = gym.make("textgym/Arithmetic-v0", **TEST_ENV.kwargs).unwrapped
    messages, _ = env.reset(options={"task_index": 2})
    answer = Answer(
        2, "t/2", messages, response, [s.end for s in split_steps(response)], [1.0, 0.0, 0.0], 0.0
    )
    script = {
        "6*3=18": ["\n2+18=20\n\\boxed{20}", "\n2+18=21\n\\boxed{21}", "\n\\boxed{20}", "\n\\boxed{19}"],
        "6*3=18\n2+18=21": ["\n\\boxed{21}", "\n\\boxed{20}", "\n\\boxed{21}", "\n\\boxed{22}"],  # a recovery
        response: ["", "", " ", ""],
    }
    seen = []

    def sample(requests, k):
        seen.extend(requests)
        return [script[prefix][:k] for _, prefix in requests]

    (row,) = mc_step_labels([answer], sample, env_judge(TEST_ENV, threads=2), k=4)
    assert [p for _, p in seen] == list(script) and all(m == messages for m, _ in seen)
    assert row["soft"] == [0.5, 0.25, 0.0] and row["hard"] == [1.0, 1.0, 0.0]
    assert row["env_step_rewards"] == [1.0, 0.0, 0.0] and row["continuations"] == 4
    assert row["response"] == response and row["step_ends"] == [6, 14, 25]
    (row,) = mc_step_labels([answer], sample, env_judge(TEST_ENV, threads=1), k=2)
    assert row["soft"] == [0.5, 0.5, 0.0] and row["hard"] == [1.0, 1.0, 0.0]  # the first 2 of each
    with pytest.raises(ValueError, match="2 continuations"):
        mc_step_labels([answer], lambda r, k: [["x"]] * len(r), env_judge(TEST_ENV, threads=1), k=2)


def _rows(n_tasks: int, start: int = 0) -> list[dict]:
    """Answers to "+*" problems that mix both operators: the worked solution (every step right) and
    a left-to-right one (its first step out of precedence: every step wrong); labels = the checker."""
    tasks = ArithmeticTasks("train", "+*", 1, 3, 25, worked_steps=True)
    rows, i = [], start
    while len(rows) < 2 * n_tasks:
        t, ti = tasks[i], i
        i += 1
        nums, ops = parse_expression(t.metadata["expression"])
        if sorted(ops) != ["*", "+"]:
            continue
        first = nums[0] + nums[1] if ops[0] == "+" else nums[0] * nums[1]
        last = first + nums[2] if ops[1] == "+" else first * nums[2]
        if last == evaluate(nums, ops):
            continue
        wrong = f"{nums[0]}{ops[0]}{nums[1]}={first}\n{first}{ops[1]}{nums[2]}={last}\n\\boxed{{{last}}}"
        for response in (t.solution, wrong):
            labels = check_steps(response, nums, ops)
            rows.append(
                {
                    "task_index": ti,
                    "task_id": t.task_id,
                    "messages": [{"role": "user", "content": t.prompt}],
                    "response": response,
                    "step_ends": [s.end for s in split_steps(response)],
                    "soft": labels,
                    "hard": labels,
                    "env_step_rewards": labels,
                    "correct": labels[-1],
                }
            )
    return rows


def test_the_loss_only_touches_the_step_tokens(tiny_model_dir):
    from transformers import AutoModelForTokenClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForTokenClassification.from_pretrained(tiny_model_dir, num_labels=1)
    rows = _rows(2)[:3]
    encoded = [encode_steps(tok, r["messages"], r["response"], r["step_ends"]) for r in rows]
    from textgym.verifiers.reward_model import pad_rows

    ids, mask = pad_rows([e[0] for e in encoded], 0)
    logits = model(input_ids=ids, attention_mask=mask).logits[..., 0]
    logits.retain_grad()
    positions = [e[1] for e in encoded]
    targets = torch.tensor([y for r in rows for y in r["soft"]])
    loss, stats = step_bce(logits, positions, targets)
    loss.backward()
    touched = torch.zeros_like(logits, dtype=torch.bool)
    for i, p in enumerate(positions):
        touched[i, p] = True
    assert bool((logits.grad[~touched] == 0).all()) and bool((logits.grad[touched] != 0).all())
    z = torch.cat([logits[i, p] for i, p in enumerate(positions)]).detach()
    manual = -(targets * torch.log(torch.sigmoid(z)) + (1 - targets) * torch.log(1 - torch.sigmoid(z))).mean()
    assert float(loss.detach()) == pytest.approx(float(manual), abs=1e-6) == stats["loss/prm"]
    # each step token holds its step's last character: decoding the response up to it ends the step
    for (row_ids, pos), r in zip(encoded, rows, strict=True):
        prompt_len = len(row_ids) - len(tok(r["response"], add_special_tokens=False)["input_ids"])
        for p, end in zip(pos, r["step_ends"], strict=True):
            text = tok.decode(row_ids[prompt_len : p + 1])
            assert text == r["response"][:end]


@pytest.fixture(scope="module")
def trained_prm(tiny_model_dir, tmp_path_factory):
    out = tmp_path_factory.mktemp("prm") / "model"
    cfg = PRMConfig(epochs=1, batch_size=8, micro_batch_size=3, eval_fraction=0.25, aggregate="product")
    res = train_prm(_rows(8), tiny_model_dir, out, cfg, log_with=())
    return out, res


def test_save_and_load_round_trip(trained_prm, tiny_model_dir):
    out, res = trained_prm
    meta = json.loads((out / "textgym.json").read_text())
    assert meta["role"] == "process_reward_model" and meta["aggregate"] == "product" and meta["steps"] == 2
    assert res["heldout_answers"] == 4 and res["train_answers"] == 12
    # the folder reloads into the same scores the trainer's model gives
    rows = _rows(8)
    trainer = PRMTrainer(rows, out, out.parent / "again", PRMConfig(epochs=1), log_with=())
    with torch.no_grad():
        z = trainer._logits([0, 1])
    expected = [torch.sigmoid(z[i, trainer.positions[i]]).tolist() for i in (0, 1)]
    prm = PRMVerifier(out)
    got = prm.score_steps([(r["messages"], r["response"], r["step_ends"]) for r in rows[:2]])
    for g, e in zip(got, expected, strict=True):
        assert g == pytest.approx(e, abs=1e-6)
    assert prm.aggregate == "product"
    task = ArithmeticTasks("train", "+*", 1, 3, 25)[rows[0]["task_index"]]
    score = prm(rows[0]["response"], task)
    assert score.details["step_scores"] == pytest.approx(got[0], abs=1e-6)
    assert score.reward == pytest.approx(aggregate_scores(got[0], "product"), abs=1e-6)
    assert PRMVerifier(out, aggregate="last")(rows[0]["response"], task).reward == pytest.approx(got[0][-1])


def test_micro_batches_leave_the_gradient_unchanged(tiny_model_dir, tmp_path):
    rows = _rows(4)
    grads = []
    for mb in (None, 3):
        cfg = PRMConfig(epochs=1, batch_size=8, micro_batch_size=mb, eval_fraction=0.0)
        trainer = PRMTrainer(rows, tiny_model_dir, tmp_path / str(mb), cfg, log_with=())
        trainer.train_step()
        grads.append(torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)


@pytest.mark.learning
def test_step_accuracy_improves_on_a_small_set(tiny_model_dir, tmp_path):
    """A step is right here exactly when the answer's first step is the product (precedence): the PRM
    must read the first line's operator. Held-out answers are those of other problems."""
    cfg = PRMConfig(epochs=8, batch_size=16, eval_fraction=0.25, optim=OptimConfig(lr=1e-3, warmup_steps=5))
    res = train_prm(_rows(64), tiny_model_dir, tmp_path / "prm", cfg, log_with=())
    assert res["heldout_steps"] == 16 * 2 * 3
    assert res["heldout_majority_baseline"] == pytest.approx(0.5)
    # measured 0.479 -> 0.969 (seed 0, AVX-512 kernels, 2 threads)
    assert res["heldout_step_accuracy"] >= 0.85, res
    assert res["heldout_step_accuracy"] >= res["heldout_step_accuracy_before"] + 0.3
    assert res["heldout_gold_step_accuracy"] == res["heldout_step_accuracy"]  # labels are the checker's here


def test_the_env_wrapper_puts_the_prms_step_scores_in_info(trained_prm):
    from textgym.training.envs import make_env

    out, _ = trained_prm
    env = make_env(
        EnvConfig(
            id="textgym/Arithmetic-v0", kwargs={**WORKED, "split": "test"}, process_reward_model=str(out)
        )
    )
    messages, _ = env.reset(options={"task_index": 2})
    answer = "6*3=18\n2+18=21\n\\boxed{21}"
    _, reward, _, _, info = env.step(answer)
    (scores,) = PRMVerifier(out).score_steps([(messages, answer, None)])
    assert info["prm_step_scores"] == pytest.approx(scores, abs=1e-6) and info["step_ends"] == [6, 14, 25]
    # "delta" (the default): potential-based shaping, the rewards telescope to the last score
    deltas = [scores[0], scores[1] - scores[0], scores[2] - scores[1]]
    assert info["step_rewards"] == pytest.approx(deltas, abs=1e-6)
    assert sum(info["step_rewards"]) == pytest.approx(scores[-1], abs=1e-6)
    assert info["env_step_rewards"] == [1.0, 0.0, 0.0] and reward == 0.0 and info["reward/correct"] == 0.0
    assert info["reward/prm"] == pytest.approx(aggregate_scores(scores, "product"))
    cfg = EnvConfig(id="textgym/Arithmetic-v0", kwargs=TEST_ENV.kwargs, process_reward_model=str(out))
    env = make_env(cfg.model_copy(update={"process_reward": "score"}))
    env.reset(options={"task_index": 2})
    _, _, _, _, info = env.step(answer)
    assert info["step_rewards"] == pytest.approx(scores, abs=1e-6)
    from textgym.config import ConfigError, validate_runtime

    with pytest.raises(ConfigError, match=r"process_reward_model.*prm train"):
        validate_runtime(EnvConfig(id="textgym/Arithmetic-v0", process_reward_model=str(out.parent / "none")))


def test_prm_label_and_train_commands(tiny_model_dir, tmp_path):
    from textgym.cli import app

    config = tmp_path / "prm.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "name": "prm_cli",
                "out_dir": str(tmp_path / "runs"),
                "model": {"path": str(tiny_model_dir)},
                "prm": {
                    "label": {
                        "env": {"id": "textgym/Arithmetic-v0", "kwargs": {**WORKED, "split": "test"}},
                        "tasks": 3,
                        "continuations": 2,
                        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
                    },
                    "epochs": 1,
                    "eval_fraction": 0.0,
                },
            }
        )
    )
    runner = CliRunner()
    r = runner.invoke(app, ["prm", "label", str(config), "prm.label.samples=2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    labels = tmp_path / "runs" / "prm_cli" / "prm" / "labels.jsonl"
    rows = [json.loads(line) for line in labels.read_text().splitlines()]
    assert len(rows) == 6 and all(len(r["soft"]) == len(r["step_ends"]) == len(r["hard"]) for r in rows)
    assert all(r["env_step_rewards"] is not None for r in rows) and "6 answers" in r.output
    r = runner.invoke(app, ["prm", "train", str(config)], catch_exceptions=False)
    if any(row["step_ends"] for row in rows):
        assert r.exit_code == 0, r.output
        assert (tmp_path / "runs" / "prm_cli" / "prm" / "model" / "config.json").is_file()
    r = runner.invoke(app, ["prm", "label", str(config), "prm.label.tasks=999"], catch_exceptions=False)
    assert r.exit_code == 2 and "exceed" in r.output
    r = runner.invoke(app, ["prm", "train", str(config), "prm.target=maybe"], catch_exceptions=False)
    assert r.exit_code == 2 and "prm.target" in r.output
