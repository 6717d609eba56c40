"""Tools, the tool-use wrapper, and the tool/web/game envs (real sandbox, real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import json
import subprocess
import sys

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env
from typer.testing import CliRunner

import textgym  # noqa: F401
from textgym import sandbox
from textgym.agents.scripted import OracleAgent, RandomAgent, evaluate_scripted, play_episode
from textgym.cli import app
from textgym.envs.arithmetic import ArithmeticEnv
from textgym.envs.tool_use import ToolUseWrapper
from textgym.envs.web.envs import extract_final_answer, normalize_answer, wiki_index, wiki_tasks
from textgym.envs.web.site import SiteServer, catalogue
from textgym.envs.wordle import WORDS, parse_guess, score_guess
from textgym.tools import (
    Browser,
    Tool,
    calculate,
    calculator_tool,
    format_tool_call,
    parse_tool_calls,
    python_tool,
)


@pytest.fixture(scope="module", autouse=True)
def _close_backends():
    yield
    sandbox.close_all()


@pytest.fixture
def site():
    url = SiteServer.acquire()
    yield url
    SiteServer.release()


# ----------------------------------------------------------------------------- parsing
def test_parse_tool_calls_hermes_format():
    text = (
        "Let me compute.\n<tool_call>\n"
        '{"name": "calculator", "arguments": {"expression": "2+2"}}\n</tool_call>\n'
        '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(1)\\"}"}</tool_call>'
    )
    calls, errors = parse_tool_calls(text)
    assert errors == []
    assert [(c.name, c.arguments) for c in calls] == [
        ("calculator", {"expression": "2+2"}),
        ("python", {"code": "print(1)"}),
    ]
    assert parse_tool_calls("no tools here") == ([], [])
    assert parse_tool_calls(format_tool_call("search", {"query": "x"}))[0][0].arguments == {"query": "x"}


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', "needs {"),
        ('<tool_call>{"name": "calculator", "arguments": [1, 2]}</tool_call>', "must be a JSON object"),
        ('<tool_call>{"name": "calculator", "arguments": {"expression": "1+', "not valid JSON"),
        ("<tool_call></tool_call>", "not valid JSON"),
    ],
)
def test_malformed_tool_calls_become_errors(text, reason):
    calls, errors = parse_tool_calls(text)
    assert calls == [] and len(errors) == 1 and reason in errors[0].reason


def test_tool_validates_arguments_and_contains_failures():
    def boom(x: int) -> str:
        raise RuntimeError("kaput")

    tool = Tool(
        "boom",
        "fails",
        {
            "type": "object",
            "properties": {"x": {"type": "integer"}},
            "required": ["x"],
            "additionalProperties": False,
        },
        boom,
    )
    r = tool({"x": "seven"})
    assert r.error and "bad arguments for boom (x: 'seven' is not of type 'integer')" in r.content
    assert "'x' is a required property" in tool({}).content
    assert "Additional properties" in tool({"x": 1, "y": 2}).content
    r = tool({"x": 1})
    assert r.error and r.content == "error: boom failed: RuntimeError: kaput"
    long = Tool("long", "long", {"type": "object"}, lambda: "z" * 10_000, max_result_chars=100)
    out = long({})
    assert not out.error and out.content.startswith("z" * 100) and "cut at 100 characters" in out.content


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("(17 + 5) * 3", "66"),
        ("7 / 2", "3.5"),
        ("2 ^ 10", "1024"),
        ("12 / 4", "3"),
        ("sqrt(2) * sqrt(2)", "2"),
        ("123456789 * 987654321", "121932631112635269"),
        ("max(3, 9) - min(4, 1)", "8"),
    ],
)
def test_calculator_values(expr, value):
    assert calculate(expr) == value


@pytest.mark.parametrize(
    "expr", ["", "x + 1", "().__class__", "__import__('os')", "9 ** 9 ** 9", "1 / 0", "'a' * 3", "1" * 600]
)
def test_calculator_rejects_without_eval(expr):
    with pytest.raises(ValueError):
        calculate(expr)
    assert calculator_tool()({"expression": expr}).error


def test_python_tool_runs_in_the_sandbox():
    tool = python_tool("process", timeout_s=2)
    assert tool({"code": "print(sum(range(10)))"}).content == "45\n"
    r = tool({"code": "import sys; print('out'); sys.stderr.write('oops'); sys.exit(3)"}).content
    assert "out" in r and "[stderr]\noops" in r and "[exit code 3]" in r
    assert "[timed out after 2 s]" in tool({"code": "while True: pass"}).content
    net = tool({"code": "import socket; socket.create_connection(('1.1.1.1', 80), timeout=2)"}).content
    assert "Network is unreachable" in net
    assert tool({"code": "x = 1"}).content.startswith("[no output")


# ----------------------------------------------------------------------------- search and browser
def test_bm25_search_finds_the_page_by_name():
    index = wiki_index()
    task = wiki_tasks()[10]
    person = task.metadata["person"]
    hits = index.search(person)
    assert hits and hits[0].title == person and hits[0].url == f"/wiki/{task.metadata['path'][0]}"
    assert index.search("zzzz qqqq") == []
    assert "no results" in index.tool()({"query": "zzzz"}).content


def test_browser_on_the_real_site(site):
    assert site.startswith("http://127.0.0.1:")
    b = Browser(site)
    page = b.open("/shop")
    assert page.startswith("Shop (") and "[0] shirt" in page
    results = b.click(0)  # the "shirt" category: a search
    assert "results for shirt" in results and "[0] " in results
    product = b.click(0)
    assert "Price: $" in product and "Add size" in product
    assert "Price" in b.find("price")
    with pytest.raises(ValueError, match="outside this site"):
        b.open("http://example.com/")
    with pytest.raises(ValueError, match="HTTP 404"):
        b.open("/shop/product/99999")
    with pytest.raises(ValueError, match="no link"):
        b.click(999)
    long = b.open("/shop/search?q=shirt+cotton+red+blue")
    assert "Next page" in long
    b.close()


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


def test_tool_turns_count_toward_the_time_limit():
    env = gym.make("textgym/ToolMath-v0")
    env.reset(options={"task_index": 0})
    ends = [env.step(format_tool_call("calculator", {"expression": "1+1"}))[2:4] for _ in range(6)]
    assert ends[:5] == [(False, False)] * 5 and ends[5] == (False, True)


@pytest.mark.parametrize("env_id", ["textgym/ToolMath-v0", "textgym/WebShop-v0", "textgym/WikiSearch-v0"])
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
        ("textgym/ToolMath-v0", 200),
        ("textgym/WebShop-v0", 200),
        ("textgym/WikiSearch-v0", 200),
        ("textgym/Wordle-v0", len(WORDS)),
    ],
)
def test_oracle_solves_and_random_agent_fails(env_id, n):
    oracle = evaluate_scripted(OracleAgent(), env_id, n=n)
    random = evaluate_scripted(RandomAgent(seed=0), env_id, n=n)
    assert oracle.accuracy >= 0.99 and oracle.mean_reward >= 0.99
    assert random.accuracy < 0.05


def test_oracle_uses_the_tools_and_webshop_reward_comes_from_the_order():
    env = gym.make("textgym/WebShop-v0")
    ep = play_episode(OracleAgent(), env, 7)
    roles = [m["role"] for m in ep["messages"]]
    assert roles.count("tool") == 4 and ep["terminated"] and ep["reward"] == 1.0
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
