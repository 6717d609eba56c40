"""The figures that tell skill from format: cut share, stated answers, error split, and the
format-controlled baseline run on a real (tiny, SFT-warmed) model."""

from __future__ import annotations

import itertools
import json

import pytest

from textgym.agents import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.evaluation.figures import (
    BOXED_STEM,
    Variant,
    baseline_variants,
    cut_share,
    error_split,
    format_baseline,
    stated_accuracy,
    stated_correct,
)


def _episode(reply: str, gold: str = "148", finish: str = "stop", correct: bool = False, category: str = ""):
    messages = [{"role": "user", "content": "Compute 85+63."}, {"role": "assistant", "content": reply}]
    return {"messages": messages, "gold": gold, "finish_reason": finish, "correct": correct,
            "category": category}  # fmt: skip


@pytest.mark.parametrize(
    ("reply", "gold", "stated"),
    [
        ("85+63 = 148", "148", True),  # an unboxed last line states its number
        ("The sum is 148.0 apples", "148", True),
        ("So the answer is 1,480.", "1480", True),
        ("\\boxed{148} ... and 149 if we round", "148", True),  # the last box wins over later numbers
        ("The answer is: \\frac{3}{4}", "0.75", True),
        ("the answer is −5", "-5", True),  # U+2212 read as a minus
        ("85+63 = 148, no wait 147", "148", False),  # the last number stated
        ("I am not sure", "148", False),
        ("\\boxed{x = 3}", "x=3", True),  # text golds compare without spaces
    ],
)
def test_stated_answers_are_read_leniently(reply, gold, stated):
    assert stated_correct(reply, gold) is stated


def test_cut_share_stated_accuracy_and_the_error_split():
    eps = [
        _episode("85+63 = 148", correct=False, category="no carry"),
        _episode("\\boxed{148}", correct=True, category="no carry"),
        _episode("Let me think step by step about 85 and", finish="length", category="carry"),
        _episode("147", correct=False, category="carry"),
    ]
    assert cut_share(eps) == 0.25 and cut_share([]) == 0.0
    assert stated_accuracy(eps) == 0.5  # the first two state 148; the verifier paid one
    assert stated_accuracy([_episode("148", gold="")]) is None
    assert error_split(eps) == {"no carry": {"n": 2, "correct": 1}, "carry": {"n": 2, "correct": 0}}
    assert error_split([_episode("1")]) == {}


def test_the_variants_are_the_stems_a_one_shot_example_and_an_instruction():
    variants = baseline_variants("textgym/Arithmetic-v0", {"split": "test", "operators": "+"}, 5)
    names = [v.name for v in variants]
    assert names[0] == "stem: " + BOXED_STEM and names[-2:] == ["one-shot", "instruction"]
    stem = variants[1]
    assert stem.name.startswith("env stem 1") and len(stem.stems) == 5
    assert all(s.endswith(" = ") and ("+" in s) for s in stem.stems.values())
    shot = variants[2].example
    assert shot[-1]["role"] == "assistant" and "\\boxed{" in shot[-1]["content"]


def test_format_baseline_takes_the_best_qualified_variant_and_regenerates_only_cut_answers(
    warm_model_dir, tmp_path, monkeypatch
):
    """The warmed tiny model (1-digit sums, boxed) under every variant: the budget is doubled for the
    cut answers alone, the chosen variant is the most accurate one cutting <= max_cut, and its
    episodes are written with the budget they ran at."""
    from textgym.evaluation import figures

    agent = LLMAgent.from_pretrained(warm_model_dir)
    calls: list[tuple[int, int, list[int]]] = []  # (tasks, budget, tokens each task already had)
    run_variant = figures._run_variant

    def counting(agent, env_id, env_kwargs, n, variant, params, batch_size, indices=None, started=None):
        rows = list(range(n)) if indices is None else list(indices)
        calls.append((len(rows), params.max_new_tokens, [len((started or {}).get(i, [])) for i in rows]))
        return run_variant(agent, env_id, env_kwargs, n, variant, params, batch_size, indices, started)

    monkeypatch.setattr(figures, "_run_variant", counting)
    kwargs = {"split": "test", "operators": "+", "digits": 1}
    n = 12
    params = SamplingParams(temperature=1.0, max_new_tokens=2)  # the baseline decodes greedily anyway
    path = tmp_path / "b.jsonl"
    out = format_baseline(agent, "textgym/Arithmetic-v0", kwargs, n, params, max_cut=0.1, max_tokens=16,
                          episodes_path=path)  # fmt: skip
    table = out["variants"]
    assert set(table) == {v.name for v in baseline_variants("textgym/Arithmetic-v0", kwargs, n)}
    qualified = {k: t for k, t in table.items() if t["cut_share"] <= 0.1}
    assert out["qualified"] == bool(qualified)
    if qualified:
        assert out["accuracy"] == max(t["accuracy"] for t in qualified.values())
        assert table[out["variant"]]["cut_share"] <= 0.1
    # every variant starts with all n tasks at 2 tokens; a later call continues only the cut ones,
    # from the tokens they have, to a doubled budget, never more tasks than the call before it
    starts = [i for i, c in enumerate(calls) if c[2] == [0] * n]
    assert len(starts) == len(table) and all(calls[i][:2] == (n, 2) for i in starts)
    for a, b in itertools.pairwise(calls):
        if b[2] != [0] * n:
            assert b[1] == 2 * a[1] and b[0] <= a[0] and set(b[2]) == {a[1]}, (a, b)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(rows) == n and {r["variant"] for r in rows} == {out["variant"]}
    assert sum(r["correct"] for r in rows) / n == out["accuracy"]
    assert all(r["max_new_tokens"] == table[out["variant"]]["max_new_tokens"] for r in rows)
    assert all(r["response_tokens"] <= r["max_new_tokens"] for r in rows)


def test_a_cut_answer_continued_to_a_larger_budget_is_the_fresh_greedy_answer(warm_model_dir):
    """`_with_budget` continues a cut answer from its tokens: the same reply as generating it afresh."""
    from textgym.evaluation.figures import _with_budget

    agent = LLMAgent.from_pretrained(warm_model_dir)
    kwargs = {"split": "test", "operators": "+", "digits": 1}
    variants = baseline_variants("textgym/Arithmetic-v0", kwargs, 6)
    variant = next(v for v in variants if v.name == "instruction")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=2)
    rows = _with_budget(agent, "textgym/Arithmetic-v0", kwargs, 6, variant, greedy, 6, 0.0, 16)
    assert rows[0]["max_new_tokens"] > 2  # the answers were cut at 2 tokens and continued
    continued = [r for r in rows if r["response_tokens"] > 2]
    assert continued
    for r in continued:
        prompt = agent.encode_prompt(r["messages"][:-1])
        fresh = agent.generate([prompt], SamplingParams(temperature=0.0, max_new_tokens=r["max_new_tokens"]))
        assert r["messages"][-1]["content"] == agent.decode(fresh[0].token_ids)
        assert r["response_tokens"] == len(fresh[0].token_ids)
        assert r["finish_reason"] == fresh[0].finish_reason


def test_a_variant_prefills_its_stem_into_the_reply(warm_model_dir, tmp_path):
    """A stem is part of the prompt and of the scored reply: `\\boxed{` + the model's `7}`."""
    agent = LLMAgent.from_pretrained(warm_model_dir)
    kwargs = {"split": "test", "operators": "+", "digits": 1}
    stem = Variant("stem: \\boxed{", stem=BOXED_STEM)
    out = format_baseline(agent, "textgym/Arithmetic-v0", kwargs, 4, SamplingParams(max_new_tokens=8),
                          variants=[stem], max_tokens=8, episodes_path=tmp_path / "b.jsonl")  # fmt: skip
    assert out["variant"] == stem.name and set(out["variants"]) == {stem.name}
    rows = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    prompt = agent.encode_prompt(rows[0]["messages"][:-1])
    alone = agent.generate([prompt + agent.tokenizer(BOXED_STEM, add_special_tokens=False)["input_ids"]],
                           SamplingParams(temperature=0.0, max_new_tokens=8))[0]  # fmt: skip
    assert rows[0]["messages"][-1]["content"] == BOXED_STEM + agent.decode(alone.token_ids)


def test_a_prefilled_env_is_its_own_env_stem_variant(warm_model_dir):
    """The baseline of a `prefill=True` env drops the prefill: its env-stem variant is that eval."""
    import gymnasium as gym

    from textgym.agents import rollout

    agent = LLMAgent.from_pretrained(warm_model_dir)
    kwargs = {"split": "test", "operators": "+", "digits": 1, "prefill": True}
    params = SamplingParams(temperature=0.0, max_new_tokens=8)
    out = format_baseline(agent, "textgym/Arithmetic-v0", kwargs, 6, params, max_tokens=8)
    envs = [gym.make("textgym/Arithmetic-v0", **kwargs) for _ in range(6)]
    trajs = rollout(agent, envs, list(range(6)), params)
    (stem,) = [name for name in out["variants"] if name.startswith("env stem")]
    assert out["variants"][stem]["accuracy"] == sum(t.reward_terms["reward/correct"] for t in trajs) / 6
    assert not any(v.startswith("env stem 2") for v in out["variants"])  # not stem after stem
