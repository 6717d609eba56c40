"""`textgym serve` against the official `openai` client (sync and async), on 127.0.0.1.

The tiny model answers; nothing about the model is faked. The tool-call conversion is tested
on hand-written Hermes text (a random tiny model does not emit calls), and end to end that
`tools` reach the chat template.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import openai
import pytest
from conftest import serve_app

from textgym.models import load_tokenizer
from textgym.serve import build_app, tool_calls_from_text
from textgym.serve.batching import Batcher, Job, QueueFullError
from textgym.serve.protocol import cut_at_stop

MSG = [{"role": "user", "content": "Compute 2+2."}]
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "calculator",
            "description": "Evaluate an arithmetic expression.",
            "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
        },
    }
]


@pytest.fixture(scope="module")
def server(tiny_model_dir):
    app = build_app(tiny_model_dir, "tiny")
    url, srv, thread = serve_app(app)
    yield url, app
    srv.should_exit = True
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0)


@pytest.fixture(scope="module")
def tok(tiny_model_dir):
    return load_tokenizer(tiny_model_dir)


def _prompt_len(tok, messages, tools=None) -> int:
    ids = tok.apply_chat_template(
        messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    return len(ids)


def test_models_and_n_choices_and_usage(client, tok):
    assert [m.id for m in client.models.list().data] == ["tiny"]
    assert client.models.retrieve("tiny").id == "tiny"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("other")
    r = client.chat.completions.create(model="tiny", messages=MSG, n=3, max_tokens=8, seed=1)
    assert len(r.choices) == 3 and [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage is not None and r.usage.prompt_tokens == _prompt_len(tok, MSG)
    # completion tokens: every sampled token of every choice, end-of-turn included
    r2 = client.chat.completions.create(
        model="tiny",
        messages=MSG,
        n=3,
        max_tokens=8,
        seed=1,
        logprobs=True,
        extra_body={"return_tokens_as_token_ids": True},
    )
    n_sampled = sum(len(c.logprobs.content) for c in r2.choices)
    assert r2.usage.completion_tokens == n_sampled and 3 <= n_sampled <= 24
    assert r2.usage.total_tokens == r2.usage.prompt_tokens + n_sampled
    assert [c.message.content for c in r2.choices] == [c.message.content for c in r.choices]  # same seed
    c = client.completions.create(model="tiny", prompt="Compute 2+2.", n=2, max_tokens=5, temperature=0)
    assert len(c.choices) == 2 and c.choices[0].text == c.choices[1].text
    assert c.usage.prompt_tokens == len(tok("Compute 2+2.", add_special_tokens=False)["input_ids"])


def test_max_tokens_and_max_completion_tokens_bound_the_completion(client):
    for kw in (
        {"max_tokens": 3},
        {"max_completion_tokens": 3},
        {"max_tokens": 50, "max_completion_tokens": 3},
    ):
        r = client.chat.completions.create(model="tiny", messages=MSG, temperature=1.0, n=4, seed=5, **kw)
        assert r.usage.completion_tokens <= 12
        assert all(c.finish_reason in ("length", "stop") for c in r.choices)
    c = client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4, temperature=0)
    assert c.usage.completion_tokens <= 4


def test_seed_makes_sampling_reproducible(client):
    def ask(seed):
        r = client.chat.completions.create(
            model="tiny", messages=MSG, temperature=1.0, max_tokens=16, seed=seed, n=2
        )
        return [c.message.content for c in r.choices]

    a, b, other = ask(7), ask(7), ask(8)
    assert a == b and a != other and a[0] != a[1]


def test_stop_strings_cut_the_text(client, tok):
    full = client.completions.create(model="tiny", prompt="Compute 2+2.", max_tokens=24, temperature=0)
    text = full.choices[0].text
    assert len(text) >= 4
    stop = text[2:4]
    cut = client.completions.create(
        model="tiny", prompt="Compute 2+2.", max_tokens=24, temperature=0, stop=[stop]
    )
    want = text[: text.find(stop)]
    assert cut.choices[0].text == want and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens <= full.usage.completion_tokens
    chat_full = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=24, temperature=0)
    content = chat_full.choices[0].message.content
    if len(content) >= 3:
        chat_cut = client.chat.completions.create(
            model="tiny", messages=MSG, max_tokens=24, temperature=0, stop=content[1:3]
        )
        assert chat_cut.choices[0].message.content == content[: content.find(content[1:3])]
        assert chat_cut.choices[0].finish_reason == "stop"
    # the cut is at the token that completes the stop string
    ids = tok("abc def", add_special_tokens=False)["input_ids"]
    k, t = cut_at_stop(ids, tok.decode, ["c d"])
    assert t == "ab" and "c d" in tok.decode(ids[:k]) and "c d" not in tok.decode(ids[: k - 1])
    assert cut_at_stop(ids, tok.decode, ["zz"]) is None


def test_streaming_equals_the_plain_response(client):
    kw = dict(model="tiny", messages=MSG, max_tokens=16, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == plain.choices[0].message.content and len(text) > 0
    assert sum(1 for c in chunks if c.choices and c.choices[0].delta.content) >= 2  # token-sized pieces
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == [plain.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])
    # completions, no usage chunk unless asked
    ckw = dict(model="tiny", prompt="Compute 2+2.", max_tokens=12, temperature=0)
    cplain = client.completions.create(**ckw)
    cchunks = list(client.completions.create(**ckw, stream=True))
    assert "".join(c.choices[0].text for c in cchunks) == cplain.choices[0].text
    assert all(c.usage is None for c in cchunks)


def test_logprobs_are_token_strings_unless_ids_are_asked(client, tok):
    r = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3
    )
    content = r.choices[0].logprobs.content
    assert content and not any(e.token.startswith("token_id:") for e in content)
    for e in content:
        assert len(e.top_logprobs) == 3 and e.bytes == list(e.token.encode())
        assert e.top_logprobs[0].token == e.token  # greedy: the sampled token is the most likely
        assert abs(e.top_logprobs[0].logprob - e.logprob) < 1e-4
        assert e.top_logprobs[0].logprob >= e.top_logprobs[1].logprob >= e.top_logprobs[2].logprob
    text = "".join(e.token for e in content)
    assert text.startswith(r.choices[0].message.content)
    ids = client.chat.completions.create(
        model="tiny",
        messages=MSG,
        max_tokens=6,
        temperature=0,
        logprobs=True,
        extra_body={"return_tokens_as_token_ids": True},
    ).choices[0]
    as_ids = [int(e.token.removeprefix("token_id:")) for e in ids.logprobs.content]
    assert [tok.decode([t]) for t in as_ids] == [e.token for e in content]
    # completions: the legacy form
    c = client.completions.create(
        model="tiny", prompt="Compute 2+2.", max_tokens=5, temperature=0, logprobs=2
    )
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset)
    assert all(len(t) == 2 and tok_ in t for t, tok_ in zip(lp.top_logprobs, lp.tokens, strict=True))
    assert lp.text_offset[0] == 0 and "".join(lp.tokens).startswith(c.choices[0].text)


def test_tool_calls_from_hermes_text():
    text = (
        "Let me compute.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "17 * 23"}}\n</tool_call>\n'
        '<tool_call>{"name": "search", "arguments": {"query": "x"}}</tool_call>'
    )
    content, calls = tool_calls_from_text(text)
    assert content == "Let me compute."
    assert [c["function"]["name"] for c in calls] == ["calculator", "search"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"expression": "17 * 23"}
    assert all(c["type"] == "function" and c["id"].startswith("call_") for c in calls)
    assert tool_calls_from_text('<tool_call>{"name": "a", "arguments": {}}</tool_call>')[0] is None
    assert tool_calls_from_text("plain") == ("plain", [])
    # the openai client reads the shape
    from openai.types.chat import ChatCompletionMessage

    msg = ChatCompletionMessage.model_validate({"role": "assistant", "content": content, "tool_calls": calls})
    assert msg.tool_calls[0].function.name == "calculator"


def test_tools_reach_the_chat_template(client, tok):
    plain = client.chat.completions.create(model="tiny", messages=MSG, max_tokens=2, temperature=0)
    with_tools = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=2, temperature=0, tools=TOOLS, tool_choice="auto"
    )
    assert with_tools.usage.prompt_tokens == _prompt_len(tok, MSG, TOOLS) > plain.usage.prompt_tokens
    none = client.chat.completions.create(
        model="tiny", messages=MSG, max_tokens=2, temperature=0, tools=TOOLS, tool_choice="none"
    )
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, tools=TOOLS, tool_choice="required")
    assert e.value.body["param"] == "tool_choice"
    # an assistant turn with tool_calls (arguments as a JSON string) and a tool result render
    history = [
        *MSG,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "calculator", "arguments": '{"expression": "2+2"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "4"},
    ]
    r = client.chat.completions.create(
        model="tiny", messages=history, max_tokens=2, tools=TOOLS, temperature=0
    )
    assert r.usage.prompt_tokens > with_tools.usage.prompt_tokens


def test_errors_are_openai_shaped(client, server):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, temperature=-1)
    assert e.value.status_code == 400 and e.value.body["param"] == "temperature"
    assert e.value.body["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, frequency_penalty=0.5)
    assert e.value.body["param"] == "frequency_penalty"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, logit_bias={"5": 10})
    assert e.value.body["param"] == "logit_bias"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="x", n=0)
    assert e.value.body["param"] == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, response_format={"type": "json_object"})
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="tiny", input="x")
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MSG)
    assert e.value.status_code == 404 and e.value.body["code"] == "model_not_found"
    r = httpx.post(
        server[0] + "/v1/chat/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_a_full_queue_answers_503(tiny_model_dir):
    app = build_app(tiny_model_dir, "tiny", max_queue=1, max_batch=1)
    url, srv, thread = serve_app(app)
    try:
        client = openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0)
        outcomes: list[str] = []

        def ask() -> None:
            try:
                client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=300, temperature=1.0)
                outcomes.append("ok")
            except openai.InternalServerError as e:  # the client's class for 5xx
                assert e.status_code == 503 and e.body["type"] == "overloaded_error"
                outcomes.append("503")

        threads = [threading.Thread(target=ask) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "503" in outcomes and "ok" in outcomes
    finally:
        srv.should_exit = True
        thread.join(timeout=10)


def test_the_batcher_batches_waiting_requests_and_bounds_its_queue(tiny_model_dir):
    from textgym.agents import SamplingParams
    from textgym.agents.transformers_backend import TransformersBackend
    from textgym.models import load_model

    model, tok = load_model(tiny_model_dir)
    calls: list[int] = []
    backend = TransformersBackend(model, tok)
    generate = backend.generate

    def counting(prompts, params, seeds=None):  # the real backend, counted
        calls.append(len(prompts))
        time.sleep(0.2)
        return generate(prompts, params, seeds=seeds)

    backend.generate = counting  # type: ignore[method-assign]
    b = Batcher(backend, max_queue=8)
    p = SamplingParams(temperature=0.0, max_new_tokens=4)
    jobs = [Job([[5, 6, 7]], p, [None]) for _ in range(5)]
    futs = [b.submit(j) for j in jobs]
    results = [f.result(timeout=60) for f in futs]
    assert all(r[0].token_ids == results[0][0].token_ids for r in results)
    assert len(calls) < 5  # the requests waiting behind the first were generated together
    with pytest.raises(QueueFullError):
        for _ in range(20):
            b.submit(Job([[5]], SamplingParams(max_new_tokens=50), [None]))
    b.close()


def test_64_concurrent_async_requests(server):
    async def main() -> tuple[int, float]:
        client = openai.AsyncOpenAI(base_url=server[0] + "/v1", api_key="x", max_retries=0, timeout=300)
        t0 = time.perf_counter()
        rs = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"Compute {i}+{i}."}], max_tokens=16
                )
                for i in range(64)
            ],
            return_exceptions=True,
        )
        await client.close()
        errors = sum(isinstance(r, Exception) for r in rs)
        return errors, time.perf_counter() - t0

    errors, seconds = asyncio.run(main())
    print(f"64 concurrent chat requests: {errors} errors, {seconds:.2f} s")
    assert errors == 0
