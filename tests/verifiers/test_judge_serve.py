"""`JudgeVerifier` against a real `textgym serve` of the tiny model on 127.0.0.1 (the plumbing, for real).

A random tiny model is no judge: its replies have no verdict in the request's tags, so every
reward is 0.0 with the reason in `details["error"]`, which is the behaviour asserted. Everything
else is real: the request's fields pass the server's validation, greedy judgements repeat, a
wrong model name is the server's 404, reported without retries.
"""

from __future__ import annotations

import pytest

from textgym.types import Task
from textgym.verifiers.judge import JudgeItem, JudgeVerifier
from textgym.verifiers.judge_client import JudgeError

TASK = Task(task_id="t", prompt="Compute 3+4.", answer="7")


def test_a_tiny_model_judge_gives_unparsable_judgements_scored_0(served):
    judge = JudgeVerifier(served, "tiny", max_tokens=6, cache=False)
    judge.check()  # GET /v1/models lists "tiny"
    a = judge(r"\boxed{7}", TASK)
    assert a.reward == 0.0 and "no verdict of the form <verdict-" in a.details["error"]
    # greedy: the same request (same nonce) gets the same judgement
    messages = judge.messages(JudgeItem(TASK.prompt, (r"\boxed{7}",), TASK.answer))
    assert isinstance(a.details["judgement"], str)
    assert judge.client.chat(messages) == judge.client.chat(messages)
    assert judge.client.stats["requests"] == 3 and judge.client.stats["retries"] == 0
    (group,) = JudgeVerifier(served, "tiny", max_tokens=6).rank([JudgeItem("Compute 3+4.", ("7", "8", "9"))])
    assert [s.reward for s in group] == [0.0, 0.0, 0.0] and all(
        "no verdict of the form <verdict-" in s.details["error"] for s in group
    )


def test_a_wrong_model_name_is_the_servers_404_without_retries(served):
    judge = JudgeVerifier(served, "gpt-judge", max_tokens=4, backoff_s=0.01)
    with pytest.raises(JudgeError, match=r"refused the request: HTTP 404: .*'gpt-judge' is not served here"):
        judge(r"\boxed{7}", TASK)
    assert judge.client.stats["requests"] == 1
    with pytest.raises(JudgeError, match=r"does not serve 'gpt-judge'; it serves \['tiny'\]"):
        judge.check()
