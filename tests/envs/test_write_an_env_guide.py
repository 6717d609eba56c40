"""The "Write your own environment" guide (docs/write-an-env.md): its snippets run as printed."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import pytest
from typer.testing import CliRunner

from textgym.cli import app
from textgym.envs import registry

ROOT = Path(__file__).resolve().parents[2]
SNIPPETS = ROOT / "docs" / "snippets"
GUIDE = ROOT / "docs" / "write-an-env.md"
runner = CliRunner()


@pytest.fixture
def guide_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for name in ("my_env.py", "try_my_env.py", "plain_env.py", "train_my_env.yaml"):
        shutil.copy(SNIPPETS / name, tmp_path / name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(registry.IMPORTS_ENV_VAR, "")
    yield tmp_path
    for module in ("my_env", "plain_env"):
        sys.modules.pop(module, None)
    for env_id in ("my/Reverse-v0", "my/Guess-v0", "plain/Echo-v0"):
        gym.registry.pop(env_id, None)


def test_try_my_env_prints_what_its_comments_say(guide_dir: Path) -> None:
    p = subprocess.run([sys.executable, "try_my_env.py"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.splitlines()
    assert lines[0] == "[{'role': 'user', 'content': \"Spell 'apple' backwards.\"}]"
    assert lines[1] == "1.0 True 1.0 {'correct': {'said': 'elppa'}}"
    assert lines[2:5] == [
        "50 [{'role': 'user', 'content': 'lower'}] 0.0 False",
        "25 [{'role': 'user', 'content': 'higher'}] 0.0 False",
        "42 [] 1.0 True",
    ]
    assert lines[-1] == "check_env passed"


def test_the_guides_env_check_output_is_what_the_command_prints(guide_dir: Path) -> None:
    r = runner.invoke(app, ["env", "check", "my_env:my/Guess-v0"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    block = GUIDE.read_text(encoding="utf-8").split("$ textgym env check my_env:my/Guess-v0\n", 1)[1]
    block = block.split("```", 1)[0]

    def without_times(text: str) -> list[str]:
        return [re.sub(r"\d+\.\d+s|\d+\.\d ms", "T", line) for line in text.strip().splitlines()]

    assert without_times(r.output) == without_times(block)
    for args in (["my_env:my/Reverse-v0", "--sft"], ["plain_env:plain/Echo-v0"]):
        r = runner.invoke(app, ["env", "check", *args], catch_exceptions=False)
        assert r.exit_code == 0, r.output


def test_the_plain_gymnasium_env_is_evaluated_by_id(guide_dir: Path) -> None:
    r = runner.invoke(
        app,
        [
            "--import",
            "plain_env",
            "eval",
            "--agent",
            "oracle",
            "--env",
            "plain/Echo-v0",
            "--n",
            "10",
            "--json",
        ],
        catch_exceptions=False,
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["accuracy"] == 1.0


def test_the_guides_run_config_trains_with_the_stock_cli(guide_dir: Path) -> None:
    r = runner.invoke(app, ["train", "train_my_env.yaml", "grpo.steps=1", "eval.n=2"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    summary = json.loads((guide_dir / "runs" / "guess" / "summary.json").read_text())
    assert summary["eval_env"] == "my/Guess-v0" and summary["n_eval"] == 2
