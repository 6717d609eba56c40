"""Worked-step Arithmetic: gold step-by-step solutions and the per-step checker (`info["step_rewards"]`)."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import textgym  # noqa: F401
from textgym.envs.arithmetic import (
    ArithmeticTasks,
    check_steps,
    evaluate,
    parse_expression,
    worked_solution,
    worked_steps,
)
from textgym.verifiers.steps import split_steps


@pytest.mark.parametrize(("operators", "digits", "n_terms"), [("+*", 1, 3), ("+-", 2, 3), ("+-*/", 2, 4)])
def test_every_worked_solution_passes_its_own_step_checker_and_verifier(operators, digits, n_terms):
    env = gym.make(
        "textgym/Arithmetic-v0",
        split="test",
        operators=operators,
        digits=digits,
        n_terms=n_terms,
        worked_steps=True,
        n_test=100,
    ).unwrapped
    for i in range(100):
        env.reset(options={"task_index": i})
        solution = env.task.solution
        lines = solution.split("\n")
        assert len(lines) == n_terms  # n_terms - 1 operations, then the boxed answer
        assert lines[-1] == f"\\boxed{{{env.task.answer}}}"
        _, reward, _, _, info = env.step(solution)
        assert reward == 1.0 and info["reward/steps"] == 1.0
        assert info["step_rewards"] == [1.0] * n_terms
        assert [solution[:e].split("\n")[-1] for e in info["step_ends"]] == lines


def test_worked_steps_follow_precedence_left_to_right():
    assert worked_steps([5, 12, 3], ["+", "*"]) == [(12, "*", 3, 36), (5, "+", 36, 41)]
    assert worked_steps([8, 4, 2, 3], ["/", "-", "*"]) == [(8, "/", 4, 2), (2, "*", 3, 6), (2, "-", 6, -4)]
    assert worked_steps([3, 15, 2], ["-", "+"]) == [(3, "-", 15, -12), (-12, "+", 2, -10)]
    assert worked_solution([3, 15, 2], ["-", "+"]) == "3-15=-12\n-12+2=-10\n\\boxed{-10}"
    # each line's result is the value of what is left, ending at `evaluate`'s answer
    tasks = ArithmeticTasks("test", "+-*/", 2, 4, 200, worked_steps=True)
    for t in tasks:
        nums, ops = parse_expression(t.metadata["expression"])
        assert worked_steps(nums, ops)[-1][3] == evaluate(nums, ops) == int(t.answer)


@pytest.mark.parametrize(
    ("response", "expected"),
    [
        ("12*3=36\n5+36=41\n\\boxed{41}", [1.0, 1.0, 1.0]),
        # out of precedence order: the value changes, so this and every later step are wrong
        ("5+12=17\n17*3=51\n\\boxed{51}", [0.0, 0.0, 0.0]),
        # an arithmetic slip, then correct arithmetic on the wrong value: all wrong
        ("12*3=35\n5+35=40\n\\boxed{40}", [0.0, 0.0, 0.0]),
        # a right step, a slip, and the right answer by luck of a wrong line
        ("12*3=36\n5+36=40\n\\boxed{41}", [1.0, 0.0, 1.0]),
        # prose and an operation not in the expression leave the expression as it was
        ("Let me see.\n7*3=21\n12*3=36\n\n  5 + 36 = 41  \n\\boxed{41}", [0.0, 0.0, 1.0, 1.0, 1.0]),
        # the same operation twice: the second finds nothing left to reduce
        ("12*3=36\n12*3=36\n5+36=41\n\\boxed{41}", [1.0, 0.0, 1.0, 1.0]),
        ("", []),
        ("\\boxed{41}", [1.0]),
        ("41", [0.0]),
    ],
)
def test_check_steps_on_hand_cases(response, expected):
    assert check_steps(response, [5, 12, 3], ["+", "*"]) == expected


def test_check_steps_negative_values_division_and_associativity():
    # 9-3+2: "9-3" first is right; "3+2" first changes the value (9-5 = 4 ≠ 8)
    assert check_steps("9-3=6\n6+2=8\n\\boxed{8}", [9, 3, 2], ["-", "+"]) == [1.0, 1.0, 1.0]
    assert check_steps("3+2=5\n9-5=4\n\\boxed{4}", [9, 3, 2], ["-", "+"]) == [0.0, 0.0, 0.0]
    # 5+3+2: "3+2" first keeps the value, so it counts as right
    assert check_steps("3+2=5\n5+5=10\n\\boxed{10}", [5, 3, 2], ["+", "+"]) == [1.0, 1.0, 1.0]
    # negative intermediate values are written with their sign
    assert check_steps("3-15=-12\n-12+2=-10\n\\boxed{-10}", [3, 15, 2], ["-", "+"]) == [1.0, 1.0, 1.0]
    # exact division only: 7/2 has no integer result
    assert check_steps("8/4=2\n2*3=6\n\\boxed{6}", [8, 4, 3], ["/", "*"]) == [1.0, 1.0, 1.0]
    assert check_steps("8/4=3\n3*3=9\n\\boxed{9}", [8, 4, 3], ["/", "*"]) == [0.0, 0.0, 0.0]
    # a line dividing by 0 is wrong, not an error
    assert check_steps("6/0=0\n6/2=3\n\\boxed{3}", [6, 2], ["/"]) == [0.0, 1.0, 1.0]


def test_split_steps_offsets_index_the_text():
    text = "  a=1\r\n\n\tb = 2 \nc"
    spans = split_steps(text)
    assert [text[s.start : s.end] for s in spans] == ["a=1", "b = 2", "c"]
    assert [s.end for s in spans] == [5, 14, 17]


def test_without_the_option_arithmetic_is_unchanged():
    plain = gym.make("textgym/Arithmetic-v0", split="test", operators="+*", digits=1, n_terms=3).unwrapped
    worked = gym.make(
        "textgym/Arithmetic-v0", split="test", operators="+*", digits=1, n_terms=3, worked_steps=True
    ).unwrapped
    for i in range(20):
        a, _ = plain.reset(options={"task_index": i})
        b, _ = worked.reset(options={"task_index": i})
        assert a == b and plain.task.answer == worked.task.answer  # the same problems
        assert plain.task.solution == f"\\boxed{{{plain.task.answer}}}"
    _, _, _, _, info = plain.step(worked.task.solution)
    assert "step_rewards" not in info and "step_ends" not in info and "reward/steps" not in info
    assert info["reward/correct"] == 1.0
    with pytest.raises(ValueError, match="worked_steps"):
        gym.make("textgym/Arithmetic-v0", steps_weight=0.5)


def test_worked_env_passes_the_gymnasium_checker_and_weights_the_steps_term():
    env = gym.make("textgym/Arithmetic-v0", operators="+*", digits=1, n_terms=3, worked_steps=True)
    check_env(env.unwrapped)
    env = gym.make(
        "textgym/Arithmetic-v0", split="test", operators="+*", n_terms=3, worked_steps=True, steps_weight=0.5
    )
    env.reset(options={"task_index": 0})
    nums, ops = parse_expression(env.unwrapped.task.metadata["expression"])
    a, op, b, c = worked_steps(nums, ops)[0]
    _, reward, _, _, info = env.step(f"{a}{op}{b}={c}\nno idea")
    assert info["step_rewards"] == [1.0, 0.0] and info["reward/correct"] == 0.0
    assert reward == pytest.approx(0.5 * 0.5)
    # an unusable action has no steps and every term 0
    env.reset(options={"task_index": 0})
    _, reward, _, _, info = env.step("   ")
    assert reward == 0.0 and info["reward/steps"] == 0.0 and "step_rewards" not in info
