"""The RL core computes what the papers say: the trainer's policy is the distribution the rollout
sampled (top-k / top-p included), terminal episodes are not bootstrapped, no dropout between
π_old and π, async batches are re-centred on the current policy, tokens the policy never sampled
stay out of the loss, and the KL placements that do not work are refused."""

from __future__ import annotations

import shutil
import tempfile

import gymnasium as gym
import pytest
import torch
from conftest import WARM_ENV, ScriptedBackend, _traj, serve_app, truncated_logprobs
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from test_logprobs import V, _batch, _model
from transformers import GPT2Config, GPT2LMHeadModel, TopKLogitsWarper, TopPLogitsWarper

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams
from textgym.agents.openai_backend import OpenAIBackend
from textgym.agents.rollout import rollout
from textgym.agents.sampling import truncation_mask
from textgym.config import ConfigError, GRPOConfig, PPOConfig, load_config
from textgym.models import disable_dropout, load_model, load_tokenizer
from textgym.trainers.rl.critic import build_critic, sequence_values, value_head
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.trainers.rl.ppo import PPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.logprobs import _full_logits_logprobs, sequence_logprobs
from textgym.training.rollout_metrics import rollout_metrics
from textgym.training.seeding import seed_everything

CUTS = [(20, 0.9), (5, 1.0), (0, 0.5)]  # (top_k, top_p)


def grpo_cfg(**over) -> GRPOConfig:
    base = {
        "env": WARM_ENV,
        "steps": 1,
        "prompts_per_step": 4,
        "group_size": 4,
        "epochs": 1,  # one minibatch, one epoch: ratio/mean is the first minibatch's
        "sampling": {"temperature": 1.0, "max_new_tokens": 8},
        "optim": {"lr": 1e-3},
    }
    base.update(over)
    return GRPOConfig.model_validate(base)


# --- 1. top-k / top-p: the trainer's log-probs are of the truncated distribution ----------------


@pytest.mark.parametrize("top_k,top_p", [*CUTS, (1, 1.0), (3, 0.3), (0, 0.999)])
def test_the_truncation_mask_keeps_what_hf_and_vllm_warpers_keep(top_k, top_p):
    g = torch.Generator().manual_seed(top_k)
    logits = torch.randn(256, 97, generator=g) * 3
    logits[0, :10] = 1.5  # ties at the k-th score are kept, as HF's warper keeps them
    expected = logits.clone()
    if top_k:
        expected = TopKLogitsWarper(top_k)(None, expected)  # type: ignore[arg-type]
    if top_p < 1:
        expected = TopPLogitsWarper(top_p)(None, expected)  # type: ignore[arg-type]
    keep = truncation_mask(logits, top_k, top_p)
    assert keep is not None
    differ = keep != torch.isfinite(expected)
    # Where the two differ, the token's tail mass (itself and every less likely survivor) must sit
    # within float32 rounding of 1 − p: HF sums in float32 in ascending order, textgym in float64
    # in descending order (a sum of <= 97 terms below 1: a few ulps of 2^-24 each)
    z = (
        logits.masked_fill(~torch.isfinite(TopKLogitsWarper(top_k)(None, logits.clone())), float("-inf"))
        if top_k
        else logits
    )
    probs = z.double().softmax(-1)
    for row, col in differ.nonzero().tolist():
        tail = probs[row][probs[row] <= probs[row, col]].sum().item()
        assert abs(tail - (1 - top_p)) < 1e-5, (row, col, tail)
    assert differ.any(-1).sum() <= 1  # and that is rare: at most one row of 256 here
    assert truncation_mask(logits, 0, 1.0) is None and truncation_mask(logits, 97, 1.0) is None


def test_the_nucleus_of_peaked_and_flat_rows_matches_a_full_sort():
    """The top-k rounds (64, 256, 1024, ... tokens) give the kept set a full descending sort gives,
    for rows whose nucleus is 1 token, a few, or nearly the whole vocabulary."""
    from textgym.agents.sampling import _nucleus

    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(8, 5000, generator=g) * 8
    flat = torch.randn(8, 5000, generator=g) * 0.1
    for logits in (peaked, flat, torch.cat([peaked, flat])):
        for p in (0.5, 0.9, 0.999):
            probs = logits.softmax(-1)
            values, order = probs.double().sort(-1, descending=True)
            kept_sorted = values.cumsum(-1) - values < p
            expected = torch.zeros_like(kept_sorted).scatter(-1, order, kept_sorted)
            assert torch.equal(_nucleus(probs, p), expected)


@pytest.mark.parametrize("top_k,top_p", CUTS)
@pytest.mark.parametrize("path", ["chunked", "full", "packed"])
def test_trainer_logprobs_are_the_truncated_distributions_on_every_path(top_k, top_p, path):
    """Each path's log-prob is z_y − logsumexp over the kept tokens and y, written out from the plain
    logits (`conftest.truncated_logprobs`, then the target added back); gradients stay finite."""
    T = 0.8
    batch = _batch(grouped=True)
    model = _model()
    if path == "chunked":
        lp, ent = sequence_logprobs(
            model, batch, T, with_entropy=True, chunk_elements=3 * V, top_k=top_k, top_p=top_p
        )
    elif path == "full":
        lp, ent = _full_logits_logprobs(model, batch, T, True, True, False, False, (top_k, top_p))
    else:
        lp, ent = sequence_logprobs(model, batch, T, with_entropy=True, packed=True, top_k=top_k, top_p=top_p)
    with torch.no_grad():
        out = model(
            input_ids=batch.input_ids, attention_mask=batch.attention_mask, position_ids=batch.position_ids
        )
    P = batch.prompt_width
    z = out.logits[:, P - 1 : -1].float() / T  # [B, L, V]
    kept_lp, ambiguous = truncated_logprobs(out.logits[:, P - 1 : -1], T, top_k, top_p)
    keep = torch.isfinite(kept_lp)
    targets = batch.input_ids[:, P:]
    keep.scatter_(-1, targets[..., None], True)
    expected = z.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(
        z.masked_fill(~keep, -torch.inf), -1
    )
    p = torch.softmax(z.masked_fill(~keep, -torch.inf), -1)
    expected_ent = -(p * torch.log(p.clamp(min=1e-45))).sum(-1)
    real = batch.attention_mask[:, P:].bool() & ~ambiguous
    assert real.sum() > 20
    torch.testing.assert_close(lp.detach()[real], expected[real], rtol=0, atol=1e-5)
    assert ent is not None
    torch.testing.assert_close(ent.detach()[real], expected_ent[real], rtol=0, atol=1e-4)
    (lp * batch.attention_mask[:, P:]).sum().backward()
    assert all(torch.isfinite(q.grad).all() for q in model.parameters() if q.grad is not None)


@pytest.mark.parametrize("top_k,top_p", CUTS)
def test_the_ratio_is_one_at_the_first_minibatch_under_top_k_top_p(tiny_model_dir, tmp_path, top_k, top_p):
    """Measured before the fix at (20, 0.9): ratio/mean 0.035, kl/old_approx 2.38 (ρ = Z_t)."""
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = grpo_cfg(sampling={"temperature": 1.0, "top_k": top_k, "top_p": top_p, "max_new_tokens": 8})
    m = GRPOTrainer(cfg, model, tok, tmp_path).train_step()
    assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-5)
    assert m["kl/old_approx"] < 1e-6 and m["clip/frac"] == 0.0


# --- 2. a terminated episode is never bootstrapped ------------------------------------------------

WRONG = ["crane", "slate", "pious", "dough", "mirth", "wacky"]


def _wordle_trajectories(tok, guesses_per_episode):
    texts = [f"\\boxed{{{w}}}" for guesses in zip(*guesses_per_episode, strict=True) for w in guesses]
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, texts))
    envs = [gym.make("textgym/Wordle-v0") for _ in guesses_per_episode]
    return rollout(agent, envs, [0] * len(envs), SamplingParams(temperature=1.0), max_turns=16)


def test_wordle_solved_on_its_last_guess_is_terminated_not_truncated(tiny_model_dir):
    """TimeLimit(6) reports truncated=True on the 6th step even when that guess finds the word."""
    tok = load_tokenizer(tiny_model_dir)
    solved_last, missed = _wordle_trajectories(tok, [[*WRONG[:5], "about"], WRONG])
    assert solved_last.reward == 1.0 and solved_last.terminated and not solved_last.truncated
    assert missed.reward == 0.0 and missed.truncated and not missed.terminated
    assert rollout_metrics([solved_last, missed])["rollout/truncated_frac"] == 0.5


def test_ppo_bootstraps_only_the_truncated_wordle_episode(tiny_model_dir, tmp_path):
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = PPOConfig.model_validate(
        {
            "env": {"id": "textgym/Wordle-v0"},
            "steps": 1,
            "prompts_per_step": 2,
            "group_size": 1,
            "sampling": {"temperature": 1.0, "max_new_tokens": 8},
            "kl_coef": 0.0,
            "gamma": 0.9,
            "lam": 1.0,
            "whiten_advantages": False,
        }
    )
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    with torch.no_grad():  # V ≡ 5 everywhere, so a bootstrap shows in the last return
        trainer.critic.model.score.bias.fill_(5.0)
    trajs = _wordle_trajectories(tok, [[*WRONG[:5], "about"], WRONG])
    for t in trajs:  # as the store may hold them from older runs: both flags on the solved one
        t.truncated = True
    batch = RolloutBatch.from_trajectories(trajs, tok.pad_token_id)
    trainer.advantages(batch, trajs, None, {})
    last = [int(batch.loss_mask[i].nonzero().flatten()[-1]) for i in range(2)]
    assert float(trainer.critic.returns[0, last[0]]) == pytest.approx(1.0, abs=1e-5)  # r, nothing after
    assert float(trainer.critic.returns[1, last[1]]) == pytest.approx(0.9 * 5.0, abs=1e-4)  # γ·V(s_T)


# --- 3. dropout is off in the policy, its reference and the critic -------------------------------


@pytest.fixture(scope="module")
def gpt2_dropout_dir(tiny_model_dir):
    """A random 2-layer GPT-2 with dropout 0.1 everywhere, with textgym's tokenizer and template."""
    tok = load_tokenizer(tiny_model_dir)
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=256, n_embd=64, n_layer=2, n_head=4,
        resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
    )  # fmt: skip
    folder = tempfile.mkdtemp(prefix="gpt2-dropout-")
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_policy_ratio_is_exactly_one_with_a_dropout_model(gpt2_dropout_dir, tmp_path):
    """Before: π_old in eval mode, π in train mode with dropout: ρ in [0.78, 1.24], clipped tokens."""
    seed_everything(0)
    model, tok = load_model(gpt2_dropout_dir)
    m = GRPOTrainer(grpo_cfg(kl_coef=0.1), model, tok, tmp_path).train_step()
    assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-5) and m["clip/frac"] == 0.0
    assert m["kl/old_approx"] < 1e-6


def test_the_critic_and_lora_adapters_have_no_dropout(gpt2_dropout_dir):
    from textgym.config import LoraSettings
    from textgym.training.lora import apply_lora

    policy, tok = load_model(gpt2_dropout_dir)
    critic = build_critic(policy).train()
    with torch.no_grad():
        value_head(critic).weight.normal_()
    ids = tok("the sum of two and three is five")["input_ids"]
    batch = RolloutBatch.from_trajectories([_traj(ids[:3], ids[3:], 1.0)], tok.pad_token_id)
    with torch.no_grad():
        assert torch.equal(sequence_values(critic, batch), sequence_values(critic, batch))  # train mode
    lora = apply_lora(policy, LoraSettings(r=4, alpha=8, dropout=0.2, target_modules=["c_attn"]))
    assert disable_dropout(lora) > 0 and disable_dropout(lora) == 0  # LoRA's and GPT-2's dropouts, now 0
    assert all(m.p == 0 for m in lora.modules() if isinstance(m, torch.nn.Dropout))
    qwen = _model()
    qwen.model.layers[0].self_attn.attention_dropout = 0.1  # Llama/Qwen2 hand this float to SDPA
    assert disable_dropout(qwen) == 1 and qwen.model.layers[0].self_attn.attention_dropout == 0.0


# --- 4. async: the ratio is centred on the current policy whatever `tis` says --------------------


def test_async_without_tis_recomputes_pi_old_each_step(warm_model_dir, tmp_path):
    seed_everything(1)
    model, tok = load_model(warm_model_dir)
    cfg = grpo_cfg(
        steps=3, prompts_per_step=2, optim={"lr": 1e-2}, rollout={"max_staleness": 1, "tis": False}
    )
    trainer = GRPOTrainer(cfg, model, tok, tmp_path)
    try:
        seen = [trainer.train_step() for _ in range(3)]
    finally:
        trainer.close()
    # Batches 2 and 3 were sampled one version back; their ratio still starts at 1 (π_old is the
    # current policy's), and the staleness shows as the rollout/trainer mismatch instead.
    for m in seen:
        assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-5), m["ratio/mean"]
    assert max(m["mismatch/k3"] for m in seen[1:]) > 1e-6


# --- 5. tokens an endpoint did not sample stay out of the loss ----------------------------------


def test_an_endpoint_stop_without_eos_and_a_missing_logprob_are_not_policy_tokens(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    env = gym.make(WARM_ENV["id"], **WARM_ENV["kwargs"])
    _, info = env.reset(options={"task_index": 0})
    answer = tok(f"\\boxed{{{info['answer']}}}", add_special_tokens=False)["input_ids"]
    extra = tok("\n", add_special_tokens=False)["input_ids"]
    app = FastAPI()

    @app.post("/v1/completions")
    def completions() -> JSONResponse:  # stopped (by a stop string, say) before any end-of-turn id
        ids = answer + extra
        values = [-0.25] * len(answer) + [None] * len(extra)
        lp = {"tokens": [f"token_id:{i}" for i in ids], "token_logprobs": values}
        return JSONResponse({"choices": [{"logprobs": lp, "finish_reason": "stop"}]})

    url, server, thread = serve_app(app)
    try:
        eos = [int(tok.eos_token_id)]
        agent = LLMAgent(None, tok, backend=OpenAIBackend(url, "m", eos_ids=eos))
        (traj,) = rollout(agent, [env], [0], SamplingParams(temperature=1.0, max_new_tokens=16))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    P = traj.prompt_length
    n = len(answer)
    assert traj.token_ids[P:].tolist() == answer + extra + eos
    assert traj.loss_mask[P:].tolist() == [1.0] * n + [0.0] * (len(extra) + 1)
    assert traj.reward == 1.0 and float(traj.token_rewards[P + n - 1]) == 1.0  # on the last policy token
    assert float(traj.token_rewards.sum()) == 1.0


# --- 7. the KL placements that do not work are refused -------------------------------------------


K3_IN_REWARD = ["grpo.kl_coef=0.1", "grpo.kl_placement=reward", "grpo.kl_estimator=k3"]
REINFORCE_PP_KL_IN_LOSS = [
    "grpo.advantage_estimator=reinforce_pp",
    "grpo.kl_coef=0.1",
    "grpo.kl_placement=loss",
]


@pytest.mark.parametrize(
    "overrides,named",
    [(K3_IN_REWARD, "kl_estimator k3 with kl_placement reward"), (REINFORCE_PP_KL_IN_LOSS, "reinforce_pp")],
)
def test_kl_placements_that_do_not_work_are_config_errors(overrides, named):
    with pytest.raises(ConfigError, match=named) as e:
        load_config("configs/grpo_arithmetic.yaml", overrides)
    assert "grpo" in str(e.value)
    # the working placements of the same estimators pass
    load_config(
        "configs/grpo_arithmetic.yaml",
        ["grpo.kl_coef=0.1", "grpo.kl_placement=reward", "grpo.kl_estimator=k1"],
    )
    load_config(
        "configs/grpo_arithmetic.yaml", ["grpo.kl_coef=0.1", "grpo.kl_placement=loss", "grpo.kl_estimator=k3"]
    )
