"""The `Examples:` sections of the environments' and verifiers' docstrings run as doctests.

They are what the docs site shows on the Environments and Verifiers pages and in the API
reference, so each one runs here against the real components (bubblewrap for the code
envs and `CodeVerifier`, the local web site for WebShop and WikiSearch).
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import io

import gymnasium as gym
import pytest

import textgym  # registers the textgym/ ids
import textgym.verifiers

MODULES = (
    "textgym.envs.arithmetic",
    "textgym.envs.base",
    "textgym.envs.registry",
    "textgym.envs.code",
    "textgym.envs.latency",
    "textgym.envs.math_qa",
    "textgym.envs.tool_use",
    "textgym.envs.web.envs",
    "textgym.envs.wordle",
    "textgym.envs.guess_number",
    "textgym.verifiers.answer_rule",
    "textgym.verifiers.answer_text",
    "textgym.verifiers.base",
    "textgym.verifiers.code",
    "textgym.verifiers.expression_forms",
    "textgym.verifiers.extraction",
    "textgym.verifiers.format",
    "textgym.verifiers.hack_telemetry",
    "textgym.verifiers.judge",
    "textgym.verifiers.judge_prompts",
    "textgym.verifiers.judge_verdict",
    "textgym.verifiers.math",
    "textgym.verifiers.math_pool",
    "textgym.verifiers.question_expressions",
    "textgym.verifiers.restatement",
    "textgym.evaluation.audit_set",
    "textgym.agents.trajectory",
)
# The other ecosystems' envs (the `[interop]` extra): their examples run where the library is installed.
INTEROP = {
    "textgym.envs.interop.reasoning_gym": "reasoning_gym",
    "textgym.envs.interop.textarena": "textarena",
    "textgym.envs.interop.textworld": "textworld",
    "textgym.envs.interop.openenv": "openenv",
}
MODULES += tuple(m for m, lib in INTEROP.items() if importlib.util.find_spec(lib) is not None)
# Data types and protocols: nothing to run.
NO_EXAMPLE = {"Score", "RubricTerm", "Verifier", "JudgeItem"}


def _doctests() -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    tests = []
    for name in MODULES:
        tests += [t for t in finder.find(importlib.import_module(name)) if t.examples]
    return sorted(tests, key=lambda t: t.name)


DOCTESTS = _doctests()
# Examples that run code in the sandbox (bubblewrap): the code envs, CodeVerifier, and ToolMath
# (its python tool starts the sandbox when the env is made).
NEEDS_SANDBOX = (
    "textgym.envs.code.",
    "textgym.verifiers.code.CodeVerifier",
    "textgym.envs.tool_use.make_tool_math",
)
PARAMS = [
    pytest.param(t, id=t.name, marks=[pytest.mark.sandbox] if t.name.startswith(NEEDS_SANDBOX) else [])
    for t in DOCTESTS
]


@pytest.mark.parametrize("test", PARAMS)
def test_the_docstring_examples_run(test: doctest.DocTest) -> None:
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
    result = runner.run(test, out=out.write)
    assert result.failed == 0, out.getvalue()
    assert result.attempted == len(test.examples) > 0


def test_every_registered_env_and_every_verifier_has_a_runnable_example() -> None:
    sources = "\n".join(e.source for t in DOCTESTS for e in t.examples)
    with_examples = {t.name for t in DOCTESTS}
    for env_id, spec in gym.registry.items():
        if not env_id.startswith("textgym/") or "Feedback" in env_id:  # Feedback: HumanEval's/MBPP's class
            continue
        module, attr = str(spec.entry_point).split(":")
        if module in INTEROP and module not in MODULES:  # the extra is not installed here
            continue
        assert f"{module}.{attr}" in with_examples or f'"{env_id}"' in sources, env_id
    for name in textgym.verifiers.__all__:
        obj = getattr(textgym.verifiers, name)
        if name not in NO_EXAMPLE:
            assert f"{obj.__module__}.{name}" in with_examples, name
