"""Issue 61: the form a question asks for (`answer_forms`) and the one reading of look-alike characters
(`answer_text.normalize_unicode`), tested in-process (the verifier runs them in the math-verify worker)."""

from __future__ import annotations

import pytest

from textgym.verifiers.answer_forms import check_forms, in_form, matches_template, requested_forms
from textgym.verifiers.answer_text import has_lookalikes, normalize_unicode, number_literal

ASKED = [  # (question, forms asked)
    ("Express your answer as a common fraction.", ["common_fraction"]),
    ("Express your answer as an improper fraction.", ["common_fraction"]),
    ("Express your answer as a common fraction in simplest radical form.", ["common_fraction", "radical"]),
    ("Express your answer as a mixed number.", ["mixed_number"]),
    ("Express your answer as a decimal to the nearest hundredth.", ["decimal"]),
    ("Convert $\\frac{57}{160}$ to a terminating decimal.", ["decimal"]),
    ("Round your answer to the nearest tenth of a cent.", ["decimal"]),
    ("Simplify and write the result with a rational denominator: $\\sqrt{2}$", ["rational_denominator"]),
    ("Factor the expression $ab+5b+2a+10$.", ["factored"]),
    ("Completely factor $x^3-4x$.", ["factored"]),
    ("Enter your answer using interval notation.", ["interval"]),
    ('Enter the equation of this line in the form "$y = mx + b$".', ["template"]),
    # not a form of the answer
    ("What is the greatest common factor of 6432 and 132?", []),
    ("The polynomial $x^3 - 3x^2 + 4x - 1$ is a factor of $x^9 + px^6 + qx^3 + r.$", []),
    ("The quadratic can be written in the form $(x+b)^2+c$. What is $b+c$?", []),
    ("The number gives a terminating decimal, with $a$ and $b$ relatively prime.", []),
    ("What fraction of the books remaining are math books?", []),
]


@pytest.mark.parametrize(("question", "forms"), ASKED)
def test_requested_forms_read_the_phrase_not_any_mention(question, forms):
    assert [f.name for f in requested_forms(question)] == forms


IN_FORM = [  # (answer, form, in it)
    (r"\frac{14}{3}", "common_fraction", True),
    (r"-\dfrac{35}{9}", "common_fraction", True),
    (r"\frac{\pi}{6}", "common_fraction", True),
    ("4.666667", "common_fraction", False),
    (r"4\frac{2}{3}", "common_fraction", False),
    (r"\frac{28}{6}", "common_fraction", False),
    (r"\frac{2\pi}{12}", "common_fraction", False),
    (r"1\frac{4}{5}", "mixed_number", True),
    (r"137 \frac{1}{2}", "mixed_number", True),
    ("3", "mixed_number", True),
    (r"\frac{9}{5}", "mixed_number", False),
    (r"1\frac{8}{10}", "mixed_number", False),
    ("4.5", "decimal", True),
    (r"5.4 \text{ cents}", "decimal", True),
    (r"\frac{9}{2}", "decimal", False),
    (r"3\sqrt{13}", "radical", True),
    (r"\frac{3\sqrt{3}}{4}", "radical", True),
    (r"\sqrt{53}", "radical", True),
    (r"\sqrt{117}", "radical", False),
    (r"\frac{1}{\sqrt{3}}", "radical", False),
    (r"\sqrt[3]{16}", "radical", False),
    (r"\sqrt{\frac{1}{3}}", "radical", False),
    (r"\frac{6\sqrt{13}}{4}", "radical", False),
    (r"\sqrt{2.25}", "radical", False),
    (r"\frac{\sqrt{3}}{3}", "rational_denominator", True),
    (r"\frac{1}{\sqrt3}", "rational_denominator", False),
    (r"\frac{1}{1+\sqrt{2}}", "rational_denominator", False),
    (r"\frac{2}{3}", "rational_denominator", True),
    ("(a+5)(b+2)", "factored", True),
    ("x(x-2)(x+2)", "factored", True),
    ("-(x-2)(x+3)", "factored", True),
    ("3(2x+1)(x+1)", "factored", True),
    ("x^2+4", "factored", True),
    ("x(x^2-4)", "factored", False),
    ("(6x+3)(x+1)", "factored", False),
    ("ab+5b+2a+10", "factored", False),
    ("b(a+5)+2(a+5)", "factored", False),
    (r"(5,\infty)", "interval", True),
    (r"\left(\frac{3}{5},\frac{8}{3}\right]", "interval", True),
    (r"(2,12) \cup (12,102)", "interval", True),
    (r"x \in [-2,7]", "interval", True),
    (r"\{x \mid x > 5\}", "interval", False),
    ("x > 5", "interval", False),
    (r"\mathbb{R}", "interval", False),
    ("(1, 2, 3)", "interval", False),
]


@pytest.mark.parametrize(("answer", "form", "ok"), IN_FORM)
def test_in_form(answer, form, ok):
    assert in_form(answer, form) is ok


TEMPLATES = [  # (answer, template, gold, matches)
    ("6r^2-4r-24", "Ar^2 + Br + C", "6r^2-4r-24", True),
    ("-24 + 6r^2 - 4r", "Ar^2 + Br + C", "6r^2-4r-24", True),
    ("r^2 + 1", "Ar^2 + Br + C", "6r^2-4r-24", True),  # B = 0 drops its term, A = 1 its factor
    ("2(3r^2-2r-12)", "Ar^2 + Br + C", "6r^2-4r-24", False),
    ("6r^2-2r-2r-24", "Ar^2 + Br + C", "6r^2-4r-24", False),
    ("(r+2)(6r-12)", "Ar^2 + Br + C", "6r^2-4r-24", False),
    ("y = -2x", "y = mx + b", "y = -2x", True),
    ("y = 2x + 3", "y = mx + b", "y = 2x + 3", True),
    ("2x + 3 = y", "y = mx + b", "y = 2x + 3", True),
    ("y - 3 = 2x", "y = mx + b", "y = 2x + 3", False),
    ("5x - 7y + 11z + 4 = 0", "Ax + By + Cz + D = 0", "5x - 7y + 11z + 4 = 0", True),
    ("5x - 7y + 11z = -4", "Ax + By + Cz + D = 0", "5x - 7y + 11z + 4 = 0", False),
    (r"\left( 3, \frac{\pi}{2} \right)", r"(r,\theta)", r"\left( 3, \frac{\pi}{2} \right)", True),
]


@pytest.mark.parametrize(("answer", "template", "gold", "ok"), TEMPLATES)
def test_matches_template(answer, template, gold, ok):
    assert matches_template(answer, template, gold) is ok


def test_a_form_is_checked_only_where_the_gold_is_in_it():
    fraction = [{"name": "common_fraction"}]
    assert check_forms("0.25", r"\frac{1}{4}", fraction)["failed"] == "common_fraction"
    assert check_forms(r"\frac{1}{4}", "0.25", fraction) == {
        "failed": None,
        "unreadable": False,
        "checked": [],
    }
    assert check_forms("0.25", None, fraction)["failed"] == "common_fraction"  # telemetry: no gold


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("\u2212148", "-148"),
        ("\u2013148", "-148"),
        ("\u2014148", "-148"),
        ("\ufe63148", "-148"),
        ("\uff0d148", "-148"),
        ("\uff11\uff14\uff18", "148"),
        ("\u0661\u0664\u0668", "148"),
        ("\u06f1\u06f4\u06f8", "148"),
        ("\u0967\u096a\u096e", "148"),
        ("x\u00b2", "x^{2}"),
        ("10\u207b\u00b3", "10^{-3}"),
        ("H\u2082O", "H_{2}O"),
        ("\u00bd", "1/2"),
        ("3\u00bd", "3 1/2"),
        ("a\u00a0b", "a b"),
        ("148", "148"),
    ],
)
def test_normalize_unicode_reads_look_alikes_as_ascii(text, read):
    assert normalize_unicode(text) == read
    assert normalize_unicode(read) == read  # idempotent


def test_lookalikes_are_signs_and_digits_not_other_unicode():
    assert has_lookalikes("\u2212148") and has_lookalikes("\uff11") and has_lookalikes("\u0661")
    assert not has_lookalikes("x\u00b2 + \u03c0") and not has_lookalikes("caf\u00e9 \u2014 fine")
    assert number_literal(normalize_unicode(r"\$18/\text{day}")) == "18"
