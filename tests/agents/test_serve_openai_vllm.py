"""`textgym serve --backend vllm` against the official `openai` client: the key protocol items.

One server (an in-process vLLM engine, float32) for the module. Where vLLM is not installed
these tests skip, except under TEXTGYM_REQUIRE_VLLM=1 (CI), where its absence is a failure.
"""

from __future__ import annotations

import asyncio
import os

import openai
import pytest
from conftest import serve_app

from textgym.agents.vllm_backend import vllm_available
from textgym.models import load_tokenizer
from textgym.serve import build_app

pytestmark = pytest.mark.vllm

if not vllm_available():
    if os.environ.get("TEXTGYM_REQUIRE_VLLM") == "1":
        raise RuntimeError("TEXTGYM_REQUIRE_VLLM=1 but vLLM is not installed (pip install 'textgym[vllm]')")
    pytest.skip("vLLM is not installed", allow_module_level=True)

MSG = [{"role": "user", "content": "Compute 2+2."}]


@pytest.fixture(scope="module")
def vllm_server(tiny_model_dir):
    app = build_app(tiny_model_dir, "tiny", backend_name="vllm", vllm_kwargs={"dtype": "float32"})
    url, srv, thread = serve_app(app)
    yield url
    srv.should_exit = True
    thread.join(timeout=10)
    app.state.batcher.close()
    app.state.batcher.backend.close()


def test_vllm_server_protocol(vllm_server, tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    client = openai.OpenAI(base_url=vllm_server + "/v1", api_key="x", max_retries=0)
    # n and usage
    r = client.chat.completions.create(
        model="tiny", messages=MSG, n=3, max_tokens=8, seed=3, logprobs=True, temperature=1.0
    )
    assert len(r.choices) == 3
    prompt = tok.apply_chat_template(MSG, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == sum(len(c.logprobs.content) for c in r.choices)
    assert not any(e.token.startswith("token_id:") for c in r.choices for e in c.logprobs.content)
    # seed: the same choices again
    again = client.chat.completions.create(
        model="tiny", messages=MSG, n=3, max_tokens=8, seed=3, logprobs=True, temperature=1.0
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in r.choices]
    # streaming equals the plain greedy response; include_usage
    kw = dict(model="tiny", messages=MSG, max_tokens=12, temperature=0)
    plain = client.chat.completions.create(**kw)
    chunks = list(client.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}))
    assert (
        "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        == plain.choices[0].message.content
    )
    assert chunks[-1].usage.completion_tokens == plain.usage.completion_tokens
    # stop strings and max_completion_tokens
    text = (
        client.completions.create(model="tiny", prompt="Compute 2+2.", max_tokens=24, temperature=0)
        .choices[0]
        .text
    )
    if len(text) >= 4:
        cut = client.completions.create(
            model="tiny", prompt="Compute 2+2.", max_tokens=24, temperature=0, stop=text[2:4]
        )
        assert cut.choices[0].text == text[: text.find(text[2:4])] and cut.choices[0].finish_reason == "stop"
    short = client.chat.completions.create(
        model="tiny", messages=MSG, max_completion_tokens=2, temperature=1.0
    )
    assert short.usage.completion_tokens <= 2
    # errors
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=MSG, logprobs=True, top_logprobs=2)
    assert e.value.body["param"] == "top_logprobs"
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="other", messages=MSG)


def test_vllm_server_64_concurrent_requests(vllm_server):
    async def main() -> int:
        client = openai.AsyncOpenAI(base_url=vllm_server + "/v1", api_key="x", max_retries=0, timeout=600)
        rs = await asyncio.gather(
            *[
                client.chat.completions.create(
                    model="tiny", messages=[{"role": "user", "content": f"Compute {i}+1."}], max_tokens=16
                )
                for i in range(64)
            ],
            return_exceptions=True,
        )
        await client.close()
        return sum(isinstance(r, Exception) for r in rs)

    assert asyncio.run(main()) == 0
