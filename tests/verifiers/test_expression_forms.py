"""Structural forms (textgym.verifiers.expression_forms) and the answer rule's use of them: what is one
form and what is not, what a question poses, and bounded, exception-free behaviour on any input."""

from __future__ import annotations

import time

import pytest

from textgym.types import Task
from textgym.verifiers import MathVerifier
from textgym.verifiers.answer_rule import check_answer
from textgym.verifiers.answer_text import fraction_parts, in_lowest_terms, unwrap
from textgym.verifiers.expression_forms import MAX_DEPTH, value_form
from textgym.verifiers.question_expressions import posed, posed_fractions, posed_texts
from textgym.verifiers.restatement import restates

SAME = [  # each group: one form
    [r"84/12", r"\frac{84}{12}", r"\dfrac{84}{12}", r"84 \div 12", r"(84)/(12)", r"84 \cdot 12^{-1}",
     r"\frac{-84}{-12}", r"12^{-1}\times 84", r"84÷12", r"84 ∕ 12", r"８４/１２", r"84*12**-1",
     r"\frac{84.0}{12}", r"\frac{84\cdot 2}{12\cdot 2}", r"\frac{1}{\frac{12}{84}}", r"84:12",
     r"\left(\frac{84}{12}\right)^{1}+0"],
    [r"(-k + 4) + (-2 + 3k)", r"(3k-2)+(4-k)", r"-(k-4)+3k-2", r"4-k+3k-2+5-5",
     r"((4-k)+(3k-2))\cdot(2-1)", r"e^{\ln((-k+4)+(-2+3k))}", r"\left(\sqrt{(-k+4)+(-2+3k)}\right)^2",
     r"(-k+4)+(-2+3k)+3-1-2"],
    [r"\sqrt{242}", r"242^{1/2}", r"242^{0.5}", r"√242", r"\sqrt{242}\cdot 1"],
    [r"a-b", r"-(b-a)", r"-b+a", r"−b+a"],
    [r"x^{-1}", r"\frac{1}{x}", r"1/x", r"\left(x^{-1}\right)^{1}"],
    [r"k = 2k+2", r"2+2k", r"2k + 2 \cdot 1"],
]  # fmt: skip
DIFFERENT = [  # pairs with different forms: an evaluation, a computation or another value
    ("7", r"\frac{84}{12}"), (r"\frac{168}{24}", r"\frac{84}{12}"), ("4+3", "7"), ("3/2", "6/4"),
    ("1.5", "3/2"),
    ("x^2", "x x"), ("x^6", "(x^2)^3"), ("2k+2", "(-k+4)+(-2+3k)"), (r"11\sqrt{2}", r"\sqrt{242}"),
    (r"\frac{40r^9}{8r^4}", r"\frac{(10r^3)(4r^6)}{8r^4}"), ("a-b", "b-a"), ("2(k+1)", "2k+2"),
]  # fmt: skip


@pytest.mark.parametrize("group", SAME, ids=[g[0] for g in SAME])
def test_notation_order_signs_and_identities_are_one_form(group):
    forms = {text: value_form(text) for text in group}
    assert forms[group[0]] is not None
    assert [t for t, f in forms.items() if f != forms[group[0]]] == []


@pytest.mark.parametrize(("a", "b"), DIFFERENT)
def test_a_computation_is_another_form(a, b):
    fa, fb = value_form(a), value_form(b)
    assert fa is not None and fb is not None and fa != fb


def test_what_a_question_poses():
    assert posed_texts("Compute 5+12*3.") == ["5+12*3"]
    assert posed_texts(r"If $f(x) = \frac{3x-2}{x-2}$, what is $f(-2)$?") == [
        "f(x)",
        r"\frac{3x-2}{x-2}",
        "f(-2)",
    ]
    assert posed_texts("Expand: \\begin{align*}\nx(x+1)-3\n\\end{align*}") == ["x(x+1)-3"]
    assert posed_texts("Janet's ducks lay 16 eggs per day.") == []
    assert posed_fractions(r"Compute $\frac{1}{5}\cdot \frac{8}{7}\div \frac{12}{20}$ and 9/3, not 1/0.") == [
        [1, 5], [8, 7], [12, 20], [9, 3]
    ]  # fmt: skip
    p = posed("Compute 84/12.")
    assert p["fractions"] == [[84, 12]] and p["expressions"] == ["84/12"] and len(p["forms"]) == 1
    assert posed(r"What is $5$ more than $x$?")["forms"] == []  # single numbers and symbols pose nothing


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        (r"\text{148}", "148"), (r"\mathbf{148}", "148"), (r"\displaystyle 148", "148"),
        (r"\textbf{148}", "148"), (r"\mathrm{148}", "148"), (r"{\bf 148}", "148"), (r"\,148\;", "148"),
        (r"{{148}}", "148"), (r"\textcolor{red}{148}", "148"), (r"10,\!080", "10,080"),
        (r"\text{either 3 or 4}", "either 3 or 4"), (r"\mathbf{\frac{84}{12}}", r"\frac{84}{12}"),
        (r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}", r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"),
    ],
)  # fmt: skip
def test_unwrap(text, plain):
    assert unwrap(text) == plain
    assert unwrap(r"864 \mbox{ inches}^2", keep_words=True) == r"864 \mbox{ inches}^2"


def test_fractions_in_lowest_terms():
    assert [fraction_parts(x) for x in (r"\frac{6}{4}", r"\frac64", "-3/2", r"-\frac{-3}{2}", "1.5")] == [
        (6, 4), (6, 4), (-3, 2), (3, 2), None
    ]  # fmt: skip
    assert [in_lowest_terms(x) for x in ("3/2", "-3/2", "6/4", "7/1", "0/5", "1/0", "7", "0.5")] == [
        True, True, False, False, False, False, True, True
    ]  # fmt: skip


def test_restates_exempts_the_gold_and_numbers():
    q = r"Simplify $\sqrt{242}$."
    assert restates(r"\sqrt{242}", q, r"11\sqrt2") is True
    assert restates(r"\sqrt{242}", q, r"\sqrt{242}") is False  # the gold as written
    assert restates(r"242^{1/2}", q, r"\sqrt{242}") is False  # the gold's form
    assert restates("242", q) is False and restates("x", "Solve $x+1=2$ for $x$.") is False
    assert restates("Evelyn", "Which of Evelyn, Ann or Bo is fastest?") is False  # words from the question
    assert restates(r"\frac{3}{8}", r"Write $\frac{3}{8}$ as a decimal.", "0.375") is True


def test_an_integer_answer_is_never_parsed(monkeypatch):
    import textgym.verifiers.restatement as restatement

    def no_parse(*args, **kwargs):
        raise AssertionError("parsed")

    monkeypatch.setattr(restatement, "read_forms", no_parse)
    assert check_answer(r"\boxed{7}", "Compute 84/12.", "7").compare == "7"
    assert check_answer("So she has 18 apples.", "How many?", "18").compare == "18"
    assert check_answer(r"\boxed{\text{7.5}}", "Compute 15/2.", "7.5").compare == "7.5"


def test_an_answer_too_deep_or_too_slow_to_read_is_not_paid():
    task = Task("t", r"Simplify $(-k + 4) + (-2 + 3k)$.", "2k+2")
    deep = "(" * (MAX_DEPTH + 1) + "2k+2" + ")" * (MAX_DEPTH + 1)
    assert MathVerifier()(rf"\boxed{{{deep}}}", task).details["refused"] == "unchecked"
    assert restates("(3k-2)+(4-k)", task.prompt, task.answer) is True  # the question's forms are cached now
    slow = check_answer(r"\boxed{(4-k)+(3k-2)}", task.prompt, task.answer, timeout_s=0.001)
    assert slow.refused == "unchecked" and slow.compare is None  # the answer's own parse overran
    assert MathVerifier()(r"\boxed{2k+2}", task).reward == 1.0  # a fresh worker answers


@pytest.mark.parametrize(
    "completion",
    [
        r"\boxed{" + "(" * 300 + "k" + ")" * 300 + "}", r"\boxed{" + "x+" * 400 + "x}",
        r"\boxed{\frac{}{}}", r"\boxed{\text{\text{\text{}}}", r"\boxed{\mathbf{" * 80 + "}" * 80,
        "\\boxed{\x00k\ud800}", r"\boxed{\left(}", r"\boxed{9^{9^{9^{9}}}}", r"\boxed{\frac{1}{0}}",
        "$" * 500, r"\boxed{" + "k" * 5000 + "}",
    ],
)  # fmt: skip
def test_malformed_answers_score_zero_in_bounded_time(completion):
    start = time.perf_counter()
    score = MathVerifier(timeout_s=5.0)(completion, Task("t", r"Simplify $(-k + 4) + (-2 + 3k)$.", "2k+2"))
    assert score.reward == 0.0 and time.perf_counter() - start < 5.0 * 3 + 60.0
