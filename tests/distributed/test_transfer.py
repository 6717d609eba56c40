"""`textgym.distributed.transfer`: byte buckets, checksums, and a bounded broadcast in a group of its own.

The two-rank cases run both ranks as threads of this process over gloo on 127.0.0.1 (each
rank its own `ProcessGroupGloo`), so they need no subprocess; the rollout-server end to end
tests are tests/serve/test_weight_sync.py.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from textgym.distributed import transfer
from textgym.distributed.transfer import TensorSpec
from textgym.training.sources.servers import RolloutServerGroup, payload, resolve_backend


def _tensors() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [
        torch.randn(3, 5, generator=g),
        torch.randn(7, generator=g).bfloat16(),  # 14 bytes: the next tensor starts after padding
        torch.tensor(3.5, dtype=torch.float64),  # 0-dim
        torch.arange(5),  # int64
        torch.randn(4, 6, generator=g).T,  # not contiguous
        torch.empty(0, 3),
        torch.randn(2, 2, generator=g).half(),
    ]


def test_pack_and_unpack_give_back_every_tensor_bitwise():
    ts = _tensors()
    specs = [TensorSpec.of(str(i), t) for i, t in enumerate(ts)]
    buf = transfer.pack(ts)
    assert buf.dtype == torch.uint8 and buf.numel() == transfer.bucket_nbytes(specs)
    assert buf.numel() % transfer.ALIGN == 0
    out = transfer.unpack(buf.clone(), specs)
    for a, b in zip(ts, out, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    assert [TensorSpec.from_json(s.to_json()) for s in specs] == specs
    with pytest.raises(ValueError, match="expected"):
        transfer.unpack(buf[:-16], specs)


def test_buckets_keep_the_order_and_the_size_limit():
    specs = [TensorSpec(f"t{i}", (n,), "float32") for i, n in enumerate([4, 4, 100, 4, 4, 4])]
    plan = transfer.plan_buckets(specs, 48)  # 16-byte tensors; the 400-byte one alone
    assert plan == [[0, 1], [2], [3, 4, 5]]
    assert [i for b in plan for i in b] == list(range(6))
    assert transfer.plan_buckets(specs, 10**9) == [list(range(6))]
    with pytest.raises(ValueError):
        transfer.plan_buckets(specs, 0)
    with pytest.raises(ValueError, match="unknown dtype"):
        TensorSpec("x", (1,), "float99").nbytes  # noqa: B018


def test_checksum_sees_one_flipped_bit_and_ignores_the_order():
    ts = {str(i): t.contiguous() for i, t in enumerate(_tensors())}
    a = transfer.checksum(ts.items())
    assert transfer.checksum(reversed(list(ts.items()))) == a
    flipped = dict(ts)
    bits = ts["0"].clone().view(torch.int32)
    bits[1, 2] ^= 1
    flipped["0"] = bits.view(torch.float32)
    assert transfer.checksum(flipped.items()) != a
    renamed = {("x" if k == "0" else k): v for k, v in ts.items()}
    assert transfer.checksum(renamed.items()) != a


def _two_ranks(timeout_s: float, rank1: bool = True) -> tuple[dict, dict]:
    """Rank 0 broadcasts a bucket to rank 1 (a thread; absent when not `rank1`)."""
    store = dist.TCPStore("127.0.0.1", 0, 2, True, wait_for_workers=False)
    out: dict = {}
    sent = transfer.pack(_tensors())

    def rank(r: int) -> None:
        try:
            g = transfer.new_group(
                "gloo", "127.0.0.1", store.port, r, 2, timeout_s, "t", store=store if r == 0 else None
            )
            buf = sent.clone() if r == 0 else torch.zeros_like(sent)
            transfer.broadcast(g, buf, timeout_s)
            out[r] = buf
        except Exception as e:
            out[r] = e

    threads = [threading.Thread(target=rank, args=(r,)) for r in ((0, 1) if rank1 else (0,))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s + 30)
    return out, {"sent": sent}


def test_a_broadcast_in_a_group_of_its_own_arrives_bitwise():
    out, ctx = _two_ranks(20)
    assert torch.equal(out[1], ctx["sent"]) and torch.equal(out[0], ctx["sent"])
    assert not dist.is_initialized()  # the default group was never touched


def test_joining_a_group_whose_peer_never_comes_raises_within_the_timeout():
    t0 = time.monotonic()
    out, _ = _two_ranks(2, rank1=False)
    assert isinstance(out[0], Exception)
    assert time.monotonic() - t0 < 2 + 10


def test_the_payload_of_a_plain_model_is_its_state_dict_with_tied_tensors_once(tiny_model_dir):
    from textgym.models import load_model

    model, _ = load_model(tiny_model_dir)
    named, layers, aliases = payload(model)
    state = model.state_dict()
    assert layers is None
    if model.config.tie_word_embeddings:
        assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    names = [n for n, _ in named]
    ptrs = {state[n].data_ptr() for n in names}
    assert len(ptrs) == len(names) == len({t.data_ptr() for t in state.values()})
    with pytest.raises(ValueError, match="lora"):
        payload(model, lora="both")  # type: ignore[arg-type]


def test_the_group_checks_its_arguments():
    with pytest.raises(ValueError):
        RolloutServerGroup([])
    with pytest.raises(ValueError):
        RolloutServerGroup(["http://a:1", "http://a:1/"])
    with pytest.raises(ValueError):
        RolloutServerGroup(["http://a:1"], timeout_s=0)
    with pytest.raises(ValueError, match="unknown backend"):
        resolve_backend("mpi")
    assert resolve_backend("gloo") == "gloo"


def test_the_payload_of_a_lora_policy_is_its_adapter_factors(tiny_model_dir):
    from textgym.config.base import LoraSettings
    from textgym.models import load_model
    from textgym.training.lora import apply_lora

    model = apply_lora(load_model(tiny_model_dir)[0], LoraSettings(r=4, alpha=8))
    named, layers, aliases = payload(model)
    assert layers and all(".lora_A." in n or ".lora_B." in n for n, _ in named)
    assert len(named) == 2 * len(layers)
    assert {a["scale"] for layer in layers for a in layer["adapters"]} == {2.0}
    if model.config.tie_word_embeddings:
        assert aliases == {"lm_head.weight": "model.embed_tokens.weight"}
    merged, no_layers, _ = payload(model, lora="merged")
    assert no_layers is None and not any(".lora_" in n for n, _ in merged)
