"""Versioned weight sync: a trainer (this process) and `textgym serve --weight-sync` processes on 127.0.0.1.

After a push every server's weights are bitwise equal to the trainer's (SHA-256 of the state
dict), greedy ids from every server equal the trainer's own, and every response reports the
new `policy_version`. A server killed (SIGKILL) or frozen (SIGSTOP) in the middle of a
broadcast makes the push raise `WeightSyncError` naming it and the step within the timeout;
the surviving server keeps its old weights and takes a new group. Every server process is
killed at teardown (SIGCONT first, for a frozen one).
"""

from __future__ import annotations

import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from conftest import free_port, start_weight_sync_server, wait_server_ready

from textgym.agents.openai_backend import OpenAIBackend
from textgym.agents.sampling import SamplingParams
from textgym.agents.transformers_backend import TransformersBackend
from textgym.agents.weight_sync import merged_state_dict
from textgym.distributed.transfer import checksum
from textgym.models import load_model
from textgym.serve.weights import DELAY_ENV
from textgym.training.sources.servers import RolloutServerGroup, WeightSyncError

pytestmark = pytest.mark.multiproc

PROMPTS = [[5, 17, 42, 7], [100, 3], [9, 9, 9, 9, 9, 1], [250, 31, 77]]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=10)


@contextmanager
def servers(model_dir: Path, n: int, logs: Path, **env: str) -> Iterator[list[tuple[str, subprocess.Popen]]]:
    """`n` `textgym serve --weight-sync` processes, ready; all killed on exit."""
    procs: list[tuple[str, subprocess.Popen]] = []
    try:
        for i in range(n):
            port = free_port()
            proc = start_weight_sync_server(model_dir, port, logs / f"server{i}.log", **env)
            procs.append((f"http://127.0.0.1:{port}", proc))
        for i, (url, proc) in enumerate(procs):
            wait_server_ready(url, proc, logs / f"server{i}.log")
        yield procs
    finally:
        for _, proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture(scope="module")
def pair(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[str]]:
    with servers(tiny_model_dir, 2, tmp_path_factory.mktemp("logs")) as procs:
        yield [url for url, _ in procs]


def _greedy(url: str) -> tuple[list[list[int]], set[int]]:
    """Greedy ids of PROMPTS from a server, and the policy versions its responses report."""
    ids, versions = [], set()
    for p in PROMPTS:
        body = {"prompt": p, "max_tokens": GREEDY.max_new_tokens, "temperature": 0.0, "logprobs": 1}
        r = httpx.post(url + "/v1/completions", json={**body, "return_tokens_as_token_ids": True}, timeout=60)
        assert r.status_code == 200, r.text
        out = r.json()
        versions.add(out["policy_version"])
        ids.append([int(t.removeprefix("token_id:")) for t in out["choices"][0]["logprobs"]["tokens"]])
    return ids, versions


def _local_greedy(model: Any, tokenizer: Any) -> list[list[int]]:
    return [g.token_ids for g in TransformersBackend(model, tokenizer).generate(PROMPTS, GREEDY)]


def _perturb(params: Any, seed: int, scale: float = 0.02) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=gen) * scale)


def _server_sum(url: str) -> tuple[str, int]:
    r = httpx.get(url + "/weights/checksum", timeout=60).json()
    return r["sha256"], r["policy_version"]


def test_a_push_leaves_every_server_bitwise_equal_to_the_trainer(pair, tiny_model_dir):
    model, tokenizer = load_model(tiny_model_dir)
    model.eval()
    start = checksum(model.state_dict().items())
    assert {_server_sum(u)[0] for u in pair} == {start}
    with RolloutServerGroup(pair, timeout_s=30, http_timeout_s=5, bucket_mb=1) as group:
        for version in (1, 2):
            _perturb(model.parameters(), seed=version)
            stats = group.push(model, version=version, step=version)
            want = checksum(model.state_dict().items())
            assert want != start
            assert [_server_sum(u) for u in pair] == [(want, version)] * 2
            local = _local_greedy(model, tokenizer)
            for url in pair:
                ids, versions = _greedy(url)
                assert ids == local
                assert versions == {version}
            remote = OpenAIBackend(pair[1], "tiny", TransformersBackend(model, tokenizer).eos_ids)
            gens = remote.generate(PROMPTS, GREEDY)
            assert {g.policy_version for g in gens} == {version}
        assert stats["weight_sync/bytes"] > 1e6 and stats["time/weight_sync_s"] < 30
        assert [s["step"] for s in group.status()] == [2, 2]  # type: ignore[index]


def test_a_lora_policy_sends_its_adapters_only(pair, tiny_model_dir):
    from textgym.config.base import LoraSettings
    from textgym.training.lora import apply_lora

    base, tokenizer = load_model(tiny_model_dir)
    model = apply_lora(base, LoraSettings(r=4, alpha=8))
    model.eval()
    with RolloutServerGroup(pair, timeout_s=30, http_timeout_s=5) as group:
        full = group.push(model, version=10, step=10, lora="merged")  # the servers' base: B = 0
        _perturb([p for n, p in model.named_parameters() if "lora_B" in n], seed=3, scale=0.05)
        stats = group.push(model, version=11, step=11)
    assert stats["weight_sync/bytes"] < full["weight_sync/bytes"] / 4
    want = checksum(merged_state_dict(model).items())
    assert [_server_sum(u) for u in pair] == [(want, 11)] * 2
    merged, _ = load_model(tiny_model_dir)  # the weights the servers generate with
    merged.load_state_dict(merged_state_dict(model))
    merged.eval()
    local = _local_greedy(merged, tokenizer)
    assert _greedy(pair[0]) == (local, {11})
    assert _greedy(pair[1]) == (local, {11})


def test_a_tensor_the_servers_cannot_take_is_refused_before_any_broadcast(pair):
    bogus = torch.nn.Module()
    bogus.register_parameter("bogus", torch.nn.Parameter(torch.zeros(3)))
    before = [_server_sum(u) for u in pair]
    with RolloutServerGroup(pair, timeout_s=30, http_timeout_s=5) as group:
        t0 = time.monotonic()
        with pytest.raises(WeightSyncError) as err:
            group.push(bogus, version=99, step=5)
    assert time.monotonic() - t0 < 10
    assert err.value.servers == pair and err.value.step == 5
    assert "step 5" in str(err.value) and "bogus: no such tensor" in str(err.value)
    assert [_server_sum(u) for u in pair] == before


def _push_in_thread(group: RolloutServerGroup, model: Any, step: int) -> dict[str, Any]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["stats"] = group.push(model, version=step, step=step)
        except Exception as e:  # the test inspects it
            box["error"], box["at"] = e, time.monotonic()

    box["thread"] = threading.Thread(target=run, daemon=True)
    box["thread"].start()
    return box


def _wait_mid_broadcast(url: str, box: dict[str, Any]) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and "error" not in box:
        s = httpx.get(url + "/weights/status", timeout=5).json()
        if s["state"] == "receiving" and 0 < s["received"] < s["expected"]:
            return
        time.sleep(0.05)
    raise AssertionError(f"the broadcast never reached {url} mid-way: {box}")


def test_killing_a_server_mid_broadcast_raises_naming_it(tiny_model_dir, tmp_path):
    model, _ = load_model(tiny_model_dir)
    start = checksum(model.state_dict().items())
    _perturb(model.parameters(), seed=7)
    timeout = 20.0
    with servers(tiny_model_dir, 2, tmp_path, **{DELAY_ENV: "0.2"}) as procs:
        (alive, _), (victim, proc) = procs
        group = RolloutServerGroup([alive, victim], timeout_s=timeout, http_timeout_s=3, bucket_mb=0.25)
        box = _push_in_thread(group, model, step=7)
        _wait_mid_broadcast(victim, box)
        killed = time.monotonic()
        proc.kill()
        box["thread"].join(timeout + 30)
        assert not box["thread"].is_alive(), "push hung"
        err = box.get("error")
        assert isinstance(err, WeightSyncError), box
        assert box["at"] - killed < timeout + 3 + 5
        assert err.servers == [victim] and err.step == 7 and err.version == 7
        assert victim in str(err) and "step 7" in str(err) and "unreachable" in str(err)
        # the survivor kept its old weights and version, and still answers
        assert _server_sum(alive) == (start, 0)
        assert _greedy(alive)[1] == {0}
        # a new group without the dead server: the run resumes
        with RolloutServerGroup([alive], timeout_s=timeout, http_timeout_s=3, bucket_mb=64) as again:
            again.push(model, version=7, step=7)
        assert _server_sum(alive) == (checksum(model.state_dict().items()), 7)


def test_a_frozen_server_makes_the_push_time_out_naming_it(tiny_model_dir, tmp_path):
    model, _ = load_model(tiny_model_dir)
    timeout, http_timeout = 6.0, 2.0
    with servers(tiny_model_dir, 1, tmp_path, **{DELAY_ENV: "0.2"}) as procs:
        [(url, proc)] = procs
        group = RolloutServerGroup([url], timeout_s=timeout, http_timeout_s=http_timeout, bucket_mb=0.25)
        t0 = time.monotonic()
        box = _push_in_thread(group, model, step=3)
        _wait_mid_broadcast(url, box)
        proc.send_signal(signal.SIGSTOP)
        box["thread"].join(timeout + 30)
        assert not box["thread"].is_alive(), "push hung"
        err = box.get("error")
        assert isinstance(err, WeightSyncError), box
        assert box["at"] - t0 < timeout + http_timeout + 5
        assert err.servers == [url] and "step 3" in str(err) and "did not answer" in str(err)


def test_a_server_that_is_not_there_fails_the_join_quickly(tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    group = RolloutServerGroup([url], timeout_s=10, http_timeout_s=2)
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError) as err:
        group.connect(step=1)
    assert time.monotonic() - t0 < 10
    assert err.value.servers == [url] and "joining the sync group" in str(err.value)
