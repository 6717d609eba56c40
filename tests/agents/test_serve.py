"""`textgym serve` and the `openai` agent backend, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import socket
import threading
import time

import gymnasium as gym
import pytest
from conftest import argmax_decode, check_exact_sampling, serve_app
from fastapi import FastAPI
from fastapi.responses import JSONResponse

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams, rollout
from textgym.agents.openai_backend import EndpointError, OpenAIBackend
from textgym.serve import build_app


def test_greedy_outputs_match_the_transformers_backend(served, tiny_model_dir):
    local = LLMAgent.from_pretrained(tiny_model_dir)
    remote = LLMAgent.from_endpoint(served, "tiny", tiny_model_dir, concurrency=4)
    params = SamplingParams(temperature=0.0, max_new_tokens=12)
    envs = [gym.make("textgym/Arithmetic-v0", split="test") for _ in range(40)]
    a = rollout(local, envs, list(range(40)), params)
    b = rollout(remote, envs, list(range(40)), params)
    same = sum(x.token_ids.tolist() == y.token_ids.tolist() for x, y in zip(a, b, strict=True))
    assert same / 40 >= 0.99
    for x, y in zip(a, b, strict=True):
        assert (x.logprobs - y.logprobs).abs().max() < 1e-4
        assert x.messages == y.messages


def test_server_rejects_bad_requests(served):
    import httpx

    r = httpx.post(served + "/v1/completions", json={"model": "other", "prompt": [1, 2]})
    assert r.status_code == 404 and "serves 'tiny'" in r.text
    r = httpx.post(served + "/v1/completions", json={"prompt": [10**9]})
    assert r.status_code == 400 and "token ids" in r.text
    r = httpx.post(served + "/v1/completions", json={"prompt": [1], "max_tokens": 0})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    models = httpx.get(served + "/v1/models").json()
    assert models["data"][0]["id"] == "tiny"
    chat = httpx.post(
        served + "/v1/chat/completions",
        json={"messages": [{"role": "user", "content": "Compute 2+2."}], "max_tokens": 5, "temperature": 0},
    ).json()
    assert chat["choices"][0]["message"]["role"] == "assistant"


def _flaky_app(plan: list[str]) -> FastAPI:
    """A fake endpoint that answers each request by the next entry of `plan`: 500, 429, hang, 400 or ok."""
    app = FastAPI()
    calls = {"n": 0}

    @app.post("/v1/completions")
    def completions() -> JSONResponse:
        kind = plan[min(calls["n"], len(plan) - 1)]
        calls["n"] += 1
        if kind == "hang":
            time.sleep(3)
        if kind in ("500", "429", "400"):
            return JSONResponse({"error": kind}, status_code=int(kind))
        body = {
            "choices": [
                {
                    "logprobs": {"tokens": ["token_id:5", "token_id:7"], "token_logprobs": [-0.5, -0.25]},
                    "finish_reason": "length",
                }
            ]
        }
        return JSONResponse(body)

    app.state.calls = calls
    return app


@pytest.mark.parametrize("plan", [["500", "ok"], ["429", "500", "ok"], ["hang", "ok"]])
def test_retryable_failures_are_retried(plan):
    app = _flaky_app(plan)
    url, server, thread = serve_app(app)
    try:
        backend = OpenAIBackend(url, "m", eos_ids=[0], timeout_s=1.0, backoff_s=0.05)
        (g,) = backend.generate([[1, 2, 3]], SamplingParams(max_new_tokens=2))
        assert g.token_ids == [5, 7] and g.logprobs.tolist() == [-0.5, -0.25] and g.finish_reason == "length"
        assert app.state.calls["n"] == len(plan)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_client_errors_and_exhausted_retries_are_clear():
    url, server, thread = serve_app(_flaky_app(["400"]))
    try:
        with pytest.raises(EndpointError, match="refused the request: HTTP 400"):
            OpenAIBackend(url, "m", eos_ids=[0], backoff_s=0.01).generate([[1]], SamplingParams())
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    url, server, thread = serve_app(_flaky_app(["500"]))
    try:
        with pytest.raises(EndpointError, match="failed 3 times; last: HTTP 500"):
            OpenAIBackend(url, "m", eos_ids=[0], max_retries=2, backoff_s=0.01).generate(
                [[1]], SamplingParams()
            )
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_eval_cli_through_the_endpoint_matches_local(served, tiny_model_dir):
    import json

    from typer.testing import CliRunner

    from textgym.cli import app

    base = ["eval", "--env", "textgym/Arithmetic-v0", "--env-kwargs", "split=test", "--n", "8", "--json"]
    base += ["--model", str(tiny_model_dir), "--max-new-tokens", "8"]
    local = CliRunner().invoke(app, base, catch_exceptions=False)
    remote = CliRunner().invoke(
        app, [*base, "--endpoint", served, "--served-model", "tiny"], catch_exceptions=False
    )
    assert local.exit_code == 0 and remote.exit_code == 0, remote.output
    a, b = (
        json.loads(local.stdout.strip().splitlines()[-1]),
        json.loads(remote.stdout.strip().splitlines()[-1]),
    )
    assert (a["accuracy"], a["mean_response_tokens"]) == (b["accuracy"], b["mean_response_tokens"])
    missing = CliRunner().invoke(app, [*base, "--endpoint", served], catch_exceptions=False)
    assert missing.exit_code == 2 and "--served-model" in missing.output


def _raw_server(responses: list[bytes]) -> tuple[str, dict[str, int], threading.Thread]:
    """A bare TCP server: connection i reads one request and sends `responses[i]` (the last one
    repeats), then closes the connection — so a response can be cut off mid-body."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.settimeout(30)
    state = {"n": 0}

    def serve() -> None:
        while state["n"] < 8:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            with conn:
                data = b""
                while b"\r\n\r\n" not in data:
                    data += conn.recv(65536)
                head, _, body = data.partition(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length")
                )
                while len(body) < length:
                    body += conn.recv(65536)
                conn.sendall(responses[min(state["n"], len(responses) - 1)])
                state["n"] += 1
        sock.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return f"http://127.0.0.1:{sock.getsockname()[1]}", state, thread


def test_a_connection_closed_mid_response_is_retried():
    import json

    body = json.dumps(
        {
            "choices": [
                {"logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}, "finish_reason": "length"}
            ]
        }
    ).encode()
    ok = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    cut = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        + body[:9]
    )
    url, state, _ = _raw_server([cut, ok])
    (g,) = OpenAIBackend(url, "m", eos_ids=[0], backoff_s=0.01).generate(
        [[1, 2]], SamplingParams(max_new_tokens=1)
    )
    assert g.token_ids == [5] and state["n"] == 2


def test_an_endpoint_that_dies_mid_eval_keeps_the_finished_episodes(warm_model_dir, tmp_path):
    from starlette.requests import Request

    from textgym.evaluation import EvaluationInterruptedError, evaluate

    app = build_app(warm_model_dir, "warm")
    state = {"left": 16, "served": 0, "resumed": 0}

    @app.middleware("http")
    async def die_after_16(request: Request, call_next):  # type: ignore[no-untyped-def]
        if request.url.path.endswith("/completions"):
            # The resumed run's agent sends its own key, so a request of the first run still
            # on its way under load (the server reads it late) is not counted as a re-run.
            if request.headers.get("authorization") == "Bearer resumed":
                state["resumed"] += 1
            elif state["left"] <= 0:
                return JSONResponse({"error": "down"}, status_code=503)
            else:
                state["left"] -= 1
                state["served"] += 1
        return await call_next(request)

    url, server, thread = serve_app(app)
    env_kwargs = {"operators": "+", "digits": 1, "instruction": ""}
    params = SamplingParams(temperature=0.0, max_new_tokens=10)
    episodes = tmp_path / "episodes.jsonl"
    try:
        # A generous timeout: a timed-out request that is retried would be counted twice below.
        agent = LLMAgent.from_endpoint(
            url, "warm", warm_model_dir, max_retries=1, backoff_s=0.01, timeout_s=600
        )
        run = dict(n=32, params=params, batch_size=8, episodes_path=episodes, policy="warm")
        with pytest.raises(EvaluationInterruptedError, match="after 16 of 32 tasks") as err:
            evaluate(agent, "textgym/Arithmetic-v0", env_kwargs, **run)
        assert err.value.finished == 16 and len(episodes.read_text().splitlines()) == 16
        assert state["served"] == 16
        agent = LLMAgent.from_endpoint(url, "warm", warm_model_dir, api_key="resumed", timeout_s=600)
        resumed = evaluate(agent, "textgym/Arithmetic-v0", env_kwargs, **run)
        assert state["resumed"] == 16  # only the unfinished tasks ran again
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    local = evaluate(
        LLMAgent.from_pretrained(warm_model_dir), "textgym/Arithmetic-v0", env_kwargs, n=32, params=params
    )
    assert resumed.per_task == local.per_task and 0 < resumed.accuracy < 1
    assert resumed.mean_response_tokens == local.mean_response_tokens
    assert len(episodes.read_text().splitlines()) == 32


NEUTRAL_BODY = {
    "top_k": 0,
    "min_p": 0.0,
    "repetition_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
}
"""The sampling fields vLLM's server fills from a model's generation_config.json when a request leaves
them unset (`ModelConfig.get_diff_sampling_param`), at the values that turn each off."""


def _capturing_app(bodies: list[dict]) -> FastAPI:
    """A fake completions endpoint that records each request's JSON body."""
    from fastapi import Body

    app = FastAPI()

    @app.post("/v1/completions")
    def completions(body: dict = Body(...)) -> JSONResponse:  # noqa: B008
        bodies.append(body)
        choice = {"logprobs": {"tokens": ["token_id:5"], "token_logprobs": [-0.5]}, "finish_reason": "length"}
        return JSONResponse({"choices": [choice]})

    return app


def test_openai_backend_spells_out_every_sampling_field():
    bodies: list[dict] = []
    url, server, thread = serve_app(_capturing_app(bodies))
    try:
        backend = OpenAIBackend(url, "m", eos_ids=[0])
        backend.generate([[1, 2]], SamplingParams(max_new_tokens=3))
        backend.generate([[1, 2]], SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    assert bodies[0] == {
        "model": "m",
        "prompt": [1, 2],
        "max_tokens": 3,
        "temperature": 1.0,
        "top_p": 1.0,
        **NEUTRAL_BODY,
        "logprobs": 0,
        "return_tokens_as_token_ids": True,
    }
    assert {k: bodies[1][k] for k in ("temperature", "top_p", "top_k", "max_tokens")} == {
        "temperature": 0.7,
        "top_p": 0.9,
        "top_k": 5,
        "max_tokens": 4,
    }
    assert {k: bodies[1][k] for k in NEUTRAL_BODY if k != "top_k"} == {
        k: v for k, v in NEUTRAL_BODY.items() if k != "top_k"
    }


def test_server_takes_the_neutral_sampling_fields_and_refuses_others(served, tiny_model_dir):
    import httpx

    base = {"prompt": [5, 6, 7], "max_tokens": 6, "temperature": 0, "logprobs": 1}
    plain = httpx.post(served + "/v1/completions", json=base).json()
    spelled = httpx.post(served + "/v1/completions", json={**base, **NEUTRAL_BODY, "min_tokens": 0}).json()
    assert spelled["choices"][0]["text"] == plain["choices"][0]["text"]
    minus_one = httpx.post(served + "/v1/completions", json={**base, "top_k": -1})  # vLLM's old "off"
    assert minus_one.json()["choices"][0]["text"] == plain["choices"][0]["text"]
    for field, value in [
        ("repetition_penalty", 1.1),
        ("min_p", 0.05),
        ("presence_penalty", 0.5),
        ("frequency_penalty", -0.5),
        ("min_tokens", 3),
    ]:
        r = httpx.post(served + "/v1/completions", json={**base, field: value})
        assert r.status_code == 400 and field in r.text and "temperature, top_p and top_k only" in r.text
        chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, field: value}
        assert httpx.post(served + "/v1/chat/completions", json=chat).status_code == 400
    # top-1 sampling at T = 1 is greedy decoding
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, **NEUTRAL_BODY, "top_k": 1}
    r = httpx.post(served + "/v1/chat/completions", json=chat)
    greedy = httpx.post(served + "/v1/chat/completions", json={**chat, "top_k": 0, "temperature": 0})
    assert r.status_code == 200 and r.json()["choices"][0] == greedy.json()["choices"][0]


def test_serve_and_openai_backend_sample_exactly_the_params_not_the_folder(hostile_model_dir):
    import httpx

    from textgym.models import load_model

    model, tok = load_model(hostile_model_dir)
    url, server, thread = serve_app(build_app(hostile_model_dir, "hostile"))
    try:
        agent = LLMAgent.from_endpoint(url, "hostile", hostile_model_dir, concurrency=4)
        check_exact_sampling(agent.generate, model, tok, agent.backend.eos_ids)
        # a request that leaves every sampling field unset gets textgym's defaults (T = 1, no top-k /
        # top-p, no penalty), not the folder's: greedy when asked, diverse otherwise
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "Hi"}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        body = {"prompt": list(prompt), "max_tokens": 8}
        r = httpx.post(
            url + "/v1/completions",
            json={**body, "temperature": 0, "logprobs": 1, "return_tokens_as_token_ids": True},
        ).json()
        ids = [int(t.removeprefix("token_id:")) for t in r["choices"][0]["logprobs"]["tokens"]]
        assert ids == argmax_decode(model, list(prompt), 8, agent.backend.eos_ids)
        texts = {
            httpx.post(url + "/v1/completions", json=body).json()["choices"][0]["text"] for _ in range(8)
        }
        assert len(texts) >= 6
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_batched_requests_sample_what_one_request_per_prompt_samples(served, tiny_model_dir):
    """`prompts_per_request` (textgym serve's per-prompt `seeds`): fewer requests, the same tokens."""
    import httpx
    import torch

    prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13], [5, 6, 7], [14]]
    seeds = [11, 12, 13, 14, 15]
    params = SamplingParams(temperature=1.0, max_new_tokens=8)
    outs = {
        k: OpenAIBackend(served, "tiny", eos_ids=[0], prompts_per_request=k).generate(prompts, params, seeds)
        for k in (1, 2, 0)
    }
    for k in (2, 0):
        for a, b in zip(outs[1], outs[k], strict=True):
            assert a.token_ids == b.token_ids
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
    assert outs[1][0].token_ids != outs[1][3].token_ids  # the same prompt, another seed
    body = {"prompt": prompts[:2], "max_tokens": 4, "logprobs": 0}
    short = httpx.post(served + "/v1/completions", json={**body, "seeds": [1]})
    assert short.status_code == 400 and "seeds: 1 seeds for 2 prompts" in short.text
    both = httpx.post(served + "/v1/completions", json={**body, "seeds": [1, 2], "seed": 3})
    assert both.status_code == 400 and "not both" in both.text
    with pytest.raises(ValueError, match="prompts_per_request must be >= 0"):
        OpenAIBackend(served, "tiny", eos_ids=[0], prompts_per_request=-1)
