"""Shared fixtures: a real tiny Qwen2 model built locally once per session."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
import torch

from textgym.envs.base import TextEnv
from textgym.types import Task

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
torch.set_num_threads(2)


class EchoTurnsEnv(TextEnv):
    """A 3-turn test env: replies with a tool message each turn, reward 1 per turn, ends after 3 turns."""

    def __init__(self, **kwargs: Any):
        super().__init__([Task(f"echo/{i}", f"Say something #{i}.") for i in range(4)], **kwargs)
        self.turn = 0

    def initial_messages(self, task):
        self.turn = 0
        return [{"role": "user", "content": task.prompt}]

    def respond(self, action):
        self.turn += 1
        done = self.turn >= 3
        obs = [] if done else [{"role": "tool", "content": f"turn {self.turn}: you said {len(action)} chars"}]
        return obs, 1.0, done, {"reward/turn": 1.0}


ECHO_ENV_ID = "textgym-test/EchoTurns-v0"
"""EchoTurnsEnv cut by `TimeLimit` after 2 of its 3 turns, so every episode is `truncated`."""
if ECHO_ENV_ID not in gym.registry:
    gym.register(ECHO_ENV_ID, entry_point=EchoTurnsEnv, max_episode_steps=2, disable_env_checker=True)

TEST_DATA = Path(__file__).resolve().parent / "data"
"""Test-only data: Math-Verify's equivalence cases (Apache-2.0), copied from ../shared/data."""


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised tiny model folder (BPE tokenizer, chat template)."""
    from textgym.models import init_model

    return init_model("tiny", tmp_path_factory.mktemp("models") / "tiny", seed=0)


@pytest.fixture(scope="session")
def tiny_byte_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same architecture with the byte-level tokenizer."""
    from textgym.models import init_model

    return init_model("tiny", tmp_path_factory.mktemp("models") / "tiny_byte", seed=0, tokenizer="byte")


WARM_ENV = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 1, "instruction": ""}}


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model after a short SFT on 1-digit addition: right format, partly right sums,
    so GRPO groups have rewards that differ (a random model scores 0 everywhere).

    It trains to a measured state, not for a fixed number of steps: SFT stops once greedy
    accuracy on 64 probe tasks reaches 0.25 (checked every 10 steps, at most 400 steps; the
    stage fails if it does not), so the fixture is the same kind of model whatever the CPU's
    kernels round differently."""
    from textgym.config import SFTConfig
    from textgym.models import load_model
    from textgym.trainers.common import seed_everything
    from textgym.trainers.sft import SFTTrainer

    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = SFTConfig.model_validate(
        {
            "env": WARM_ENV,
            "steps": 400,
            "batch_size": 32,
            "optim": {"lr": 3e-3, "warmup_steps": 10},
            "log_every": 400,
            "target": {"accuracy": 0.25, "every": 10, "n": 64, "max_new_tokens": 8, "required": True},
        }
    )
    trainer = SFTTrainer(cfg, model, tok, tmp_path_factory.mktemp("warm"))
    final = trainer.train()
    assert trainer.target_reached and trainer.probe_accuracy is not None and trainer.probe_accuracy >= 0.25
    return final
