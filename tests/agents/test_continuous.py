"""Continuous rollouts (`textgym.agents.continuous`): the lockstep trajectories, on another schedule."""

from __future__ import annotations

import threading
import time

import gymnasium as gym
import pytest
import torch
from conftest import ECHO_ENV_ID, EchoTurnsEnv, serve_app

import textgym  # noqa: F401
from textgym.agents import Generation, LLMAgent, SamplingParams, rollout
from textgym.agents.continuous import rollout_continuous, rollout_fn
from textgym.agents.rollout import RolloutStats
from textgym.envs import EnvError, make

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=10)


@pytest.fixture(scope="module")
def agent(tiny_model_dir):
    return LLMAgent.from_pretrained(tiny_model_dir, batch_size=8)


def assert_same(a, b, atol=1e-5):
    """Same tokens, masks, rewards and text; log-probs equal up to padding's float rounding."""
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x.token_ids, y.token_ids)
        assert torch.equal(x.loss_mask, y.loss_mask)
        assert torch.equal(x.token_rewards, y.token_rewards) and torch.equal(x.step_mask, y.step_mask)
        # a different batch (other rows, other padding) rounds the same logits differently
        torch.testing.assert_close(x.logprobs, y.logprobs, rtol=0, atol=atol)
        assert x.messages == y.messages and x.reward == y.reward and x.reward_terms == y.reward_terms
        assert (x.task_index, x.group, x.prompt_length) == (y.task_index, y.group, y.prompt_length)
        assert (x.terminated, x.truncated, x.finish_reason) == (y.terminated, y.truncated, y.finish_reason)


@pytest.mark.parametrize(
    ("env_id", "kwargs"),
    [
        ("textgym/Arithmetic-v0", {"split": "test"}),  # single turn
        (ECHO_ENV_ID, {"step_latency_s": [0.0, 0.03]}),  # multi-turn, steps finishing out of order
        ("textgym/Wordle-v0", {"step_latency_s": [0.0, 0.03]}),  # 6 turns (the model never wins)
    ],
)
def test_continuous_equals_lockstep_for_the_same_seeds(agent, env_id, kwargs):
    envs = [make(env_id, **kwargs) for _ in range(6)]
    seeds = [100 + i for i in range(6)]
    a = rollout(agent, envs, [0, 1, 2], PARAMS, group_size=2, max_turns=3, seeds=seeds, env_id=env_id)
    stats = RolloutStats()
    b = rollout_continuous(
        agent, envs, [0, 1, 2], PARAMS, group_size=2, max_turns=3, seeds=seeds, env_id=env_id, stats=stats
    )
    assert_same(a, b)
    turns = sum(sum(m["role"] == "assistant" for m in t.messages) for t in b)
    assert stats.generated_rows == turns and stats.episodes == 6 and 0 <= stats.idle_fraction <= 1
    if env_id != "textgym/Arithmetic-v0":
        assert turns > 6  # really multi-turn


@pytest.mark.sandbox
def test_tool_env_continuous_equals_lockstep(agent):
    envs = [make("textgym/ToolMath-v0") for _ in range(4)]
    seeds = [7, 8, 9, 10]
    a = rollout(agent, envs, [0, 1], PARAMS, group_size=2, seeds=seeds)
    b = rollout_continuous(agent, envs, [0, 1], PARAMS, group_size=2, seeds=seeds)
    assert_same(a, b)
    schemas = envs[0].reset(options={"task_index": 0})[1]["tools"]
    prompt = agent.tokenizer.apply_chat_template(
        b[0].messages[:1], tools=schemas, add_generation_prompt=True, tokenize=False
    )
    assert agent.tokenizer.decode(b[0].token_ids[: b[0].prompt_length].tolist()) == prompt


CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "52-88"}}</tool_call>'


class CalculatorThenAnswer:
    """A scripted backend: calls the calculator on ToolMath's task 0 (52-88), then answers -36.

    Stands in for a policy that uses tools (the random tiny model never writes a tool call), so
    the tool-message path of the bookkeeping runs; its generations are exact token ids.
    """

    def __init__(self, tokenizer, eos_ids):
        self.tokenizer, self.eos_ids = tokenizer, eos_ids

    def generate(self, prompts, params, seeds=None):
        out = []
        for p in prompts:
            called = self.tokenizer.decode(p).count("<|im_start|>assistant") > 1  # a second turn
            text = "\\boxed{-36}" if called else CALL
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.eos_ids[0]]
            out.append(Generation(ids, torch.full((len(ids),), -0.5), "stop"))
        return out


@pytest.mark.sandbox
def test_tool_calls_are_recorded_the_same_by_both_engines(agent):
    scripted = LLMAgent(
        None, agent.tokenizer, backend=CalculatorThenAnswer(agent.tokenizer, agent.backend.eos_ids)
    )
    envs = [make("textgym/ToolMath-v0", step_latency_s=[0.0, 0.03]) for _ in range(4)]
    a = rollout(scripted, envs, [0, 0, 0, 0], PARAMS)
    b = rollout_continuous(scripted, envs, [0, 0, 0, 0], PARAMS)
    assert_same(a, b, atol=0)
    assert [m["role"] for m in b[0].messages[-3:]] == ["assistant", "tool", "assistant"]
    assert b[0].reward == 1.0 and b[0].messages[-2]["content"] == "-36"


class GateEnv(EchoTurnsEnv):
    """EchoTurns whose first step, in the env marked slow, waits until `gate` is set (or `wait_s`)."""

    def __init__(self, gate: threading.Event, slow: bool, wait_s: float):
        super().__init__()
        self.gate, self.slow, self.wait_s = gate, slow, wait_s
        self.stepping = threading.Event()
        self.opened: bool | None = None

    def respond(self, action):
        if self.slow and self.turn == 0:
            self.stepping.set()
            self.opened = self.gate.wait(self.wait_s)
            self.stepping.clear()
        return super().respond(action)


@pytest.mark.parametrize(("engine", "overlaps"), [(rollout_continuous, True), (rollout, False)])
def test_generation_runs_while_a_slow_env_step_waits(agent, engine, overlaps):
    """The slow env's first step only ends early once a generate call ran *during* it: continuous
    rollouts generate the fast episodes' turns meanwhile; lockstep never does (it waits out
    `wait_s`). Event ordering, not timing: the continuous run waits on the event, up to 60 s."""
    gate = threading.Event()
    envs = [GateEnv(gate, slow=i == 0, wait_s=60.0 if overlaps else 0.5) for i in range(3)]
    real = agent.backend.generate

    def generate(prompts, params, seeds=None):
        if envs[0].stepping.is_set():
            gate.set()
        return real(prompts, params, seeds=seeds)

    agent.backend.generate = generate
    try:
        trajs = engine(agent, envs, [0, 1, 2], PARAMS, seeds=[1, 2, 3], max_turns=3)
    finally:
        del agent.backend.generate
    assert envs[0].opened is overlaps and gate.is_set() is overlaps
    assert all(t.reward == 3.0 for t in trajs)


class FailingEnv(EchoTurnsEnv):
    """EchoTurns that raises on its second step of task 2."""

    def respond(self, action):
        if self.task_index == 2 and self.turn == 1:
            time.sleep(0.05)
            raise RuntimeError("the game server went away")
        return super().respond(action)


def test_an_env_step_error_propagates_with_its_episode(agent):
    gym.register("textgym-test/Failing-v0", entry_point=FailingEnv, disable_env_checker=True)
    try:
        envs = [make("textgym-test/Failing-v0", step_latency_s=0.01) for _ in range(4)]
        with pytest.raises(EnvError, match="the game server went away") as info:
            rollout_continuous(agent, envs, [0, 1, 2, 3], PARAMS, seeds=[1, 2, 3, 4], env_id="fail")
    finally:
        del gym.registry["textgym-test/Failing-v0"]
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "episode 2 (task_index=2), turn 1" in notes and "fail" in notes
    assert "task_index=2" in str(info.value)  # TextGymAdapter's message names the task and action


def test_unseeded_continuous_rollouts_repeat_under_torch_manual_seed(agent):
    envs = [make(ECHO_ENV_ID) for _ in range(4)]
    torch.manual_seed(3)
    a = rollout_continuous(agent, envs, [0, 1], PARAMS, group_size=2)
    torch.manual_seed(3)
    b = rollout_continuous(agent, envs, [0, 1], PARAMS, group_size=2)
    assert_same(a, b)
    assert a[0].token_ids.tolist() != a[1].token_ids.tolist()  # the group's samples differ


def test_mode_selector_and_argument_checks(agent):
    assert rollout_fn("lockstep") is rollout and rollout_fn("continuous") is rollout_continuous
    with pytest.raises(ValueError, match="unknown rollout mode"):
        rollout_fn("async")  # type: ignore[arg-type]
    envs = [make(ECHO_ENV_ID) for _ in range(2)]
    with pytest.raises(ValueError, match="max_batch"):
        rollout_continuous(agent, envs, [0], PARAMS, max_batch=0)
    with pytest.raises(ValueError, match="need 4 environments"):
        rollout_continuous(agent, envs, [0, 1], PARAMS, group_size=2)
    trajs = rollout_continuous(agent, envs, [0, 1], PARAMS, seeds=[5, 6], max_batch=1, step_threads=1)
    assert_same(trajs, rollout(agent, envs, [0, 1], PARAMS, seeds=[5, 6]))


def test_continuous_rollouts_through_an_openai_endpoint(served, tiny_model_dir):
    """One concurrent request per turn to `textgym serve`; the server's per-request seeds make the
    rollout repeatable whatever the requests' arrival order, and greedy turns equal lockstep's."""
    remote = LLMAgent.from_endpoint(served, "tiny", tiny_model_dir, concurrency=4)
    envs = [make(ECHO_ENV_ID, step_latency_s=[0.0, 0.03]) for _ in range(4)]
    stats = RolloutStats()
    a = rollout_continuous(remote, envs, [0, 1, 2, 3], PARAMS, seeds=[1, 2, 3, 4], stats=stats)
    b = rollout_continuous(remote, envs, [0, 1, 2, 3], PARAMS, seeds=[1, 2, 3, 4])
    assert_same(a, b)
    assert stats.generate_calls == stats.generated_rows == 8 and 0 < stats.generate_s <= stats.wall_s
    greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
    c = rollout_continuous(remote, envs, [0, 1, 2, 3], greedy)
    d = rollout(remote, envs, [0, 1, 2, 3], greedy)
    assert [t.token_ids.tolist() for t in c] == [t.token_ids.tolist() for t in d]


def test_grpo_trainer_takes_rollout_mode_continuous(tiny_model_dir, tmp_path):
    """`rollout.mode: continuous` with per-sequence seeds rolls out what lockstep does (same metrics)."""
    import json

    from textgym.config import GRPOConfig
    from textgym.models import load_model
    from textgym.trainers.rl.grpo import GRPOTrainer
    from textgym.training.seeding import seed_everything

    records = {}
    for mode in ("lockstep", "continuous"):
        seed_everything(0)
        model, tok = load_model(tiny_model_dir)
        cfg = GRPOConfig.model_validate(
            {
                "env": {"id": ECHO_ENV_ID},
                "steps": 1,
                "prompts_per_step": 2,
                "group_size": 2,
                "sampling": {"temperature": 1.0, "max_new_tokens": 6},
                "rollout": {"mode": mode, "per_sequence_seeds": True},
            }
        )
        GRPOTrainer(cfg, model, tok, tmp_path / mode).train()
        records[mode] = json.loads((tmp_path / mode / "metrics.jsonl").read_text().splitlines()[0])
    keys = [k for k in records["lockstep"] if k.startswith("rollout/")]
    assert keys and all(records["lockstep"][k] == records["continuous"][k] for k in keys)


@pytest.mark.vllm
def test_continuous_rollouts_on_the_vllm_backend(tiny_model_dir):
    """The in-process vLLM engine driven step by step (each turn a request joining the running batch,
    per-request seeds): greedy and seeded sampled rollouts equal lockstep's, and nothing is left
    running in the engine."""
    from textgym.agents.vllm_backend import vllm_available

    if not vllm_available():
        pytest.skip("vLLM is not installed")
    agent = LLMAgent.from_pretrained(tiny_model_dir, backend="vllm", vllm_kwargs={"dtype": "float32"})
    try:
        envs = [make(ECHO_ENV_ID, step_latency_s=[0.0, 0.03]) for _ in range(4)]
        greedy = SamplingParams(temperature=0.0, max_new_tokens=10)
        a = rollout_continuous(agent, envs, [0, 1, 2, 3], greedy)
        b = rollout(agent, envs, [0, 1, 2, 3], greedy)
        assert [t.token_ids.tolist() for t in a] == [t.token_ids.tolist() for t in b]
        stats = RolloutStats()
        c = rollout_continuous(agent, envs, [0, 1, 2, 3], PARAMS, seeds=[1, 2, 3, 4], stats=stats)
        d = rollout(agent, envs, [0, 1, 2, 3], PARAMS, seeds=[1, 2, 3, 4])
        assert_same(c, d)
        turns = sum(sum(m["role"] == "assistant" for m in t.messages) for t in c)
        assert stats.generated_rows == turns > 4 and stats.generate_s > 0  # multi-turn, turn by turn
        assert not agent.backend.has_unfinished()
    finally:
        agent.backend.close()


def test_an_episode_continues_across_a_weight_push_its_tokens_tagged(tiny_model_dir):
    """A partial rollout at turn boundaries: the server's version changes between two turns of every
    episode (as when a push lands), each turn's tokens carry the version that sampled them, the
    trajectory's `policy_version` is the oldest, and the batch counts as mixed."""
    from textgym.serve import build_app
    from textgym.training.sources.async_producer import staleness_metrics

    app = build_app(tiny_model_dir, "tiny")
    batcher = app.state.batcher

    def push() -> None:
        batcher.policy_version = 7  # what a weight sync sets (between two generation rounds)

    class PushAfterFirstTurn(gym.Wrapper):
        """The first steps of both episodes meet (so both first turns are sampled first), then push."""

        barrier: threading.Barrier | None = None

        def step(self, action):
            if self.barrier is not None and self.unwrapped.turn == 0:
                self.barrier.wait(timeout=30)
            else:
                push()
            return self.env.step(action)

    url, server, thread = serve_app(app)
    try:
        remote = LLMAgent.from_endpoint(url, "tiny", tiny_model_dir)
        for engine in (rollout, rollout_continuous):
            batcher.policy_version = 6
            # lockstep samples every first turn before any step; continuous needs the barrier
            continuous = engine is rollout_continuous
            PushAfterFirstTurn.barrier = threading.Barrier(2, action=push) if continuous else None
            envs = [PushAfterFirstTurn(make(ECHO_ENV_ID)) for _ in range(2)]
            trajs = engine(remote, envs, [0, 1], PARAMS, seeds=[1, 2])
            for t in trajs:
                assert t.policy_version == 6
                versions = t.token_versions
                assert versions is not None and versions.shape == t.token_ids.shape
                policy = t.loss_mask.bool()
                assert set(versions[policy].tolist()) == {6, 7} and set(versions[~policy].tolist()) == {-1}
                first_turn = t.prompt_length + int(torch.nonzero(~policy[t.prompt_length :])[0])
                assert set(versions[t.prompt_length : first_turn].tolist()) == {6}
            m = staleness_metrics(trajs, trainer_version=7)
            assert m["rollout/mixed_version_frac"] == 1.0 and m["rollout/staleness_max"] == 1.0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        batcher.close()


def test_a_batching_window_makes_fuller_calls_and_the_same_trajectories(agent):
    """With a window longer than any step, each turn waits for every running step: one `generate`
    call per turn, and still lockstep's trajectories for the same seeds."""
    envs = [make(ECHO_ENV_ID, step_latency_s=[0.0, 0.05]) for _ in range(6)]
    seeds = [40 + i for i in range(6)]
    a = rollout(agent, envs, [0, 1, 2], PARAMS, group_size=2, seeds=seeds)
    stats = RolloutStats()
    b = rollout_continuous(
        agent, envs, [0, 1, 2], PARAMS, group_size=2, seeds=seeds, stats=stats, batch_window_s=5.0
    )
    assert_same(a, b)
    assert stats.generate_calls == 2 and stats.generated_rows == 12  # 2 turns (TimeLimit) x 6 episodes
    assert stats.wall_s < 5.0  # the window closed early: every unfinished episode was ready
    with pytest.raises(ValueError, match="batch_window_s must be >= 0"):
        rollout_continuous(agent, envs, [0], PARAMS, batch_window_s=-1.0)
    trainer_fn = rollout_fn("continuous", 5.0)
    assert trainer_fn.keywords == {"batch_window_s": 5.0}  # what a trainer's `rollout.batch_window_s` passes
