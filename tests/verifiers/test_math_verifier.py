from __future__ import annotations

import json
import re
import time

import pytest
from conftest import TEST_DATA

from textgym.envs.math_qa import gsm8k_tasks, math500_tasks
from textgym.types import Task
from textgym.verifiers import FormatVerifier, MathVerifier, Rubric, RubricTerm, extract_answer, math_equal


@pytest.mark.parametrize(
    ("text", "answer", "kind"),
    [
        ("first \\boxed{1} then \\boxed{\\frac{1}{2}}", "\\frac{1}{2}", "boxed"),  # the last box wins
        ("\\boxed{\\{1, 2\\}} done", "\\{1, 2\\}", "boxed"),  # braces balanced
        ("\\fbox{4}", "4", "boxed"),
        ("<answer> 42 </answer> and <answer>43</answer>", "43", "answer_tag"),
        ("<ANSWER>7</ANSWER>", "7", "answer_tag"),
        ("work\n#### 1,234\nmore text", "1,234", "hashes"),
        ("So the answer is 18 apples. Next", "18 apples", "answer_is"),
        ("The final answer is: $x=3$.", "$x=3$", "answer_is"),
        ("<answer>5</answer> but \\boxed{6}", "6", "boxed"),  # boxed outranks the tag
        ("no marker here 12", None, None),
        ("\\boxed{unclosed", None, None),
    ],
)
def test_extract_answer(text, answer, kind):
    got = extract_answer(text)
    if answer is None:
        assert got is None
    else:
        assert got is not None and (got.text, got.kind) == (answer, kind)


@pytest.mark.parametrize(
    "text",
    [
        "<answer>" * 40_000,  # quadratic for a naive lazy regex
        "\\boxed{" * 30_000,
        "x" * 200_000,
        "the answer is " * 20_000,
        "{" * 100_000 + "\\boxed{1}",
    ],
)
def test_extraction_is_linear_on_adversarial_input(text):
    start = time.perf_counter()
    extract_answer(text)
    assert time.perf_counter() - start < 2.0


@pytest.mark.parametrize(
    "completion",
    [
        "\\boxed{10^{10^{10}}}",
        "\\boxed{9^{9^{9^{9}}}}",
        "x" * 200_000,
        "\x00\\boxed{3\x00}\x00",
        "\\boxed{" + "(" * 5000 + "}",
        "\\boxed{\\frac{1}{0}}",
        "\\boxed{\ud800}",
    ],
)
def test_pathological_input_is_bounded_and_never_raises(completion):
    v = MathVerifier(timeout_s=3.0)
    start = time.perf_counter()
    s = v(completion, Task("t", "q", "3"))
    # bounded by the verifier's timeout plus a worker restart, never an exception
    assert time.perf_counter() - start < 3.0 + 60.0
    assert s.reward == 0.0


def test_timeout_kills_and_replaces_the_worker():
    v = MathVerifier(timeout_s=1.0)
    # math-verify's own 1 s alarms handle this one; ask for a hard kill with a tiny budget instead
    res = math_equal("3", "\\boxed{10^{10^{10}}}", timeout_s=0.05)
    assert res["equal"] is False and "did not answer" in res["error"]
    assert v("\\boxed{3}", Task("t", "q", "3")).reward == 1.0  # a fresh worker answers


def test_equivalence_is_math_not_strings():
    v = MathVerifier()
    t = Task("t", "q", "\\frac{1}{2}")
    assert v("\\boxed{0.5}", t).reward == 1.0
    assert v("\\boxed{\\dfrac{1}{2}}", t).reward == 1.0
    assert v("\\boxed{1/2}", t).reward == 1.0
    unreduced = v("\\boxed{\\dfrac{2}{4}}", t)  # the answer rule: a fraction is written in lowest terms
    assert unreduced.reward == 0.0 and unreduced.details["refused"] == "expression"
    assert v("\\boxed{0.51}", t).reward == 0.0
    assert v("#### 1,000", Task("t", "q", "1000")).reward == 1.0
    assert v("The answer is $18.", Task("t", "q", "18")).reward == 1.0
    s = v("I cannot tell", Task("t", "q", "18"))
    assert s.reward == 0.0 and s.details["error"]


def test_rubric_weights_and_weight_zero_terms():
    r = Rubric([RubricTerm("correct", MathVerifier(), 1.0), RubricTerm("format", FormatVerifier(), 0.0)])
    s = r("\\boxed{4}", Task("t", "q", "4"))
    assert s.reward == 1.0 and s.details["reward/format"] == 1.0
    s = r("4", Task("t", "q", "4"))
    assert s.details["reward/format"] == 0.0
    with pytest.raises(ValueError, match="unique"):
        Rubric([RubricTerm("a", FormatVerifier()), RubricTerm("a", FormatVerifier())])


# --- Math-Verify's own equivalence cases ---------------------------------------------------------

CASES = [json.loads(line) for line in (TEST_DATA / "math_verify_cases" / "math_equiv_cases.jsonl").open()]

# Rows where textgym's MathVerifier (its own extraction: the last \boxed{} wins; fixed defaults
# precision=6, strict=True, no set-relation comparison) decides differently from the harness
# recorded in the file. Each is explained in the README ("Math-Verify cases").
VERIFIER_EXCEPTIONS = {
    # several \boxed{} answers, gold is all of them; textgym takes the last box only
    184,
    207,
    237,
    238,
    239,
    241,
    243,
    244,
    248,
    249,
    250,
    251,
    # the test passes non-default parameters (precision, strict=False, set-relation comparison)
    6,
    126,
    134,
    140,
    187,
    255,
    # the test restricts extraction to LaTeX only; textgym also reads plain expressions
    31,
    32,
    # "The final answer is $10,455$" after an earlier \boxed{255}: textgym's box priority wins
    173,
    # math-verify quirk recorded as expected_equal=True for 1-1/e vs 1+1/e with default configs
    265,
    # the answer rule (textgym.verifiers.answer_rule): no marker and two different numbers in
    # the answer's sentence name no single answer (a European decimal comma reads as two numbers;
    # "not 10 which is 1,000.99"; "1/3 \approx 11")
    5,
    7,
    13,
    14,
    15,
    16,
    101,
    104,
    # the answer rule: the gold is a number and the answer an expression to evaluate
    30,
    189,
    # the answer rule: a fraction not in lowest terms is a division left to do (`\frac3{3}` for 1)
    37,
    # exact answers are exact (issue 61): a decimal is the number it writes, `0.0833333333333333`
    # is not 1/12 (math-verify rounds both to 6 places)
    127,
}


def _harness(row):
    p = row["params"]
    if p is None:
        return math_equal(
            row["gold"],
            row["pred"],
            gold_match=("latex_default", "expr"),
            pred_match=("latex_default", "expr"),
        )
    mt = tuple(p["match_types"])
    return math_equal(
        row["gold"],
        row["pred"],
        gold_match=mt,
        pred_match=mt,
        float_rounding=p["precision"],
        strict=p["strict"],
        allow_set_relation_comp=p["allow_set_relation_comp"],
    )


def test_math_verify_cases_behave_as_recorded():
    assert len(CASES) == 270
    mismatches = [r["id"] for r in CASES if _harness(r)["equal"] != r["expected_equal"]]
    assert mismatches == []


def test_math_verifier_on_math_verify_cases_differs_only_where_documented():
    v = MathVerifier()
    differs = {
        r["id"]
        for r in CASES
        if (v(r["pred"], Task("t", "q", r["gold"])).reward == 1.0) != r["expected_equal"]
    }
    assert differs == VERIFIER_EXCEPTIONS


# --- every gold answer passes its own verifier, and a wrong number fails -------------------------


def _wrong(answer: str) -> str:
    m = re.search(r"\d", answer)
    if m is None:
        return "7"
    return answer[: m.start()] + str((int(m.group()) + 1) % 10) + answer[m.end() :]


@pytest.mark.parametrize("name", ["gsm8k_test", "math500"])
def test_every_gold_answer_passes_and_a_wrong_one_fails(name):
    tasks = gsm8k_tasks("test") if name == "gsm8k_test" else math500_tasks()
    v = MathVerifier()
    failed_gold = [
        t.task_id for t in tasks if v(f"Work... so the answer is \\boxed{{{t.answer}}}.", t).reward != 1.0
    ]
    passed_wrong = [t.task_id for t in tasks if v(f"\\boxed{{{_wrong(t.answer)}}}", t).reward != 0.0]
    assert failed_gold == [] and passed_wrong == []


def test_gsm8k_train_gold_solutions_pass():
    v = MathVerifier()
    assert [t.task_id for t in gsm8k_tasks("train") if v(t.solution, t).reward != 1.0] == []


@pytest.mark.parametrize(
    ("completion", "gold", "reward"),
    [
        ("\\boxed{128}", "128", 1.0),
        ("so \\boxed{118}", "128", 2 / 3),  # the carry into the tens place missed
        ("\\boxed{28}", "128", 2 / 3),  # a missing hundreds digit costs its share
        ("\\boxed{1128}", "128", 3 / 4),  # an extra digit too
        ("\\boxed{821}", "128", 1 / 3),  # places are aligned at the units digit
        ("\\boxed{007}", "7", 1.0),  # leading zeros are not places
        ("\\boxed{-7}", "7", 0.0),  # a wrong sign scores nothing
        ("\\boxed{-12}", "-13", 0.5),
        ("\\boxed{1,024}", "1024", 1.0),
        ("\\boxed{12.5}", "12", 0.0),  # not an integer
        ("\\boxed{}", "12", 0.0),
        ("12", "12", 0.0),  # no final-answer marker
        ("", "12", 0.0),
    ],
)
def test_digit_match_gives_the_share_of_right_digit_places(completion, gold, reward):
    from textgym.verifiers import DigitMatchVerifier

    s = DigitMatchVerifier()(completion, Task("t", "q", gold))
    assert s.reward == pytest.approx(reward, abs=1e-12)
    if reward == 1.0:  # full credit exactly where the exact-match term gives 1
        assert MathVerifier()(completion, Task("t", "q", gold)).reward == 1.0
    if reward == 0.0 and completion != "\\boxed{-7}":
        assert "error" in s.details


def test_digit_match_is_exact_only_for_the_right_answer_and_needs_an_integer_gold():
    import random

    from textgym.verifiers import DigitMatchVerifier

    v, rng = DigitMatchVerifier(), random.Random(0)
    for _ in range(500):
        gold, pred = rng.randrange(0, 2000), rng.randrange(0, 2000)
        r = v(f"\\boxed{{{pred}}}", Task("t", "q", str(gold))).reward
        assert 0.0 <= r <= 1.0 and (r == 1.0) == (pred == gold)
    with pytest.raises(ValueError, match="integer gold answer"):
        v("\\boxed{1}", Task("t", "q", "\\frac{1}{2}"))


def test_arithmetic_logs_digit_match_and_weights_it_only_when_asked():
    import gymnasium as gym

    import textgym  # noqa: F401

    for weight in (0.0, 0.5):
        env = gym.make("textgym/Arithmetic-v0", operators="+", instruction="", digit_match_weight=weight)
        env.reset(options={"task_index": 0})
        gold = env.unwrapped.task.answer
        wrong = str(int(gold) + 10 if int(gold) % 100 < 90 else int(gold) - 10)  # tens place wrong
        places = len(gold)
        _, r, _, _, info = env.step(f"\\boxed{{{wrong}}}")
        assert info["reward/correct"] == 0.0
        assert info["reward/digit_match"] == pytest.approx((places - 1) / places)
        assert r == pytest.approx(weight * (places - 1) / places)
