"""Weight sync into a `textgym serve --backend vllm` server: the engine serves exactly what was pushed.

One in-process server (a vLLM engine in float32, served by uvicorn in a thread) and the trainer
in this process, over gloo on 127.0.0.1. vLLM keeps fused weights, so there is no checksum:
greedy ids after each push must equal the transformers backend's on the trainer's weights.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from conftest import serve_app

from textgym.agents.vllm_backend import vllm_available
from textgym.agents.weight_sync import merged_state_dict
from textgym.models import load_model
from textgym.serve import build_app
from textgym.training.sources.servers import RolloutServerGroup

pytestmark = [pytest.mark.vllm, pytest.mark.multiproc]

if not vllm_available():
    if os.environ.get("TEXTGYM_REQUIRE_VLLM") == "1":
        raise RuntimeError("TEXTGYM_REQUIRE_VLLM=1 but vLLM is not installed (pip install 'textgym[vllm]')")
    pytest.skip("vLLM is not installed", allow_module_level=True)

from test_weight_sync import _greedy, _local_greedy, _perturb  # noqa: E402


@pytest.fixture(scope="module")
def vllm_url(tiny_model_dir) -> Iterator[str]:
    app = build_app(
        tiny_model_dir, "tiny", backend_name="vllm", vllm_kwargs={"dtype": "float32"}, weight_sync=True
    )
    url, server, thread = serve_app(app)
    yield url
    server.should_exit = True
    thread.join(timeout=10)
    app.state.batcher.close()
    app.state.batcher.backend.close()


def test_a_vllm_server_generates_with_the_pushed_weights(vllm_url, tiny_model_dir):
    from textgym.config.base import LoraSettings
    from textgym.training.lora import apply_lora

    model, tokenizer = load_model(tiny_model_dir)
    model.eval()
    assert _greedy(vllm_url) == (_local_greedy(model, tokenizer), {0})
    with RolloutServerGroup([vllm_url], timeout_s=60, http_timeout_s=10) as group:
        _perturb(model.parameters(), seed=1)
        group.push(model, version=1, step=1)
        assert _greedy(vllm_url) == (_local_greedy(model, tokenizer), {1})

        lora = apply_lora(load_model(tiny_model_dir)[0], LoraSettings(r=4, alpha=8))
        group.push(lora, version=2, step=2, lora="merged")  # back to the base weights (B = 0)
        _perturb([p for n, p in lora.named_parameters() if "lora_B" in n], seed=3, scale=0.05)
        group.push(lora, version=3, step=3)  # adapters only, merged by the server
    merged, _ = load_model(tiny_model_dir)
    merged.load_state_dict(merged_state_dict(lora))
    merged.eval()
    assert _greedy(vllm_url) == (_local_greedy(merged, tokenizer), {3})
