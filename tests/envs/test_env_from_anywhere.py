"""Environments from anywhere: a user's own module (plain Gymnasium, string observations, no
textgym import) by id in every command and config; entry points; `env new` / `env check` /
`env show`; accuracy terms; env errors with their context; the train pre-flight."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

import gymnasium as gym
import pytest
from typer.testing import CliRunner

from textgym.cli import app
from textgym.envs import registry
from textgym.envs.registry import EnvError, TextGymAdapter, UnknownEnvError, ensure_registered, make
from textgym.evaluation import OracleAgent, check_env, evaluate_scripted

runner = CliRunner()

# A plain Gymnasium env as a user brings it: text spaces, string observations, `is_success`,
# a seed picks the task; it imports gymnasium and numpy only.
USER_MODULE = '''
import string

import gymnasium as gym
import numpy as np

WORDS = ["apple", "river", "stone", "cloud", "piano", "tiger", "lemon", "chair"]


class EchoEnv(gym.Env):
    """Repeat the word the env says."""

    metadata = {"render_modes": []}

    def __init__(self, partial: bool = False, explode_on_task: int = -1):
        self.observation_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.action_space = gym.spaces.Text(max_length=200, charset=string.printable)
        self.partial = partial
        self.explode_on_task = explode_on_task
        self.word = None
        self.index = None

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.index = seed
        self.word = WORDS[int(self.np_random.integers(len(WORDS)))]
        return f"Say '{self.word}'.", {}

    def step(self, action):
        if self.index == self.explode_on_task:
            raise KeyError("boom")
        said = str(action).strip().strip("'\\".").lower()
        ok = said == self.word
        reward = 1.0 if ok else (0.5 if self.partial and said[:1] == self.word[:1] else 0.0)
        info = {} if self.partial else {"is_success": ok}
        return "done", reward, True, False, info

    def oracle_action(self, messages):
        return self.word

    def random_action(self, rng):
        return str(rng.choice(WORDS[:4])) + "s"


gym.register(id="user/Echo-v0", entry_point=EchoEnv)
'''


@pytest.fixture(autouse=True)
def _no_imports_leak(monkeypatch: pytest.MonkeyPatch) -> None:
    """`textgym --import M` exports $TEXTGYM_IMPORTS for child processes; restore it after each test."""
    monkeypatch.setenv(registry.IMPORTS_ENV_VAR, "")


@pytest.fixture
def user_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding `userenvs.py`, made the current directory (as a user runs textgym from it)."""
    (tmp_path / "userenvs.py").write_text(USER_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    yield tmp_path
    sys.modules.pop("userenvs", None)
    gym.registry.pop("user/Echo-v0", None)


def invoke(*args: str):
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def test_module_colon_id_is_imported_from_the_current_folder(user_dir: Path) -> None:
    assert "user/Echo-v0" not in gym.registry
    assert ensure_registered("userenvs:user/Echo-v0") == "userenvs:user/Echo-v0"
    env = make("userenvs:user/Echo-v0")
    obs, info = env.reset(options={"task_index": 3})
    # a string observation is one user message; task 3 is reset(seed=3)
    assert obs == [{"role": "user", "content": env.unwrapped.word.join(["Say '", "'."])}]
    assert info["task_index"] == 3
    assert make("user/Echo-v0").reset(options={"task_index": 3})[0] == obs
    _, reward, terminated, _, info = env.step(env.unwrapped.word)
    assert (reward, terminated, info["reward/correct"]) == (1.0, True, 1.0)
    assert registry.task_count(env) == registry.UNBOUNDED_TASKS


def test_unknown_ids_list_every_id_and_suggest_the_closest(user_dir: Path) -> None:
    with pytest.raises(UnknownEnvError) as e:
        ensure_registered("textgym/Wordel-v0")
    assert "Did you mean 'textgym/Wordle-v0'" in str(e.value)
    assert "textgym/GSM8K-v0" in str(e.value) and "CartPole-v1" not in str(e.value)
    ensure_registered("userenvs:user/Echo-v0")
    with pytest.raises(UnknownEnvError, match="Did you mean 'user/Echo-v0'"):
        ensure_registered("user/Echo-v1")
    with pytest.raises(ImportError, match="cannot import 'nosuchmodule'"):
        ensure_registered("nosuchmodule:x/Y-v0")
    r = runner.invoke(app, ["eval", "--agent", "oracle", "--env", "textgym/Wordel-v0", "--n", "1"])
    assert r.exit_code == 2 and "Did you mean 'textgym/Wordle-v0'" in r.output


def test_a_plain_gymnasium_env_is_checked_and_evaluated_with_the_stock_cli(user_dir: Path) -> None:
    r = invoke("env", "check", "userenvs:user/Echo-v0")
    assert r.exit_code == 0, r.output
    for name in ("make", "gymnasium", "determinism", "oracle", "random", "bad actions", "accuracy"):
        assert f"ok    {name}:" in r.output, (name, r.output)
    r = invoke(
        "--import", "userenvs", "eval", "--agent", "oracle", "--env", "user/Echo-v0", "--n", "20", "--json"
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["accuracy"] == 1.0
    r = invoke(
        "eval", "--agent", "random", "--env", "userenvs:user/Echo-v0", "--n", "20", "--json", "--show", "2"
    )
    out = json.loads(r.output)
    assert out["accuracy"] == 0.0 and len(out["episodes"]) == 2
    assert out["episodes"][0]["messages"][0]["content"].startswith("Say '")
    r = invoke("envs")
    assert "user/Echo-v0" in r.output and "textgym/Wordle-v0" in r.output


def test_accuracy_needs_a_correct_term_partial_credit_is_not_solved(user_dir: Path) -> None:
    # Without `is_success` or a `correct` term, a 0.5 partial credit must not count as correct.
    class Wrong(OracleAgent):
        def act(self, env, messages, info):
            return env.unwrapped.word[0] + "zzz"

    res = evaluate_scripted(Wrong(), "userenvs:user/Echo-v0", {"partial": True}, n=10)
    assert res.mean_reward == 0.5 and res.accuracy == 0.0
    results = {r.name: r for r in check_env("userenvs:user/Echo-v0", {"partial": True})}
    # valid Gymnasium: the check warns, naming the fallback it uses, and does not fail
    assert results["accuracy"].status == "warn", results["accuracy"]
    assert "reward/correct" in results["accuracy"].detail and "return >= 1" in results["accuracy"].detail
    r = invoke("env", "check", "userenvs:user/Echo-v0", "--env-kwargs", "partial=true", "--no-hacks")
    assert r.exit_code == 0, r.output
    assert "warn  accuracy:" in r.output and "fail" not in r.output.replace("failed", ""), r.output


def test_an_accuracy_term_other_than_correct_is_read() -> None:
    from textgym.envs import SingleTurnEnv
    from textgym.types import Task
    from textgym.verifiers import Rubric, RubricTerm, Score

    class ExactEnv(SingleTurnEnv):
        accuracy_term = "exact"

    rubric = Rubric(
        [
            RubricTerm("exact", lambda c, t: Score(float(c == t.answer)), 0.5),
            RubricTerm("close", lambda c, t: Score(float(c.lower() == t.answer.lower())), 0.5),
        ]
    )
    env = TextGymAdapter(ExactEnv([Task(task_id="t", prompt="Say A.", answer="A")], rubric), "x")
    env.reset(options={"task_index": 0})
    assert env.step("a")[4]["reward/correct"] == 0.0
    env.reset(options={"task_index": 0})
    assert env.step("A")[4]["reward/correct"] == 1.0


def test_an_env_that_raises_names_the_env_the_task_and_the_action(user_dir: Path) -> None:
    env = make("userenvs:user/Echo-v0", explode_on_task=2)
    env.reset(options={"task_index": 2})
    with pytest.raises(
        EnvError, match=r"userenvs:user/Echo-v0: step raised KeyError\('boom'\) on task_index=2, "
    ):
        env.step("hello")
    results = {r.name: r for r in check_env("userenvs:user/Echo-v0", {"explode_on_task": 0})}
    assert results["oracle"].status == "fail" and "boom" in results["oracle"].detail
    assert results["bad actions"].status == "fail"


def test_an_env_that_never_ends_fails_the_episode_end_check() -> None:
    from textgym.envs import TextEnv
    from textgym.types import Task

    class Forever(TextEnv):
        def initial_messages(self, task):
            return [{"role": "user", "content": "Talk."}]

        def respond(self, action):
            return [{"role": "user", "content": "More."}], 0.0, False, {"reward/correct": 0.0}

    gym.register(
        id="test/Forever-v0", entry_point=lambda: Forever([Task(task_id="f", prompt="p", answer="a")])
    )
    try:
        results = {r.name: r for r in check_env("test/Forever-v0")}
        assert results["episode end"].status == "fail"
        assert "max_episode_steps" in results["episode end"].detail
    finally:
        gym.registry.pop("test/Forever-v0")


def test_installed_packages_register_envs_through_entry_points(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "pkg_envs.py").write_text(
        "import gymnasium as gym\n"
        "def register():\n"
        "    gym.register(id='pkg/Thing-v0', entry_point='textgym.envs.arithmetic:ArithmeticEnv')\n",
        encoding="utf-8",
    )
    dist = tmp_path / "pkg_envs-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: pkg-envs\nVersion: 0.1\n", encoding="utf-8")
    (dist / "entry_points.txt").write_text("[textgym.envs]\npkg = pkg_envs:register\n", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    try:
        assert "pkg/Thing-v0" in registry.env_ids()
        r = invoke("envs")
        assert "pkg/Thing-v0" in r.output and "pkg " in r.output
    finally:
        gym.registry.pop("pkg/Thing-v0", None)
        sys.modules.pop("pkg_envs", None)


def test_suite_files_import_modules_and_report_errors_by_field(user_dir: Path) -> None:
    from textgym.evaluation.suites import load_suite

    (user_dir / "suite.yaml").write_text(
        "imports: [userenvs]\nenvs:\n  - {id: user/Echo-v0, n: 5}\n  - {id: textgym/Wordle-v0, n: 0}\n",
        encoding="utf-8",
    )
    with pytest.raises(ValueError, match=r"envs\.1\.n"):
        load_suite(str(user_dir / "suite.yaml"))
    (user_dir / "suite.yaml").write_text("imports: [userenvs]\nenvs:\n  - {id: user/Echo-v0, n: 5}\n")
    assert load_suite(str(user_dir / "suite.yaml")).envs[0].id == "user/Echo-v0"


def test_run_configs_take_imports_and_module_ids(user_dir: Path) -> None:
    from textgym.config import ConfigError, load_config

    base = {"name": "r", "model": {"init_preset": "tiny"}}
    cfg = load_config(values={"imports": ["userenvs"], "sft.env.id": "user/Echo-v0"}, **base)
    assert cfg.sft.env.id == "user/Echo-v0"
    cfg = load_config(values={"sft.env.id": "userenvs:user/Echo-v0"}, **base)
    assert cfg.sft.env.id == "userenvs:user/Echo-v0"
    with pytest.raises(ConfigError, match="Did you mean 'textgym/Arithmetic-v0'"):
        load_config(values={"sft.env.id": "textgym/Arithmetik-v0"}, **base)
    with pytest.raises(ConfigError, match="imports"):
        load_config(values={"imports": ["no_such_module_here"]}, **base)


def test_env_show_prints_the_prompt_the_gold_and_an_oracle_transcript() -> None:
    r = invoke("env", "show", "textgym/Arithmetic-v0", "--task", "3", "--env-kwargs", "split=test")
    assert r.exit_code == 0, r.output
    from textgym.envs.arithmetic import ArithmeticEnv

    task = ArithmeticEnv(split="test").tasks[3]
    assert task.prompt in r.output and f"gold answer: {task.answer}" in r.output
    assert "reward 1.000" in r.output and "accuracy term: reward/correct" in r.output


@pytest.mark.parametrize("multi_turn", [False, True])
def test_env_new_writes_a_project_that_passes_env_check_and_its_tests(
    tmp_path, monkeypatch, multi_turn
) -> None:
    name = "guess_game" if multi_turn else "reverse_words"
    r = invoke("env", "new", name, "--out", tmp_path, *(["--multi-turn"] if multi_turn else []))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{name}.py", f"test_{name}.py", f"train_{name}.yaml"]
    )
    monkeypatch.chdir(tmp_path)
    try:
        env_id = f"{name}:{name}/{'GuessGame' if multi_turn else 'ReverseWords'}-v0"
        r = invoke(
            "env", "check", env_id, "--sft" if not multi_turn else "--n", *([] if not multi_turn else ["8"])
        )
        assert r.exit_code == 0, r.output
        assert "fail" not in r.output
        # the generated tests pass
        import subprocess

        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"test_{name}.py"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert p.returncode == 0, p.stdout + p.stderr
        # refusing to overwrite
        r = runner.invoke(app, ["env", "new", name, "--out", str(tmp_path)])
        assert r.exit_code == 2 and "refusing to overwrite" in r.output
    finally:
        sys.modules.pop(name, None)
        for k in [k for k in gym.registry if k.startswith(f"{name}/")]:
            gym.registry.pop(k)


def test_env_new_project_trains_from_its_config_with_the_stock_cli(tmp_path, monkeypatch) -> None:
    r = invoke("env", "new", "reverse_text", "--out", tmp_path)
    assert r.exit_code == 0
    monkeypatch.chdir(tmp_path)
    try:
        r = invoke("train", "train_reverse_text.yaml", "grpo.steps=2", "eval.n=4", "grpo.checkpoint_every=1")
        assert r.exit_code == 0, r.output
        summary = json.loads((tmp_path / "runs" / "reverse_text" / "summary.json").read_text())
        assert summary["eval_env"] == "reverse_text/ReverseText-v0"
        metrics = [
            json.loads(x)
            for x in (tmp_path / "runs/reverse_text/grpo/metrics.jsonl").read_text().splitlines()
        ]
        assert [m["step"] for m in metrics if "rollout/accuracy" in m] == [1, 2]
    finally:
        sys.modules.pop("reverse_text", None)
        gym.registry.pop("reverse_text/ReverseText-v0", None)


def test_a_user_env_trains_from_yaml_and_an_env_failing_mid_run_resumes(user_dir: Path, monkeypatch) -> None:
    """String observations, no textgym import, `imports:` in the config; the env raises at GRPO
    step 2, the CLI names the env, task and action, and `--resume` finishes the run."""
    config = textwrap.dedent(
        """
        name: echo
        imports: [userenvs]
        seed: 0
        threads: 2
        model: {init_preset: tiny}
        grpo:
          env: {id: user/Echo-v0, kwargs: {explode_on_task: 9}}
          steps: 3
          prompts_per_step: 4
          group_size: 2
          sampling: {temperature: 1.0, max_new_tokens: 6}
          checkpoint_every: 1
        eval:
          env: {id: user/Echo-v0}
          n: 4
          sampling: {temperature: 0.0, max_new_tokens: 6}
        """
    )
    (user_dir / "echo.yaml").write_text(config, encoding="utf-8")
    # pre-flight: an env broken on task 0 stops the run before any model is built
    r = runner.invoke(app, ["train", "echo.yaml", "grpo.env.kwargs.explode_on_task=0"])
    assert r.exit_code == 2 and "pre-flight" in r.output and "boom" in r.output
    assert not (user_dir / "runs" / "echo" / "grpo").exists()
    # mid-run: the task stream of a seed-indexed env is 0, 1, 2, ...: task 9 comes at step 3
    r = runner.invoke(app, ["train", "echo.yaml", "grpo.log_every=1"])
    assert r.exit_code == 1, r.output
    assert "user/Echo-v0: step raised KeyError('boom') on task_index=9" in r.output
    # the hint repeats the overrides, so the command it gives continues this run
    assert "`textgym train echo.yaml grpo.log_every=1 --resume`" in " ".join(r.output.split())
    stage = user_dir / "runs" / "echo" / "grpo"
    steps = [json.loads(x)["step"] for x in (stage / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]
    # fixed (the env no longer explodes on task 9): the run resumes from its step-2 checkpoint
    r = runner.invoke(app, ["train", "echo.yaml", "--resume", "grpo.env.kwargs.explode_on_task=-1"])
    assert r.exit_code == 0, r.output
    steps = [json.loads(x)["step"] for x in (stage / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2, 3]
    summary = json.loads((user_dir / "runs" / "echo" / "summary.json").read_text())
    assert summary["eval_env"] == "user/Echo-v0" and 0.0 <= summary["accuracy_after"] <= 1.0
