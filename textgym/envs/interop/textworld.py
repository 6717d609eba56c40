"""`textgym/TextWorld-v0`: text adventures generated locally with Microsoft's TextWorld.

Task *i* of a split is the game that TextWorld's generator (`textworld.generator.make_game`, the
Python side of `tw-make custom`) builds from one seed and the world options (`nb_rooms`,
`nb_objects`, `quest_length`). Games are compiled once into a cache folder (the same seed and
options give the same game file, byte for byte) and played with `textworld.start`. Needs the
`textworld` package (`pip install 'textgym[interop]'`); nothing is downloaded at run time.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import threading
import warnings
from pathlib import Path
from typing import Any, SupportsFloat

import numpy as np

from textgym.envs.base import LazyTasks, TextEnv
from textgym.envs.interop import require
from textgym.types import Message, Task
from textgym.verifiers.answer_text import normalize_unicode, unwrap
from textgym.verifiers.extraction import boxed_spans

SPLIT_SEEDS = {"train": 0, "test": 1_000_000}
"""The first game seed of each split: task *i* of `split` is seed `SPLIT_SEEDS[split] + i`."""
DEFAULT_NUM_TASKS = 10_000
"""Tasks per split (seeds); the ranges of the two splits never meet."""
INSTRUCTION = (
    "You are playing a text adventure. Reply with one command per turn, such as 'go north', "
    "'take key', 'open chest' or 'put apple on table' (or the command in \\boxed{...}). "
    "'look' and 'inventory' describe where you are and what you carry."
)
_WORDS = ("look", "inventory", "go", "north", "south", "east", "west", "take", "drop", "open", "close",
          "eat", "examine", "the", "key", "door", "xyzzy", "wait", "put", "on")  # fmt: skip
_LETTERS_RE = re.compile(r"[A-Za-z]{3,}")
_MAX_COMMAND_CHARS = 120
_GEN_LOCK = threading.Lock()


def default_cache_dir() -> Path:
    """Where generated games are kept: `$TEXTGYM_TEXTWORLD_CACHE`, else `$XDG_CACHE_HOME/textgym/textworld`.

    Examples:
        >>> import os
        >>> home = Path(os.path.expanduser("~")) / ".cache" / "textgym" / "textworld"
        >>> default_cache_dir() == Path(os.environ.get("TEXTGYM_TEXTWORLD_CACHE", home))  # no XDG_CACHE_HOME
        True
    """
    env = os.environ.get("TEXTGYM_TEXTWORLD_CACHE")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "textgym" / "textworld"


def game_path(seed: int, nb_rooms: int, nb_objects: int, quest_length: int, cache_dir: Path) -> Path:
    """Generate (once) and return the compiled game (`.z8`, its `.json` beside it) for `seed` and the options.

    The folder name holds the options and TextWorld's version; a game is written to a temporary
    folder and moved into place, so concurrent processes never read half a game.

    Args:
        seed: the generator's seed (map, objects and quest all follow from it).
        nb_rooms: rooms in the world.
        nb_objects: objects besides the rooms (doors, containers, items).
        quest_length: actions in the shortest winning walkthrough.
        cache_dir: the cache root (see `default_cache_dir`).

    Raises:
        ImportError: without the `textworld` package.
        ValueError: when TextWorld cannot build a game with these options (e.g. too few objects
            for the quest length).
    """
    require("textworld", "textworld")
    import textworld
    from textworld.generator import compile_game, make_game

    folder = Path(cache_dir) / f"tw{textworld.__version__}-r{nb_rooms}-o{nb_objects}-q{quest_length}"
    final = folder / f"game_{seed}.z8"
    if final.is_file() and final.with_suffix(".json").is_file():
        return final
    folder.mkdir(parents=True, exist_ok=True)
    options = textworld.GameOptions()
    options.seeds = int(seed)
    options.nb_rooms = int(nb_rooms)
    options.nb_objects = int(nb_objects)
    options.quest_length = int(quest_length)
    options.force_recompile = True
    tmp = Path(tempfile.mkdtemp(prefix=f".game_{seed}-", dir=folder))
    try:
        options.path = str(tmp / "game.z8")
        with _GEN_LOCK:  # the generator keeps module-level state
            try:
                game = make_game(options)
            except Exception as e:  # TextWorld raises several types for impossible options
                raise ValueError(
                    f"TextWorld could not generate a game with seed={seed}, nb_rooms={nb_rooms}, "
                    f"nb_objects={nb_objects}, quest_length={quest_length}: {type(e).__name__}: {e}"
                ) from e
            compiled = Path(compile_game(game, options))
        os.replace(compiled.with_suffix(".json"), final.with_suffix(".json"))
        os.replace(compiled, final)  # last: a .z8 in place means the game is complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def clean_feedback(text: str) -> str:
    """TextWorld's text without the ASCII-art banner, the `>` prompt lines (and status bar) and blank runs.

    Examples:
        >>> print(clean_feedback("  $$$$ \\\\__/\\n\\nWelcome!\\n\\n\\n\\n-= Hall =-\\n>   -= Hall =-0/1"))
        Welcome!
        <BLANKLINE>
        -= Hall =-
    """
    lines = text.replace("\r", "").split("\n")
    start = 0
    while start < len(lines) and not _LETTERS_RE.search(lines[start]) and not lines[start].strip().isalpha():
        start += 1
    kept = [ln.rstrip() for ln in lines[start:] if not ln.lstrip().startswith(">")]  # prompts, status bar
    return re.sub(r"\n{3,}", "\n\n", "\n".join(kept)).strip()


def parse_command(action: str) -> str:
    r"""The game command in a reply: its last `\boxed{...}`, else its last non-empty line.

    The command is lowercased, stripped of quotes and a final period, kept to printable ASCII and
    at most 120 characters; "" when nothing is left. The reply is read after `normalize_unicode`
    (fullwidth letters are letters) and the box's typesetting is dropped (`\boxed{\text{go north}}`).

    Examples:
        >>> parse_command("I should leave.\nGo South.")
        'go south'
        >>> parse_command(r"\boxed{take the key}")
        'take the key'
        >>> parse_command("\x00\ufffd")
        ''
    """
    action = normalize_unicode(action)
    found = boxed_spans(action)
    if found:
        text = unwrap(found[-1][0])
    else:
        lines = [ln for ln in action.splitlines() if ln.strip()]
        text = lines[-1] if lines else ""
    text = "".join(c for c in text if 32 <= ord(c) < 127)
    text = text.strip().strip("`'\"").strip().rstrip(".!").strip().lower()
    return " ".join(text.split())[:_MAX_COMMAND_CHARS]


class TextWorldTasks(LazyTasks):
    """The tasks of one split: task *i* is the game of seed `first_seed + i` (nothing is generated here).

    Args:
        split: "train" or "test" (disjoint seed ranges, `SPLIT_SEEDS`).
        num_tasks: how many seeds the split has.

    Raises:
        ValueError: on an unknown split or a non-positive `num_tasks`.

    Examples:
        >>> tasks = TextWorldTasks("test", 10)
        >>> len(tasks), tasks[3].task_id, tasks[3].metadata["seed"]
        (10, 'textworld/test/3', 1000003)
    """

    def __init__(self, split: str = "train", num_tasks: int = DEFAULT_NUM_TASKS):
        if split not in SPLIT_SEEDS:
            raise ValueError(f"split must be one of {sorted(SPLIT_SEEDS)}, got {split!r}")
        if num_tasks <= 0 or num_tasks > 1_000_000:
            raise ValueError(f"num_tasks must be in [1, 1000000], got {num_tasks}")
        self.split = split
        self.num_tasks = int(num_tasks)
        self.first_seed = SPLIT_SEEDS[split]

    def __len__(self) -> int:
        return self.num_tasks

    def task(self, index: int) -> Task:
        """Task `index` (see the class docstring)."""
        seed = self.first_seed + index
        return Task(
            task_id=f"textworld/{self.split}/{index}",
            prompt=f"TextWorld game, seed {seed}",
            metadata={"seed": seed},
        )


class TextWorldEnv(TextEnv):
    r"""TextWorld text adventures, generated locally: explore, pick up and use objects to finish a quest.

    ## Description
    Task *i* of `split` is the game TextWorld generates from seed `SPLIT_SEEDS[split] + i` with
    `nb_rooms`, `nb_objects` and `quest_length`. A game is generated on its first `reset`
    (about 0.5 s on 2 CPU cores) and kept in `cache_dir`.

    ## Action Space
    `UnicodeText`: one game command per turn, the reply's last `\boxed{...}` or else its last
    non-empty line ("go north", "take key"). Junk is sent to the game, which answers it
    ("That's not a verb I recognise."); a reply with no readable characters costs a turn.

    ## Observation Space
    `ChatMessages`: after `reset`, one user message with the instructions, the quest and the first
    room; after each command, the game's answer.

    ## Rewards
    The step's reward is the game's score increase (TextWorld quests score 1 point when won, so
    an episode returns at most `max_score`, usually 1). Terms, on every turn:
    `reward/score` (the increase) and `reward/correct` (1.0 on the step that wins, else 0.0), so
    accuracy is the share of games won.

    ## Episode End
    Terminates when the game is won or lost; truncated after `max_turns` commands.

    ## Scripted agents
    The oracle plays TextWorld's own plan from the current state (`policy_commands`; the
    walkthrough's next command when there is none), so it wins every game; `random_action`
    is a random admissible command or a random word pair.

    Args:
        split: "train" or "test": disjoint seed ranges.
        num_tasks: seeds per split (default 10,000).
        nb_rooms: rooms per world (default 3).
        nb_objects: objects per world (default 6).
        quest_length: commands in the shortest winning walkthrough (default 5).
        max_turns: commands before truncation (default 50).
        list_commands: append the admissible commands to each observation (default False; they
            are always in `info["admissible_commands"]`).
        cache_dir: where generated games are kept (default `default_cache_dir()`).
        **kwargs: `TextEnv`'s (`system_prompt`, `max_action_chars`, `render_mode`).

    Raises:
        ImportError: without the `textworld` package (`pip install 'textgym[interop]'`).
        ValueError: on an unknown split, or sizes below 1 (`reset` raises it when TextWorld
            cannot build a game with the options).

    ## Version History
    - v0: initial version (TextWorld 1.7).

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/TextWorld-v0", nb_rooms=2, nb_objects=3, quest_length=2)
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> "Reply with one command per turn" in obs[0]["content"]
        True
        >>> obs, reward, terminated, truncated, info = env.step("xyzzy")
        >>> reward, terminated, info["reward/correct"]
        (0.0, False, 0.0)
        >>> oracle = env.get_wrapper_attr("oracle_action")
        >>> while not terminated:
        ...     obs, reward, terminated, truncated, info = env.step(oracle([]))
        >>> reward, info["reward/correct"], info["won"]
        (1.0, 1.0, True)
    """

    def __init__(
        self,
        *,
        split: str = "train",
        num_tasks: int = DEFAULT_NUM_TASKS,
        nb_rooms: int = 3,
        nb_objects: int = 6,
        quest_length: int = 5,
        max_turns: int = 50,
        list_commands: bool = False,
        cache_dir: str | os.PathLike[str] | None = None,
        **kwargs: Any,
    ):
        require("textworld", "textworld")
        for name, value in (("nb_rooms", nb_rooms), ("nb_objects", nb_objects),
                            ("quest_length", quest_length), ("max_turns", max_turns)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        super().__init__(TextWorldTasks(split, num_tasks), **kwargs)
        self.split = split
        self.nb_rooms, self.nb_objects, self.quest_length = nb_rooms, nb_objects, quest_length
        self.max_turns = int(max_turns)
        self.list_commands = bool(list_commands)
        self.cache_dir = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self._game: Any = None
        self._state: Any = None
        self._turns = 0
        self._score = 0.0

    # -- the game ----------------------------------------------------------------------
    def _start(self, seed: int) -> Any:
        import textworld

        path = game_path(seed, self.nb_rooms, self.nb_objects, self.quest_length, self.cache_dir)
        infos = textworld.EnvInfos(
            admissible_commands=True, policy_commands=True, objective=True, score=True,
            max_score=True, won=True, lost=True, extras=["walkthrough"],
        )  # fmt: skip
        self._close_game()
        with warnings.catch_warnings():  # jericho: "not fully supported" (TextWorld tracks the score itself)
            warnings.filterwarnings("ignore", message=".*not fully supported")
            self._game = textworld.start(str(path), request_infos=infos)
            return self._game.reset()

    def _close_game(self) -> None:
        if self._game is not None:
            self._game.close()
            self._game = None

    def _observation(self, text: str) -> list[Message]:
        content = clean_feedback(text)
        if self.list_commands and self._state is not None:
            content += "\n\nAdmissible commands: " + ", ".join(self._state["admissible_commands"] or [])
        return [{"role": "user", "content": content}]

    # -- TextEnv hooks -----------------------------------------------------------------
    def initial_messages(self, task: Task) -> list[Message]:
        """Generate (or load) the task's game and start it: the instructions, the quest, the first room."""
        self._state = self._start(int(task.metadata["seed"]))
        self._turns, self._score = 0, float(self._state["score"] or 0)
        obs = self._observation(self._state.feedback)
        obs[0]["content"] = f"{INSTRUCTION}\n\n{obs[0]['content']}"
        return obs

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Send the command to the game; the reward is the score increase."""
        command = parse_command(action)
        if not command:
            return self._no_command("I could not read a command in your reply.")
        self._state, _, done = self._game.step(command)
        score = float(self._state["score"] or 0)
        gain, self._score = score - self._score, score
        won, lost = bool(self._state["won"]), bool(self._state["lost"])
        terminated = bool(done or won or lost)
        info = self._info(gain, won)
        info.update({"command": command, "won": won, "lost": lost})
        obs = [] if terminated else self._observation(self._state.feedback)
        return obs, gain, terminated, info

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """An unusable reply (empty, too long, not text) costs a turn and says why."""
        obs, reward, terminated, info = self._no_command(f"Invalid reply ({reason}).")
        info["error"] = reason
        return obs, reward, terminated, info

    def _no_command(self, text: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        info = self._info(0.0, False)
        info.update({"command": None, "won": False, "lost": False})
        return [{"role": "user", "content": f"{text} Reply with one game command."}], 0.0, False, info

    def _info(self, gain: float, won: bool) -> dict[str, Any]:
        return {
            "reward/score": float(gain),
            "reward/correct": 1.0 if won else 0.0,
            "score": self._score,
            "max_score": float(self._state["max_score"] or 0),
            "admissible_commands": list(self._state["admissible_commands"] or []),
        }

    # -- gymnasium API -----------------------------------------------------------------
    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Play one command; `truncated` is True after `max_turns` commands without an end.

        Raises:
            RuntimeError: if called before `reset()` or after the episode terminated.
        """
        obs, reward, terminated, _, info = super().step(action)
        self._turns += 1
        return obs, reward, terminated, not terminated and self._turns >= self.max_turns, info

    def close(self) -> None:
        """Stop the game interpreter."""
        self._close_game()
        super().close()

    # -- scripted experts --------------------------------------------------------------
    def oracle_action(self, messages: list[Message]) -> str:
        """TextWorld's plan from the current state (`policy_commands[0]`), else the walkthrough's next step.

        Raises:
            RuntimeError: before `reset()`.
        """
        if self._state is None:
            raise RuntimeError("call reset() before asking the oracle")
        plan = self._state["policy_commands"] or []
        if plan:
            return str(plan[0])
        walkthrough = self._state.get("extra.walkthrough") or ["look"]
        return str(walkthrough[min(self._turns, len(walkthrough) - 1)])

    def random_action(self, rng: np.random.Generator) -> str:
        """Half the time a random admissible command, else two random words (`--agent random`)."""
        commands = list(self._state["admissible_commands"] or []) if self._state is not None else []
        if commands and rng.random() < 0.5:
            return str(commands[int(rng.integers(len(commands)))])
        return " ".join(_WORDS[int(i)] for i in rng.integers(len(_WORDS), size=2))
