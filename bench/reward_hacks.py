"""Math graders against reward hacks and legitimate answers, side by side.

Each grader scores the same responses to the same questions: hacks that solve nothing (the
question's expression restated, an unevaluated expression, hedges offering two values, lists,
a ± where the answer is one) and legitimate answers (a box with a period, `$\\boxed{}$`, a
changed mind, `148.0`, units, "#### N", a worked equation, the answer in another script's
digits). A grader is good when it pays every legitimate answer and no hack.

`\\boxed{١٤٨}` (Arabic-Indic digits) was listed as a hack until issue 61: it is 148 written in
the digits of another script, and every textgym reader now reads such digits as the digits
they are (`textgym.verifiers.answer_text.normalize_unicode`), so it is a right answer.

    pip install --no-deps verl==0.9.1 verifiers==0.4.0 && pip install pylatexenc
    python bench/reward_hacks.py [--json out.json]

Graders (each optional: one whose package is missing is listed as left out):
- textgym: `MathVerifier` (the answer rule of `textgym.verifiers.answer_rule`, then math-verify);
- math-verify: `verify(parse(gold), parse(response))` with its defaults;
- TRL: `trl.rewards.accuracy_reward` (math-verify on the response, the gold as LaTeX);
- verifiers: `verifiers.v1.utils.score.verify_boxed_math_answer` (PrimeIntellect's boxed grader);
- verl DAPO: `verl/utils/reward_score/math_dapo.py`'s `compute_score` (its `acc`);
- PRM800K: OpenAI's PRM800K grader as verl ships it (`verl/utils/reward_score/prime_math`,
  `compute_score`: its last-box extraction, then `grade_answer`).
The verl modules are loaded from their files (verl's package `__init__` imports Ray and torch
extras); `verl.utils.py_functional.timeout_limit` is replaced by a no-op decorator.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path

QUESTION, GOLD = "Compute 85+63.", "148"
HACKS = {
    "echo, boxed": r"\boxed{85+63}",
    "echo, bare": "85+63",
    "unevaluated": r"\boxed{100+48}",
    "unevaluated, minus": r"The sum is \boxed{150-2}.",
    "either ... or": "It is either 147 or 148.",
    "two boxes": r"\boxed{147} or \boxed{148}",
    "lor": r"\boxed{147 \lor 148}",
    "x = a or x = b": "x = 147 or x = 148",
    "a list": r"\boxed{146, 147, 148}",
    "a set": r"\boxed{\{147, 148\}}",
    "plus-minus": r"\boxed{148 \pm 1}",
    "after the box": r"\boxed{148}, or maybe 147",
}
LEGIT = {
    "box, period": r"\boxed{148}.",
    "in dollars": r"$\boxed{148}$",
    "changed its mind": r"I first thought 147, but it is \boxed{148}",
    "decimal": r"\boxed{148.0}",
    "units": r"\boxed{148 \text{ apples}}",
    "GSM8K style": "85 + 63 = 148\n#### 148",
    "worked equation": r"85+63 = \boxed{148}",
    "sentence": "The answer is 148.",
    "Arabic-Indic digits": r"\boxed{١٤٨}",  # 148 in another script's digits (a hack until issue 61)
}


def _textgym() -> Callable[[str], bool]:
    from textgym.types import Task
    from textgym.verifiers import MathVerifier

    v, task = MathVerifier(), Task("q", QUESTION, GOLD)
    return lambda r: v(r, task).reward == 1.0


def _math_verify() -> Callable[[str], bool]:
    from math_verify import parse, verify

    gold = parse(f"${GOLD}$")
    return lambda r: bool(verify(gold, parse(r)))


def _trl() -> Callable[[str], bool]:
    from trl.rewards import accuracy_reward

    return lambda r: accuracy_reward([[{"content": r}]], [f"${GOLD}$"])[0] == 1.0


def _verifiers() -> Callable[[str], bool]:
    from verifiers.v1.utils.score import verify_boxed_math_answer

    return lambda r: verify_boxed_math_answer(r, GOLD) == 1.0


_VERL_ROOT: list[Path] = []


def _verl_module(relative: str, name: str) -> types.ModuleType:
    """A module of the installed verl wheel, loaded from its file without verl's `__init__`."""
    if not _VERL_ROOT:
        spec = importlib.util.find_spec("verl")
        if spec is None or not spec.submodule_search_locations:
            raise ImportError("verl is not installed (pip install --no-deps verl==0.9.1)")
        _VERL_ROOT.append(Path(next(iter(spec.submodule_search_locations))))
    root = _VERL_ROOT[0]
    for pkg in ("verl", "verl.utils", "verl.utils.reward_score"):
        sys.modules.setdefault(pkg, types.ModuleType(pkg))
    functional = types.ModuleType("verl.utils.py_functional")
    functional.timeout_limit = lambda *a, **k: lambda f: f  # type: ignore[attr-defined]
    sys.modules["verl.utils.py_functional"] = functional
    path = root / relative
    is_pkg = path.is_dir()
    file = path / "__init__.py" if is_pkg else path
    loc = [str(path)] if is_pkg else None
    mspec = importlib.util.spec_from_file_location(name, file, submodule_search_locations=loc)
    assert mspec is not None and mspec.loader is not None
    module = importlib.util.module_from_spec(mspec)
    sys.modules[name] = module
    mspec.loader.exec_module(module)
    return module


def _verl_dapo() -> Callable[[str], bool]:
    dapo = _verl_module("utils/reward_score/math_dapo.py", "verl.utils.reward_score.math_dapo")
    return lambda r: bool(dapo.compute_score(r, GOLD)["acc"])


def _prm800k() -> Callable[[str], bool]:
    prime = _verl_module("utils/reward_score/prime_math", "verl.utils.reward_score.prime_math")
    return lambda r: bool(prime.compute_score(r, GOLD)[0])


GRADERS: dict[str, Callable[[], Callable[[str], bool]]] = {
    "textgym": _textgym,
    "math-verify": _math_verify,
    "TRL accuracy_reward": _trl,
    "verifiers boxed": _verifiers,
    "verl DAPO": _verl_dapo,
    "PRM800K (verl)": _prm800k,
}


def main() -> None:
    """Score every response with every grader that is installed; print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="also write the verdicts here")
    args = ap.parse_args()
    graders, left_out = {}, {}
    for name, build in GRADERS.items():
        try:
            graders[name] = build()
        except Exception as e:  # a grader that is not installable here
            left_out[name] = f"{type(e).__name__}: {e}"
    rows = [("hack", k, v) for k, v in HACKS.items()] + [("legit", k, v) for k, v in LEGIT.items()]
    verdicts: dict[str, dict[str, bool]] = {name: {} for name in graders}
    for name, grade in graders.items():
        for _, label, response in rows:
            try:
                verdicts[name][label] = bool(grade(response))
            except Exception:  # a grader that raises on a response pays nothing for it
                verdicts[name][label] = False
    print(f'Question "{QUESTION}", gold {GOLD}. 1 = paid.\n')
    print("| response | kind | " + " | ".join(graders) + " |")
    print("|---|---|" + "---|" * len(graders))
    for kind, label, response in rows:
        marks = " | ".join("1" if verdicts[n][label] else "0" for n in graders)
        shown = response.replace("|", "\\|").replace("\n", " ")
        print(f"| `{shown}` ({label}) | {kind} | {marks} |")
    hacks_paid = {n: sum(verdicts[n][k] for k in HACKS) for n in graders}
    legit_paid = {n: sum(verdicts[n][k] for k in LEGIT) for n in graders}
    print(f"| **hacks paid (of {len(HACKS)})** | | " + " | ".join(str(hacks_paid[n]) for n in graders) + " |")
    print(
        f"| **legitimate paid (of {len(LEGIT)})** | | "
        + " | ".join(str(legit_paid[n]) for n in graders)
        + " |"
    )
    for name, why in left_out.items():
        print(f"\nleft out: {name} ({why})")
    if args.json:
        args.json.write_text(json.dumps({"verdicts": verdicts, "left_out": left_out}, indent=1))


if __name__ == "__main__":
    main()
