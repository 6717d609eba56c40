"""`textgym/HumanEval-v0`, `textgym/MBPP-v0` and their multi-turn `...Feedback-v0` variants.

The agent writes Python; the `CodeVerifier` runs the task's unit tests on it in the
sandbox (`sandbox="process"` by default, or `"docker"`); MBPP's prompt shows one of them
and hides the rest (`mbpp_task`). Data ship inside the package (`textgym/data/humaneval`,
`textgym/data/mbpp`, with licences and provenance); `task_index` *i* is row *i* of the file.
"""

from __future__ import annotations

import gzip
import json
from functools import lru_cache
from importlib import resources
from typing import Any

from textgym.envs.base import TextEnv
from textgym.sandbox import SandboxBackend
from textgym.types import Message, Task
from textgym.verifiers.code import CodeVerifier, split_check_function

HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the complete function "
    "(signature included) in a ```python code block."
)
MBPP_INSTRUCTION = (
    "Write a Python function for the task below. Reply with the code in a ```python code block."
)
FEEDBACK_TEMPLATE = (
    "Your code failed the tests.\n\nFailing test:\n```python\n{test}\n```\n\nError:\n```\n{error}\n```\n\n"
    "Fix the code and reply with the complete corrected solution in a ```python code block."
)
MAX_FEEDBACK_CHARS = 2000


@lru_cache(maxsize=2)
def humaneval_tasks(mode: str = "binary") -> tuple[Task, ...]:
    """HumanEval's 164 problems (Chen et al. 2021, arXiv:2107.03374) as code tasks.

    Each task's metadata holds `prompt_code` (the signature and docstring the solution
    continues), `entry_point`, and the tests: in "binary" mode one unit `check(entry_point)`
    after the dataset's test code; in "fraction" mode one unit per statement of `check`.
    `solution` is the canonical solution as a full function in a ```python block.
    """
    path = resources.files("textgym").joinpath("data", "humaneval", "HumanEval.jsonl.gz")
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    tasks = []
    for row in rows:
        entry = row["entry_point"]
        if mode == "binary":
            tests, setup = [f"check({entry})"], row["test"]
        else:
            tests, setup = split_check_function(row["test"], entry), ""
        tasks.append(
            Task(
                task_id=row["task_id"],
                prompt=f"```python\n{row['prompt'].rstrip()}\n```",
                solution=f"```python\n{row['prompt']}{row['canonical_solution']}```",
                metadata={
                    "prompt_code": row["prompt"],
                    "entry_point": entry,
                    "tests": tests,
                    "setup": setup,
                    "canonical_solution": row["canonical_solution"],
                },
            )
        )
    return tuple(tasks)


MBPP_SPLITS = {
    "all": (1, 974),
    "prompt": (1, 10),
    "test": (11, 510),
    "validation": (511, 600),
    "train": (601, 974),
}
"""MBPP's task-id ranges per split (google-research/mbpp README), inclusive."""


MBPP_HIDDEN_FILE = "hidden_tests.jsonl"
"""Generated hidden tests in `textgym/data/mbpp` (`tools/mbpp_hidden_tests.py`; PROVENANCE.md there)."""
MBPP_SHOWN_HEADER = "Your code should pass this test (it is also graded on hidden tests):"
"""The line before the one assert an MBPP prompt shows."""


@lru_cache(maxsize=2)
def mbpp_rows(subset: str) -> tuple[dict[str, Any], ...]:
    """The rows of MBPP's shipped file for `subset` ("sanitized": 427, "full": 974), in file order.

    Raises:
        ValueError: on an unknown subset.
    """
    base = resources.files("textgym").joinpath("data", "mbpp")
    if subset == "sanitized":
        rows = json.loads(base.joinpath("sanitized-mbpp.json").read_text(encoding="utf-8"))
    elif subset == "full":
        text = base.joinpath("mbpp.jsonl").read_text(encoding="utf-8")
        rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    else:
        raise ValueError(f"MBPP subset must be 'sanitized' or 'full', got {subset!r}")
    return tuple(rows)


@lru_cache(maxsize=1)
def mbpp_hidden_tests() -> dict[tuple[str, int], tuple[str, ...]]:
    """MBPP's generated hidden tests (`data/mbpp/hidden_tests.jsonl`): (subset, task_id) -> asserts.

    Made once by `tools/mbpp_hidden_tests.py` (type-aware mutations of the task's inputs, graded
    by its reference solution in the sandbox); never generated at run time. A task without a
    row has none.
    """
    path = resources.files("textgym").joinpath("data", "mbpp", MBPP_HIDDEN_FILE)
    if not path.is_file():
        return {}
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip():
            row = json.loads(line)
            out[(str(row["subset"]), int(row["task_id"]))] = tuple(row["tests"])
    return out


def mbpp_challenge_tests(row: dict[str, Any], subset: str, full_row: dict[str, Any]) -> list[str]:
    """The full set's `challenge_test_list` asserts that grade `row` (MBPP's task `row["task_id"]`).

    A full row: its own. A sanitized row: the full row's, where sanitizing kept the row's code
    and `test_list` as they were (up to line endings); an edited task may ask for other outputs
    (mbpp/16's challenge assert wants 'Not matched!', its sanitized reference returns False).
    """
    challenge = list(full_row.get("challenge_test_list") or [])
    if subset == "full":
        return challenge
    same_code = row["code"].replace("\r\n", "\n").strip() == full_row["code"].replace("\r\n", "\n").strip()
    return challenge if same_code and list(row["test_list"]) == list(full_row["test_list"]) else []


def mbpp_task(
    row: dict[str, Any], subset: str, full_row: dict[str, Any], generated: list[str] | tuple[str, ...]
) -> Task:
    """One MBPP row as a code task: one assert shown, the graded list hidden behind it.

    The prompt is the task text and the row's first `test_list` assert. The graded units, in
    this order: that assert, the row's other `test_list` asserts, the full set's challenge
    asserts (`mbpp_challenge_tests`; `full_row` is the full set's row of the same task id),
    then `generated` (`mbpp_hidden_tests`). `metadata["shown_tests"]` holds what the prompt
    shows. Imports: `test_imports` (sanitized, placed before the solution) or `test_setup_code`
    (full, placed after the solution, whose classes it uses).
    """
    text = row["prompt"] if subset == "sanitized" else row["text"]
    code = row["code"].replace("\r\n", "\n")
    shown = list(row["test_list"][:1])
    tests = list(row["test_list"]) + mbpp_challenge_tests(row, subset, full_row) + list(generated)
    # sanitized: imports go before the solution; full: the setup code uses the solution's
    # classes (e.g. `Node`), so it runs after it, as in the original evaluation.
    prefix = "\n".join(row.get("test_imports", [])) if subset == "sanitized" else ""
    setup = "" if subset == "sanitized" else row["test_setup_code"].replace("\r\n", "\n")
    return Task(
        task_id=f"mbpp/{row['task_id']}",
        prompt=text.strip() + "\n" + MBPP_SHOWN_HEADER + "\n" + "\n".join(shown),
        solution=f"```python\n{code.rstrip()}\n```",
        metadata={
            "tests": tests,
            "shown_tests": shown,
            "prefix": prefix,
            "setup": setup,
            "reference_code": code,
        },
    )


@lru_cache(maxsize=8)
def mbpp_tasks(subset: str = "sanitized", split: str = "all") -> tuple[Task, ...]:
    """MBPP (Austin et al. 2021, arXiv:2108.07732): "sanitized" (427 rows) or "full" (974).

    `split` selects the upstream task-id range (`MBPP_SPLITS`: train 601-974, test 11-510,
    validation 511-600, prompt 1-10; sanitized: 120 / 257 / 43 / 7 rows); "all" keeps every
    row, so task *i* is row *i* of the file. Within a split, task *i* is the split's *i*-th
    row in file order.

    The prompt shows one assert (the row's first); the task is graded on it and on hidden ones:
    the row's other asserts, the full set's `challenge_test_list`, and the generated tests of
    `textgym/data/mbpp/hidden_tests.jsonl` (`mbpp_task`, `mbpp_hidden_tests`), so that a
    reply that only reproduces what the prompt shows fails.

    Raises:
        ValueError: on an unknown subset or split.
    """
    if split not in MBPP_SPLITS:
        raise ValueError(f"MBPP split must be one of {sorted(MBPP_SPLITS)}, got {split!r}")
    low, high = MBPP_SPLITS[split]
    rows = mbpp_rows(subset)
    full = {int(r["task_id"]): r for r in mbpp_rows("full")}
    hidden = mbpp_hidden_tests()
    return tuple(
        mbpp_task(row, subset, full[int(row["task_id"])], hidden.get((subset, int(row["task_id"])), ()))
        for row in rows
        if low <= int(row["task_id"]) <= high
    )


class CodeEnv(TextEnv):
    """Write Python that passes hidden unit tests, run in the sandbox.

    ## Description
    One programming problem per episode. The agent's reply is scored by `CodeVerifier`:
    its last ```python block (or the whole reply) runs with the task's tests in the sandbox.

    ## Action Space
    `UnicodeText`: the agent's reply, any string.

    ## Observation Space
    `ChatMessages`: one user message after `reset`. Single-turn: `[]` after `step`.
    With `feedback=True`, a failed attempt is answered by a user message holding the
    failing test and the error (stderr tail), and the agent may try again.

    ## Rewards
    `correct`: 1.0 when all tests pass (`mode="binary"`), or the fraction of asserts that
    pass (`mode="fraction"`). With feedback, each step's reward is the change of the score
    from the previous attempt, so the episode's return equals the final attempt's score
    whichever turn is final; the `reward/correct` term is that change too (so terms summed
    over the episode also give the final score), and `info["attempt_score"]` is the attempt's
    own score.

    ## Episode End
    Single-turn: terminates after one step. Feedback: terminates when an attempt scores
    1.0; otherwise the turn limit is `TimeLimit` (`max_episode_steps`, 3 for the
    registered `...Feedback-v0` ids), which truncates.

    ## Arguments
    `sandbox` ("process" | "docker" | a backend), `mode`, `timeout_s`, `memory_mb`
    (per run), `feedback`, `instruction`; plus `TextEnv`'s.

    ## Version History
    - v0: initial version.
    """

    def __init__(
        self,
        tasks: tuple[Task, ...],
        *,
        instruction: str,
        sandbox: str | SandboxBackend = "process",
        mode: str = "binary",
        feedback: bool = False,
        timeout_s: float = 10.0,
        memory_mb: int = 1024,
        **kwargs: Any,
    ):
        super().__init__(tasks, **kwargs)
        self.verifier = CodeVerifier(sandbox, mode=mode, timeout_s=timeout_s, memory_mb=memory_mb)
        self.instruction = instruction
        self.feedback = bool(feedback)
        self._last_score = 0.0

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[list[Message], dict[str, Any]]:
        """Pose a task (see `TextEnv.reset`)."""
        self._last_score = 0.0
        return super().reset(seed=seed, options=options)

    def initial_messages(self, task: Task) -> list[Message]:
        """The instruction, then the task."""
        return [{"role": "user", "content": f"{self.instruction}\n\n{task.prompt}"}]

    def _outcome(
        self, score: float, info: dict[str, Any]
    ) -> tuple[list[Message], float, bool, dict[str, Any]]:
        reward = score - self._last_score if self.feedback else score
        self._last_score = score
        info["attempt_score"] = score
        info["reward/correct"] = reward  # terms sum over turns to the final attempt's score, like the reward
        if not self.feedback or score >= 1.0:
            return [], reward, True, info
        details = info.get("details", {})
        message = FEEDBACK_TEMPLATE.format(
            test=str(details.get("failed_test", ""))[:MAX_FEEDBACK_CHARS],
            error=str(details.get("error") or info.get("error", ""))[-MAX_FEEDBACK_CHARS:],
        )
        return [{"role": "user", "content": message}], reward, False, info

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Run the tests on the action's code; end or give feedback (see the class docstring)."""
        assert self.task is not None
        score = self.verifier(action, self.task)
        info: dict[str, Any] = {"details": score.details, "judge_refused": bool(score.details.get("refused"))}
        if score.reward < 1.0 and score.details.get("error"):
            info["error"] = str(score.details["error"]).strip().splitlines()[-1][:300]
        return self._outcome(score.reward, info)

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Score an unusable action 0.0; with feedback, say what was wrong and continue."""
        info: dict[str, Any] = {"error": reason, "details": {"error": reason}}
        return self._outcome(self.invalid_action_reward, info)


class HumanEvalEnv(CodeEnv):
    r"""HumanEval (164 problems): complete a Python function from its signature and docstring.

    See `CodeEnv` for spaces, rewards and arguments. The agent may reply with the whole
    function (recommended) or with the body alone (HumanEval's original completion format).

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/HumanEval-v0")   # sandbox="process": bubblewrap
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> info["task_id"]
        'HumanEval/0'
        >>> env.step(env.unwrapped.task.solution)[1]   # the canonical solution passes
        1.0
        >>> _ = env.reset(options={"task_index": 0})
        >>> obs, reward, terminated, truncated, info = env.step(
        ...     "def has_close_elements(numbers, threshold):\n    return False")
        >>> reward, info["error"], info["details"]["failed_test"]
        (0.0, 'AssertionError', 'check(has_close_elements)')
    """

    def __init__(self, instruction: str = HUMANEVAL_INSTRUCTION, mode: str = "binary", **kwargs: Any):
        if mode not in ("binary", "fraction"):
            raise ValueError(f"mode must be 'binary' or 'fraction', got {mode!r}")
        super().__init__(humaneval_tasks(mode), instruction=instruction, mode=mode, **kwargs)


class MBPPEnv(CodeEnv):
    r"""MBPP: write a Python function from a one-line description and one test assert.

    `subset="sanitized"` (427 rows, default) or `"full"` (974); `split="all"` (default),
    "train", "test", "validation" or "prompt" (see `mbpp_tasks`). See `CodeEnv`.

    The prompt shows the task's first assert; the reward also counts hidden ones (the task's
    other asserts, the full set's challenge asserts, and up to 6 generated from the reference
    solution, `textgym/data/mbpp/hidden_tests.jsonl`), so a reply that only reproduces the
    shown assert fails (`mbpp_task`; docs/envs.md, "MBPP: shown and hidden tests").

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/MBPP-v0", mode="fraction")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> info["task_id"]
        'mbpp/2'
        >>> env.step("def similar_elements(a, b):\n    return tuple(set(a) & set(b))")[1]
        1.0
        >>> _ = env.reset(options={"task_index": 0})
        >>> "(it is also graded on hidden tests)" in obs[0]["content"]
        True
        >>> env.step("def similar_elements(a, b):\n    return (4, 5)")[1]  # the shown assert of 9 passes
        0.1111111111111111
    """

    def __init__(
        self,
        subset: str = "sanitized",
        split: str = "all",
        instruction: str = MBPP_INSTRUCTION,
        **kwargs: Any,
    ):
        super().__init__(mbpp_tasks(subset, split), instruction=instruction, **kwargs)
