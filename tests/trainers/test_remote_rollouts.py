"""Rollout-server settings and the `openai` backend's spreading over servers, without a server.

The training runs against real servers are in `tests/distributed/test_rollout_servers_training.py`.
"""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from pydantic import ValidationError

from textgym.agents.openai_backend import OpenAIBackend
from textgym.agents.sampling import SamplingParams
from textgym.config import ConfigError
from textgym.config.online_dpo import OnlineDPOConfig
from textgym.config.rl import RolloutEngineConfig
from textgym.training.sources.remote import check_servers

ENV = {"id": "textgym/Arithmetic-v0"}


def test_rollout_server_settings_are_checked():
    cfg = RolloutEngineConfig(servers=["http://127.0.0.1:8001", "http://127.0.0.1:8002/"])
    assert cfg.use_tis  # the servers sample, the trainer trains: TIS on by default
    assert not RolloutEngineConfig(servers=["http://a:1"], tis=False).use_tis
    assert not RolloutEngineConfig().use_tis
    with pytest.raises(ValidationError, match="not an http"):
        RolloutEngineConfig(servers=["127.0.0.1:8001"])
    with pytest.raises(ValidationError, match="listed twice"):
        RolloutEngineConfig(servers=["http://a:1", "http://a:1/"])
    with pytest.raises(ValidationError, match="leave backend at 'transformers'"):
        RolloutEngineConfig(servers=["http://a:1"], backend="vllm")
    with pytest.raises(ValidationError, match="online DPO does not generate on rollout servers"):
        OnlineDPOConfig(env=ENV, rollout={"servers": ["http://a:1"]})


def test_an_unreachable_server_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"http://127\.0\.0\.1:9 is not reachable"):
        check_servers(["http://127.0.0.1:9"], timeout_s=2)


def test_requests_go_to_the_least_loaded_server_with_their_seeds():
    seen: list[tuple[str, int]] = []
    gate = asyncio.Event()

    async def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        seen.append((request.url.host, body["seed"]))
        if len(seen) == 4:
            gate.set()
        await gate.wait()  # all four in flight at once: the load decides where each goes
        choice = {"logprobs": {"tokens": ["token_id:7"], "token_logprobs": [-0.5]}, "finish_reason": "stop"}
        return httpx.Response(200, json={"choices": [choice], "policy_version": 3})

    backend = OpenAIBackend(["http://a:1", "http://b:2/v1"], "tiny", eos_ids=[7])
    assert backend.urls == ["http://a:1/v1/completions", "http://b:2/v1/completions"]

    async def run() -> list:
        sem = asyncio.Semaphore(8)
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as client:
            jobs = [backend.generate_one(client, sem, [1, 2], SamplingParams(), seed=s) for s in range(4)]
            return await asyncio.gather(*jobs)

    gens = asyncio.run(run())
    assert sorted(seen) == [("a", 0), ("a", 2), ("b", 1), ("b", 3)]
    assert [g.token_ids for g in gens] == [[7]] * 4 and {g.policy_version for g in gens} == {3}
    assert backend._in_flight == [0, 0]
    with pytest.raises(ValueError, match="2 seeds for 1 prompts"):
        backend.generate([[1]], SamplingParams(), seeds=[1, 2])
