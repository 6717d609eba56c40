"""`textgym verify judge` and `textgym audit` end to end against a judge on 127.0.0.1 (`judge_fakes`)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from judge_fakes import FakeJudge, block, right_answer_judge, tagged
from typer.testing import CliRunner

from textgym.cli import app

ROOT = Path(__file__).resolve().parents[2]
runner = CliRunner()


def invoke(*args: object):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def lines_of(output: str) -> list[dict]:
    return [json.loads(x) for x in output.splitlines() if x.startswith("{")]


def write_jsonl(path: Path, rows: list) -> Path:
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


@pytest.fixture
def server():
    fakes: list[FakeJudge] = []

    def start(reply=None, **kw) -> FakeJudge:
        fakes.append(FakeJudge(reply, **kw))
        return fakes[-1]

    yield start
    for f in fakes:
        f.close()


def graded(prompt: str) -> str:
    """`SCORE: 7` for a response that says seven, no verdict for one that says nothing."""
    response = block(prompt, "response")
    if "nothing" in response:
        return "I cannot grade this."
    if "seven" in response:
        return "Seven is right but unexplained.\n" + tagged(prompt, "SCORE: 7")
    return "Wrong.\n" + tagged(prompt, "SCORE: 0")


def test_verify_judge_acceptance_in_a_subprocess(server, tmp_path):
    """The issue's acceptance: a 500 retried, an unparsable judgement → 0.0 with an error, SCORE: 7 → 0.7."""
    judge = server(graded).fail(500)
    path = write_jsonl(
        tmp_path / "in.jsonl",
        [
            {"prompt": "Compute 3+4.", "completion": "seven"},
            {"prompt": "Compute 3+4.", "completion": "nothing to say"},
            {"prompt": "Compute 3+4.", "completion": "eight"},
        ],
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "textgym", "verify", "judge", "--endpoint", judge.url, "--model", "judge"]
    r = subprocess.run([*cmd, "--input", str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    out = lines_of(r.stdout)
    assert [o["line"] for o in out] == [1, 2, 3] and len(r.stdout.splitlines()) == 3
    assert out[0]["reward"] == pytest.approx(0.7) and out[0]["details"]["score"] == 7.0
    assert out[1]["reward"] == 0.0 and "no verdict of the form <verdict-" in out[1]["details"]["error"]
    assert out[1]["details"]["judgement"] == "I cannot grade this."
    assert out[2]["reward"] == 0.0 and "error" not in out[2]["details"]
    assert len(judge.requests) == 4  # the 500, then one request per line
    assert "1 retries" in r.stderr and "1 unparsable" in r.stderr


def test_output_keeps_input_order_under_concurrency_and_bad_lines_exit_1(server, tmp_path):
    def slow_first(prompt: str) -> str:
        n = int(block(prompt, "response"))
        time.sleep(0.03 * (8 - n))  # earlier lines answer later
        return tagged(prompt, f"SCORE: {n}")

    judge = server(slow_first)
    rows: list = [{"prompt": "q", "completion": str(i)} for i in range(8)]
    rows.insert(3, {"prompt": "q"})  # no completion
    rows.insert(5, "not json")
    r = invoke("verify", "judge", "--endpoint", judge.url, "--model", "judge", "--input",
               write_jsonl(tmp_path / "in.jsonl", rows), "--concurrency", "4")  # fmt: skip
    assert r.exit_code == 1
    out = lines_of(r.stdout)
    assert [o["line"] for o in out] == list(range(1, 11))
    assert [o.get("reward") for o in out] == [0.0, 0.1, 0.2, None, 0.3, None, 0.4, 0.5, 0.6, 0.7]
    assert out[3]["error"] == "line 4: needs a string 'completion'" and "invalid JSON" in out[5]["error"]
    assert judge.max_in_flight == 4


def test_pairwise_and_group_modes_and_the_cache(server, tmp_path):
    biased = server(lambda p: tagged(p, "WINNER: A"))
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Compute 3+4.", "completion_a": r"\boxed{7}",
                                                     "completion_b": r"\boxed{8}"}] * 2)  # fmt: skip
    cache = tmp_path / "cache.jsonl"
    args = ("verify", "judge", "--endpoint", biased.url, "--model", "judge", "--mode", "pairwise")
    r = invoke(*args, "--input", pairs, "--cache", cache)
    assert r.exit_code == 0
    out = lines_of(r.stdout)
    assert [o["reward"] for o in out] == [0.5, 0.5] and not out[0]["details"]["consistent"]
    assert "consistent 0/2, position A chosen 4 times and B 0 (position bias +1.00)" in r.stderr
    assert len(biased.requests) == 2  # both orders of one pair; the repeated line came from the cache
    r = invoke(*args, "--input", pairs, "--cache", cache)
    assert r.exit_code == 0 and len(biased.requests) == 2 and "4 cached" in r.stderr

    fair = server(right_answer_judge)
    group = write_jsonl(
        tmp_path / "group.jsonl", [{"prompt": "Compute 3+4.", "completions": [r"\boxed{8}", r"\boxed{7}"]}]
    )
    r = invoke(
        "verify", "judge", "--endpoint", fair.url, "--model", "judge", "--mode", "group", "--input", group
    )
    assert r.exit_code == 0 and lines_of(r.stdout)[0]["rewards"] == [0.0, 1.0] and len(fair.requests) == 1


def test_endpoint_and_usage_errors(server, tmp_path):
    judge = server()
    path = write_jsonl(tmp_path / "in.jsonl", [{"prompt": "q", "completion": "c"}])
    r = invoke("verify", "judge", "--endpoint", judge.url, "--model", "nope", "--input", path)
    assert r.exit_code == 1
    url = r"http://127\.0\.0\.1:\d+/v1/chat/completions"
    assert re.search(
        rf"error: judge endpoint {url} refused the request: HTTP 404: .*'nope' not found", r.stderr
    )
    assert len(judge.requests) == 1
    r = invoke(
        "verify", "judge", "--endpoint", judge.url, "--model", "judge", "--input", tmp_path / "missing.jsonl"
    )
    assert r.exit_code == 2 and "not found" in r.stderr
    r = invoke(
        "verify", "judge", "--endpoint", judge.url, "--model", "judge", "--input", path, "--mode", "listwise"
    )
    assert r.exit_code == 2 and "--mode must be one of" in r.stderr
    bad_rubric = tmp_path / "rubric.txt"
    bad_rubric.write_text("Grade {prompt}.")
    r = invoke(
        "verify",
        "judge",
        "--endpoint",
        judge.url,
        "--model",
        "judge",
        "--input",
        path,
        "--rubric",
        bad_rubric,
    )
    assert r.exit_code == 2 and "needs the placeholder(s) ['{completion}', '{verdict_format}']" in r.stderr
    assert invoke("verify", "judge", "--help").exit_code == 0 and invoke("audit", "--help").exit_code == 0
