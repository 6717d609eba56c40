"""Rejection sampling's filter (correct-only, reward threshold, dedupe, best-of-K) on hand-made rows."""

from __future__ import annotations

import dataclasses
import json

import pyarrow as pa
import pytest
import torch
from conftest import _traj

import textgym  # noqa: F401
from textgym.envs import make
from textgym.envs.hint import AnswerHintWrapper
from textgym.offline.rejection import kept_records, read_jsonl, select_responses, task_prompts, write_jsonl
from textgym.offline.store import SCHEMA, trajectory_row


def _row(prompt, response, reward, correct, task, sample=0):
    t = dataclasses.replace(_traj(prompt, response, reward, task), reward_terms={"reward/correct": correct})
    return trajectory_row(t, sample=sample)


P, Q, R = [1, 2], [1, 3], [1, 4]
ROWS = [
    _row(P, [5, 9], 1.0, 1.0, 0, 0),  # 0: correct
    _row(P, [6, 9], 0.0, 0.0, 0, 1),  # 1: wrong
    _row(P, [5, 9], 1.0, 1.0, 0, 2),  # 2: a repeat of row 0
    _row(P, [7, 9], 1.5, 1.0, 0, 3),  # 3: correct, the highest reward (e.g. a format bonus)
    _row(P, [8, 9], 1.0, 1.0, 0, 4),  # 4: correct, ties with row 0
    _row(Q, [5, 9], 0.5, 0.0, 1, 0),  # 5: wrong, partial credit
    _row(Q, [6, 9], 0.0, 0.0, 1, 1),  # 6: wrong
    _row(R, [5, 9], 0.9, 1.0, 2, 0),  # 7: correct, task 2 ...
    _row(R, [6, 9], 1.0, 1.0, 3, 0),  # 8: ... and task 3 poses the same prompt: its own group
]
TABLE = pa.Table.from_pylist(ROWS, schema=SCHEMA)


def test_correct_only_with_dedupe_keeps_each_correct_response_once_best_reward_first():
    sel = select_responses(TABLE)
    # P: correct rows 0, 2, 3, 4 ranked by reward (3; then 0, 2, 4 in table order); 2 repeats 0.
    # Q: nothing correct -> unsolved (task 1). Tasks 2 and 3 share prompt R but are two problems
    # (a game's hidden word or number is the task, its opening message the same): a group each.
    assert sel.rows == [3, 0, 4, 7, 8]
    assert sel.unsolved == [1]
    assert (sel.trajectories, sel.prompts, sel.passed, sel.duplicates_dropped, sel.prompts_kept) == (
        9,
        4,
        6,
        1,
        3,
    )


def test_max_per_prompt_keeps_the_best_of_k():
    assert select_responses(TABLE, max_per_prompt=1).rows == [3, 7, 8]  # RAFT: best-of-K
    assert select_responses(TABLE, max_per_prompt=2).rows == [3, 0, 7, 8]
    # Without dedupe the repeat counts: P's correct rows are 3, 0, 2, 4.
    sel = select_responses(TABLE, dedup=False, max_per_prompt=3)
    assert sel.rows == [3, 0, 2, 7, 8] and sel.duplicates_dropped == 0


def test_min_reward_alone_or_with_correctness():
    # Reward threshold only: Q's partial-credit 0.5 passes 0.5, and correctness is not asked.
    sel = select_responses(TABLE, correct_only=False, min_reward=0.5)
    assert sel.rows == [3, 0, 4, 5, 7, 8] and sel.unsolved == []
    sel = select_responses(TABLE, correct_only=True, min_reward=1.0)
    assert sel.rows == [3, 0, 4, 8] and sel.passed == 5 and sel.unsolved == [1, 2]
    # No rule at all and a cap: best-of-K by reward among every sample (the wrong ones too).
    assert select_responses(TABLE, correct_only=False, max_per_prompt=1).rows == [3, 5, 7, 8]
    with pytest.raises(ValueError, match="max_per_prompt"):
        select_responses(TABLE, max_per_prompt=0)


def test_kept_records_carry_exact_token_ids_and_can_take_another_prompt(tmp_path):
    recs = kept_records(TABLE, [3, 8])
    assert [r["task_index"] for r in recs] == [0, 3] and [r["sample"] for r in recs] == [3, 0]
    assert recs[0]["prompt_ids"] == P and recs[0]["completion_ids"] == [7, 9]
    assert recs[0]["completion_mask"] == [1, 1] and recs[0]["reward"] == 1.5
    assert recs[0]["prompt"] == [{"role": "user", "content": "task 0"}] and recs[0]["completion"] == []
    assert not recs[0]["rationalized"]
    # Under another prompt (STaR): the task's prompt replaces the row's own.
    other = {0: ([4, 4, 4], [{"role": "user", "content": "plain"}]), 3: ([3], [])}
    recs = kept_records(TABLE, [3, 8], prompts=other)
    assert [r["prompt_ids"] for r in recs] == [[4, 4, 4], [3]] and recs[0]["completion_ids"] == [7, 9]
    assert all(r["rationalized"] for r in recs)
    # task_prompts: each task's first row.
    prompts = task_prompts(TABLE)
    assert sorted(prompts) == [0, 1, 2, 3] and prompts[1] == (Q, [{"role": "user", "content": "task 1"}])
    write_jsonl(recs, tmp_path / "kept.jsonl")
    assert read_jsonl(tmp_path / "kept.jsonl") == json.loads(json.dumps(recs))


def test_a_multi_turn_completion_keeps_its_environment_tokens_masked():
    t = _traj([1, 2], [5, 6, 7, 8], 1.0)
    t.loss_mask = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 1.0])  # policy, env turn (2 tokens), policy
    t.messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    (rec,) = kept_records(pa.Table.from_pylist([trajectory_row(t)], schema=SCHEMA), [0])
    assert rec["completion_ids"] == [5, 6, 7, 8] and rec["completion_mask"] == [1, 0, 0, 1]
    assert rec["prompt"] == [{"role": "user", "content": "q"}]
    assert rec["completion"] == [{"role": "assistant", "content": "a"}]


def test_the_hint_wrapper_puts_the_gold_answer_in_the_first_prompt_only():
    env = make("textgym/Arithmetic-v0", operators="+", digits=2, instruction="")
    obs, info = env.reset(options={"task_index": 5})
    hinted = AnswerHintWrapper(
        make("textgym/Arithmetic-v0", operators="+", digits=2, instruction=""), "{content} [{answer}]"
    )
    hobs, hinfo = hinted.reset(options={"task_index": 5})
    assert hobs[-1]["content"] == f"{obs[-1]['content']} [{info['answer']}]" and hinfo == info
    # The reward is still the env's own verdict against the gold answer.
    assert hinted.step(f"\\boxed{{{info['answer']}}}")[1] == 1.0
    with pytest.raises(ValueError, match="no gold 'answer'"):
        from conftest import ECHO_ENV_ID

        AnswerHintWrapper(make(ECHO_ENV_ID), "{content}{answer}").reset(options={"task_index": 0})
