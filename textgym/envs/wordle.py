"""`textgym/Wordle-v0`: guess a hidden five-letter word in six tries, with letter feedback.

The smallest multi-turn env in textgym (no tools), and a template for writing your own:
`initial_messages` poses the task, `respond` answers each guess, and the turn limit is
gymnasium's `TimeLimit` (6 guesses), so `truncated` means what gymnasium says.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from textgym.envs.base import TextEnv
from textgym.types import Message, Task
from textgym.verifiers.answer_text import normalize_unicode, unwrap
from textgym.verifiers.extraction import boxed_spans

# Common English five-letter words, written for textgym (no external list).
_WORD_LIST = """
about above abuse actor acute admit adopt adult after again agent agree ahead alarm album alert
alike alive allow alone along alter among angel anger angle angry apart apple apply arena argue
arise array aside asset audio audit avoid award aware badly baker basic beach began begin being
below bench birth black blade blame blind block blood board boost booth bound brain brand bread
break breed brief bring broad broke brown build built buyer cable camel carry catch cause chain
chair chart chase cheap check chest chief child china chose civil claim class clean clear click
clock close coach coast could count court cover craft crash cream crime cross crowd crown curve
cycle daily dance dated dealt death debut delay depth doing doubt dozen draft drama drawn dream
dress drink drive drove dying eager early earth eight elite empty enemy enjoy enter entry equal
error event every exact exist extra faith false fault fiber field fifth fifty fight final first
fixed flash fleet floor fluid focus force forth forty forum found frame frank fraud fresh front
fruit fully funny giant given glass globe going grace grade grand grant grass great green gross
group grown guard guess guest guide happy heart heavy hence horse hotel house human ideal image
index inner input issue joint judge known label large laser later laugh layer learn lease least
leave legal level light limit local logic loose lower lucky lunch major maker march match maybe
mayor meant media metal might minor minus mixed model money month moral motor mount mouse mouth
movie music needs never newly night noise north noted novel nurse occur ocean offer often order
other ought paint panel paper party peace phase phone photo piece pilot pitch place plain plane
plant plate point pound power press price pride prime print prior prize proof proud prove queen
quick quiet quite radio raise range rapid ratio reach ready refer right rival river robot rough
round route royal rural scale scene scope score sense serve seven shall shape share sharp sheet
shelf shell shift shirt shock shoot short shown sight since sixth sixty sized skill sleep slide
small smart smile smoke solid solve sorry sound south space spare speak speed spend spent split
spoke sport staff stage stake stand start state steam steel stick still stock stone stood store
storm story strip stuck study stuff style sugar suite super sweet table taken taste taxes teach
teeth thank theft their theme there these thick thing think third those three threw throw tight
times tired title today topic total touch tough tower track trade train treat trend trial tried
tries truck truly trust truth twice under union unity until upper upset urban usage usual valid
value video virus visit vital voice waste watch water wheel where which while white whole whose
woman women world worry worse worst worth would wound write wrong wrote yield young youth
"""
WORDS: tuple[str, ...] = tuple(_WORD_LIST.split())
MAX_GUESSES = 6
_GUESS_TAG_RE = re.compile(r"<guess>(.*?)</guess>", re.DOTALL)
INSTRUCTION = (
    "Let's play Wordle. Guess the hidden five-letter English word in at most 6 tries. After each "
    "guess I mark every letter: G = right letter, right place; Y = in the word, elsewhere; "
    "- = not in the word. Reply with your guess as \\boxed{word}."
)


def score_guess(guess: str, target: str) -> str:
    r"""Wordle's feedback for `guess` against `target`: one of "G", "Y", "-" per letter.

    Repeated letters follow the game's rule: greens first, then yellows left to right, each
    target letter matched at most once.

    Examples:
        >>> score_guess("crane", "about")
        '--Y--'
        >>> score_guess("eerie", "there")   # green first; the target's other "e" marks one more
        'Y-Y-G'
    """
    marks = ["-"] * 5
    left: dict[str, int] = {}
    for i, (g, t) in enumerate(zip(guess, target, strict=True)):
        if g == t:
            marks[i] = "G"
        else:
            left[t] = left.get(t, 0) + 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and left.get(g, 0) > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


def parse_guess(action: str) -> str | None:
    r"""The guess in a reply: its last `\boxed{xxxxx}` or `<guess>xxxxx</guess>`, else the reply itself.

    Returns None unless the result is five letters, and when the reply offers more than one
    distinct guess (`\boxed{crane} or \boxed{about}`: one guess per turn). The reply is read
    after `normalize_unicode` (fullwidth letters are letters), and the box's typesetting is
    dropped (`\boxed{\text{crane}}` is crane: `answer_text.unwrap`).

    Examples:
        >>> parse_guess(r"My guess is \boxed{Crane}.")
        'crane'
        >>> parse_guess("crane!"), parse_guess("I think it is crane") is None
        ('crane', True)
        >>> parse_guess(r"\boxed{crane} or \boxed{about}") is None
        True
        >>> parse_guess(r"\boxed{\text{crane}}"), parse_guess(r"\boxed{\textbf{CRANE}}.")
        ('crane', 'crane')
    """
    action = normalize_unicode(action)
    spans = sorted(
        [(start, unwrap(b)) for b, start, _ in boxed_spans(action)]
        + [(m.start(), m.group(1)) for m in _GUESS_TAG_RE.finditer(action)]
    )
    offered = {g.strip().lower() for _, g in spans if g.strip()}
    if len(offered) > 1:
        return None
    five = [g.strip().lower() for _, g in spans if re.fullmatch(r"\s*[A-Za-z]{5}\s*", g)]
    if five:
        return five[-1]
    bare = action.strip().strip(".!").lower()
    return bare if re.fullmatch(r"[a-z]{5}", bare) else None


class WordleEnv(TextEnv):
    r"""Wordle: find the hidden word in six guesses from per-letter feedback.

    ## Description
    Task *i* hides `WORDS[i]` (a list of common English five-letter words). Any five
    letters are a valid guess.

    ## Action Space
    `UnicodeText`: the reply; the guess is its last `\boxed{word}` (or `<guess>word</guess>`,
    or a reply that is just the word).

    ## Observation Space
    `ChatMessages`: the rules after `reset`; after each wrong or unreadable guess one user
    message with the feedback ("crane: - Y G - -", guesses left).

    ## Rewards
    `correct`: 1.0 on the step that finds the word, else 0.0.

    ## Episode End
    Terminates when the word is found; otherwise `TimeLimit` truncates after 6 guesses
    (`textgym/Wordle-v0` registers `max_episode_steps=6`).

    ## Version History
    - v0: initial version.

    Examples:
        >>> import gymnasium as gym
        >>> import textgym
        >>> env = gym.make("textgym/Wordle-v0")
        >>> obs, info = env.reset(options={"task_index": 0})   # the hidden word is "about"
        >>> obs, reward, terminated, truncated, info = env.step(r"\boxed{crane}")
        >>> print(obs[0]["content"])
        crane: - - Y - -
        5 guesses left.
        >>> reward, terminated
        (0.0, False)
        >>> env.step("<guess>about</guess>")[1:3]
        (1.0, True)
    """

    def __init__(self, **kwargs: Any):
        tasks = [Task(task_id=f"wordle/{i}", prompt=INSTRUCTION, answer=w) for i, w in enumerate(WORDS)]
        super().__init__(tasks, **kwargs)
        self.guesses: list[tuple[str, str]] = []

    def initial_messages(self, task: Task) -> list[Message]:
        """The rules."""
        self.guesses = []
        return [{"role": "user", "content": task.prompt}]

    def respond(self, action: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """Mark the guess; end on the hidden word."""
        assert self.task is not None
        guess = parse_guess(action)
        if guess is None:
            obs, reward, done, info = self._feedback(
                "I could not read a guess: reply with \\boxed{word} (five letters).", None
            )
            return obs, reward, done, {**info, "invalid_action": True}
        marks = score_guess(guess, self.task.answer)
        self.guesses.append((guess, marks))
        if guess == self.task.answer:
            return [], 1.0, True, {"reward/correct": 1.0, "guess": guess, "guesses": len(self.guesses)}
        return self._feedback(f"{guess}: {' '.join(marks)}", guess)

    def invalid_action(self, reason: str) -> tuple[list[Message], float, bool, dict[str, Any]]:
        """An unusable reply costs a turn and says why."""
        return self._feedback(f"Invalid reply ({reason}); reply with \\boxed{{word}}.", None)

    def _feedback(self, text: str, guess: str | None) -> tuple[list[Message], float, bool, dict[str, Any]]:
        left = MAX_GUESSES - len(self.guesses)
        return (
            [{"role": "user", "content": f"{text}\n{left} guesses left."}],
            0.0,
            False,
            {
                "reward/correct": 0.0,
                "guess": guess,
                "guesses": len(self.guesses),
            },
        )

    def oracle_action(self, messages: list[Message]) -> str:
        """The expert reads the hidden word."""
        if self.task is None:
            raise RuntimeError("call reset() before asking the oracle")
        return f"\\boxed{{{self.task.answer}}}"

    def random_action(self, rng: np.random.Generator) -> str:
        """A uniformly random word of the list (what `textgym eval --agent random` plays)."""
        return f"\\boxed{{{WORDS[int(rng.integers(len(WORDS)))]}}}"
