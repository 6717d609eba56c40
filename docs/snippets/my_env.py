"""Two small environments: a single-turn one built on SingleTurnEnv, a multi-turn one on TextEnv."""

import re
from typing import Any

import gymnasium as gym

from textgym.envs import SingleTurnEnv, TextEnv
from textgym.types import Task
from textgym.verifiers import Rubric, RubricTerm, Score
from textgym.verifiers.answer_text import normalize_unicode

WORDS = ["apple", "river", "stone", "cloud", "piano", "tiger", "lemon", "chair"]


class ReversedWord:
    """Verifier: 1.0 when the reply's last word is the task's answer and it offers no other."""

    def __call__(self, completion: str, task: Task) -> Score:
        words = completion.lower().replace(".", " ").split()
        said = words[-1] if words else ""
        hedged = "or" in words  # "either elppa or apple" offers two answers: not one
        return Score(reward=float(said == task.answer and not hedged), details={"said": said})


class ReverseEnv(SingleTurnEnv):
    """Spell a word backwards; one turn."""

    def __init__(self, **kwargs: Any):
        tasks = [
            Task(task_id=f"reverse/{i}", prompt=f"Spell '{w}' backwards.", answer=w[::-1],
                 solution=f"Backwards it is {w[::-1]}")
            for i, w in enumerate(WORDS)
        ]
        rubric = Rubric([RubricTerm("correct", ReversedWord(), 1.0)])
        super().__init__(tasks, rubric, **kwargs)


class GuessEnv(TextEnv):
    """Guess a number from 1 to 100; each wrong guess is answered with 'higher' or 'lower'."""

    def __init__(self, **kwargs: Any):
        tasks = [Task(task_id=f"guess/{n}", prompt="Guess my number (1-100).", answer=str(n))
                 for n in range(1, 101)]
        super().__init__(tasks, **kwargs)

    def initial_messages(self, task: Task) -> list[dict[str, str]]:
        return [{"role": "user", "content": task.prompt}]

    def respond(self, action: str) -> tuple[list[dict[str, str]], float, bool, dict[str, Any]]:
        assert self.task is not None
        # One number, read as textgym's own readers read it: "−42" (U+2212) is minus 42 and "٤٣ or 42"
        # offers two numbers, so neither is a guess of 42.
        numbers = re.findall(r"-?[0-9]+", normalize_unicode(action))
        if len(numbers) != 1:
            ask = [{"role": "user", "content": "Reply with one number."}]
            return ask, 0.0, False, {"reward/correct": 0.0}
        guess, target = int(numbers[0]), int(self.task.answer)
        if guess == target:
            return [], 1.0, True, {"reward/correct": 1.0}
        hint = "higher" if guess < target else "lower"
        return [{"role": "user", "content": hint}], 0.0, False, {"reward/correct": 0.0}

    def invalid_action(self, reason: str) -> tuple[list[dict[str, str]], float, bool, dict[str, Any]]:
        # Multi-turn: an unusable reply costs a turn instead of ending the episode.
        return [{"role": "user", "content": f"Invalid reply ({reason})."}], 0.0, False, {"reward/correct": 0.0}

    def oracle_action(self, messages: list[dict[str, str]]) -> str:
        assert self.task is not None
        return self.task.answer


gym.register(id="my/Reverse-v0", entry_point=ReverseEnv)
gym.register(id="my/Guess-v0", entry_point=GuessEnv, max_episode_steps=7)
