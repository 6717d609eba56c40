"""The tool-use wrapper and the tool/web/game envs (real sandbox, real HTTP server on 127.0.0.1), with the
oracle and random agents."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import gymnasium as gym
import httpx
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

import textgym  # noqa: F401
from textgym import sandbox
from textgym.cli import app
from textgym.envs.arithmetic import ArithmeticEnv
from textgym.envs.tool_use import ToolUseWrapper
from textgym.envs.web.envs import extract_final_answer, normalize_answer, read_final_answer, shop_tasks
from textgym.envs.web.site import catalogue
from textgym.envs.wordle import WORDS, parse_guess, score_guess
from textgym.evaluation.scripted import OracleAgent, RandomAgent, evaluate_scripted, play_episode
from textgym.tools import calculator_tool, format_tool_call


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    sandbox.close_all()


# ----------------------------------------------------------------------------- the site server
@pytest.mark.multiproc
def test_site_server_is_shared_and_stopped_by_the_last_close():
    # in a fresh interpreter: other tests of this session may hold the server
    script = """
import gymnasium as gym, httpx, textgym
from textgym.envs.web.site import SiteServer
assert not SiteServer.running()
a = gym.make("textgym/WebShop-v0")
b = gym.make("textgym/WikiSearch-v0")
url = SiteServer.url
assert url.startswith("http://127.0.0.1:") and a.unwrapped.site_url == b.unwrapped.site_url == url
a.close()
assert SiteServer.running() and httpx.get(url + "/").status_code == 200
b.close()
assert not SiteServer.running()
try:
    httpx.get(url + "/", timeout=2)
    raise SystemExit("the server still answers")
except httpx.ConnectError:
    print("stopped")
"""
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "stopped", r.stderr[-2000:]


# ----------------------------------------------------------------------------- the wrapper
def test_wrapper_answers_tool_calls_and_passes_the_answer_through():
    env = gym.wrappers.TimeLimit(
        ToolUseWrapper(ArithmeticEnv(split="test"), [calculator_tool()], error_penalty=-0.1),
        max_episode_steps=4,
    )
    obs, info = env.reset(options={"task_index": 3})
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator"]
    expression = env.unwrapped.task.metadata["expression"]
    obs, r, term, _, info = env.step(format_tool_call("calculator", {"expression": expression}))
    assert obs == [{"role": "tool", "content": env.unwrapped.task.answer}] and r == 0.0 and not term
    assert info["tool_calls"] == 1 and info["tool_errors"] == 0 and info["task_id"] == "arithmetic/test/3"
    obs, r, term, _, info = env.step("<tool_call>{oops</tool_call>")
    assert (
        "not valid JSON" in obs[0]["content"]
        and r == pytest.approx(-0.1)
        and info["reward/tool_error"] == -0.1
    )
    obs, r, *_ = env.step(format_tool_call("nope", {}))
    assert "unknown tool 'nope'; tools: calculator" in obs[0]["content"] and r == pytest.approx(-0.1)
    obs, r, term, _trunc, info = env.step(f"\\boxed{{{env.unwrapped.task.answer}}}")
    assert r == 1.0 and term and info["reward/correct"] == 1.0


@pytest.mark.sandbox
def test_tool_turns_count_toward_the_time_limit():
    env = gym.make("textgym/ToolMath-v0")
    env.reset(options={"task_index": 0})
    ends = [env.step(format_tool_call("calculator", {"expression": "1+1"}))[2:4] for _ in range(6)]
    assert ends[:5] == [(False, False)] * 5 and ends[5] == (False, True)


@pytest.mark.parametrize(
    "env_id",
    [
        pytest.param("textgym/ToolMath-v0", marks=pytest.mark.sandbox),  # its `python` tool
        "textgym/WebShop-v0",
        "textgym/WikiSearch-v0",
    ],
)
@pytest.mark.filterwarnings("ignore:.*is different from the unwrapped version")
def test_tool_envs_pass_check_env_wrapped(env_id):
    env = gym.make(env_id)
    wrapper = env.env
    while not isinstance(wrapper, ToolUseWrapper):
        wrapper = wrapper.env
    check_env(wrapper, skip_render_check=True)  # the tool-using env itself, not only the env it wraps
    obs, info = wrapper.reset(seed=0)
    assert info["tools"] and obs[0]["role"] == "user"
    env.close()


# ----------------------------------------------------------------------------- envs, oracle and random agents
@pytest.mark.parametrize(
    ("env_id", "n"),
    [
        pytest.param("textgym/ToolMath-v0", 200, marks=pytest.mark.sandbox),  # its `python` tool
        ("textgym/WebShop-v0", 200),
        ("textgym/WikiSearch-v0", 200),
        ("textgym/Wordle-v0", len(WORDS)),
        ("textgym/GuessNumber-v0", 100),
    ],
)
def test_oracle_solves_and_random_agent_fails(env_id, n):
    kwargs = {"split": "test"} if env_id == "textgym/GuessNumber-v0" else None
    oracle = evaluate_scripted(OracleAgent(), env_id, kwargs, n=n)
    random = evaluate_scripted(RandomAgent(seed=0), env_id, kwargs, n=n)
    assert oracle.accuracy >= 0.99 and oracle.mean_reward >= 0.99
    assert random.accuracy < 0.05


def test_oracle_uses_the_tools_and_webshop_reward_comes_from_the_order():
    env = gym.make("textgym/WebShop-v0")
    ep = play_episode(OracleAgent(), env, 7)
    roles = [m["role"] for m in ep["messages"]]
    assert roles.count("tool") == 4 and ep["terminated"] and ep["reward"] == 1.0
    # the oracle acts on what the pages show: no hidden product id in its calls; each click
    # names the link whose line shows the wanted item, then its size
    want = env.unwrapped.task.metadata
    calls = [m["content"] for m in ep["messages"] if m["role"] == "assistant"][:4]
    assert all(str(want["target"]) not in c for c in calls)
    clicks = [json.loads(c.split("<tool_call>")[1].split("</tool_call>")[0]) for c in calls[1:3]]
    assert [c["name"] for c in clicks] == ["click", "click"]
    results, product = ep["messages"][2]["content"], ep["messages"][4]["content"]
    listed = next(
        line for line in results.splitlines() if line.startswith(f"[{clicks[0]['arguments']['link_id']}] ")
    )
    assert all(want[a].lower() in listed.lower() for a in ("color", "material", "category"))
    assert f"[{clicks[1]['arguments']['link_id']}] Add size {want['size']} " in product
    # a results page without the item: the oracle pages on; an unexpected page: it searches
    env.reset(options={"task_index": 7})
    core = env.unwrapped
    query = f"{want['color']}+{want['material']}+{want['category']}"
    page = 2  # the item is listed on page 1
    core.browser.open(f"/shop/search?q={query}&page={page}")
    assert not any(link.endswith(f"/shop/product/{want['target']}") for link in core.browser.links)
    next_link = json.loads(core.oracle_action([]).split("<tool_call>")[1].split("</tool_call>")[0])
    assert core.browser.links[next_link["arguments"]["link_id"]].endswith(f"page={page + 1}")
    core.browser.open("/shop/cart")
    assert '"url": "/shop/search?q=' in core.oracle_action([])
    # buy a different color of the same category: 4 of 5 attributes at most
    core = env.unwrapped
    env.reset(options={"task_index": 7})
    want = core.task.metadata
    other = next(
        p
        for p in catalogue()
        if p.category == want["category"]
        and p.color != want["color"]
        and p.material == want["material"]
        and p.sizes.get(want["size"])
        and p.price <= want["budget"]
    )
    for url in (f"/shop/cart/add?product={other.id}&size={want['size']}", "/shop/checkout"):
        env.step(format_tool_call("open", {"url": url}))
    _, reward, term, _, info = env.step("done")
    assert term and reward == pytest.approx(0.8) and info["reward/correct"] == 0.0
    assert "color" not in info["details"]["matched"]
    env.reset(options={"task_index": 7})  # a new session: no order yet
    _, reward, *_ = env.step("done")
    assert reward == 0.0
    env.close()


def _buy(env, *checkouts):
    """Place each checkout (a list of `(product id, size)`) through the env's browser; the final reply."""
    for items in checkouts:
        for pid, size in items:
            obs, *_ = env.step(format_tool_call("open", {"url": f"/shop/cart/add?product={pid}&size={size}"}))
            assert obs[0]["content"].startswith("Cart ("), obs  # the real site took it
        obs, *_ = env.step(format_tool_call("open", {"url": "/shop/checkout"}))
        assert "Order placed" in obs[0]["content"]
    _, reward, terminated, _, info = env.step("done")
    assert terminated
    return reward, info


def test_webshop_scores_an_order_on_all_it_holds():
    env = gym.make("textgym/WebShop-v0")
    env.reset(options={"task_index": 7})
    want = env.unwrapped.task.metadata
    assert want == {"category": "dress", "color": "orange", "material": "wool", "size": "L", "budget": 65,
                    "target": 413}  # fmt: skip
    by_id = {p.id: p for p in catalogue()}
    target = (413, "L")

    def stocked(p):
        return next(s for s, n in p.sizes.items() if n)

    dearer = next(p for p in catalogue() if p.category == "dress" and p.price > 65 and any(p.sizes.values()))
    other_kind = next(
        p for p in catalogue() if p.category != "dress" and p.price <= 65 and any(p.sizes.values())
    )
    near = next(
        p for p in catalogue()
        if p.category == "dress" and p.color != "orange" and p.material != "wool" and p.sizes.get("L")
        and p.price <= 65
    )  # fmt: skip
    price, two_near = by_id[413].price, by_id[413].price + near.price
    assert price == 58.95 and two_near > 65  # so two items are also over budget here
    two, two_apart = "2 items ordered, 1 asked for", "2 items ordered in 2 checkouts, 1 asked for"

    def over(total):
        return f"total {total:.2f} over budget 65.00"

    dearer_item, other_item = (dearer.id, stocked(dearer)), (other_kind.id, stocked(other_kind))
    near_lost = [
        f"color {near.color} ordered, orange asked for",
        f"material {near.material} ordered, wool asked for",
    ]
    cases = [
        ([[target]], 1.0, None, []),
        ([[target, target]], 0.0, "several_items", [two, over(2 * price)]),
        ([[target, (near.id, "L")]], 0.0, "several_items", [two, over(two_near)]),
        ([[target], [(near.id, "L")]], 0.0, "several_items", [two_apart, over(two_near)]),
        ([[target, dearer_item]], 0.0, "several_items", [two, over(price + dearer.price)]),
        ([[dearer_item]], 0.0, "over_budget", [over(dearer.price)]),
        ([[other_item]], 0.0, "wrong_category", [f"a {other_kind.category} ordered, a dress asked for"]),
        ([[(near.id, "L")]], 0.6, None, near_lost),
        ([], 0.0, "no_order", ["no order placed"]),
    ]
    for checkouts, reward_wanted, refused, lost in cases:
        env.reset(options={"task_index": 7})  # a new session: nothing bought yet
        reward, info = _buy(env, *checkouts)
        details = info["details"]
        assert reward == pytest.approx(reward_wanted), (checkouts, details)
        assert info["reward/correct"] == float(reward_wanted == 1.0)
        assert (details["refused"], details["lost"]) == (refused, lost), checkouts
        items = sum(len(c) for c in checkouts)
        total = round(sum(by_id[pid].price for c in checkouts for pid, _ in c), 2)
        assert (details["items"], details["total"]) == (items, total)
    # a shotgun order within budget: the count alone zeroes it
    cheap = next(
        i for i, t in enumerate(shop_tasks()) if 2 * by_id[t.metadata["target"]].price <= t.metadata["budget"]
    )
    env.reset(options={"task_index": cheap})
    m = env.unwrapped.task.metadata
    reward, info = _buy(env, [(m["target"], m["size"])] * 2)
    assert (reward, info["details"]["refused"], info["details"]["lost"]) == (
        0.0, "several_items", ["2 items ordered, 1 asked for"]
    )  # fmt: skip
    # the site's record: every checkout of the session, together
    env.reset(options={"task_index": 7})
    _buy(env, [target], [(near.id, "L"), target])
    core = env.unwrapped
    record = httpx.get(f"{core.site_url}/shop/api/order", params={"session": core.session}).json()
    assert record["orders"] == 2 and [(i["product"], i["size"]) for i in record["items"]] == [
        target, (near.id, "L"), target
    ]  # fmt: skip
    assert record["total"] == round(2 * by_id[413].price + near.price, 2)
    env.close()


N_BLIND = 100


def test_a_blind_buyer_earns_little_whatever_it_buys():
    """Buying one fixed item whatever the instruction says: the best such item over tasks 0..N_BLIND-1."""
    env = gym.make("textgym/WebShop-v0")
    core = env.unwrapped
    by_id = {p.id: p for p in catalogue()}
    totals = dict.fromkeys(((p.id, s) for p in catalogue() for s, n in p.sizes.items() if n), 0.0)
    shares = dict.fromkeys(totals, 0.0)  # the five-attribute share alone, without the zeroing rules
    for i in range(N_BLIND):
        env.reset(options={"task_index": i})
        want = core.task.metadata
        for pid, size in totals:
            totals[pid, size] += core.score_order({"items": [{"product": pid, "size": size}]})[0]
            p = by_id[pid]
            shares[pid, size] += (
                sum((p.category == want["category"], p.color == want["color"], size == want["size"],
                     p.material == want["material"], p.price <= want["budget"])) / 5
            )  # fmt: skip
    # an item earns only on the tasks that ask for its kind; the share alone paid a blind buyer 0.37
    assert max(totals.values()) / N_BLIND == pytest.approx(0.09)
    assert max(shares.values()) / N_BLIND == pytest.approx(0.366)
    env.close()


def test_wordle_feedback_and_parsing():
    assert score_guess("speed", "abide") == "--Y-Y"
    assert score_guess("eerie", "there") == "Y-Y-G"
    assert parse_guess("I think \\boxed{Crane}") == "crane" and parse_guess("plant") == "plant"
    assert parse_guess("no idea") is None
    env = gym.make("textgym/Wordle-v0")
    env.reset(options={"task_index": WORDS.index("craft")})
    obs, r, term, _trunc, _ = env.step("\\boxed{trace}")
    assert obs[0]["content"].startswith("trace: Y G G Y -") and r == 0.0 and not term
    obs, r, term, *_ = env.step("hmm")
    assert "could not read a guess" in obs[0]["content"]
    _, r, term, *_ = env.step("<guess>craft</guess>")
    assert r == 1.0 and term


def test_wiki_answer_normalisation():
    assert normalize_answer(" The Kalomira. ") == "kalomira"
    assert extract_final_answer("so \\boxed{Ravelo} it is") == "Ravelo"
    assert extract_final_answer("Answer: Ravelo") == "Ravelo"


@pytest.mark.parametrize(
    ("reply", "answer", "refused"),
    [
        (r"The answer is \boxed{Venido}.", "Venido", None),
        (r"Rimika is a city in Venido, so \boxed{Venido}", "Venido", None),
        (r"\boxed{Venido} \boxed{venido.}", "venido.", None),  # the same answer twice
        ("I looked it up.\nAnswer: Venido", "Venido", None),
        ("Answer: Venido\nSo the answer is Venido.", "Venido.", None),
        ("Venido", "Venido", None),
        (r"\boxed{Rimika} or \boxed{Venido}", "", "2 different answers given"),
        ("Answer: Venido\nAnswer: Rimika", "", "2 different answers given"),
        ("Answer: Rimika\nAnswer: Venido", "", "2 different answers given"),
        (
            r"\boxed{Venido}, or maybe Rimika",
            "",
            "another candidate after the answer (or, maybe, ...)",
        ),
        (
            r"\boxed{Venido}. Possibly Kamika.",
            "",
            "another candidate after the answer (or, maybe, ...)",
        ),
        (
            r"It is Rimika or \boxed{Venido}",
            "",
            "alternatives in the answer's sentence (or, either, ...)",
        ),
        ("\\boxed{Venido}\nAnswer: Rimika", "", "another answer is given after the box"),
    ],
)
def test_wiki_reply_names_one_answer_or_none(reply, answer, refused):
    assert read_final_answer(reply) == (answer, refused)
    env = gym.make("textgym/WikiSearch-v0")
    env.reset(options={"task_index": 0})  # Nilo Famini, born in Rimika, a city of Venido
    _, reward, terminated, _, info = env.step(reply)
    assert terminated and reward == float(refused is None) and info["details"]["refused"] == refused
    env.close()


def test_eval_cli_with_scripted_agents():
    r = CliRunner().invoke(
        app,
        ["eval", "--env", "textgym/WikiSearch-v0", "--agent", "oracle", "--n", "20", "--json"],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["accuracy"] == 1.0
    r = CliRunner().invoke(app, ["eval", "--env", "textgym/Wordle-v0"], catch_exceptions=False)
    assert r.exit_code == 2 and "--agent model needs --model" in r.output


def test_toolmath_offers_the_named_tools_with_or_without_schemas_in_the_prompt():
    env = gym.make("textgym/ToolMath-v0", tools="calculator", operators="*", digits=3)
    obs, info = env.reset(options={"task_index": 0})
    assert [t["function"]["name"] for t in info["tools"]] == ["calculator"]
    bare = gym.make(
        "textgym/ToolMath-v0", tools=["calculator"], schemas_in_prompt=False, operators="*", digits=3
    )
    obs2, info2 = bare.reset(options={"task_index": 0})
    assert "tools" not in info2 and obs2 == obs  # same question, no schemas for the chat template
    expr = obs[0]["content"].split()[1].rstrip(".")
    reply, reward, terminated, _, _ = bare.step(format_tool_call("calculator", {"expression": expr}))
    assert (reward, terminated) == (0.0, False) and reply[0]["content"] == str(eval(expr))
    assert bare.step("\\boxed{" + reply[0]["content"] + "}")[1:3] == (1.0, True)
    with pytest.raises(ValueError, match="non-empty subset of"):
        gym.make("textgym/ToolMath-v0", tools="calculator,abacus")
    with pytest.raises(ValueError, match="non-empty subset of"):
        gym.make("textgym/ToolMath-v0", tools="")


def test_guess_number_feedback_narrows_the_range_and_bisection_always_wins():
    from textgym.envs.guess_number import parse_number_guess

    assert parse_number_guess("I say \\boxed{42}") == 42 and parse_number_guess(" 7 ") == 7
    assert parse_number_guess("\\boxed{4} or \\boxed{5}") is None and parse_number_guess("4 5") is None
    assert parse_number_guess("9" * 100_000) is None  # bounded parse
    env = gym.make("textgym/GuessNumber-v0", split="test")
    assert env.unwrapped.tasks.__len__() == 100
    env.reset(options={"task_index": 36})  # the number is 37
    obs, r, term, trunc, info = env.step("\\boxed{50}")
    assert (r, term, trunc) == (0.0, False, False) and "from 1 to 49" in obs[0]["content"]
    obs, *_ = env.step("\\boxed{20}")
    assert "from 21 to 49" in obs[0]["content"]
    obs, *_ = env.step("\\boxed{90}")  # outside the open range: it stays 21..49
    assert "from 21 to 49" in obs[0]["content"] and "4 guesses left" in obs[0]["content"]
    obs, r, term, trunc, info = env.step("maybe 30?")
    assert info["invalid_action"] and "could not read" in obs[0]["content"] and not term
    env.step("\\boxed{30}")
    env.step("\\boxed{31}")
    _, r, term, trunc, info = env.step("\\boxed{32}")  # the 7th guess, wrong: out of guesses
    assert (r, term, trunc) == (0.0, False, True) and info["guesses"] == 7
    # bisection finds every number of 1..100 within 7 guesses, and needs 7 for some
    turns = [play_episode(OracleAgent(), env, i)["turns"] for i in range(100)]
    assert max(turns) == 7 and sum(turns) / 100 == pytest.approx(5.8)
    # a smaller game with its own limit
    small = gym.make("textgym/GuessNumber-v0", high=8, max_guesses=3, max_episode_steps=3)
    obs, _ = small.reset(seed=0)
    assert "1 to 8" in obs[0]["content"] and "at most 3 guesses" in obs[0]["content"]
    with pytest.raises(ValueError, match="high must be greater"):
        gym.make("textgym/GuessNumber-v0", low=5, high=5)


def test_guess_number_oracle_prefix_opens_deep_in_the_bisection_tree_and_pays_only_the_policy():
    env = gym.make("textgym/GuessNumber-v0", oracle_prefix=6)
    assert env.unwrapped.tasks.task(3).metadata == {"oracle_prefix": 6}  # drawn from (seed, 3)
    obs, _ = env.reset(options={"task_index": 3})  # the number is 51
    assert env.unwrapped.task.answer == "51" and env.observation_space.contains(obs)
    assert [m["role"] for m in obs] == ["user"] + ["assistant", "user"] * 5  # stops short of 51
    assert [m["content"] for m in obs[1::2]] == [f"\\boxed{{{g}}}" for g in (50, 75, 62, 56, 53)]
    assert obs[-1]["content"] == "53 is too high. The number is from 51 to 52. 2 guesses left."
    assert env.unwrapped.guesses == 5 and (env.unwrapped.lo, env.unwrapped.hi) == (51, 52)
    assert env.unwrapped.oracle_action(obs) == "\\boxed{51}" and env.step("\\boxed{51}")[1:3] == (1.0, True)
    # the prefix's guesses count against the limit: two wrong guesses from here end the game
    env.reset(options={"task_index": 3})
    assert env.step("\\boxed{52}")[1:4] == (0.0, False, False)
    assert env.step("\\boxed{52}")[1:4] == (0.0, False, True)
    # depths are uniform on 0..oracle_prefix, and every restart is still won by bisection
    depths = [env.unwrapped.tasks.task(i).metadata["oracle_prefix"] for i in range(700)]
    assert set(depths) == set(range(7)) and min(depths.count(d) for d in range(7)) > 70
    wins = [play_episode(OracleAgent(), env, i)["reward"] for i in range(50)]
    assert wins == [1.0] * 50
    # off by default, and the test split's games start at the rules
    plain = gym.make("textgym/GuessNumber-v0", split="test")
    assert len(plain.reset(options={"task_index": 3})[0]) == 1
    assert plain.unwrapped.tasks.task(3).metadata == {}
    with pytest.raises(ValueError, match="oracle_prefix"):
        gym.make("textgym/GuessNumber-v0", oracle_prefix=-1)


def test_scripted_eval_reports_tool_calls_and_truncation_per_episode():
    wiki = evaluate_scripted(OracleAgent(), "textgym/WikiSearch-v0", n=10).turn_stats()
    assert wiki["tool_calls_mean"] == wiki["turns_mean"] - 1 >= 1  # every turn but the answer calls a tool
    guess = evaluate_scripted(RandomAgent(seed=0), "textgym/GuessNumber-v0", {"split": "test"}, n=100)
    stats = guess.turn_stats()
    assert stats["truncated_time_limit_frac"] == pytest.approx(1 - guess.accuracy)
    assert stats["tool_calls_mean"] == 0


@pytest.mark.sandbox
def test_toolmath_oracle_calls_python_when_the_calculator_is_not_offered():
    kwargs = {"tools": "python", "split": "test"}
    result = evaluate_scripted(OracleAgent(), "textgym/ToolMath-v0", kwargs, n=5)
    assert result.accuracy == 1.0 and result.turn_stats()["tool_calls_mean"] == 1.0
    assert '"name": "python"' in result.episodes[0]["messages"][1]["content"]


def test_guess_number_progress_is_potential_based_and_bounded_by_finding_the_number():
    env = gym.make("textgym/GuessNumber-v0", split="test", progress_weight=0.5)
    env.reset(options={"task_index": 36})  # 37
    rewards = [env.step(a)[1] for a in ("\\boxed{50}", "\\boxed{90}", "oops", "\\boxed{37}")]
    assert rewards[1] == 0.0 and rewards[2] == 0.0  # out of the open range, unreadable: no progress
    assert rewards[0] == pytest.approx(0.5 * (1 - math.log2(49) / math.log2(100)))
    assert sum(rewards) == pytest.approx(1.0 + 0.5)  # progress telescopes to 1 when the number is found
    # any play: progress sums to Φ(end) − Φ(start) <= 1, so no guessing pattern out-earns finding the number
    rng = np.random.default_rng(0)
    for task in range(0, 100, 7):
        env.reset(options={"task_index": task})
        total, done = 0.0, False
        while not done:
            _, _, term, trunc, info = env.step(f"\\boxed{{{int(rng.integers(1, 101))}}}")
            total += info["reward/progress"]
            done = term or trunc
        assert -1e-12 <= total <= 1 + 1e-12
        assert (total == pytest.approx(1.0)) == (env.unwrapped.lo == env.unwrapped.hi)
    with pytest.raises(ValueError, match="progress_weight"):
        gym.make("textgym/GuessNumber-v0", progress_weight=-1)
    # a wasted guess (unreadable, or empty) can cost more than a wrong one
    env = gym.make("textgym/GuessNumber-v0", invalid_action_reward=-0.1)
    env.reset(options={"task_index": 0})
    assert [env.step(a)[1] for a in ("maybe fifty", "", "\\boxed{50}")] == [-0.1, -0.1, 0.0]


def test_an_env_whose_oracle_tool_call_takes_no_argument_still_gets_its_call():
    class OldStyle(ArithmeticEnv):
        def oracle_tool_call(self):  # the signature before the offered tools were passed
            return "calculator", {"expression": str(self.task.metadata["expression"])}

    env = ToolUseWrapper(OldStyle(operators="*", digits=3), [calculator_tool()])
    obs, _ = env.reset(options={"task_index": 0})
    assert '"name": "calculator"' in env.oracle_action(list(obs))
