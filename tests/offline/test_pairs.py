"""Preference pairs (and unpaired examples) built from stored trajectories."""

from __future__ import annotations

import pyarrow as pa
import pytest
from conftest import _traj

import textgym  # noqa: F401
from textgym.offline import build_pairs
from textgym.offline.store import SCHEMA, trajectory_row


def test_build_pairs_modes_margin_cap_and_dedup():
    p, q = [1, 2], [1, 3]
    trajs = [
        _traj(p, [5, 2], 1.0),
        _traj(p, [5, 2], 1.0),  # duplicate response
        _traj(p, [6, 2], 0.0),
        _traj(p, [7, 2], 0.25),
        _traj(q, [8, 2], 0.0, 1),
        _traj(q, [9, 2], 0.0, 1),  # no reward difference: no pair
    ]
    table = pa.Table.from_pylist([trajectory_row(t) for t in trajs], schema=SCHEMA)
    pairs, unpaired, stats = build_pairs(table, margin=0.5)
    assert stats.duplicates_dropped == 1 and stats.prompts == 2 and stats.prompts_with_pairs == 1
    assert pairs.num_rows == 1
    row = pairs.to_pylist()[0]
    assert (row["chosen_ids"], row["rejected_ids"], row["prompt_ids"]) == ([5, 2], [6, 2], p)
    assert row["chosen_mask"] == [1, 1]
    assert unpaired.num_rows == 5 and stats.desirable == 1 and stats.undesirable == 4
    pairs, _, _ = build_pairs(table, margin=0.3, mode="all")
    assert sorted((r["chosen_reward"], r["rejected_reward"]) for r in pairs.to_pylist()) == [
        (1.0, 0.0),
        (1.0, 0.25),
    ]
    pairs, _, _ = build_pairs(table, margin=0.0, mode="all", max_per_prompt=2)
    assert pairs.num_rows == 2  # p's 3 pairs capped at 2; q's responses tie, so never a pair
    pairs, _, stats = build_pairs(table, margin=0.5, dedup=False)
    assert stats.duplicates_dropped == 0 and pairs.num_rows == 1
    with pytest.raises(ValueError, match="margin"):
        build_pairs(table, margin=-1.0)


def test_tasks_with_the_same_opening_message_are_not_paired_with_each_other():
    # A game's tasks (a hidden number each) open with the same message: a pair compares two
    # answers to one problem, never a win on one hidden number with a loss on another.
    p = [1, 2]
    trajs = [_traj(p, [5, 2], 1.0, 0), _traj(p, [6, 2], 0.0, 1), _traj(p, [7, 2], 0.0, 0)]
    table = pa.Table.from_pylist([trajectory_row(t) for t in trajs], schema=SCHEMA)
    pairs, _, stats = build_pairs(table, margin=0.5, mode="all")
    assert stats.prompts == 2 and [(r["chosen_ids"], r["rejected_ids"]) for r in pairs.to_pylist()] == [
        ([5, 2], [7, 2])
    ]
