"""The `rft:` stage (rejection-sampling fine-tuning): a round is exactly SFT on its filtered samples,
STaR's rationalisation trains without the hint, resume skips finished rounds, bad configs fail early."""

from __future__ import annotations

import json
import math
import re
import shutil

import pytest
import torch
from conftest import ECHO_ENV_ID, WARM_ENV

from textgym.agents import LLMAgent
from textgym.agents.sampling import Generation
from textgym.config import ConfigError, SFTConfig, load_config
from textgym.models import load_model, load_tokenizer
from textgym.offline import read_trajectories
from textgym.offline.rejection import read_jsonl, select_responses
from textgym.pipeline import run
from textgym.stages.rft import collect_round
from textgym.trainers.sft import SFTExample, SFTTrainer
from textgym.training.seeding import seed_everything


def _data(tmp_path, model_dir, **rft):
    return {
        "name": "rft_test",
        "out_dir": str(tmp_path),
        "model": {"path": str(model_dir)},
        "log_with": [],
        "rft": {
            "env": WARM_ENV,
            "rounds": 2,
            "collect": {"n": 12, "samples": 4, "sampling": {"max_new_tokens": 8}},
            "filter": {"max_per_prompt": 2},
            "epochs": 2,
            "batch_size": 4,
            "optim": {"lr": 1e-3},
            "log_every": 1,
            **rft,
        },
    }


def _config(tmp_path, model_dir, **rft):
    return load_config(values=_data(tmp_path, model_dir, **rft))


def _state(model_dir):
    model, _ = load_model(model_dir)
    return model.state_dict()


@pytest.mark.parametrize("start_from", ["previous", "start"])
def test_each_round_equals_sft_on_its_filtered_samples_exactly(warm_model_dir, tmp_path, start_from):
    summary = run(_config(tmp_path, warm_model_dir, **{"from": start_from}), echo=lambda s: None)
    rounds = summary["rft_rounds"]
    assert [r["round"] for r in rounds] == [0, 1] and all(r["rollouts"] == 48 for r in rounds)
    stage = tmp_path / "rft_test" / "rft"
    for r in range(2):
        round_dir = stage / f"round_{r}"
        table = read_trajectories(round_dir / "trajectories")
        # Round 1 sampled the latest model in both modes; fresh tasks each round.
        policy = str(warm_model_dir) if r == 0 else str(stage / "round_0" / "train" / "final")
        assert set(table.column("policy").to_pylist()) == {policy}
        assert sorted(set(table.column("task_index").to_pylist())) == list(range(12 * r, 12 * r + 12))
        # The filter, applied here to the stored samples: correct only, each response once, best 2.
        sel = select_responses(table, correct_only=True, dedup=True, max_per_prompt=2)
        ids, p, mask = (table.column(c).to_pylist() for c in ("token_ids", "prompt_length", "loss_mask"))
        examples = [
            SFTExample(tuple(ids[i][: p[i]]), tuple(ids[i][p[i] :]), tuple(mask[i][p[i] :])) for i in sel.rows
        ]
        assert 0 < len(examples) == rounds[r]["kept"] <= 24
        kept = read_jsonl(round_dir / "kept.jsonl")
        assert [(tuple(k["prompt_ids"]), tuple(k["completion_ids"])) for k in kept] == [
            (e.prompt_ids, e.completion_ids) for e in examples
        ]
        # SFT on them, independently of the stage: same start, seed and hyperparameters.
        steps = math.ceil(2 * len(examples) / 4)
        assert rounds[r]["sft_steps"] == steps
        start = warm_model_dir if r == 0 or start_from == "start" else stage / "round_0" / "train" / "final"
        cfg = SFTConfig.model_validate(
            {"env": WARM_ENV, "steps": steps, "batch_size": 4, "optim": {"lr": 1e-3}, "log_every": 1}
        )
        model, tok = load_model(start)
        seed_everything(0 + 100 + r)
        final = SFTTrainer(
            cfg, model, tok, tmp_path / f"sft_{r}", seed=0 + r, log_with=(), examples=examples
        ).train()
        ours, theirs, before = _state(round_dir / "train" / "final"), _state(final), _state(start)
        assert ours.keys() == theirs.keys()
        for name in ours:
            assert torch.equal(ours[name], theirs[name]), name
        assert any(not torch.equal(ours[n], before[n]) for n in ours)  # the round did train
    assert summary["final_model"] == str(stage / "round_1" / "train" / "final")


class HintReader:
    """A policy that solves a task when its prompt carries the answer as a hint, and otherwise only
    the tasks whose sum is even (a backend for `LLMAgent`: token ids in, token ids out)."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.eos_ids = [tokenizer.eos_token_id]

    def generate(self, prompts, params):
        out = []
        for ids in prompts:
            text = self.tok.decode(ids)
            hint = re.search(r"Hint: the answer is (\d+)\.", text)
            a, b = map(int, re.findall(r"Compute (\d+)\+(\d+)\.", text)[-1])
            answer = int(hint.group(1)) if hint else (a + b if (a + b) % 2 == 0 else a + b + 1)
            gen = self.tok(f"\\boxed{{{answer}}}", add_special_tokens=False)["input_ids"] + self.eos_ids
            out.append(Generation(gen, torch.full((len(gen),), -0.1), "stop"))
        return out


def test_rationalisation_samples_with_the_hint_and_trains_without_it(tiny_model_dir, tmp_path):
    env = {"id": "textgym/Arithmetic-v0", "kwargs": {"operators": "+", "digits": 2, "instruction": ""}}
    cfg = _config(tmp_path, tiny_model_dir, env=env, rounds=1, rationalize={"samples": 2})
    tok = load_tokenizer(tiny_model_dir)
    agent = LLMAgent(None, tok, backend=HintReader(tok))
    round_dir = tmp_path / "round_0"
    records, counts = collect_round(cfg, 0, round_dir, agent, tiny_model_dir, lambda s: None)

    table = read_trajectories(round_dir / "trajectories")
    rows = list(_rows(table, "task_index", "token_ids", "prompt_length", "messages"))
    expr = {t: _sum(json.loads(m)[0]["content"]) for t, _, _, m in rows}
    assert len(set(expr.values())) == 12  # 12 different problems (prompts)
    odd = sorted(t for t, (a, b) in expr.items() if (a + b) % 2)
    assert 0 < len(odd) < 12
    hinted = read_trajectories(round_dir / "rationalized")
    # The unsolved tasks, and only those, were sampled again (2 each) with the hint in the prompt.
    assert sorted(set(hinted.column("task_index").to_pylist())) == odd and hinted.num_rows == 2 * len(odd)
    for t, ids, p, msgs in _rows(hinted, "task_index", "token_ids", "prompt_length", "messages"):
        hint = f"Hint: the answer is {sum(expr[t])}."
        assert hint in tok.decode(ids[:p]) and hint in json.loads(msgs)[0]["content"]
    # Kept: each even task's sample unaided (its 4 identical samples once), each odd task's hinted one.
    assert counts["rationalize_prompts"] == len(odd) == counts["rationalized"]
    assert counts["rationalize_prompts_kept"] == len(odd) and counts["duplicates_dropped"] == 3 * (
        12 - len(odd)
    )
    assert counts["kept"] == 12 == len(records) and read_jsonl(round_dir / "kept.jsonl") == records
    star = [r for r in records if r["rationalized"]]
    assert sorted(r["task_index"] for r in star) == odd
    prompts = {t: (ids[:p], json.loads(m)[:1]) for t, ids, p, m in rows}
    for r in star:
        # The training text: the prompt exactly as posed, without the hint, then the hinted sample's tokens.
        assert (r["prompt_ids"], r["prompt"]) == prompts[r["task_index"]]
        a, b = expr[r["task_index"]]
        example = SFTExample(tuple(r["prompt_ids"]), tuple(r["completion_ids"]))
        text = tok.decode(example.trajectory().token_ids)
        assert "Hint" not in text and f"Compute {a}+{b}." in text and f"\\boxed{{{a + b}}}" in text
        assert r["completion"][0]["content"] == f"\\boxed{{{a + b}}}"


def _rows(table, *names):
    return zip(*(table.column(c).to_pylist() for c in names), strict=True)


def _sum(prompt):
    a, b = re.search(r"Compute (\d+)\+(\d+)\.", prompt).groups()
    return int(a), int(b)


def test_resume_skips_finished_rounds_and_finishes_an_interrupted_one(warm_model_dir, tmp_path):
    cfg = _config(tmp_path, warm_model_dir, rationalize={}, **{"from": "start"})
    summary = run(cfg, echo=lambda s: None)
    stage = tmp_path / "rft_test" / "rft"
    final1, kept1 = (
        _state(stage / "round_1" / "train" / "final"),
        read_jsonl(stage / "round_1" / "kept.jsonl"),
    )
    for rec in kept1:  # whatever the tiny model rationalised, its training prompt has no hint
        assert "Hint" not in json.dumps(rec["prompt"])
    # Everything finished: both rounds are skipped.
    lines: list[str] = []
    again = run(cfg, resume=True, echo=lines.append)
    assert [line for line in lines if "finished earlier" in line] == [
        "rft round 0: finished earlier, skipped",
        "rft round 1: finished earlier, skipped",
    ]
    assert again["rft_rounds"] == summary["rft_rounds"] and again["final_model"] == summary["final_model"]
    # Round 1 interrupted in its SFT: its samples are reused; the kept set and the model come out the same.
    shards = sorted(p.name for p in (stage / "round_1" / "trajectories").iterdir())
    (stage / "round_1" / "done.json").unlink()
    shutil.rmtree(stage / "round_1" / "train")
    lines = []
    third = run(cfg, resume=True, echo=lines.append)
    assert (
        "rft round 0: finished earlier, skipped" in lines
        and "rft round 1: finished earlier, skipped" not in lines
    )
    assert sorted(p.name for p in (stage / "round_1" / "trajectories").iterdir()) == shards
    assert read_jsonl(stage / "round_1" / "kept.jsonl") == kept1
    assert third["rft_rounds"] == summary["rft_rounds"]
    resumed = _state(stage / "round_1" / "train" / "final")
    assert all(torch.equal(resumed[n], final1[n]) for n in final1)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"filter": {"correct_only": False}}, r"rft\.filter: .*rejects"),
        ({"rationalize": {"hint": "{content} (the answer)"}}, r"rft\.rationalize\.hint: .*\{answer\}"),
        ({"rationalize": {"hint": "{content} {answer} {oops}"}}, r"rft\.rationalize\.hint: .*format"),
        ({"from": "base"}, r"rft\.from: Input should be 'start' or 'previous'"),
        ({"collect": {"samples": 0}}, r"rft\.collect\.samples: "),
        ({"epochs": 0}, r"rft\.epochs: "),
        ({"bogus": 1}, r"rft\.bogus: Extra inputs"),
        ({"env": {**WARM_ENV, "reward_model": "rm"}}, r"rft\.env: .*reward_model is not supported"),
    ],
)
def test_bad_rft_configs_name_the_field(tiny_model_dir, tmp_path, override, message):
    with pytest.raises(ConfigError, match=message):
        _config(tmp_path, tiny_model_dir, **override)


def test_rft_is_exclusive_and_checked_against_its_env_before_any_work(tiny_model_dir, tmp_path):
    from textgym.pipeline import preflight

    with pytest.raises(ConfigError, match="at most one of the grpo, ppo, dpo, rft and online_dpo stages"):
        load_config(values={**_data(tmp_path, tiny_model_dir), "dpo": {"env": WARM_ENV}})
    gsm8k = {"id": "textgym/GSM8K-v0", "kwargs": {"split": "test"}}  # 1319 tasks
    cfg = _config(tmp_path, tiny_model_dir, env=gsm8k, collect={"n": 700})
    with pytest.raises(ConfigError, match=r"rft\.collect\.n: .* has 1319 tasks; 2 rounds of n=700"):
        preflight(cfg)
    preflight(_config(tmp_path, tiny_model_dir, env=gsm8k, collect={"n": 700, "fresh_tasks": False}))
    cfg = _config(tmp_path, tiny_model_dir, env={"id": ECHO_ENV_ID}, collect={"n": 2}, rationalize={})
    with pytest.raises(ConfigError, match=r"rft\.rationalize: .* no gold answer"):
        preflight(cfg)
    assert not (tmp_path / "rft_test").exists()  # nothing was written
