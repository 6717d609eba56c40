"""`textgym/TextArena-v0`: TextArena's single-player games as a multi-turn textgym env.

[TextArena](https://github.com/LeonGuertler/TextArena) ships ~100 text games; this env plays its
single-player ones that run offline (`OFFLINE_GAMES`), with TextArena's own rules, messages and
end-of-game reward (`env.close()`). Needs the `textarena` package (`pip install 'textgym[interop]'`).

Games that need something from outside (`NEEDS_DOWNLOAD_OR_KEY`): Wordle, Hangman, WordLadder
and WordSearch load NLTK's `words` corpus (downloaded at run time: `python -m nltk.downloader
words`, plus `averaged_perceptron_tagger_eng` for WordSearch); TwentyQuestions and GuessWho ask
an LLM judge through OpenRouter (`OPENROUTER_API_KEY`). They are refused unless
`allow_downloads=True`. `BROKEN_GAMES` do not import under textarena 0.7.4 on Python 3.11.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import random
from collections.abc import Sequence
from typing import Any, SupportsFloat

import numpy as np

from textgym.envs.base import LazyTasks, TextEnv
from textgym.envs.interop import require
from textgym.types import Message, Task

_VARIANTS = {
    "2048-v0": ("ultra-easy", "mega-easy", "super-easy", "very-easy", "easy", "hard", "very-hard", "extreme",
                "3x3", "5x5", "6x6", "8x8", "10x10"),
    "Bandit-v0": ("hard",), "Blackjack-v0": ("long",), "Countdown-v0": (), "Crosswords-v0": ("hardcore",),
    "Cryptarithm-v0": (), "FifteenPuzzle-v0": (), "FrozenLake-v0": ("random", "hardcore"),
    "GuessTheNumber-v0": ("hardcore",), "LightsOut-v0": (), "LogicPuzzle-v0": ("hard",),
    "Mastermind-v0": ("hard", "extreme"), "Minesweeper-v0": ("small", "medium", "hard"), "PegJump-v0": (),
    "RushHour-v0": (), "Secretary-v0": ("long",), "Set-v0": (), "Slitherlink-v0": (),
    "Sokoban-v0": ("medium",), "Sudoku-v0": ("very-easy", "easy", "medium", "hard"), "ThreeCardMonte-v0": (),
    "TowerOfHanoi-v0": ("medium", "hard", "hardcore", "extreme"),
}  # fmt: skip
OFFLINE_GAMES: tuple[str, ...] = tuple(
    sorted([g for g in _VARIANTS] + [f"{g}-{v}" for g, vs in _VARIANTS.items() for v in vs])
)
"""TextArena 0.7.4's single-player game ids that run with nothing but the package (checked offline)."""
NEEDS_DOWNLOAD_OR_KEY: dict[str, str] = {
    **{g: "NLTK's 'words' corpus (downloaded at run time)" for g in (
        "Wordle-v0", "Wordle-v0-hardcore", "Wordle-v0-long", "Wordle-v0-long-hardcore", "Hangman-v0",
        "Hangman-v0-hardcore", "WordLadder-v0", "WordLadder-v0-medium", "WordLadder-v0-hard")},
    **{g: "NLTK's 'words' and 'averaged_perceptron_tagger_eng' data (downloaded at run time)"
       for g in ("WordSearch-v0", "WordSearch-v0-hardcore")},
    **{g: "an OpenRouter API key (OPENROUTER_API_KEY): an LLM answers the questions" for g in (
        "TwentyQuestions-v0", "TwentyQuestions-v0-hardcore", "GuessWho-v0")},
}  # fmt: skip
"""Single-player games that need a download or an API key, and what they need (`allow_downloads=True`)."""
BROKEN_GAMES = ("Klondike-v0",)
"""Single-player games whose module does not import (textarena 0.7.4, Python 3.11: a SyntaxError)."""
ORACLE_GAMES = ("GuessTheNumber", "Mastermind", "TowerOfHanoi")
"""Game families (every variant) with a scripted expert: it reads the hidden number or code, or
plays the optimal Tower of Hanoi move from the current towers."""
SPLIT_SEED_OFFSET = {"train": 0, "test": 1_000_000_000}
"""Task *i* of `split` resets the game with seed `seed + SPLIT_SEED_OFFSET[split] + i`."""
DEFAULT_NUM_TASKS = 10_000
DEFAULT_MAX_TURNS = 100
"""The env's turn cap unless `max_turns=` says otherwise (or the game's own limit is higher)."""
_RANDOM_TOKENS = (
    "up",
    "down",
    "left",
    "right",
    "hit",
    "stand",
    "A C",
    "B A",
    "red",
    "accept",
    "0 0",
    "1 2 +",
)


@contextlib.contextmanager
def _quiet() -> Any:
    """Hide what a game prints (LogicPuzzle and RushHour print to stdout)."""
    with contextlib.redirect_stdout(io.StringIO()):
        yield


def format_observation(messages: Sequence[tuple[int, str, Any]]) -> str:
    """TextArena's pending messages for the player as one text, without the echo of the player's own action.

    Examples:
        >>> from textarena import ObservationType as T
        >>> pending = [(0, "[5]", T.PLAYER_ACTION), (-1, "The target number is higher.", T.GAME_MESSAGE)]
        >>> print(format_observation(pending))
        The target number is higher.
    """
    parts = [
        str(text).strip() for sender, text, kind in messages if getattr(kind, "name", "") != "PLAYER_ACTION"
    ]
    return "\n\n".join(p for p in parts if p)


def hanoi_next_move(towers: dict[str, list[int]]) -> tuple[str, str] | None:
    """The optimal next move that brings every disk to tower C, from any legal position; None when solved.

    Examples:
        >>> hanoi_next_move({"A": [3, 2, 1], "B": [], "C": []})
        ('A', 'C')
        >>> hanoi_next_move({"A": [], "B": [], "C": [2, 1]}) is None
        True
    """
    where = {disk: peg for peg, disks in towers.items() for disk in disks}

    def move(k: int, target: str) -> tuple[str, str] | None:
        if k == 0:
            return None
        if where[k] == target:
            return move(k - 1, target)
        other = ({"A", "B", "C"} - {where[k], target}).pop()
        return move(k - 1, other) or (where[k], target)

    return move(len(where), "C")


class _Seeds(LazyTasks):
    def __init__(self, game: str, split: str, seed: int, n: int):
        self.game, self.split, self.seed, self.n = game, split, seed, n

    def __len__(self) -> int:
        return self.n

    def task(self, index: int) -> Task:
        """Task `index` (see the class docstring)."""
        seed = self.seed + SPLIT_SEED_OFFSET[self.split] + index
        return Task(
            task_id=f"textarena/{self.game}/{self.split}/{index}",
            prompt=f"TextArena {self.game} (seed {seed}): the game's rules come at reset.",
            metadata={"game": self.game, "seed": seed},
        )


class TextArenaEnv(TextEnv):
    """A TextArena single-player game: TextArena's messages are user turns, the replies its moves.

    ## Description
    Task *i* is the game `game` reset with seed `seed + SPLIT_SEED_OFFSET[split] + i` (TextArena seeds
    Python's `random`; the env keeps a private `random` state per episode and restores the
    process's own around every call into the game, so episodes replay exactly).

    ## Action Space
    `UnicodeText`: the move in TextArena's own format, in square brackets (`[5]`, `[A C]`,
    `[1 2 3 4]`); a reply without any bracket is wrapped in brackets, as TextArena's
    `ActionFormattingWrapper` does.

    ## Observation Space
    `ChatMessages`: after reset the game's rules and board; after each move one user message
    with what the game says (hints, the board, an invalid-move notice), without the echo of the
    move. TextArena allows one invalid move in a row; the second ends the game.

    ## Rewards
    Reported on every turn, non-zero on the last: `score` (the reward) is TextArena's own reward
    for the player from `env.close()`: 1 for a win, else the game's completion fraction (0..1),
    or -1 in games that penalise invalid moves (Bandit, Secretary); a game that returns a
    non-number (a TextArena bug in Countdown, Cryptarithm and Slitherlink invalid moves) scores 0.
    A game that ends on invalid moves scores at most 0: TextArena would pay it the completion
    fraction, so one guess and two junk replies outscored playing on (a reward hack the
    probes of `textgym env hacks` found: 0.81 against the random agent's 0.12).
    `correct` (accuracy): 1.0 for a win (`score >= 1`).

    ## Episode End
    Terminates when TextArena says the game is done; truncated after `max_turns` replies (the env
    ends the episode itself; the id is registered without `max_episode_steps`).

    ## Version History
    - v0: initial version (textarena 0.7.4).

    Args:
        game: a TextArena single-player game id (`OFFLINE_GAMES`, e.g. "GuessTheNumber-v0").
        split: "train" or "test" (disjoint seed ranges).
        seed: the base seed of the game resets (default 0).
        num_tasks: tasks (seeds) per split (default 10000).
        max_turns: replies before the env truncates the episode (default: the game's own turn
            limit when it has one and it is above 100, else 100).
        allow_downloads: allow the games of `NEEDS_DOWNLOAD_OR_KEY` (default False).
        **kwargs: `system_prompt`, `max_action_chars`, `invalid_action_reward`, `render_mode`.

    Raises:
        ImportError: without the `textarena` package.
        ValueError: for a missing, unknown, multi-player or broken game (with the closest names),
            a game that needs a download or key without `allow_downloads=True`, an unknown split,
            or non-positive `num_tasks` / `max_turns`.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/TextArena-v0", game="GuessTheNumber-v0")
        >>> obs, info = env.reset(options={"task_index": 0})
        >>> print(obs[0]["content"].splitlines()[1])
        You have to guess the number between 1 and 20 within 10 turns.
        >>> obs, reward, terminated, truncated, info = env.step("[10]")
        >>> obs[0]["content"], reward, terminated
        ('The target number is higher.', 0.0, False)
        >>> env.unwrapped.oracle_action([])
        '[13]'
        >>> obs, reward, terminated, truncated, info = env.step("[13]")
        >>> reward, terminated, info["reward/correct"]
        (1.0, True, 1.0)
    """

    def __init__(
        self,
        game: str | None = None,
        *,
        split: str = "train",
        seed: int = 0,
        num_tasks: int = DEFAULT_NUM_TASKS,
        max_turns: int | None = None,
        allow_downloads: bool = False,
        **kwargs: Any,
    ):
        if not isinstance(game, str):
            raise ValueError(
                f"textgym/TextArena-v0 needs game=NAME (a TextArena single-player game id such as "
                f"'GuessTheNumber-v0'; OFFLINE_GAMES lists them), got {game!r}"
            )
        if split not in SPLIT_SEED_OFFSET:
            raise ValueError(f"split must be one of {sorted(SPLIT_SEED_OFFSET)}, got {split!r}")
        for name, value in (("num_tasks", num_tasks), ("max_turns", 1 if max_turns is None else max_turns)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise ValueError(f"seed must be an int, got {seed!r}")
        self.game = game.removesuffix("-raw")
        self._check_game(self.game, allow_downloads)
        require("textarena", "textarena")
        outer = random.getstate()
        try:
            with _quiet():
                import textarena as ta

                self._ta = ta.make(f"{self.game}-raw")
        finally:
            random.setstate(outer)
        super().__init__(_Seeds(self.game, split, seed, num_tasks), **kwargs)
        self.split = split
        game_turns = getattr(self._ta, "max_turns", None)
        if max_turns is None:
            max_turns = max(DEFAULT_MAX_TURNS, game_turns if isinstance(game_turns, int) else 0)
        self.max_turns = int(max_turns)
        self.turns = 0
        self._rng_state: Any = None

    @staticmethod
    def _check_game(game: str, allow_downloads: bool) -> None:
        if game in OFFLINE_GAMES or (allow_downloads and game in NEEDS_DOWNLOAD_OR_KEY):
            return
        if game in NEEDS_DOWNLOAD_OR_KEY:
            raise ValueError(
                f"TextArena's {game!r} needs {NEEDS_DOWNLOAD_OR_KEY[game]}; pass allow_downloads=True to "
                f"play it anyway. Games that run offline: {', '.join(OFFLINE_GAMES)}"
            )
        if game in BROKEN_GAMES:
            raise ValueError(f"TextArena's {game!r} does not import with textarena 0.7.4 on Python 3.11")
        known = list(OFFLINE_GAMES) + list(NEEDS_DOWNLOAD_OR_KEY)
        close = difflib.get_close_matches(game, known, n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        raise ValueError(
            f"{game!r} is not a TextArena single-player game that textgym plays (multi-player games "
            f"need opponents).{hint} Offline games: {', '.join(OFFLINE_GAMES)}"
        )

    # -- calls into TextArena with the episode's own `random` state ------------------------
    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        outer = random.getstate()
        try:
            if self._rng_state is not None:
                random.setstate(self._rng_state)
            with _quiet():
                return fn(*args, **kwargs)
        finally:
            self._rng_state = random.getstate()
            random.setstate(outer)

    def _observation(self) -> str:
        _, messages = self._call(self._ta.get_observation)
        return format_observation(messages)

    # -- hooks -------------------------------------------------------------------------
    def initial_messages(self, task: Task) -> list[Message]:
        """Reset the game with the task's seed; its rules and first board."""
        self.turns = 0
        self._rng_state = None
        self._call(self._ta.reset, num_players=1, seed=int(task.metadata["seed"]))
        return [{"role": "user", "content": self._observation()}]

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Play the move in TextArena; on the game's end, its reward."""
        move = action if ("[" in action or "]" in action) else f"[{action.strip()}]"
        return self._play(move)

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """An empty or over-long reply is played as an empty move (TextArena counts it as invalid)."""
        obs, reward, terminated, info = self._play("")
        info["error"] = reason
        return obs, reward, terminated, info

    def _play(self, move: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        self.turns += 1
        done, _ = self._call(self._ta.step, move)
        if not done:
            text = self._observation() or "(no message)"
            return (
                [{"role": "user", "content": text}],
                0.0,
                False,
                {"reward/score": 0.0, "reward/correct": 0.0},
            )
        rewards, game_info = self._call(self._ta.close)
        raw = (rewards or {}).get(0, 0.0)
        try:
            score = float(raw)
        except (TypeError, ValueError):
            score = 0.0
        info = game_info.get(0, {}) if isinstance(game_info, dict) else {}
        if info.get("invalid_move") and score < 1.0:
            # a game forfeited by invalid moves earns no completion credit: otherwise two junk
            # replies after one guess end GuessTheNumber with more than playing it out does
            score = min(score, 0.0)
        return (
            [],
            score,
            True,
            {
                "reward/score": score,
                "reward/correct": float(score >= 1.0),
                "reason": info.get("reason"),
                "invalid_move": bool(info.get("invalid_move", False)),
            },
        )

    def step(self, action: str) -> tuple[list[Message], SupportsFloat, bool, bool, dict[str, Any]]:
        """Play one reply; truncated after `max_turns` replies (see `TextEnv.step`).

        Raises:
            RuntimeError: if called before `reset()` or after the episode ended.
        """
        obs, reward, terminated, truncated, info = super().step(action)
        if not terminated and self.turns >= self.max_turns:
            truncated = True
            self._done = True
        return obs, reward, terminated, truncated, info

    # -- scripted experts --------------------------------------------------------------
    def oracle_action(self, messages: list[Message]) -> str:
        """The expert's next move: the hidden number or code, or the optimal Tower of Hanoi move.

        GuessTheNumber: the hidden number; Mastermind: the secret code; TowerOfHanoi:
        `hanoi_next_move` on the current towers.

        Raises:
            RuntimeError: before `reset()`.
            NotImplementedError: for a game outside `ORACLE_GAMES`.
        """
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        family = self.game.split("-v0")[0]
        state = self._ta.state.game_state
        if family == "GuessTheNumber":
            return f"[{state['game_number']}]"
        if family == "Mastermind":
            return "[" + " ".join(str(d) for d in state["secret_code"]) + "]"
        if family == "TowerOfHanoi":
            move = hanoi_next_move(state["towers"])
            return f"[{move[0]} {move[1]}]" if move else "[A C]"
        raise NotImplementedError(
            f"no scripted expert for TextArena's {self.game!r}; games with one: {', '.join(ORACLE_GAMES)}"
        )

    def random_action(self, rng: np.random.Generator) -> str:
        """A random bracketed move: a number in [0, 100) or a common move word (`--agent random`)."""
        if rng.random() < 0.5:
            return f"[{int(rng.integers(0, 100))}]"
        return f"[{_RANDOM_TOKENS[int(rng.integers(len(_RANDOM_TOKENS)))]}]"
