"""Demonstrations: the env's oracle played as a policy, token-faithful, into the store and into SFT."""

from __future__ import annotations

import json

import gymnasium as gym
import pytest
import torch
from typer.testing import CliRunner

import textgym  # noqa: F401  (registers the envs)
from textgym.agents.continuous import rollout_continuous
from textgym.agents.demonstrator import OracleDemonstrator
from textgym.agents.rollout import rollout
from textgym.agents.sampling import SamplingParams
from textgym.models import load_model, load_tokenizer

TOOLMATH = {"tools": "calculator", "operators": "*", "digits": 3, "instruction": "Use the calculator."}


def _toolmath(**kw):
    return gym.make("textgym/ToolMath-v0", **{**TOOLMATH, **kw})


def test_oracle_episodes_are_token_faithful_multi_turn_trajectories(tiny_model_dir):
    tok = load_tokenizer(tiny_model_dir)
    envs = [_toolmath() for _ in range(3)]
    trajs = rollout(OracleDemonstrator(tok), envs, [0, 1, 2], SamplingParams())
    for t, env in zip(trajs, envs, strict=True):
        roles = [m["role"] for m in t.messages]
        assert roles == ["user", "assistant", "tool", "assistant"]
        assert t.reward == 1.0 and t.reward_terms["reward/correct"] == 1.0 and t.terminated
        # the calculator was called with the question's expression, its result was boxed
        expr = t.messages[0]["content"].split()[1].rstrip(".")
        assert json.loads(t.messages[1]["content"].split("<tool_call>")[1].split("</tool_call>")[0]) == {
            "name": "calculator",
            "arguments": {"expression": expr},
        }
        assert t.messages[3]["content"] == "\\boxed{" + str(eval(expr)) + "}"
        # the token sequence is the chat template's rendering of the conversation (its closing
        # newline after the last end-of-turn aside) ...
        tools = env.reset(options={"task_index": 0})[1]["tools"]
        full = tok.apply_chat_template(t.messages, tools=tools, tokenize=True, return_dict=False)
        ids = t.token_ids.tolist()
        assert full[: len(ids)] == ids and len(full) - len(ids) <= 1
        # ... and the loss mask is 1 on exactly the two assistant turns (each ending with EOS)
        mask = t.loss_mask.bool()
        spans, cur = [], []
        for i, m in enumerate(mask.tolist()):
            if m:
                cur.append(ids[i])
            elif cur:
                spans.append(cur)
                cur = []
        spans.append(cur)
        assert [tok.decode(s) for s in spans] == [m["content"] + tok.eos_token for m in t.messages[1::2]]
        assert torch.all(t.logprobs == 0)
    from textgym.training.rollout_metrics import rollout_metrics

    m = rollout_metrics(trajs)
    assert (m["rollout/turns_mean"], m["rollout/tool_results_mean"], m["rollout/accuracy"]) == (2.0, 1.0, 1.0)


def test_an_episode_that_opens_mid_game_trains_only_the_policy_turns(tiny_model_dir):
    # GuessNumber's restarts: the first observation holds the oracle's earlier guesses as
    # assistant messages; they are prompt (loss mask 0), and the policy's turns are its own
    tok = load_tokenizer(tiny_model_dir)
    kw = {"high": 20, "max_guesses": 5, "max_episode_steps": 5, "oracle_prefix": 4}
    envs = [gym.make("textgym/GuessNumber-v0", **kw) for _ in range(12)]
    openings = [len(env.reset(options={"task_index": i})[0]) for i, env in enumerate(envs)]
    trajs = rollout(OracleDemonstrator(tok), envs, list(range(12)), SamplingParams())
    assert any(n > 1 for n in openings) and all(t.reward == 1.0 for t in trajs)
    for t, n in zip(trajs, openings, strict=True):
        opening = tok.apply_chat_template(
            t.messages[:n], tokenize=True, return_dict=False, add_generation_prompt=True
        )
        assert (
            t.token_ids[: t.prompt_length].tolist() == opening and t.loss_mask[: t.prompt_length].sum() == 0
        )
        played = [m for m in t.messages[n:] if m["role"] == "assistant"]
        assert t.turns == len(played) >= 1 and t.response_length == sum(
            len(tok(m["content"], add_special_tokens=False)["input_ids"]) + 1 for m in played
        )
    from textgym.training.rollout_metrics import rollout_metrics

    m = rollout_metrics(trajs)
    assert (
        m["rollout/turns_mean"]
        == sum(t.turns for t in trajs) / 12
        < sum(m["role"] == "assistant" for t in trajs for m in t.messages) / 12
    )


def _policy_runs(t):
    """The token runs with loss mask 1 after the prompt (the turns the loss trains), in order."""
    runs, cur = [], []
    p = t.prompt_length
    for tok_id, m in zip(t.token_ids[p:].tolist(), t.loss_mask[p:].tolist(), strict=True):
        if m:
            cur.append(tok_id)
        elif cur:
            runs, cur = [*runs, cur], []
    return runs + ([cur] if cur else [])


def test_dart_noise_plays_random_turns_outside_the_loss_and_the_expert_recovers(tiny_model_dir):
    # DART: with probability `noise` a turn is the env's random action, as context (mask 0);
    # every trained turn is the expert's bisection of the range the feedback left open, also
    # after a random guess took the game off the expert's path
    import re

    tok = load_tokenizer(tiny_model_dir)
    kw = {"high": 20, "max_guesses": 5, "max_episode_steps": 5}

    def play(noise, seed):
        envs = [gym.make("textgym/GuessNumber-v0", **kw) for _ in range(32)]
        demo = OracleDemonstrator(tok, noise=noise, seed=seed)
        return rollout(demo, envs, list(range(32)), SamplingParams())

    trajs = play(0.5, 0)
    noise_turns = off_path = turns = 0
    for t in trajs:
        lo, hi, mids = 1, 20, []
        for m in t.messages[1:]:
            if m["role"] == "assistant":
                mids.append((lo + hi) // 2)
            else:
                lo, hi = (int(x) for x in re.search(r"from (\d+) to (\d+)", m["content"]).groups())
        assistant = [m["content"] for m in t.messages if m["role"] == "assistant"]
        trained = [tok.decode(run) for run in _policy_runs(t)]
        # each trained run is the expert's reply at its turn; the others are the random turns
        expert = [f"\\boxed{{{mid}}}{tok.eos_token}" for mid in mids]
        it = iter(zip(assistant, expert, strict=True))
        assert all(any(run == e for _, e in it) for run in trained), (trained, assistant)
        assert t.turns == len(trained)
        noise_turns += len(assistant) - len(trained)
        turns += len(assistant)
        off_path += any(a + tok.eos_token != e for a, e in zip(assistant, expert, strict=True))
    # about half the turns are noise (binomial, > 100 turns: 0.35 to 0.65 is over 3 sd either side)
    assert 0.35 < noise_turns / turns < 0.65 and off_path >= 8
    assert not all(t.reward == 1.0 for t in trajs) and any(t.reward == 1.0 for t in trajs)
    again = play(0.5, 0)
    assert [t.token_ids.tolist() for t in again] == [t.token_ids.tolist() for t in trajs]
    assert [t.loss_mask.tolist() for t in again] == [t.loss_mask.tolist() for t in trajs]
    assert [t.token_ids.tolist() for t in play(0.5, 1)] != [t.token_ids.tolist() for t in trajs]
    clean = play(0.0, 0)
    assert all(t.reward == 1.0 and len(_policy_runs(t)) == t.turns == len(t.messages) // 2 for t in clean)
    with pytest.raises(ValueError, match=r"noise must be in \[0, 1\)"):
        OracleDemonstrator(tok, noise=1.0)
    with pytest.raises(AttributeError, match="has no random_action"):
        rollout(OracleDemonstrator(tok, noise=0.99), [_OracleOnlyEnv()], [0], SamplingParams())


def test_a_tool_free_expert_answers_in_its_head_on_the_turns_it_would_call_a_tool(tiny_model_dir):
    # tool_free: on a tool turn the expert answers with the inner env's own oracle (the right
    # product, boxed at once) with that probability; the turn is trained on (mask 1)
    tok = load_tokenizer(tiny_model_dir)

    def play(tool_free, seed=0, n=60):
        envs = [_toolmath() for _ in range(n)]
        return rollout(
            OracleDemonstrator(tok, seed=seed, tool_free=tool_free), envs, list(range(n)), SamplingParams()
        )

    direct = play(1.0, n=4)
    for t in direct:
        assert [m["role"] for m in t.messages] == ["user", "assistant"] and t.reward == 1.0
        expr = t.messages[0]["content"].split()[1].rstrip(".")
        assert t.messages[1]["content"] == "\\boxed{" + str(eval(expr)) + "}"
        (run,) = _policy_runs(t)
        assert tok.decode(run) == t.messages[1]["content"] + tok.eos_token
    assert all(len(t.messages) == 4 for t in play(0.0, n=4))
    mixed = play(0.5)
    share = sum(len(t.messages) == 2 for t in mixed) / len(mixed)
    # binomial(60, 0.5): sd 0.065, so 0.25..0.75 is ~3.9 sd either side
    assert 0.25 < share < 0.75 and all(t.reward == 1.0 for t in mixed)
    assert [len(t.messages) for t in play(0.5)] == [len(t.messages) for t in mixed]  # seeded
    assert [len(t.messages) for t in play(0.5, seed=1)] != [len(t.messages) for t in mixed]
    # an env without tools has nothing to skip: the draw never fires
    envs = [gym.make("textgym/GuessNumber-v0", high=20) for _ in range(3)]
    plain = rollout(OracleDemonstrator(tok, tool_free=1.0), envs, [0, 1, 2], SamplingParams())
    assert [t.messages for t in plain] == [
        t.messages
        for t in rollout(
            OracleDemonstrator(tok),
            [gym.make("textgym/GuessNumber-v0", high=20) for _ in range(3)],
            [0, 1, 2],
            SamplingParams(),
        )
    ]
    with pytest.raises(ValueError, match=r"tool_free must be in \[0, 1\]"):
        OracleDemonstrator(tok, tool_free=1.5)


class _NoOracleEnv(gym.Env):
    """A plain Gymnasium text env with no scripted expert."""

    def reset(self, *, seed=None, options=None):
        return [{"role": "user", "content": "Say hi."}], {}

    def step(self, action):
        return [], 0.0, True, False, {}


class _OracleOnlyEnv(_NoOracleEnv):
    """An expert, but no random action to perturb it with."""

    def oracle_action(self, messages):
        return "hi"


def test_a_demonstrator_needs_an_oracle_and_lockstep_rollouts(tiny_model_dir):
    demo = OracleDemonstrator(load_tokenizer(tiny_model_dir))
    with pytest.raises(AttributeError, match="has no oracle_action"):
        rollout(demo, [_NoOracleEnv()], [0], SamplingParams())
    with pytest.raises(ValueError, match="plays in lockstep"):
        rollout_continuous(demo, [_toolmath()], [0], SamplingParams())
    with pytest.raises(TypeError, match="does not sample"):
        demo.generate([[1, 2]], SamplingParams())


def test_rollouts_collect_agent_oracle_fills_the_store_and_resumes(tiny_model_dir, tmp_path):
    from textgym.cli import app
    from textgym.offline.store import read_trajectories

    out = tmp_path / "demos"
    args = ["rollouts", "collect", "--agent", "oracle", "--model", str(tiny_model_dir)]
    args += ["--env", "textgym/ToolMath-v0", "--out", str(out), "--n", "6", "--batch-size", "4"]
    for k, v in TOOLMATH.items():  # values as JSON, which YAML reads back ("*" alone is a YAML alias)
        args += ["--env-kwargs", f"{k}={json.dumps(v)}"]
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert "6 tasks rolled out (6 episodes, 2 shards)" in res.output
    t = read_trajectories(out)
    assert t.column("source").to_pylist() == ["demonstration"] * 6
    assert set(t.column("policy").to_pylist()) == {f"oracle:{tiny_model_dir.resolve()}"}
    assert t.column("reward").to_pylist() == [1.0] * 6
    again = CliRunner().invoke(app, args)
    assert again.exit_code == 0 and "0 tasks rolled out" in again.output and "6 already in" in again.output
    bad = CliRunner().invoke(app, [*args[:3], "teacher", *args[4:]])
    assert bad.exit_code != 0 and "--agent must be 'policy' or 'oracle'" in bad.output
    bad = CliRunner().invoke(app, [*args[:3], "policy", *args[4:], "--noise", "0.5"])
    assert bad.exit_code != 0 and "--noise and --tool-free change the oracle's" in bad.output
    # an expert that answers in its head: every episode one turn, boxed at once, still right
    direct = tmp_path / "direct"
    res = CliRunner().invoke(app, [*args[:9], str(direct), *args[10:], "--tool-free", "1"])
    assert res.exit_code == 0, res.output
    t = read_trajectories(direct)
    roles = [[m["role"] for m in json.loads(x)] for x in t.column("messages").to_pylist()]
    assert roles == [["user", "assistant"]] * 6 and t.column("reward").to_pylist() == [1.0] * 6
    # DART noise from the command line: some turns random and outside the loss
    noisy = tmp_path / "noisy"
    game = ["--env", "textgym/GuessNumber-v0", "--env-kwargs", "high=20", "--out", str(noisy)]
    res = CliRunner().invoke(app, [*args[:6], *game, "--n", "16", "--noise", "0.5", "--seed", "3"])
    assert res.exit_code == 0, res.output
    t = read_trajectories(noisy)
    turns = [sum(m["role"] == "assistant" for m in json.loads(x)) for x in t.column("messages").to_pylist()]
    masks = t.column("loss_mask").to_pylist()
    runs = [sum(1 for a, b in zip([0, *m], m, strict=False) if b > a) for m in masks]  # policy turns
    assert all(r <= n for r, n in zip(runs, turns, strict=True)) and sum(runs) < sum(turns)


def test_store_examples_train_the_assistant_turns_and_filter_by_reward(tiny_model_dir, tmp_path):
    from textgym.config import SFTConfig
    from textgym.offline.pairs import collect_rollouts
    from textgym.offline.store import read_trajectories
    from textgym.trainers.sft import SFTTrainer, store_examples

    tok = load_tokenizer(tiny_model_dir)
    store = tmp_path / "store"
    collect_rollouts(OracleDemonstrator(tok), "textgym/ToolMath-v0", store, env_kwargs=TOOLMATH, n=4)
    rows = read_trajectories(store)
    examples = store_examples(store, min_reward=1.0)
    assert len(examples) == 4
    for ex, ids, mask, p in zip(
        examples,
        rows.column("token_ids").to_pylist(),
        rows.column("loss_mask").to_pylist(),
        rows.column("prompt_length").to_pylist(),
        strict=True,
    ):
        assert list(ex.prompt_ids) + list(ex.completion_ids) == ids
        assert ex.completion_mask is not None and list(ex.completion_mask) == mask[p:]
        assert 0 in ex.completion_mask  # the tool turn is context, not trained on
    with pytest.raises(ValueError, match=r"no episode with reward >= 1.5 has a policy token"):
        store_examples(store, min_reward=1.5)
    with pytest.raises(FileNotFoundError, match="no trajectory shard"):
        store_examples(tmp_path / "missing")
    # the trainer reads the store through its config, and its loss covers only policy tokens
    cfg = SFTConfig.model_validate(
        {"env": {"id": "textgym/ToolMath-v0", "kwargs": TOOLMATH}, "steps": 1, "batch_size": 4,
         "trajectories": str(store), "min_reward": 1.0}
    )  # fmt: skip
    model, _ = load_model(tiny_model_dir)
    trainer = SFTTrainer(cfg, model, tok, tmp_path / "sft")
    batch_mask = sum(float(trainer.example(i).loss_mask.sum()) for i in range(4))
    assert batch_mask == sum(sum(m) for m in rows.column("loss_mask").to_pylist())
    with pytest.raises(ValueError, match="either `trajectories`"):
        SFTConfig.model_validate({**cfg.model_dump(), "demonstrations": {"n": 2}})
    with pytest.raises(ValueError, match="less than 1"):
        demos = {"n": 2, "noise": 1.0}
        SFTConfig.model_validate({"env": {"id": "textgym/ToolMath-v0"}, "demonstrations": demos})
    with pytest.raises(ValueError, match="min_reward filters"):
        SFTConfig.model_validate({"env": {"id": "textgym/ToolMath-v0"}, "min_reward": 1.0})


@pytest.mark.learning
def test_sft_on_inline_demonstrations_learns_the_tool_turns(tiny_model_dir, tmp_path):
    """`sft.demonstrations` collects the oracle's episodes into the stage folder (reused on
    resume) and SFT on them lowers the loss of the assistant turns."""
    from textgym.config import SFTConfig
    from textgym.trainers.sft import SFTTrainer
    from textgym.training.seeding import seed_everything

    cfg = SFTConfig.model_validate(
        {"env": {"id": "textgym/ToolMath-v0", "kwargs": TOOLMATH}, "steps": 30, "batch_size": 16,
         "demonstrations": {"n": 64}, "optim": {"lr": 3e-3}, "log_every": 1}
    )  # fmt: skip
    seed_everything(0)
    model, tok = load_model(tiny_model_dir)
    trainer = SFTTrainer(cfg, model, tok, tmp_path / "sft")
    assert len(trainer.examples or []) == 64
    shards = sorted((tmp_path / "sft" / "demonstrations").glob("shard-*.parquet"))
    assert shards
    trainer.train()
    rows = [json.loads(x) for x in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["loss/sft"] < 0.5 * rows[0]["loss/sft"]
    # a second trainer on the same stage folder collects nothing new
    model2, _ = load_model(tiny_model_dir)
    SFTTrainer(cfg, model2, tok, tmp_path / "sft", resume=True)
    assert sorted((tmp_path / "sft" / "demonstrations").glob("shard-*.parquet")) == shards
