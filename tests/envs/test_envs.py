from __future__ import annotations

import copy

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

import textgym  # noqa: F401
from textgym.envs.arithmetic import ArithmeticTasks, evaluate
from textgym.envs.interop import INTEROP_IDS
from textgym.envs.math_qa import gsm8k_tasks, math500_tasks

# The interop ids need their libraries and kwargs; tests/envs/test_interop_*.py check them.
TEXTGYM_IDS = sorted(k for k in gym.registry if k.startswith("textgym/") and k not in INTEROP_IDS)
SANDBOXED = {
    "textgym/HumanEval-v0",
    "textgym/HumanEvalFeedback-v0",
    "textgym/MBPP-v0",
    "textgym/MBPPFeedback-v0",
    "textgym/ToolMath-v0",
}
"""Envs that start a sandbox backend when made (the code envs' verifier, ToolMath's `python` tool)."""


def sandboxed(*values):
    """`values` as a parameter set, marked `sandbox` when its env id (the first value) is in SANDBOXED."""
    return pytest.param(*values, marks=[pytest.mark.sandbox] if values[0] in SANDBOXED else [])


ENV_IDS = [sandboxed(env_id) for env_id in TEXTGYM_IDS]


def test_registry_has_the_math_and_code_envs():
    assert {"textgym/Arithmetic-v0", "textgym/GSM8K-v0", "textgym/MATH500-v0"} <= set(TEXTGYM_IDS)
    code = {
        "textgym/HumanEval-v0",
        "textgym/MBPP-v0",
        "textgym/HumanEvalFeedback-v0",
        "textgym/MBPPFeedback-v0",
    }
    assert code <= set(TEXTGYM_IDS)
    assert gym.spec("textgym/MBPPFeedback-v0").max_episode_steps == 3


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id):
    env = gym.make(env_id)
    check_env(env.unwrapped)


@pytest.mark.parametrize("env_id", ENV_IDS)
def test_same_seed_same_episode(env_id):
    a, b = gym.make(env_id), gym.make(env_id)
    for seed in (0, 1, 12345):
        obs_a, info_a = a.reset(seed=seed)
        obs_b, info_b = b.reset(seed=seed)
        assert obs_a == obs_b and info_a == info_b
        # the next unseeded reset continues the same RNG stream
        assert a.reset()[0] == b.reset()[0]
        step_a = a.step("\\boxed{7}")
        step_b = b.step("\\boxed{7}")
        assert step_a[1:4] == step_b[1:4] and step_a[4] == step_b[4]
    # different seeds pose different tasks (with overwhelming probability)
    assert a.reset(seed=1)[1]["task_id"] != a.reset(seed=2)[1]["task_id"]


@pytest.mark.parametrize(
    ("env_id", "kwargs", "n"),
    [
        sandboxed("textgym/GSM8K-v0", {"split": "test"}, 1319),
        sandboxed("textgym/GSM8K-v0", {"split": "train"}, 7473),
        sandboxed("textgym/MATH500-v0", {}, 500),
        sandboxed("textgym/Arithmetic-v0", {"split": "test", "n_test": 300}, 300),
        sandboxed("textgym/HumanEval-v0", {}, 164),
        sandboxed("textgym/MBPP-v0", {}, 427),
        sandboxed("textgym/MBPP-v0", {"subset": "full"}, 974),
        sandboxed("textgym/MBPP-v0", {"split": "test"}, 257),
    ],
)
def test_task_index_selects_row(env_id, kwargs, n):
    env = gym.make(env_id, **kwargs)
    assert len(env.unwrapped.tasks) == n
    for i in (0, 1, n - 1):
        obs, info = env.reset(options={"task_index": i})
        assert info["task_index"] == i
        assert info["task_id"] == env.unwrapped.tasks[i].task_id
        assert env.unwrapped.tasks[i].prompt in obs[-1]["content"]
    with pytest.raises(ValueError, match="task_index"):
        env.reset(options={"task_index": n})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"task": 0})


def test_gsm8k_rows_match_the_shipped_file():
    import json
    from importlib import resources

    path = resources.files("textgym").joinpath("data", "gsm8k", "test.jsonl")
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    tasks = gsm8k_tasks("test")
    assert len(rows) == len(tasks) == 1319
    assert tasks[5].prompt == rows[5]["question"]
    assert rows[5]["answer"].endswith("#### " + tasks[5].answer)
    assert all("<<" not in t.solution for t in tasks)  # calculator annotations removed
    assert math500_tasks()[0].answer == "\\left( 3, \\frac{\\pi}{2} \\right)"


def test_gsm8k_math500_ship_licences():
    from importlib import resources

    root = resources.files("textgym").joinpath("data")
    for d in ("gsm8k", "math500", "humaneval"):
        assert "MIT" in root.joinpath(d, "LICENSE").read_text(encoding="utf-8")
        assert root.joinpath(d, "PROVENANCE.md").is_file()
    assert "CC BY 4.0" in root.joinpath("mbpp", "LICENSE").read_text(encoding="utf-8")
    assert root.joinpath("mbpp", "PROVENANCE.md").is_file()


def test_code_task_rows_match_the_shipped_files():
    import gzip
    import hashlib
    import json
    from importlib import resources

    from textgym.envs.code import humaneval_tasks, mbpp_tasks

    root = resources.files("textgym").joinpath("data")
    raw = root.joinpath("humaneval", "HumanEval.jsonl.gz").read_bytes()
    assert hashlib.sha256(raw).hexdigest().startswith("b796127e635a67f9")  # PROVENANCE.md checksum
    rows = [json.loads(line) for line in gzip.decompress(raw).decode().splitlines()]
    tasks = humaneval_tasks()
    assert [t.task_id for t in tasks] == [r["task_id"] for r in rows]
    assert (
        tasks[42].metadata["prompt_code"] == rows[42]["prompt"]
        and rows[42]["prompt"].strip() in tasks[42].prompt
    )
    sanitized = json.loads(root.joinpath("mbpp", "sanitized-mbpp.json").read_text(encoding="utf-8"))
    assert [t.task_id for t in mbpp_tasks("sanitized")] == [f"mbpp/{r['task_id']}" for r in sanitized]
    tests = mbpp_tasks("sanitized")[9].metadata["tests"]  # MBPP's asserts, then hidden generated ones
    assert tests[:3] == sanitized[9]["test_list"] and tests[0] in mbpp_tasks("sanitized")[9].prompt
    train = mbpp_tasks("full", "train")
    assert len(train) == 374 and train[0].task_id == "mbpp/601" and train[-1].task_id == "mbpp/974"
    with pytest.raises(ValueError, match="MBPP split"):
        mbpp_tasks("full", "dev")


def test_arithmetic_generator_is_seeded_and_held_out():
    a = ArithmeticTasks("train", "+-*", 2, 3, 200, generator_seed=7)
    b = ArithmeticTasks("train", "+-*", 2, 3, 200, generator_seed=7)
    c = ArithmeticTasks("train", "+-*", 2, 3, 200, generator_seed=8)
    assert [a[i] for i in range(50)] == [b[i] for i in range(50)]
    assert [a[i].prompt for i in range(50)] != [c[i].prompt for i in range(50)]
    test = ArithmeticTasks("test", "+-*", 2, 3, 200, generator_seed=7)
    test_exprs = {t.metadata["expression"] for t in test}
    assert len(test_exprs) == 200  # distinct
    # a small space makes collisions frequent: 1-digit a+b has 100 problems, 25 held out
    small_train = ArithmeticTasks("train", "+", 1, 2, 25)
    small_test = {t.metadata["expression"] for t in ArithmeticTasks("test", "+", 1, 2, 25)}
    assert all(small_train[i].metadata["expression"] not in small_test for i in range(2000))
    assert len(a) > 2**62  # unbounded stream


def test_arithmetic_holds_out_facts_not_strings():
    """A test problem's commutative / associative rearrangements are never trained (`b+a` for a
    test `a+b`, `4*3` for `3*4`, `3*6+2` for `2+6*3`), while `3-9` for a test `9-3` may be."""
    from textgym.envs.arithmetic import fact_key, parse_expression

    assert fact_key([85, 63], ["+"]) == fact_key([63, 85], ["+"])
    assert fact_key([3, 4], ["*"]) == fact_key([4, 3], ["*"])
    assert fact_key([2, 6, 3], ["+", "*"]) == fact_key([3, 6, 2], ["*", "+"])
    assert fact_key([9, 3, 2], ["-", "+"]) == fact_key([2, 3, 9], ["-", "+"])
    assert fact_key([9, 3], ["-"]) != fact_key([3, 9], ["-"])
    assert fact_key([8, 2], ["/"]) != fact_key([2, 8], ["/"])
    for ops, digits, terms in (("+", 2, 2), ("*", 1, 2), ("+-*", 1, 3)):
        test = ArithmeticTasks("test", ops, digits, terms, 20 if digits == 1 and terms == 2 else 100)
        keys = {fact_key(*parse_expression(t.metadata["expression"])) for t in test}
        assert len(keys) == len(test)  # one problem per fact in the test split
        train = ArithmeticTasks("train", ops, digits, terms, len(test))
        # 1-digit a*b: 100 problems, 55 facts, 20 held out -> most swaps would collide by chance
        trained = [train[i].metadata["expression"] for i in range(2000)]
        assert not any(fact_key(*parse_expression(e)) in keys for e in trained)
        swapped = {"".join(reversed(t.metadata["expression"].partition(ops[0])))
                   for t in test if terms == 2}  # fmt: skip
        assert not swapped & set(trained)


def test_the_training_seed_changes_which_tasks_are_trained():
    from textgym.training.sampler import STREAM_STRIDE, TaskSampler

    unbounded = 2**63
    assert TaskSampler(unbounded, 0).next(3) == [0, 1, 2]
    s1 = TaskSampler(unbounded, 1)
    assert s1.next(2) == [STREAM_STRIDE, STREAM_STRIDE + 1]
    resumed = TaskSampler(unbounded, 1)
    resumed.cursor = 1
    assert resumed.next(1) == [STREAM_STRIDE + 1]
    train = ArithmeticTasks("train", "+", 2, 2, 100)
    seed0 = [train[i].prompt for i in TaskSampler(unbounded, 0).next(64)]
    seed1 = [train[i].prompt for i in TaskSampler(unbounded, 1).next(64)]
    assert len(set(seed0) & set(seed1)) <= 8  # 9,900 distinct sums: chance overlaps only
    finite = TaskSampler(50, 0).next(50), TaskSampler(50, 1).next(50)
    assert sorted(finite[0]) == sorted(finite[1]) == list(range(50)) and finite[0] != finite[1]


def test_arithmetic_task_categories_split_by_carry_and_borrow():
    env = gym.make("textgym/Arithmetic-v0", split="test", operators="+", digits=2)
    category, stems = env.unwrapped.task_category, env.unwrapped.answer_stems

    def task(expr):
        from textgym.types import Task

        return Task(task_id="t", prompt=f"Compute {expr}.", answer="0", metadata={"expression": expr})

    assert [category(task(e)) for e in ("85+67", "85+63", "15+5", "5+95", "99+1", "40+60")] == [
        "carry", "no carry", "carry", "carry", "carry", "no carry",
    ]  # fmt: skip
    assert [category(task(e)) for e in ("52-17", "57-12", "12-57", "3*4", "1+2+3")] == [
        "borrow", "no borrow", "negative", "", "",
    ]  # fmt: skip
    assert stems(task("85+63")) == ["85+63 = "]
    counts = {}
    for t in env.unwrapped.tasks:
        counts[category(t)] = counts.get(category(t), 0) + 1
    assert set(counts) == {"carry", "no carry"} and sum(counts.values()) == len(env.unwrapped.tasks)


def test_arithmetic_answers_follow_precedence():
    assert evaluate([2, 3, 4], ["+", "*"]) == 14
    assert evaluate([20, 4, 2], ["-", "-"]) == 14
    assert evaluate([8, 4, 2], ["/", "*"]) == 4
    with pytest.raises(ValueError, match="exact"):
        evaluate([7, 2], ["/"])
    tasks = ArithmeticTasks("test", "+-*/", 2, 3, 300)
    assert any("/" in t.metadata["expression"] for t in tasks)
    for t in tasks:
        expr = t.metadata["expression"]
        # Python's own arithmetic agrees (every division is exact by construction)
        assert abs(eval(expr) - int(t.answer)) < 1e-9, expr


def test_arithmetic_kwargs_are_validated():
    with pytest.raises(ValueError, match="operators"):
        gym.make("textgym/Arithmetic-v0", operators="^")
    with pytest.raises(ValueError, match="digits"):
        gym.make("textgym/Arithmetic-v0", digits=0)
    with pytest.raises(ValueError, match="split"):
        gym.make("textgym/Arithmetic-v0", split="dev")


@pytest.mark.parametrize(
    ("action", "reason"),
    [
        ("", "empty action"),
        ("   \n ", "empty action"),
        ("x" * 100_001, "action too long"),
        (None, "action must be a str"),
        (b"\\boxed{3}", "action must be a str"),
    ],
)
def test_bad_actions_score_zero_with_reason(action, reason):
    env = gym.make("textgym/Arithmetic-v0", split="test").unwrapped  # unwrapped: the checker would warn
    env.reset(options={"task_index": 0})
    obs, reward, terminated, truncated, info = env.step(action)
    assert reward == 0.0 and terminated and not truncated and obs == []
    assert reason in info["error"]
    assert info["reward/correct"] == 0.0 and info["reward/format"] == 0.0


@pytest.mark.parametrize(
    "garbage",
    [
        "\x00\x01\x02",
        "\\boxed{",
        "<answer></answer>",
        "🙂" * 1000,
        "\\boxed{10^{10^{10}}}",
        "#### ",
        "\ud800",
    ],
)
def test_garbage_actions_are_scored_not_raised(garbage):
    env = gym.make("textgym/GSM8K-v0")
    env.reset(options={"task_index": 3})
    _, reward, terminated, _, info = env.step(garbage)
    assert reward == 0.0 and terminated
    assert info["reward/correct"] == 0.0


def test_reward_weights_and_terms():
    env = gym.make("textgym/Arithmetic-v0", split="test", format_weight=0.25, correct_weight=2.0)
    _, info = env.reset(options={"task_index": 0})
    gold = info["answer"]
    _, r, *_, info = env.step(f"so \\boxed{{{gold}}}")
    assert r == pytest.approx(2.25) and info["reward/correct"] == 1.0 and info["reward/format"] == 1.0
    env.reset(options={"task_index": 0})
    _, r, *_, info = env.step(f"the answer is {gold}")  # right, but no accepted marker
    assert r == pytest.approx(2.0) and info["reward/format"] == 0.0
    env.reset(options={"task_index": 0})
    _, r, *_, info = env.step(f"<answer>{int(gold) + 1}</answer>")
    assert r == pytest.approx(0.25) and info["reward/correct"] == 0.0


def test_step_outside_an_episode_is_an_api_error():
    env = gym.make("textgym/Arithmetic-v0").unwrapped
    with pytest.raises(RuntimeError, match="reset"):
        env.step("1")
    env.reset(seed=0)
    env.step("1")
    with pytest.raises(RuntimeError, match="ended"):
        env.step("1")


def test_render_ansi_and_observations_are_fresh_objects():
    env = gym.make("textgym/Arithmetic-v0", render_mode="ansi")
    obs, _ = env.reset(seed=0)
    snapshot = copy.deepcopy(obs)
    obs[0]["content"] = "mutated"
    assert "[user] " + snapshot[0]["content"] in env.render()
    env.step("\\boxed{1}")
    assert "[assistant] \\boxed{1}" in env.render()


def test_prefill_announces_the_answer_stem_and_scores_the_whole_reply():
    env = gym.make("textgym/Arithmetic-v0", split="test", operators="+", digits=2, prefill=True)
    _, info = env.reset(options={"task_index": 0})
    stem = info["reply_prefix"]
    expression = env.unwrapped.task.metadata["expression"]
    assert stem == f"{expression} = "
    assert env.step(stem + env.unwrapped.task.answer)[1] == 1.0
    env.reset(options={"task_index": 0})
    assert env.step(stem + str(int(env.unwrapped.task.answer) + 1))[1] == 0.0
    _, plain = gym.make("textgym/Arithmetic-v0", split="test").reset(options={"task_index": 0})
    assert "reply_prefix" not in plain
    with pytest.raises(ValueError, match="worked_steps"):
        gym.make("textgym/Arithmetic-v0", worked_steps=True, prefill=True)
    from textgym.envs import SingleTurnEnv
    from textgym.types import Task
    from textgym.verifiers import Rubric

    with pytest.raises(ValueError, match="answer_stems"):
        SingleTurnEnv([Task(task_id="t/0", prompt="?", answer="1")], Rubric([]), prefill=True)
