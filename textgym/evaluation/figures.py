"""What a before/after figure carries beside accuracy, so that skill is told apart from format.

A policy trained against a verifier gains from three things: the skill the task asks for, the
answer format the verifier reads, and the token budget (an answer cut at `max_new_tokens`
earns nothing). A learning figure here names each:

- **cut share** (`cut_share`): the share of answers that hit the token budget;
- **stated-answer accuracy** (`stated_accuracy`): what the model said its answer was, read
  leniently (`stated_answer`: the last `\\boxed{}`, else "the answer is X", else the last
  number), next to what the verifier paid;
- **format-controlled baseline** (`format_baseline`): the model before training with the
  answer format given (a prefilled answer stem, a one-shot example, or an instruction; the
  best of them), at a token budget that cuts at most 2% of answers. The gain that counts is
  the one above it.

The figures are those the run summary (`summary.json`: `accuracy_baseline`, `baseline`,
`cut_share_*`, `stated_accuracy_*`), `textgym eval` and `bench/learning.py` report.
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

from textgym.agents.llm_agent import LLMAgent
from textgym.agents.sampling import SamplingParams
from textgym.agents.trajectory import episode_correct
from textgym.envs.registry import as_messages
from textgym.envs.registry import make as make_env
from textgym.types import Message, Task
from textgym.verifiers.answer_text import _closing, normalize_unicode

MAX_CUT_SHARE = 0.02
"""The baseline's budget is raised until at most this share of its answers is cut."""
MAX_BASELINE_TOKENS = 512
"""The largest budget the baseline tries (tokens per answer)."""
BASELINE_INSTRUCTION = (
    "Reply with the final answer only, written as \\boxed{ANSWER}. Do not explain or show work."
)
"""The system message of the baseline's `instruction` variant."""
BOXED_STEM = "\\boxed{"
"""The stem every env gets as a prefilled answer; an env adds its own with `answer_stems(task)`."""

_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?")
_ANSWER_IS = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*([^\n]+)", re.IGNORECASE)
_BOXED = "\\boxed{"


def _last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` with balanced braces (an unclosed one: to the end)."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    i = start + len(_BOXED)
    j = _closing(text, i)
    return text[i:] if j is None else text[i:j]


def stated_answer(text: str) -> str | None:
    r"""What a response states as its answer, read leniently: the figure, not the reward.

    The last `\boxed{...}`; else what follows the last "answer is" / "answer:"; else the last
    number in the text (`85+63 = 148` states 148). Read after `normalize_unicode` (a minus
    written U+2212 is a minus). None when nothing is stated.

    Examples:
        >>> stated_answer("85+63 = 148"), stated_answer("So the answer is 12 apples.")
        ('148', '12 apples.')
        >>> stated_answer("\\boxed{\\frac{1}{2}} since ..."), stated_answer("no idea")
        ('\\frac{1}{2}', None)
    """
    text = normalize_unicode(text)
    boxed = _last_boxed(text)
    if boxed is not None and boxed.strip():
        return boxed.strip()
    said = list(_ANSWER_IS.finditer(text))
    if said:
        return said[-1].group(1).strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1].strip() if numbers else None


def _as_number(text: str) -> Fraction | None:
    text = re.sub(r"\\[dt]?frac\{(-?\d+)\}\{(\d+)\}", r"\1/\2", text)
    numbers = _NUMBER.findall(text)
    if len(numbers) != 1:
        return None
    try:
        return Fraction(numbers[0].replace(",", "").replace(" ", ""))
    except (ValueError, ZeroDivisionError):
        return None


def stated_correct(text: str, gold: str) -> bool | None:
    """Whether the answer `text` states (`stated_answer`) is `gold`: numbers by value, else by text.

    A stated answer holding one number is compared by value with a numeric gold (`148.0`,
    `148 apples`, `1,480` read as 1480); otherwise the two are compared as lower-case text
    without spaces, `$` and `\\text{}`. None when `gold` is empty.
    """
    if not gold:
        return None
    said = stated_answer(text)
    if said is None:
        return False
    g = _as_number(gold)
    if g is not None:
        return _as_number(said) == g

    def squash(s: str) -> str:
        return re.sub(r"\\text\{([^{}]*)\}|[\s$]", r"\1", s).lower().rstrip(".")

    return squash(said) == squash(gold)


def _reply(episode: dict[str, Any]) -> str:
    for m in reversed(episode.get("messages") or []):
        if m.get("role") == "assistant":
            return str(m.get("content", ""))
    return ""


def cut_share(episodes: Sequence[dict[str, Any]]) -> float:
    """Share of episodes whose last answer hit the token budget (`finish_reason == "length"`)."""
    return sum(e.get("finish_reason") == "length" for e in episodes) / len(episodes) if episodes else 0.0


def stated_accuracy(episodes: Sequence[dict[str, Any]]) -> float | None:
    """Share of episodes whose last reply states the gold answer (`stated_correct`); None without golds."""
    judged = [stated_correct(_reply(e), str(e.get("gold") or "")) for e in episodes]
    known = [j for j in judged if j is not None]
    return sum(known) / len(known) if known else None


def error_split(episodes: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Episodes by the env's own task category (`category`, e.g. Arithmetic's carry / no carry).

    Returns:
        `{category: {"n": episodes, "correct": correct ones}}`; `{}` when no episode has one.
    """
    out: dict[str, dict[str, int]] = {}
    for e in episodes:
        cat = e.get("category")
        if cat:
            row = out.setdefault(str(cat), {"n": 0, "correct": 0})
            row["n"] += 1
            row["correct"] += int(bool(e.get("correct")))
    return out


@dataclass
class Variant:
    """One way of giving the answer format: a system instruction, a one-shot example, or a prefilled stem.

    Attributes:
        name: "instruction", "one-shot", "stem: <text>" or "env stem K (e.g. ...)".
        system: a system message put first, or "".
        example: a solved (user, assistant) exchange put before the question, or ().
        stem: text the reply is prefilled with (part of the reply the env reads), or "".
        stems: per-task stems by task index, in place of `stem` (an env's own `answer_stems`).
    """

    name: str
    system: str = ""
    example: tuple[Message, ...] = ()
    stem: str = ""
    stems: dict[int, str] = field(default_factory=dict)

    def prompt(self, messages: list[Message]) -> list[Message]:
        """The conversation the model sees for a task whose own messages are `messages`."""
        head: list[Message] = [{"role": "system", "content": self.system}] if self.system else []
        own = [m for m in messages if not (self.system and m["role"] == "system")]
        return [*head, *self.example, *own]

    def stem_for(self, task_index: int) -> str:
        """The prefilled stem of task `task_index`."""
        return self.stems.get(task_index, self.stem)


def _example(env_id: str, env_kwargs: dict[str, Any]) -> tuple[Message, ...] | None:
    """A solved exchange from the env's train split (task 0 there), or None when there is none."""
    kwargs = {**env_kwargs, "split": "train"} if "split" in env_kwargs else dict(env_kwargs)
    try:
        env = make_env(env_id, **kwargs)
        obs, _ = env.reset(options={"task_index": 0})
        messages = as_messages(obs, env_id)
        reply = env.get_wrapper_attr("oracle_action")(messages)
        env.close()
    except Exception:  # an env without a train split or a gold solution: no one-shot variant
        return None
    question = [m for m in messages if m["role"] != "system"]
    return (*question, {"role": "assistant", "content": str(reply)})


def baseline_variants(env_id: str, env_kwargs: dict[str, Any], n: int) -> list[Variant]:
    """The format variants tried for an env, in order: the stems, a one-shot example, an instruction.

    Stems: `\\boxed{` for every env, plus those the env's `answer_stems(task)` gives (Arithmetic:
    `85+63 = `), one variant per distinct stem position. The one-shot example is task 0 of the
    env's train split with its gold reply (`oracle_action`), when the env has both.
    """
    variants = [Variant("stem: " + BOXED_STEM, stem=BOXED_STEM)]
    env = make_env(env_id, **env_kwargs)
    try:
        stems_of = env.get_wrapper_attr("answer_stems")
    except AttributeError:
        stems_of = None
    if stems_of is not None:
        tasks = env.get_wrapper_attr("tasks")
        per_task = [list(stems_of(tasks[i])) for i in range(n)]
        for k in range(max((len(s) for s in per_task), default=0)):
            stems = {i: s[k] for i, s in enumerate(per_task) if len(s) > k}
            variants.append(Variant(f"env stem {k + 1} (e.g. {stems.get(0, '')!r})", stems=stems))
    env.close()
    example = _example(env_id, env_kwargs)
    if example is not None:
        variants.append(Variant("one-shot", example=example))
    variants.append(Variant("instruction", system=BASELINE_INSTRUCTION))
    return variants


def _run_variant(
    agent: LLMAgent,
    env_id: str,
    env_kwargs: dict[str, Any],
    n: int,
    variant: Variant,
    params: SamplingParams,
    batch_size: int,
    indices: Sequence[int] | None = None,
    started: dict[int, list[int]] | None = None,
) -> tuple[list[dict[str, Any]], list[list[int]]]:
    """One greedy single-turn episode per task under `variant`, each its row (cf. `evaluate`'s rows).

    The tasks are 0..n−1, or `indices` when given (the rows then follow `indices`). `started`
    holds, per task, reply tokens an earlier, smaller budget already generated: they are
    appended to the prompt and the reply continues from them, up to `params.max_new_tokens`
    in all. Returns the rows and each row's reply token ids.
    """
    env = make_env(env_id, **env_kwargs)
    tasks = env.get_wrapper_attr("tasks")
    order = list(range(n)) if indices is None else list(indices)
    started = started or {}
    conversations, prompts = [], []
    for i in order:
        obs, _ = env.reset(options={"task_index": i})
        conv = variant.prompt(as_messages(obs, env_id))
        stem = variant.stem_for(i)
        ids = agent.encode_prompt(conv)
        if stem:
            ids = ids + list(agent.tokenizer(stem, add_special_tokens=False)["input_ids"])
        conversations.append(conv)
        prompts.append(ids + started.get(i, []))
    # rows continued from the same number of tokens share one budget: one generate call per group
    replies: dict[int, list[int]] = {}
    finish: dict[int, str] = {}
    for done in sorted({len(started.get(i, [])) for i in order}):
        part = [k for k, i in enumerate(order) if len(started.get(i, [])) == done]
        budget = SamplingParams(**{**params.__dict__, "max_new_tokens": params.max_new_tokens - done})
        for c in range(0, len(part), batch_size):
            chunk = part[c : c + batch_size]
            for k, gen in zip(chunk, agent.generate([prompts[k] for k in chunk], budget), strict=True):
                replies[k] = started.get(order[k], []) + list(gen.token_ids)
                finish[k] = gen.finish_reason
    rows, token_ids = [], []
    for k, (i, conv) in enumerate(zip(order, conversations, strict=True)):
        reply = variant.stem_for(i) + agent.decode(replies[k])
        env.reset(options={"task_index": i})
        _, reward, _, _, info = env.step(reply)
        terms = {name: float(v) for name, v in info.items() if name.startswith("reward/")}
        rows.append(
            {
                "task_index": i,
                "task_id": tasks[i].task_id,
                "gold": tasks[i].answer,
                "variant": variant.name,
                "reward": float(reward),
                "correct": episode_correct(terms, float(reward)),
                "terms": terms,
                "messages": [*conv, {"role": "assistant", "content": reply}],
                "response_tokens": len(replies[k]),
                "finish_reason": finish[k],
                "max_new_tokens": params.max_new_tokens,
            }
        )
        token_ids.append(replies[k])
    env.close()
    return rows, token_ids


def _with_budget(
    agent: LLMAgent,
    env_id: str,
    env_kwargs: dict[str, Any],
    n: int,
    variant: Variant,
    params: SamplingParams,
    batch_size: int,
    max_cut: float,
    max_tokens: int,
    beat: float = -1.0,
) -> list[dict[str, Any]]:
    """`_run_variant` at `params.max_new_tokens`, the budget doubled until at most `max_cut` are cut.

    Doubling stops at `max_tokens`; as soon as the variant cannot exceed accuracy `beat` (the
    best qualified variant so far) even if every cut answer came out right; or when a doubling
    ended fewer than half of the answers it was given (a model that does not stop: the variant
    stays unqualified). Greedy answers that ended within a budget are the same under a larger one,
    so only the cut ones are generated again, each continued from the tokens it already has (the
    greedy continuation of a greedy prefix is the larger budget's greedy answer, up to float
    rounding between a prefill and a decode step at a near-tie).
    """
    rows, tokens = _run_variant(agent, env_id, env_kwargs, n, variant, params, batch_size)
    budget = params.max_new_tokens
    while cut_share(rows) > max_cut and budget < max_tokens:
        cut = [r["task_index"] for r in rows if r["finish_reason"] == "length"]
        if (sum(bool(r["correct"]) for r in rows) + len(cut)) / n <= beat:
            break  # even if every cut answer came out right, the variant would not win
        budget = min(2 * budget, max_tokens)
        wider = SamplingParams(**{**params.__dict__, "max_new_tokens": budget})
        started = {i: tokens[i] for i in cut}
        redo, more = _run_variant(agent, env_id, env_kwargs, n, variant, wider, batch_size, cut, started)
        for i, row, ids in zip(cut, redo, more, strict=True):
            rows[i], tokens[i] = row, ids
        for r in rows:
            r["max_new_tokens"] = budget
        if 2 * sum(rows[i]["finish_reason"] == "length" for i in cut) > len(cut):
            break  # the doubling ended fewer than half of the cut answers: the model does not stop
    return rows


def format_baseline(
    agent: LLMAgent,
    env_id: str,
    env_kwargs: dict[str, Any] | None,
    n: int,
    params: SamplingParams,
    *,
    batch_size: int = 64,
    max_cut: float = MAX_CUT_SHARE,
    max_tokens: int = MAX_BASELINE_TOKENS,
    variants: Iterable[Variant] | None = None,
    episodes_path: str | Path | None = None,
) -> dict[str, Any]:
    """The format-controlled baseline: the policy's best accuracy with the answer format given.

    Each variant (`baseline_variants`: an instruction, a one-shot example from the train split,
    a prefilled `\\boxed{`, the env's own answer stems) is evaluated greedily on the tasks
    0..n−1 of a single-turn env, at a budget raised from `params.max_new_tokens` until it cuts
    at most `max_cut` of the answers (`_with_budget`). The baseline is the most accurate variant
    among those that got there (or, when none did, the one that cut least). An env whose
    replies are prefilled (`prefill=True`) is evaluated without its prefill: its own stem is
    one of the variants, so the baseline is at least the untrained model's prefilled accuracy.

    Args:
        agent: the policy before training.
        env_id: the evaluation env (single-turn).
        env_kwargs: its keyword arguments.
        n: tasks evaluated.
        params: the evaluation's sampling (its temperature is replaced by greedy decoding).
        batch_size: prompts per generate call.
        max_cut: largest share of cut answers a variant may have to qualify.
        max_tokens: the largest budget tried.
        variants: the variants to try (default `baseline_variants`).
        episodes_path: where to write the chosen variant's episodes (JSONL), when given.

    Returns:
        `{"accuracy", "variant", "max_new_tokens", "cut_share", "stated_accuracy", "seconds",
        "qualified", "n", "variants": {name: {"accuracy", "cut_share", "max_new_tokens",
        "stated_accuracy", "seconds"}}}` (`seconds`: the wall time a variant took).

    Raises:
        ValueError: when the env is multi-turn (its first episode does not end after one step)
            or has fewer than `n` tasks.
    """
    env_kwargs = {k: v for k, v in (env_kwargs or {}).items() if k != "prefill"}  # the variants give it
    greedy = SamplingParams(temperature=0.0, max_new_tokens=params.max_new_tokens)
    chosen = list(variants) if variants is not None else baseline_variants(env_id, env_kwargs, n)
    results: dict[str, list[dict[str, Any]]] = {}
    seconds: dict[str, float] = {}
    best_so_far = -1.0
    for v in chosen:  # the stems first: their answers are short, and a good first best prunes the rest
        start = time.perf_counter()
        rows = _with_budget(
            agent, env_id, env_kwargs, n, v, greedy, batch_size, max_cut, max_tokens, best_so_far
        )
        seconds[v.name] = time.perf_counter() - start
        results[v.name] = rows
        if cut_share(rows) <= max_cut:
            best_so_far = max(best_so_far, sum(bool(r["correct"]) for r in rows) / n)
    table = {
        name: {
            "accuracy": sum(bool(r["correct"]) for r in rows) / len(rows),
            "cut_share": cut_share(rows),
            "max_new_tokens": rows[0]["max_new_tokens"],
            "stated_accuracy": stated_accuracy(rows),
            "seconds": seconds[name],
        }
        for name, rows in results.items()
    }
    qualified = [name for name, t in table.items() if t["cut_share"] <= max_cut]
    if qualified:
        best = max(qualified, key=lambda name: table[name]["accuracy"])
    else:
        best = min(table, key=lambda name: table[name]["cut_share"])
    if episodes_path is not None:
        path = Path(episodes_path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps(r) + "\n" for r in results[best]), encoding="utf-8")
    return {**table[best], "variant": best, "qualified": bool(qualified), "n": n, "variants": table}


def baseline_applies(env_id: str, env_kwargs: dict[str, Any] | None = None, n: int = 1) -> bool:
    """Whether `format_baseline` can run on `env_id`: single-turn, with at least `n` textgym `Task`s.

    A Gymnasium env without a task list (string observations, a seed-indexed task) has no gold
    answer or answer stem to give the format with: it gets no baseline.
    """
    env = make_env(env_id, **dict(env_kwargs or {}))
    try:
        tasks = env.get_wrapper_attr("tasks")
    except AttributeError:
        return False
    finally:
        env.close()
    try:
        if len(tasks) < n or not isinstance(tasks[0], Task):
            return False
    except (TypeError, IndexError, KeyError):
        return False
    return single_turn(env_id, env_kwargs)


def single_turn(env_id: str, env_kwargs: dict[str, Any] | None = None) -> bool:
    """Whether `env_id` is single-turn: its task 0 ends after one (empty) action."""
    env = make_env(env_id, **dict(env_kwargs or {}))
    try:
        env.reset(options={"task_index": 0})
        _, _, terminated, truncated, _ = env.step("")
        return bool(terminated or truncated)
    finally:
        env.close()
