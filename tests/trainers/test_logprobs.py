"""The chunked LM-head log-probability path equals the full-logits one, values and gradients."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from textgym.agents.trajectory import Trajectory
from textgym.training.batch import RolloutBatch
from textgym.training.logprobs import _full_logits_logprobs, head_logprobs, pack_rows, sequence_logprobs

V = 997  # a prime, so that no chunk size divides the tokens evenly


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=V,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        tie_word_embeddings=True,
    )
    return AutoModelForCausalLM.from_config(cfg).float()


def _batch(grouped: bool, seed: int = 0) -> RolloutBatch:
    """6 rows, ragged prompts and responses (padding on both sides), optionally 2 groups of 3."""
    g = torch.Generator().manual_seed(seed)
    trajs = []
    prompts = [torch.randint(3, V, (int(n),), generator=g).tolist() for n in (5, 9)]
    for i in range(6):
        prompt = prompts[i // 3] if grouped else torch.randint(3, V, (4 + i,), generator=g).tolist()
        n = 3 + (5 * i) % 7
        response = torch.randint(3, V, (n,), generator=g).tolist()
        ids = prompt + response
        mask = [0] * len(prompt) + [1] * n
        mask[len(prompt) + 1] = 0  # an env token inside the response
        trajs.append(
            Trajectory(
                token_ids=torch.tensor(ids),
                loss_mask=torch.tensor(mask, dtype=torch.float32),
                logprobs=torch.zeros(len(ids)),
                token_rewards=torch.zeros(len(ids)),
                prompt_length=len(prompt),
                messages=[],
                reward=0.0,
                group=i // 3 if grouped else -1,
            )
        )
    return RolloutBatch.from_trajectories(trajs, pad_id=0)


@pytest.mark.parametrize("grouped", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [3 * V, 10**9])
def test_chunked_head_equals_full_logits_values_and_gradients(grouped, temperature, chunk_elements):
    """Log-probs, entropy (with grad, as an entropy bonus uses it) and every parameter's
    gradient of a loss over both agree with the [B, L, V] computation to 1e-5 (fp32)."""
    batch = _batch(grouped)
    real = batch.attention_mask[:, batch.prompt_width :].float()
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(1))
    results = []
    for chunked in (True, False):
        model = _model()
        model.train()
        if chunked:
            lp, ent = sequence_logprobs(
                model, batch, temperature, with_entropy=True, entropy_grad=True, chunk_elements=chunk_elements
            )
        else:
            lp, ent = _full_logits_logprobs(model, batch, temperature, True, True, True, False)
        assert ent is not None
        loss = (lp * weights * real).sum() + 0.3 * (ent * real).sum()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        results.append((lp.detach(), ent.detach(), grads))
    (lp1, e1, g1), (lp2, e2, g2) = results
    torch.testing.assert_close(lp1 * real, lp2 * real, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1 * real, e2 * real, rtol=0, atol=1e-5)
    assert (lp1[real == 0] == 0).all(), "padding positions are 0 on the chunked path"
    for name in g1:
        scale = float(g2[name].abs().max()) + 1e-12
        err = float((g1[name] - g2[name]).abs().max()) / scale
        assert err < 1e-5, f"{name}: relative gradient error {err:.2e}"


def test_no_grad_pass_and_entropy_without_grad_match():
    """The no-grad passes (π_old, π_ref) and the logged entropy (no grad) take the same values."""
    model = _model().eval()
    batch = _batch(True)
    real = batch.attention_mask[:, batch.prompt_width :].float()
    with torch.no_grad():
        lp1, e1 = sequence_logprobs(model, batch, 1.0, with_entropy=True, chunk_elements=2 * V)
        lp2, e2 = _full_logits_logprobs(model, batch, 1.0, True, True, False, False)
    assert e1 is not None and e2 is not None
    torch.testing.assert_close(lp1 * real, lp2 * real, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1 * real, e2 * real, rtol=0, atol=1e-5)
    lp3, e3 = sequence_logprobs(
        model, batch, 1.0, with_entropy=True, entropy_grad=False, chunk_elements=2 * V
    )
    assert lp3.requires_grad and e3 is not None and not e3.requires_grad


def test_chunks_keep_only_one_chunk_of_logits_for_backward():
    """With many chunks, autograd keeps no [N, V] logits: the saved tensors of the head
    part are the chunk inputs (hidden states), not V-wide tensors."""
    torch.manual_seed(0)
    head = torch.nn.Linear(32, 5000, bias=False)
    hidden = torch.randn(400, 32, requires_grad=True)
    targets = torch.randint(0, 5000, (400,))
    saved: list[tuple[int, ...]] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        saved.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        lp, _ = head_logprobs(head, hidden, targets, chunk_elements=50 * 5000)
    assert lp.shape == (400,)
    assert not any(5000 in s and len(s) == 2 and s[0] > 1 for s in saved), saved
    # The unchunked computation does keep [N, V] tensors (what the chunking removes).
    saved.clear()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        head_logprobs(head, hidden, targets, chunk_elements=10**9)
    assert any(s == (400, 5000) for s in saved)
    # And the two agree, gradients included.
    g = torch.autograd.grad(lp.sum(), hidden)[0]
    lp_full, _ = head_logprobs(head, hidden, targets, chunk_elements=10**9)
    g_full = torch.autograd.grad(lp_full.sum(), hidden)[0]
    torch.testing.assert_close(lp, lp_full, rtol=0, atol=1e-5)
    torch.testing.assert_close(g, g_full, rtol=1e-5, atol=1e-6)


def test_lora_model_takes_the_chunked_path_with_adapter_gradients():
    """A peft model's decoder and head are reached through the wrapper; adapters get gradients."""
    from textgym.config.base import LoraSettings
    from textgym.training.lora import apply_lora

    batch = _batch(True)
    base = _model()
    lora = apply_lora(copy.deepcopy(base), LoraSettings(r=4, alpha=8), seed=0)
    lp, _ = sequence_logprobs(lora, batch, chunk_elements=2 * V)
    with torch.no_grad():
        ref, _ = _full_logits_logprobs(base, batch, 1.0, False, True, False, False)
    real = batch.attention_mask[:, batch.prompt_width :].float()
    # B starts at zero: the adapted model equals the base one.
    torch.testing.assert_close(lp.detach() * real, ref * real, rtol=0, atol=1e-5)
    (lp * real).sum().backward()
    adapters = [p for n, p in lora.named_parameters() if "lora_B" in n]
    assert adapters and all(p.grad is not None and p.grad.abs().sum() > 0 for p in adapters)


def test_the_chunked_path_is_taken_for_hf_and_peft_models():
    """Qwen2 and its peft wrapper qualify; a model that soft-caps its logits does not."""
    from textgym.config.base import LoraSettings
    from textgym.training.logprobs import chunked_head_supported
    from textgym.training.lora import apply_lora

    model = _model()
    assert chunked_head_supported(model)
    assert chunked_head_supported(apply_lora(_model(), LoraSettings(r=4, alpha=8), seed=0))
    model.config.final_logit_softcapping = 30.0
    assert not chunked_head_supported(model)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("chunk_elements", [3 * V, 10**9])
def test_packed_rows_equal_the_padded_batch_values_and_gradients(temperature, chunk_elements):
    """Padding-free packing (one row, positions restarting per sequence) gives the padded
    batch's log-probs, entropy and parameter gradients (relative 1e-6 on the gradient norm)."""
    batch = _batch(False)
    real = batch.attention_mask[:, batch.prompt_width :].float()
    weights = torch.randn(batch.loss_mask.shape, generator=torch.Generator().manual_seed(2))
    out = []
    for packed in (True, False):
        model = _model()
        lp, ent = sequence_logprobs(
            model,
            batch,
            temperature,
            with_entropy=True,
            entropy_grad=True,
            chunk_elements=chunk_elements,
            packed=packed,
        )
        assert ent is not None
        ((lp * weights * real).sum() + 0.1 * (ent * real).sum()).backward()
        grad = torch.cat([p.grad.flatten() for p in model.parameters()])
        out.append((lp.detach(), ent.detach(), grad))
    (lp1, e1, g1), (lp2, e2, g2) = out
    torch.testing.assert_close(lp1, lp2 * real, rtol=0, atol=1e-5)
    torch.testing.assert_close(e1, e2 * real, rtol=0, atol=1e-5)
    rel = float((g1 - g2).norm() / g2.norm())
    assert rel < 1e-6, f"packed vs padded gradient: relative difference {rel:.2e}"


def test_pack_rows_layout():
    """Sequences are concatenated without padding; positions restart; predict indexes the
    token before each response token."""
    batch = _batch(False)
    ids, pos, predict, real = pack_rows(batch)
    lengths = batch.attention_mask.sum(-1)
    assert ids.shape == (1, int(lengths.sum())) and pos.shape == ids.shape
    assert int((pos[0] == 0).sum()) == len(batch)  # one start per sequence
    assert len(predict) == int(real.sum())
    targets = batch.input_ids[:, batch.prompt_width :][real]
    assert torch.equal(ids[0, predict + 1], targets)


def test_memory_kept_for_backward_does_not_grow_with_the_vocabulary():
    """The tensors autograd keeps for the backward of a policy forward (parameters aside) are
    the same bytes at V = 4,096 and V = 65,536: the logits are never kept, only recomputed
    chunk by chunk. The plain full-logits path keeps ~9× more there than at 4,096 ids."""

    def saved_bytes(vocab: int, chunked: bool) -> int:
        torch.manual_seed(0)
        cfg = Qwen2Config(
            vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, intermediate_size=128, tie_word_embeddings=True,
        )  # fmt: skip
        model = AutoModelForCausalLM.from_config(cfg).train()
        params = {p.data_ptr() for p in model.parameters()}
        batch = _batch(False)
        total = 0

        def pack(t: torch.Tensor) -> torch.Tensor:
            nonlocal total
            if t.data_ptr() not in params:
                total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            if chunked:
                sequence_logprobs(model, batch, with_entropy=True, chunk_elements=8 * 4096)
            else:
                _full_logits_logprobs(model, batch, 1.0, True, True, False, False)
        return total

    small, large = saved_bytes(4096, True), saved_bytes(65536, True)
    assert large <= 1.01 * small, (small, large)
    full_small, full_large = saved_bytes(4096, False), saved_bytes(65536, False)
    assert full_large > 8 * full_small and full_large > 10 * large
