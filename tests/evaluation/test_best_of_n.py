"""Best-of-N with a process reward model in `textgym eval`, beside majority vote and pass@N."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from textgym.envs.arithmetic import ArithmeticTasks, check_steps, parse_expression
from textgym.evaluation.best_of_n import best_of_n, majority_pick, sample_counts
from textgym.evaluation.core import EvalResult
from textgym.verifiers.steps import split_steps

WORKED = {
    "split": "test",
    "operators": "+*",
    "digits": 1,
    "n_terms": 3,
    "worked_steps": True,
    "instruction": "",
}


def _result(answers: list[list[tuple[str, int]]]) -> EvalResult:
    episodes = [
        {
            "task_index": i,
            "sample": j,
            "correct": c,
            "messages": [{"role": "user", "content": f"task {i}"}, {"role": "assistant", "content": text}],
        }
        for i, samples in enumerate(answers)
        for j, (text, c) in enumerate(samples)
    ]
    N = len(answers[0])
    return EvalResult("e", len(answers), N, 0.0, 0.0, {}, 0.0, 0.0, 0.0, episodes=episodes)


def test_best_of_n_majority_and_pass_at_n_by_hand():
    b = "\\boxed{%s}"
    result = _result(
        [
            [(b % 5, 0), (b % 7, 1), (b % 5, 0), (b % 7, 1)],  # task 0: 7 is right
            [(b % 3, 1), ("no answer", 0), (b % 4, 0), (b % 4, 0)],  # task 1: 3 is right
        ]
    )
    scores = [[0.2, 0.9, 0.1, 0.9], [0.5, 0.6, 0.4, 0.1]]
    rows = best_of_n(result, scores)
    assert [r["n"] for r in rows] == [1, 2, 4]
    # n = 1: the first samples (0, 1); n = 2: picks 1 (0.9) and 1 (0.6, wrong);
    # n = 4: 1 (a tie at 0.9: the first) and 1
    assert [r["best_of_n"] for r in rows] == [0.5, 0.5, 0.5]
    # majority: n = 1: 5 (wrong), 3 (right); n = 2: tie 5/7 -> 5, 3 (the unanswered one does not vote);
    # n = 4: tie 5/7 -> 5 first; 4 twice beats 3
    assert [r["majority"] for r in rows] == [0.5, 0.5, 0.0]
    # pass@n: task 0 has 2 of 4 right, task 1 has 1 of 4
    assert rows[0]["pass_at_n"] == pytest.approx((0.5 + 0.25) / 2)
    assert rows[1]["pass_at_n"] == pytest.approx(((1 - 1 / 6) + 0.5) / 2)
    assert rows[2]["pass_at_n"] == 1.0 and all(r["mean"] == 3 / 8 for r in rows)
    assert best_of_n(result, scores, ns=[3])[0]["best_of_n"] == 0.5
    with pytest.raises(ValueError, match=r"1\.\.4"):
        best_of_n(result, scores, ns=[5])
    with pytest.raises(ValueError, match="4 scores"):
        best_of_n(result, [[0.0] * 3] * 2)
    assert sample_counts(5) == [1, 2, 4, 5] and majority_pick(["x", "\\boxed{ 2 }", "\\boxed{2}"]) == 1


@pytest.fixture(scope="module")
def prm_dir(tiny_model_dir, tmp_path_factory):
    """A PRM trained for one epoch on worked solutions and left-to-right slips (any PRM folder will do)."""
    from textgym.config import PRMConfig
    from textgym.trainers.reward.prm import train_prm

    rows = []
    for i, t in enumerate(ArithmeticTasks("train", "+*", 1, 3, 25, worked_steps=True)[:16]):
        nums, ops = parse_expression(t.metadata["expression"])
        labels = check_steps(t.solution, nums, ops)
        ends = [s.end for s in split_steps(t.solution)]
        msgs = [{"role": "user", "content": t.prompt}]
        rows.append(
            {"task_index": i, "messages": msgs, "response": t.solution, "step_ends": ends, "soft": labels}
        )
    out = tmp_path_factory.mktemp("bon") / "prm"
    train_prm(rows, tiny_model_dir, out, PRMConfig(epochs=1, batch_size=8, eval_fraction=0.0), log_with=())
    return out


def test_textgym_eval_reports_best_of_n_by_the_prm(warm_model_dir, prm_dir):
    """The warm model (1-digit sums, right about a quarter of the time greedily) sampled at T = 1."""
    import torch

    from textgym.cli import app
    from textgym.verifiers.prm import PRMVerifier

    torch.manual_seed(0)
    args = ["eval", "--env", "textgym/Arithmetic-v0", "--model", str(warm_model_dir), "--n", "8"]
    args += ["--samples", "4", "--temperature", "1", "--max-new-tokens", "8", "--prm", str(prm_dir)]
    args += [f"--env-kwargs={kv}" for kv in ("split=test", "operators=+", "digits=1", "instruction=")]
    r = CliRunner().invoke(app, [*args, "--json", "--show", "32"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output[r.output.index("{") :].splitlines()[0])  # after any progress bars
    rows, episodes = summary["best_of_n"], summary["episodes"]
    assert [row["n"] for row in rows] == [1, 2, 4]
    assert 0 < summary["accuracy"] < 1  # some samples right, some wrong: the picks matter
    # recomputed through the verifier's own call (the prompt is the task's, the instruction is empty)
    prm, tasks = PRMVerifier(prm_dir), ArithmeticTasks("test", "+", 1, 2)
    for row in rows:
        n, hits = row["n"], 0
        for i in range(8):
            eps = episodes[4 * i : 4 * i + n]
            scores = [prm(e["messages"][-1]["content"], tasks[i]).reward for e in eps]
            hits += eps[max(range(n), key=lambda j, s=scores: (s[j], -j))]["correct"]
        assert row["best_of_n"] == pytest.approx(hits / 8)
        assert row["mean"] == pytest.approx(summary["accuracy"])
    assert rows[-1]["pass_at_n"] >= rows[-1]["best_of_n"]  # with all N samples, no pick beats "any is right"
    assert rows[0]["best_of_n"] == pytest.approx(sum(episodes[4 * i]["correct"] for i in range(8)) / 8)
    # the table, and the errors
    r = CliRunner().invoke(app, args, catch_exceptions=False)
    assert r.exit_code == 0 and "best-of-n (PRM)" in r.output and "majority vote" in r.output
    one = [a if a != "4" else "1" for a in args]
    r = CliRunner().invoke(app, one, catch_exceptions=False)
    assert r.exit_code == 2 and "--samples N" in r.output
