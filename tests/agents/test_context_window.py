"""Multi-turn episodes that outgrow the context window are truncated and scored, never crashed on.

Also the per-episode counts and truncation causes that the rollout metrics and `textgym eval`
report (issue 34, items 4 and 5).
"""

from __future__ import annotations

import shutil
import tempfile

import gymnasium as gym
import pytest
import torch
from conftest import ScriptedBackend
from transformers import GPT2Config, GPT2LMHeadModel

import textgym  # noqa: F401
from textgym.agents import LLMAgent, SamplingParams
from textgym.agents.continuous import rollout_continuous
from textgym.agents.rollout import rollout
from textgym.config import PPOConfig
from textgym.evaluation.core import EvalResult
from textgym.models import load_model, load_tokenizer
from textgym.trainers.rl.ppo import PPOTrainer
from textgym.training.batch import RolloutBatch
from textgym.training.rollout_metrics import rollout_metrics
from textgym.training.seeding import seed_everything

WRONG = ["crane", "slate", "pious", "dough", "mirth", "wacky"]
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=8)


def _wordle(tok, texts, engine=rollout, **kwargs):
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, list(texts)))
    (traj,) = engine(agent, [gym.make("textgym/Wordle-v0")], [0], PARAMS, **kwargs)
    return traj


def _turn_starts(traj) -> list[int]:
    """Index of each policy turn's first token."""
    m = traj.loss_mask.tolist()
    return [i for i in range(len(m)) if m[i] == 1 and (i == 0 or m[i - 1] == 0)]


@pytest.fixture(scope="module")
def full_game(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    return tok, _wordle(tok, [f"\\boxed{{{w}}}" for w in WRONG])


@pytest.mark.parametrize("engine", [rollout, rollout_continuous])
def test_an_episode_that_outgrows_the_context_is_truncated_scored_and_token_faithful(full_game, engine):
    tok, full = full_game
    assert full.truncation == "time_limit" and full.truncated and len(_turn_starts(full)) == 6
    starts = _turn_starts(full)
    # turn 3 would start at starts[2]: with a window of starts[2] + 7 tokens, its 8-token
    # response would not fit, so the episode ends after its 2nd turn, before that observation
    limit = starts[2] + PARAMS.max_new_tokens - 1
    cut = _wordle(tok, [f"\\boxed{{{w}}}" for w in WRONG], engine=engine, max_context_tokens=limit)
    assert cut.truncated and not cut.terminated and cut.truncation == "context"
    assert sum(m["role"] == "assistant" for m in cut.messages) == 2 and cut.reward == 0.0
    # the tokens are the first two turns of the uncut game, exactly; it ends on a policy token
    end = max(i for i in range(starts[2]) if full.loss_mask[i] == 1) + 1
    assert cut.token_ids.tolist() == full.token_ids[:end].tolist()
    assert cut.loss_mask.tolist() == full.loss_mask[:end].tolist() and cut.loss_mask[-1] == 1
    assert len(cut.token_ids) + PARAMS.max_new_tokens <= limit
    assert cut.messages[-1]["role"] == "assistant"  # the observation it never saw is not recorded
    # one token more of room and the third turn fits
    longer = _wordle(tok, [f"\\boxed{{{w}}}" for w in WRONG], engine=engine, max_context_tokens=limit + 1)
    assert sum(m["role"] == "assistant" for m in longer.messages) >= 3
    m = rollout_metrics([cut, full])
    assert m["rollout/truncated_context_frac"] == 0.5 and m["rollout/truncated_time_limit_frac"] == 0.5
    assert m["rollout/truncated_frac"] == 1.0 and m["rollout/truncated_max_turns_frac"] == 0.0


def test_a_solved_episode_is_terminated_whatever_the_window(full_game):
    tok, full = full_game
    limit = _turn_starts(full)[1] + PARAMS.max_new_tokens - 1  # room for one turn only
    won = _wordle(tok, ["\\boxed{about}"], max_context_tokens=limit)
    assert won.terminated and not won.truncated and won.truncation == "" and won.reward == 1.0


def test_a_first_prompt_with_no_room_for_a_response_is_refused(full_game):
    tok, full = full_game
    with pytest.raises(ValueError, match=r"first prompt has \d+ tokens.*outgrows the context of"):
        _wordle(tok, ["\\boxed{about}"], max_context_tokens=full.prompt_length + PARAMS.max_new_tokens - 1)
    with pytest.raises(ValueError, match="max_context_tokens must be positive"):
        _wordle(tok, ["\\boxed{about}"], max_context_tokens=0)


def test_ppo_bootstraps_an_episode_cut_by_the_context(tiny_model_dir, tmp_path, full_game):
    tok, full = full_game
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    cfg = PPOConfig.model_validate(
        {"env": {"id": "textgym/Wordle-v0"}, "steps": 1, "prompts_per_step": 1, "group_size": 1,
         "sampling": {"temperature": 1.0, "max_new_tokens": 8}, "kl_coef": 0.0, "gamma": 0.9,
         "lam": 1.0, "whiten_advantages": False}
    )  # fmt: skip
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    with torch.no_grad():  # V ≡ 5 everywhere, so a bootstrap shows in the last return
        trainer.critic.model.score.bias.fill_(5.0)
    limit = _turn_starts(full)[2] + PARAMS.max_new_tokens - 1
    cut = _wordle(tok, [f"\\boxed{{{w}}}" for w in WRONG], max_context_tokens=limit)
    batch = RolloutBatch.from_trajectories([cut], tok.pad_token_id)
    trainer.advantages(batch, [cut], None, {})
    last = int(batch.loss_mask[0].nonzero().flatten()[-1])
    assert float(trainer.critic.returns[0, last]) == pytest.approx(0.9 * 5.0, abs=1e-4)  # γ·V(s_T), not 0


@pytest.fixture(scope="module")
def short_gpt2_dir(tiny_model_dir):
    """A random GPT-2 (learned absolute positions: indexing past `n_positions` fails) whose window
    holds a Wordle prompt and about two turns."""
    tok = load_tokenizer(tiny_model_dir)
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, []))
    env = gym.make("textgym/Wordle-v0")
    obs, _ = env.reset(options={"task_index": 0})
    n_positions = len(agent.encode_prompt(obs)) + 48
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=len(tok), n_positions=n_positions, n_embd=32, n_layer=1, n_head=2,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.eos_token_id,
    )  # fmt: skip
    folder = tempfile.mkdtemp(prefix="gpt2-short-")
    GPT2LMHeadModel(config).save_pretrained(folder)
    tok.save_pretrained(folder)
    yield folder, n_positions
    shutil.rmtree(folder, ignore_errors=True)


def test_ppo_on_a_model_whose_window_the_game_outgrows(short_gpt2_dir, tmp_path):
    """The model's own `max_position_embeddings` is the default window: sampled episodes stop
    inside it (a GPT-2 would raise an index error past it) and PPO trains on them."""
    folder, n_positions = short_gpt2_dir
    seed_everything(0)
    model, tok = load_model(folder)
    assert LLMAgent(model, tok).context_length == n_positions
    cfg = PPOConfig.model_validate(
        {"env": {"id": "textgym/Wordle-v0"}, "steps": 1, "prompts_per_step": 2, "group_size": 2,
         "sampling": {"temperature": 1.0, "max_new_tokens": 16}, "log_trajectories": False}
    )  # fmt: skip
    trainer = PPOTrainer(cfg, model, tok, tmp_path)
    trajs = trainer.collect(2)
    assert all(len(t.token_ids) <= n_positions for t in trajs)
    assert any(t.truncation == "context" for t in trajs)
    m = trainer.train_step()
    assert m["rollout/truncated_context_frac"] > 0 and torch.isfinite(torch.tensor(m["loss/policy"]))
    assert m["time/generate_s"] > 0 and m["time/env_s"] > 0


def test_invalid_actions_and_tool_calls_are_counted_per_episode(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    traj = _wordle(tok, ["no guess here", "\\boxed{crane}", "\\boxed{about}"])
    assert traj.counts == {"invalid_actions": 1} and traj.terminated and traj.reward == 1.0
    env = gym.make("textgym/ToolMath-v0", tools="calculator")
    obs, _ = env.reset(options={"task_index": 0})
    call = env.get_wrapper_attr("oracle_action")(list(obs))  # the expert's calculator call, then a broken one
    agent = LLMAgent(None, tok, backend=ScriptedBackend(tok, [call, "<tool_call>not json</tool_call>"]))
    (tool,) = rollout(agent, [env], [0], PARAMS, max_turns=2)
    assert tool.counts == {"tool_calls": 1, "tool_errors": 1} and tool.truncation == "max_turns"
    m = rollout_metrics([traj, tool])
    assert m["rollout/invalid_actions_mean"] == 0.5 and m["rollout/tool_calls_mean"] == 0.5
    assert m["rollout/tool_errors_mean"] == 0.5 and m["rollout/truncated_max_turns_frac"] == 0.5
    assert m["rollout/reward_per_turn_mean"] == pytest.approx((1.0 / 3 + tool.reward / 2) / 2)
    # what `textgym eval` reports from its episode rows
    rows = [
        {"reward": 1.0, "turns": 3, "invalid_actions": 1, "tool_calls": 0, "truncation": ""},
        {"reward": 0.0, "turns": 6, "tool_calls": 2, "tool_errors": 1, "truncation": "context"},
    ]
    res = EvalResult("x", 2, 1, 0.5, 0.5, {1: 0.5}, 4.0, 1.0, 1.0, episodes=rows)
    s = res.turn_stats()
    assert s["turns_mean"] == 4.5 and s["tool_calls_mean"] == 1.0 and s["tool_errors_mean"] == 0.5
    assert s["invalid_actions_mean"] == 0.5 and s["truncated_context_frac"] == 0.5
    assert s["reward_per_turn_mean"] == pytest.approx(1.0 / 6)
    assert res.summary()["turns"] == s
