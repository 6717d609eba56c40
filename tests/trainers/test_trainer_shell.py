"""The trainer shell (`textgym.training.trainer`): the set-up, resume, evaluation and save steps
every trainer composes, each checked on a tiny real model."""

from __future__ import annotations

import json

import torch

from textgym.config import LoraSettings, OptimConfig
from textgym.models import load_model
from textgym.training.checkpoint import save_checkpoint
from textgym.training.optim import build_optimizer
from textgym.training.trainer import (
    announce_memory,
    eval_every,
    prepare_policy,
    resume_checkpoint,
    save_final_model,
    stage_logger,
)


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def test_prepare_policy_adds_lora_that_starts_at_the_base_model_turns_dropout_off_and_checkpoints(
    tiny_model_dir,
):
    model, _ = load_model(tiny_model_dir)
    model.config.attention_dropout = 0.1
    for m in model.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.1
    ids = torch.tensor([[1, 5, 9, 13]])
    base = _logits(model.eval(), ids)
    adapted = prepare_policy(model, LoraSettings(r=4, alpha=8), seed=0, gradient_checkpointing=True)
    assert adapted is not model and hasattr(adapted, "disable_adapter")  # a peft model
    torch.testing.assert_close(_logits(adapted.eval(), ids), base, rtol=0, atol=0)  # B = 0
    assert all(getattr(m, "attention_dropout", 0.0) == 0.0 for m in adapted.modules())
    assert adapted.base_model.model.is_gradient_checkpointing
    kept, _ = load_model(tiny_model_dir)
    for m in kept.modules():
        if hasattr(m, "attention_dropout"):
            m.attention_dropout = 0.1
    same = prepare_policy(kept, None, seed=0, gradient_checkpointing=False, dropout_off=False)
    assert same is kept and not same.is_gradient_checkpointing
    assert any(getattr(m, "attention_dropout", 0.0) == 0.1 for m in same.modules())


def test_resume_checkpoint_restores_the_newest_checkpoint_and_says_where_it_was(tiny_model_dir, tmp_path):
    model, tok = load_model(tiny_model_dir)
    opt, sched = build_optimizer(model, OptimConfig(lr=1e-3), 10)
    assert resume_checkpoint(tmp_path, True, model, opt, sched) is None  # nothing saved yet
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    save_checkpoint(tmp_path, 3, model, tok, opt, sched, {"cursor": 7})
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    assert resume_checkpoint(tmp_path, False, model, opt, sched) is None  # not resuming: untouched
    assert not torch.equal(model.state_dict()["lm_head.weight"], saved["lm_head.weight"])
    state = resume_checkpoint(tmp_path, True, model, opt, sched)
    assert state is not None and state["step"] == 3 and state["cursor"] == 7
    assert state["checkpoint_dir"] == str(tmp_path / "checkpoints" / "step_3")
    for k, v in model.state_dict().items():
        torch.testing.assert_close(v, saved[k], rtol=0, atol=0)
    logger = stage_logger(tmp_path, state, [], None)
    logger.log(4, {"loss": 1.0})
    logger.close()
    assert [json.loads(x)["step"] for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [4]


def test_announce_memory_echoes_each_model_and_writes_memory_json(tmp_path):
    memory = {"policy": {"params_m": 1.5, "param_mib": 6.0, "grad_mib": 6.0, "optim_mib": 12.0}}
    lines: list[str] = []
    announce_memory("grpo", memory, tmp_path, lines.append)
    assert lines == [
        "grpo memory on each of 1 rank(s):",
        "  policy 1.5M params · 6.0 MiB params + 6.0 grads + 12.0 optimizer per rank",
    ]
    assert json.loads((tmp_path / "memory.json").read_text()) == memory


def test_eval_every_adds_the_evaluation_on_its_steps_only():
    policy, calls, now = torch.nn.Linear(1, 1), [], [0]

    def evaluate(model, tokenizer):
        calls.append(now[0])
        assert model is policy and tokenizer == "tok" and not torch.is_grad_enabled()
        return {"eval/accuracy": 0.5}

    hook = eval_every(policy, "tok", evaluate, 3)
    seen = []
    for step in range(1, 8):
        now[0] = step
        metrics: dict[str, float] = {}
        hook(step, metrics)
        seen.append(metrics)
    assert calls == [3, 6] and seen[2] == {"eval/accuracy": 0.5} and seen[3] == {}
    for fn, every in ((None, 3), (evaluate, 0)):
        eval_every(policy, "tok", fn, every)(3, metrics := {})
        assert metrics == {}


def test_save_final_model_writes_a_plain_folder_and_with_lora_the_adapter_too(tiny_model_dir, tmp_path):
    model, tok = load_model(tiny_model_dir)
    final = save_final_model(tmp_path / "full", model, tok, lora=False)
    assert final == tmp_path / "full" / "final" and (final / "config.json").is_file()
    adapted = prepare_policy(model, LoraSettings(r=4, alpha=8), seed=0, gradient_checkpointing=False)
    merged = save_final_model(tmp_path / "lora", adapted, tok, lora=True)
    assert (merged / "config.json").is_file() and (tmp_path / "lora" / "final_adapter").is_dir()
    reloaded, _ = load_model(merged)
    ids = torch.tensor([[1, 5, 9, 13]])
    torch.testing.assert_close(
        _logits(reloaded.eval(), ids), _logits(adapted.eval(), ids), rtol=1e-5, atol=1e-5
    )
