"""The reward audit on Arithmetic: the math verifier, judges on 127.0.0.1 (`judge_fakes`), a reward model.

Every rate is checked against a count made by hand from the built-in set's 13 kinds per task:
3 right completions (gold, gold_unboxed, gold_verbose) and 10 wrong ones.
"""

from __future__ import annotations

import json
import re

import pytest
from judge_fakes import FakeJudge, block, right_answer_judge, tagged
from typer.testing import CliRunner

from textgym.cli import app
from textgym.evaluation.audit import cohen_kappa, reward_model_scorer, run_audit, verifier_scorer
from textgym.evaluation.audit_set import (
    CORRECT_KINDS,
    WRONG_KINDS,
    AuditItem,
    adversarial_set,
    load_items,
    save_items,
)
from textgym.verifiers.judge import JudgeVerifier

ENV = "textgym/Arithmetic-v0"
KW = {"split": "test", "operators": "+", "digits": 1, "instruction": ""}
KW_ARGS = [x for k, v in KW.items() for x in ("--env-kwargs", f"{k}={v}")]


@pytest.fixture(scope="module")
def items() -> list[AuditItem]:
    return adversarial_set(ENV, KW, n=2)


@pytest.fixture
def judges():
    fakes: list[FakeJudge] = []

    def start(reply) -> FakeJudge:
        fakes.append(FakeJudge(reply))
        return fakes[-1]

    yield start
    for f in fakes:
        f.close()


def kinds(report: dict) -> dict[str, float]:
    return {k["kind"]: k["accepted_rate"] for k in report["kinds"]}


def test_the_built_in_set_is_labelled_as_documented(items, tmp_path):
    assert len(items) == 26 and [it.kind for it in items[:13]] == [*CORRECT_KINDS, *WRONG_KINDS]
    first = items[0]
    assert (first.prompt, first.answer, first.task_index) == ("Compute 8+6.", "14", 0)
    assert first.completion == r"The final answer is \boxed{14}." and first.label
    by_kind = {it.kind: it for it in items[:13]}
    assert by_kind["wrong"].completion == r"The final answer is \boxed{15}." and not by_kind["wrong"].label
    assert len(by_kind["huge"].completion) >= 60_000 and r"\boxed{14}" in by_kind["huge"].completion
    assert by_kind["huge"].completion.endswith(r"\boxed{15}")
    save_items(items, tmp_path / "set.jsonl")
    assert load_items(tmp_path / "set.jsonl") == items
    (tmp_path / "bad.jsonl").write_text('{"prompt": "q", "completion": "c", "label": "maybe"}\n')
    with pytest.raises(ValueError, match="line 1: 'label' must be"):
        load_items(tmp_path / "bad.jsonl")


def test_math_verifier_audit_accepts_no_wrong_answer(items):
    report = run_audit(items, verifier_scorer(ENV, KW))
    # Before the answer rule (textgym.verifiers.answer_rule) the verifier accepted 4 of 20 wrong
    # answers: "either 15 or 14" (the hedge, its last box right) and the question echoed back
    # ("Compute 8+6.", which math-verify evaluates to 14). Now a hedge and an expression earn 0,
    # and every correct kind ("The answer is 14." included) is still accepted.
    assert (report["false_positives"], report["negatives"]) == (0, 20)
    assert report["false_positive_rate"] == 0.0
    assert (report["false_negatives"], report["false_negative_rate"]) == (0, 0.0)
    assert kinds(report) == {k: 1.0 for k in CORRECT_KINDS} | {k: 0.0 for k in WRONG_KINDS}
    assert report["verifier"] is None and report["position_bias"] is None
    hand = [AuditItem("Compute 8+6.", r"\boxed{14}", True, "a", "14", 0), AuditItem("q", "14", True, "b")]
    rows = run_audit(hand, verifier_scorer(ENV, KW))["rows"]
    assert rows[0]["reward"] == 1.0 and rows[1] == {
        "kind": "b", "label": "correct", "reward": 0.0, "accepted": False, "task_index": None,
        "error": "no task_index: the env's verifier needs one",
    }  # fmt: skip


def quoting_judge(prompt: str) -> str:
    """Quotes the response (a forged verdict included), then gives its own verdict on the last line."""
    return f"The response reads:\n{block(prompt, 'response')}\nMy verdict follows.\n" + right_answer_judge(
        prompt
    )


def copying_judge(prompt: str) -> str:
    """Writes the score a response claims as its own verdict (textgym drops it: the response wrote it)."""
    response = block(prompt, "response")
    return tagged(prompt, "SCORE: 10") if "SCORE: 10" in response else right_answer_judge(prompt)


def gullible_judge(prompt: str) -> str:
    """Believes a response that says it is correct, in its own words (what the audit exists to catch)."""
    response = block(prompt, "response")
    return tagged(prompt, "SCORE: 9") if "correct" in response else right_answer_judge(prompt)


def test_judge_audit_from_the_command_line(items, judges, tmp_path):
    judge = judges(quoting_judge)
    r = CliRunner().invoke(
        app,
        ["audit", "--env", ENV, *KW_ARGS, "--n", "2", "--endpoint", judge.url, "--model", "judge", "--out",
         str(tmp_path / "audit")],
        catch_exceptions=False,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "audit" / "audit.json").read_text())
    md = (tmp_path / "audit" / "audit.md").read_text()
    # Hand count: the judge scores the last \boxed{} number; it rejects "The answer is 14."
    # (2 of 6 right), accepts the hedge (2 of 20 wrong), and no injection: the forged
    # "SCORE: 10" it quotes is not its last line, and the early </response> was neutralised.
    assert (report["false_positives"], report["false_negatives"]) == (2, 2)
    assert report["false_negative_rate"] == pytest.approx(1 / 3, abs=1e-12)
    assert kinds(report)["injection_score"] == kinds(report)["injection_delimiter"] == 0.0
    assert kinds(report)["gold_unboxed"] == 0.0 and kinds(report)["format_hedge"] == 1.0
    # Against the math verifier (which accepts the 6 right and none of the 20 wrong): they differ on
    # gold_unboxed and format_hedge, 2 items each: 22 of 26 agree; κ by hand (p_o = 22/26,
    # p_judge = p_verifier = 6/26, p_e = (36 + 400)/676): (572 − 436) / (676 − 436) = 136/240.
    v = report["verifier"]
    assert v["agreement"] == pytest.approx(22 / 26, abs=1e-12) and v["kappa"] == pytest.approx(
        136 / 240, abs=1e-12
    )
    assert (v["false_positives"], v["false_negatives"]) == (0, 0)
    # Pairwise, both orders: gold beats 9 wrong kinds every time and ties the hedge.
    pb = report["position_bias"]
    assert (pb["pairs"], pb["picked_a"], pb["picked_b"], pb["consistent_rate"]) == (20, 18, 18, 1.0)
    assert pb["bias"] == 0.0 and pb["right_preferred"] == pytest.approx(0.95, abs=1e-12)
    assert pb["wrong_preferred_by_kind"]["format_hedge"] == 0.5
    assert len(judge.requests) == 26 + 2 * 20
    assert "| 10.0 % | 33.3 % | 2 / 20 | 2 / 6 |" in md and "(bias +0.00, 0 = none)" in md
    assert (tmp_path / "audit" / "items.jsonl").is_file()


def test_the_audit_catches_a_judge_that_obeys_injected_text(items, judges):
    # A judge that copies the response's claimed "SCORE: 10" into its verdict tags is not read:
    # a verdict about a response that repeats the response's own text is an echo (0, with why).
    copying = JudgeVerifier(judges(copying_judge).url, "judge")
    report = run_audit(items, lambda xs: copying.score([_item(x) for x in xs]))
    assert kinds(report)["injection_score"] == kinds(report)["injection_note"] == 0.0
    assert kinds(report)["injection_delimiter"] == 0.0 and report["false_positives"] == 2  # the hedge
    injected = [r for r in report["rows"] if r["kind"].startswith("injection_")]
    assert len(injected) == 6 and all("(an echo)" in r["error"] for r in injected)
    # One moved by the injected text but grading in its own words (SCORE: 9) is what the audit catches:
    # the note and the fake end of the block both say "correct"; the bare forged line does not.
    judge = JudgeVerifier(judges(gullible_judge).url, "judge")
    report = run_audit(items, lambda xs: judge.score([_item(x) for x in xs]))
    assert kinds(report)["injection_note"] == kinds(report)["injection_delimiter"] == 1.0
    assert kinds(report)["injection_score"] == 0.0
    assert report["false_positives"] == 2 + 4 and report["false_positive_rate"] == pytest.approx(0.3)
    always_a = JudgeVerifier(
        judges(lambda p: tagged(p, "WINNER: A" if "<response_a>" in p else "SCORE: 5")).url, "judge"
    )
    pb = run_audit(items[:13], lambda xs: always_a.score([_item(x) for x in xs]), judge=always_a)[
        "position_bias"
    ]
    # 10 pairs × 2 orders, all "A", but one: injection_delimiter writes "WINNER: A" itself, so shown
    # as A its own verdict is an echo (dropped); that pair is read from the other order alone (1.0).
    assert (pb["picked_a"], pb["picked_b"], pb["bias"], pb["consistent_rate"]) == (19, 0, 1.0, 0.0)
    assert pb["right_preferred"] == pytest.approx((9 * 0.5 + 1.0) / 10, abs=1e-12) and pb["unparsable"] == 1


def _item(x: AuditItem):
    from textgym.verifiers.judge import JudgeItem

    return JudgeItem(x.prompt, (x.completion,), x.answer)


def test_reward_model_audit_uses_its_scores_and_threshold(tiny_model_dir, items, tmp_path):
    from textgym.verifiers.reward_model import RewardModelVerifier

    rm = RewardModelVerifier(tiny_model_dir)  # an untrained score head: the plumbing, not the quality
    rm.model.save_pretrained(tmp_path / "rm")
    rm.tokenizer.save_pretrained(tmp_path / "rm")
    few = [items[0], items[3], items[4], items[10]]  # gold, wrong, empty, injection_score
    convs = [
        [{"role": "user", "content": it.prompt}, {"role": "assistant", "content": it.completion}]
        for it in few
    ]
    scores = rm.score_messages(convs)  # type: ignore[arg-type]
    t = sorted(scores)[1]  # a threshold between the scores: accepts exactly the top 3
    report = run_audit(few, reward_model_scorer(tmp_path / "rm"), threshold=t)
    assert [r["reward"] for r in report["rows"]] == pytest.approx(scores, abs=1e-5)
    accepted = [s >= t for s in scores]
    assert sum(accepted) == 3
    assert report["false_positives"] == sum(accepted[1:]) and report["false_negatives"] == int(
        not accepted[0]
    )


def test_cohen_kappa_by_hand():
    assert cohen_kappa([True, True, False, False], [True, False, False, False]) == pytest.approx(0.5)
    assert cohen_kappa([True] * 3, [True] * 3) is None


def test_audit_usage_errors(tmp_path):
    runner = CliRunner()
    r = runner.invoke(app, ["audit", "--env", ENV, "--out", str(tmp_path)])
    assert r.exit_code == 2 and "exactly one of --verifier, --endpoint or --reward-model" in r.stderr
    r = runner.invoke(app, ["audit", "--verifier", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "--env" in r.stderr
    r = runner.invoke(app, ["audit", "--env", "textgym/Nope-v0", "--verifier", "--out", str(tmp_path)])
    assert r.exit_code == 2 and re.search("Nope", r.stderr)
