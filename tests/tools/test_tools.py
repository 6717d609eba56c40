"""Tools: parsing tool calls, argument checks, the calculator, python (real sandbox), search and the browser
(real HTTP server on 127.0.0.1)."""

from __future__ import annotations

import pytest

import textgym  # noqa: F401
from textgym import sandbox
from textgym.envs.web.envs import wiki_index, wiki_tasks
from textgym.envs.web.site import SiteServer
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


@pytest.mark.sandbox
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
