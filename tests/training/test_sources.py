"""Rollout sources and the run loop, driven without a trainer: only what each one takes."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from conftest import ScriptedBackend, _traj

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams, derive_seed
from textgym.agents.trajectory import Trajectory
from textgym.config import GRPOConfig, OnlineDPOConfig
from textgym.models import load_tokenizer
from textgym.training.envs import make_env
from textgym.training.loop import run_loop
from textgym.training.sampler import TaskSampler
from textgym.training.sources.async_producer import AsyncRollouts, StalenessError
from textgym.training.sources.base import RolloutRequest, RolloutSettings
from textgym.training.sources.local import AgentSource

ARITH = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 1, "instruction": ""}}


def test_rollout_settings_read_the_config_once_with_16_turns_by_default():
    cfg = GRPOConfig.model_validate({"env": ARITH, "group_size": 4, "max_context_tokens": 300})
    s = RolloutSettings.of(cfg)
    assert (s.group_size, s.max_turns, s.env_id, s.max_context_tokens) == (4, 16, ARITH["id"], 300)
    assert (s.mode, s.batch_window_s) == ("lockstep", 0.0)
    assert RolloutSettings.of(cfg.model_copy(update={"max_turns": 3})).max_turns == 3
    dpo = OnlineDPOConfig.model_validate({"env": ARITH, "samples_per_prompt": 3})
    assert RolloutSettings.of(dpo, group_size=dpo.samples_per_prompt).group_size == 3  # no such field there


def test_an_agent_source_rolls_out_groups_tagged_with_the_requests_version_and_offset(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    answers = ["\\boxed{1}", "\\boxed{2}", "\\boxed{3}", "\\boxed{4}"]
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, answers))
    envs = [make_env(GRPOConfig.model_validate({"env": ARITH}).env) for _ in range(4)]
    entered = []

    def context():
        entered.append(torch.is_grad_enabled())
        return torch.autocast("cpu", enabled=False)

    settings = RolloutSettings(group_size=2, env_id=ARITH["id"])
    source = AgentSource(settings, agent, envs, SamplingParams(max_new_tokens=8), context)
    trajs = source.rollout(RolloutRequest([5, 9], version=7, first_group=4))
    assert [t.task_index for t in trajs] == [5, 5, 9, 9]
    assert [t.group for t in trajs] == [4, 4, 5, 5]  # offset to the step's global groups
    assert {t.policy_version for t in trajs} == {7} and entered == [False]  # under no_grad
    assert all(t.env_id == ARITH["id"] for t in trajs)
    # version None keeps what the backend reported (rollout servers tag their own)
    agent.backend.texts = ["\\boxed{0}"] * 2
    plain = AgentSource(RolloutSettings(group_size=2), agent, envs, SamplingParams())
    (a, b) = plain.rollout(RolloutRequest([1]))
    assert a.policy_version == b.policy_version == Trajectory.__dataclass_fields__["policy_version"].default


class VersionedSource:
    """A stand-in for rollout servers: every trajectory carries the version it serves now."""

    def __init__(self) -> None:
        self.version, self.requests, self.threads = 0, [], set()

    def rollout(self, request: RolloutRequest) -> list[Trajectory]:
        self.requests.append(request)
        self.threads.add(threading.current_thread().name)
        out = []
        for task in request.tasks:
            for _ in range(2):
                t = _traj([1, 2], [3], 0.0, task)
                t.policy_version = self.version
                out.append(t)
        return out

    def close(self) -> None:
        pass


def test_the_async_producer_needs_no_trainer_and_bounds_staleness():
    """Batch s is submitted k steps ahead with its tasks and seeds drawn at submission, in order;
    a batch older than the bound raises; a checkpoint keeps the cursor of the next batch to train."""
    source, tasks = VersionedSource(), TaskSampler(100, seed=0)
    expected = TaskSampler(100, seed=0)
    producer = AsyncRollouts(
        source, None, tasks, prompts_per_step=3, group_size=2, max_staleness=1, steps=4, seed=5, start_step=0
    )
    metrics: dict[str, float] = {}
    first = producer.next_batch(0, metrics)
    producer.jobs[0].future.result()  # batch 1, generating in the producer's thread
    assert [r.tasks for r in source.requests] == [expected.next(3), expected.next(3)]  # batches 0 and 1
    assert source.requests[1].seeds == [derive_seed(5, 1, 0, g, j) for g in range(3) for j in range(2)]
    assert source.threads == {"textgym-rollouts_0"} and len(first) == 6
    assert metrics["rollout/staleness_max"] == 0.0 and "time/rollout_wait_s" in metrics
    assert producer.state() == {"cursor": 3}  # batch 1 is pending: a resumed run draws its tasks again
    source.version = 1  # the servers got version 1 after step 0's update
    second = producer.next_batch(1, metrics)  # sampled by version 0 at step 1: staleness 1
    assert {t.policy_version for t in second} == {0} and metrics["rollout/staleness_max"] == 1.0
    producer.jobs[0].future.result()  # batch 2 generated (by version 1) before the next push
    source.version = 0  # the push of version 2 never lands: batch 3, submitted at step 2, is of version 0
    third = producer.next_batch(2, metrics)
    producer.jobs[0].future.result()
    assert {t.policy_version for t in third} == {1} and metrics["rollout/staleness_max"] == 1.0
    with pytest.raises(StalenessError, match=r"staleness 3 exceeds rollout\.max_staleness=1"):
        producer.next_batch(3, metrics)
    producer.close()


def test_run_loop_logs_checkpoints_evaluates_and_stops_without_a_trainer(tmp_path):
    class Logger:
        def __init__(self) -> None:
            self.rows, self.closed = [], False

        def log(self, step: int, metrics: dict[str, float]) -> None:
            self.rows.append((step, dict(metrics)))

        def close(self) -> None:
            self.closed = True

    saved, logger, done = [], Logger(), [0]

    def train_step() -> dict[str, float]:
        done[0] += 1
        return {"loss": float(done[0])}

    def save() -> Path:
        saved.append(done[0])
        return tmp_path

    def after_step(step: int, metrics: dict[str, float]) -> None:
        if step == 3:
            metrics["eval/accuracy"] = 0.5

    run_loop(train_step, save, logger, start=1, name="t", steps=9, log_every=4, checkpoint_every=2,
             describe=lambda m: "", after_step=after_step, stop=lambda: done[0] == 6)  # fmt: skip
    # steps 2..7 ran (started at 1, stopped after step 7 = the 6th call)
    assert [s for s, _ in logger.rows] == [3, 4, 7]  # the evaluation's step, the cadence, the last
    assert logger.rows[0][1] == {"loss": 2.0, "eval/accuracy": 0.5}
    assert saved == [1, 3, 5, 6] and logger.closed  # steps 2, 4, 6, and the last (7) at the end
