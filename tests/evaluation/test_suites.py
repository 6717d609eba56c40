"""Evaluation suites, reports, and the comparison of two reports."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from textgym.cli import app
from textgym.evaluation.suites import (
    BUILTIN_SUITES,
    bootstrap_interval,
    compare_reports,
    load_suite,
    mcnemar_p,
    wilson_interval,
)

runner = CliRunner()


def test_wilson_interval_hand_values():
    # 8 of 10, z = 1.96: centre (0.8 + 0.19208) / 1.38416, half-width 1.96*sqrt(0.016 + 0.0096040)/1.38416
    lo, hi = wilson_interval(8, 10)
    z = 1.959963984540054
    centre = (0.8 + z * z / 20) / (1 + z * z / 10)
    half = z * math.sqrt(0.8 * 0.2 / 10 + z * z / 400) / (1 + z * z / 10)
    assert lo == pytest.approx(centre - half, abs=1e-12) and hi == pytest.approx(centre + half, abs=1e-12)
    assert lo == pytest.approx(0.4902, abs=1e-4) and hi == pytest.approx(0.9433, abs=1e-4)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 50)[0] == 0.0 and wilson_interval(50, 50)[1] == 1.0


def test_mcnemar_exact_values():
    assert mcnemar_p(0, 0) == 1.0
    assert mcnemar_p(0, 6) == pytest.approx(2 / 64)  # 2 * (1/2)^6
    assert mcnemar_p(1, 9) == pytest.approx(2 * (1 + 10) / 1024)
    assert mcnemar_p(5, 5) == 1.0


def test_bootstrap_interval_brackets_the_mean():
    values = [1.0] * 30 + [0.0] * 70
    lo, hi = bootstrap_interval(values)
    assert lo < 0.3 < hi and lo > 0.18 and hi < 0.42
    assert bootstrap_interval([1.0, 1.0]) == (1.0, 1.0)


def test_load_suite_builtin_and_yaml(tmp_path):
    core = load_suite("core")
    assert [e.id for e in core.envs] == [e["id"] for e in BUILTIN_SUITES["core"]]
    path = tmp_path / "mine.yaml"
    path.write_text("envs:\n  - {id: textgym/Wordle-v0, n: 5}\n")
    assert load_suite(str(path)).name == "mine"
    path.write_text("envs:\n  - {id: textgym/Nope-v0, n: 5}\n")
    with pytest.raises(ValueError, match="unknown environment"):
        load_suite(str(path))
    path.write_text("envs:\n  - {id: textgym/Wordle-v0, n: 0}\n")
    with pytest.raises(ValueError, match="greater than or equal to 1"):
        load_suite(str(path))
    with pytest.raises(ValueError, match="unknown suite"):
        load_suite("nonexistent")


def test_suite_report_files_and_comparison(tmp_path):
    suite = tmp_path / "small.yaml"
    suite.write_text(
        "name: small\nenvs:\n  - {id: textgym/Wordle-v0, n: 40}\n"
        "  - {id: textgym/Arithmetic-v0, kwargs: {split: test}, n: 30}\n"
    )
    for agent in ("oracle", "random"):
        r = runner.invoke(
            app,
            ["eval", "--suite", str(suite), "--agent", agent, "--out", str(tmp_path / agent)],
            catch_exceptions=False,
        )
        assert r.exit_code == 0, r.output
    oracle = json.loads((tmp_path / "oracle" / "report.json").read_text())
    assert [row["accuracy"] for row in oracle["envs"]] == [1.0, 1.0]
    assert oracle["envs"][0]["accuracy_ci95"][1] == 1.0 and oracle["envs"][0]["accuracy_ci95"][0] > 0.9
    md = (tmp_path / "oracle" / "report.md").read_text()
    assert "| textgym/Wordle-v0 | 40 | 1 | 1.000 [" in md
    png = (tmp_path / "oracle" / "report.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 5000
    random = json.loads((tmp_path / "random" / "report.json").read_text())
    rows = compare_reports(random, oracle)
    assert [r["env_id"] for r in rows] == ["textgym/Wordle-v0", "textgym/Arithmetic-v0"]
    wordle = rows[0]
    assert wordle["b_only_correct"] == 40 - sum(t[0] for t in random["envs"][0]["per_task"])
    assert wordle["significant"] and wordle["p_value"] < 1e-6 and wordle["diff"] > 0.9
    r = runner.invoke(
        app,
        [
            "report",
            "compare",
            str(tmp_path / "random" / "report.json"),
            str(tmp_path / "oracle" / "report.json"),
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0 and "yes" in r.output
    (tmp_path / "junk.json").write_text("[1, 2]")
    r = runner.invoke(app, ["report", "compare", str(tmp_path / "junk.json"), str(tmp_path / "junk.json")])
    assert r.exit_code == 2 and "not a textgym report" in r.output


def test_eval_needs_exactly_one_of_env_and_suite():
    r = runner.invoke(app, ["eval", "--agent", "oracle"], catch_exceptions=False)
    assert r.exit_code == 2 and "exactly one of --env or --suite" in r.output


def test_shipped_suite_files_load():
    from pathlib import Path

    root = Path(__file__).resolve().parents[2] / "configs" / "suites"
    files = sorted(root.glob("*.yaml"))
    assert files
    for path in files:
        suite = load_suite(str(path))
        assert suite.envs and all(e.n >= 1 for e in suite.envs)


def test_an_env_of_a_suite_sets_its_own_token_budget(tmp_path, tiny_model_dir):
    """`max_new_tokens` of a suite env replaces `--max-new-tokens` for that env only, and is reported."""
    suite = tmp_path / "budgets.yaml"
    suite.write_text(
        "envs:\n"
        "  - {id: textgym/Arithmetic-v0, kwargs: {split: test}, n: 4, max_new_tokens: 3}\n"
        "  - {id: textgym/Arithmetic-v0, kwargs: {split: test, digits: 1}, n: 4}\n"
    )
    args = ["eval", "--suite", str(suite), "--model", str(tiny_model_dir), "--max-new-tokens", "12"]
    r = runner.invoke(app, [*args, "--out", str(tmp_path / "out")], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in (tmp_path / "out" / "episodes.jsonl").read_text().splitlines()]
    own = [row for row in rows if row["env_kwargs"] == {"split": "test"}]
    job = [row for row in rows if row["env_kwargs"] == {"split": "test", "digits": 1}]
    assert len(own) == len(job) == 4
    assert {row["sampling"]["max_new_tokens"] for row in own} == {3}
    assert {row["sampling"]["max_new_tokens"] for row in job} == {12}
    assert max(row["response_tokens"] for row in own) <= 3 < max(row["response_tokens"] for row in job)
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert [row.get("max_new_tokens") for row in report["envs"]] == [3, None]
