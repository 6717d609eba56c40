"""examples/verifier_judge_server.py, the stand-in judge of the RLAIF preset and benchmark, on 127.0.0.1.

It answers the built-in rubrics of all three modes; through it the audit must find exactly what
the math verifier finds (it grades with the same verifier), and injected text must not move it.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
from pathlib import Path

import httpx
import pytest

from textgym.evaluation.audit import judge_scorer, run_audit, verifier_scorer
from textgym.evaluation.audit_set import adversarial_set
from textgym.verifiers.judge import JudgeItem, JudgeVerifier

ROOT = Path(__file__).resolve().parents[1]
ENV, KW = "textgym/Arithmetic-v0", {"split": "test", "operators": "+-*", "digits": 1, "instruction": ""}


@pytest.fixture(scope="module")
def example():
    spec = importlib.util.spec_from_file_location(
        "verifier_judge_server", ROOT / "examples" / "verifier_judge_server.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["verifier_judge_server"] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def url(example):
    server = example.make_server("127.0.0.1", 0, "verifier-judge")
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_gold_answers_from_the_question_or_the_reference(example):
    assert example.gold_answer("<question>\nCompute 2+3*4.\n</question>") == "14"
    assert example.gold_answer("<question>\nCompute 7-9.\n</question>") == "-2"
    assert example.gold_answer("<question>\nCompute 7-9.\n</question>\n<reference>\n5\n</reference>") == "5"
    assert example.gold_answer("<question>\nWhat is love?\n</question>") is None


def test_its_audit_is_the_math_verifiers_and_ignores_injections(url):
    items = adversarial_set(ENV, KW, n=3)
    judge = JudgeVerifier(url, "verifier-judge", reference=False)
    judge.check()
    report = run_audit(items, judge_scorer(judge), verifier=verifier_scorer(ENV, KW), judge=judge)
    v = report["verifier"]
    assert v["agreement"] == 1.0 and v["kappa"] == 1.0
    assert (report["false_positives"], report["false_negatives"]) == (
        v["false_positives"],
        v["false_negatives"],
    )
    by_kind = {k["kind"]: k["accepted_rate"] for k in report["kinds"]}
    assert by_kind["injection_score"] == by_kind["injection_note"] == by_kind["injection_delimiter"] == 0.0
    pb = report["position_bias"]
    assert pb["consistent_rate"] == 1.0 and pb["bias"] == 0.0 and pb["unparsable"] == 0
    (group,) = JudgeVerifier(url, "verifier-judge", mode="group").rank(
        [JudgeItem("Compute 2+3*4.", (r"\boxed{14}", r"\boxed{20}", "14"))]
    )
    assert [s.reward for s in group] == [1.0, 0.0, 1.0]
    stats = httpx.get(url + "/stats").json()
    assert stats["requests"] == judge.client.stats["requests"] + 1 and stats["latency_s_mean"] > 0
    unknown = JudgeVerifier(url, "verifier-judge")(r"\boxed{1}", _task("What is love?"))
    assert unknown.reward == 0.0 and "no verdict of the form <verdict-" in unknown.details["error"]


def _task(prompt: str):
    from textgym.types import Task

    return Task(task_id="t", prompt=prompt, answer=None)
