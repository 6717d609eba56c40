"""Every registry is one `Registry`: the same lookup error, duplicate refusal and sorted names."""

from __future__ import annotations

import pickle
import subprocess
import sys
import types

import pytest

from textgym.algorithms.preference_losses import PAIR_LOSSES
from textgym.algorithms.registry import ADVANTAGES, POLICY_LOSSES, Registry, UnknownNameError
from textgym.stages.registry import STAGES

REGISTRIES = {
    "advantages": (ADVANTAGES, {"grpo", "rloo", "reinforce_pp", "grpo_process"}),
    "policy_losses": (POLICY_LOSSES, {"ppo_clip", "gspo", "gspo_token", "cispo"}),
    "pair_losses": (PAIR_LOSSES, {"dpo", "ipo", "simpo", "orpo"}),
    "stages": (STAGES, {"sft", "grpo", "ppo", "dpo", "rft", "online_dpo"}),
}
EXPECTED_TEXT = {
    "advantages": "advantage_estimator: unknown advantage estimator 'nope'; registered: grpo, "
    "grpo_process, reinforce_pp, rloo (add one with @register_advantage from textgym.algorithms.registry)",
    "pair_losses": "loss: unknown pair loss 'nope'; registered: dpo, ipo, orpo, simpo (add one with "
    "@register_pair_loss from textgym.algorithms.preference_losses)",
}


@pytest.mark.parametrize("which", sorted(REGISTRIES))
def test_every_registry_answers_an_unknown_name_with_one_error_naming_the_known_ones(which):
    registry, built_ins = REGISTRIES[which]
    with pytest.raises(UnknownNameError) as caught:
        registry.get("nope")
    e = caught.value
    assert isinstance(e, KeyError) and isinstance(e, ValueError)  # callers catching either still do
    assert (e.name, e.kind, e.field) == ("nope", registry.kind, registry.field)
    assert e.known == registry.names() and built_ins <= set(e.known)
    where = f"{registry.field}: " if registry.field else ""
    assert str(e) == (
        f"{where}unknown {registry.kind} 'nope'; registered: {', '.join(registry.names())} "
        f"(add one with {registry.add_with})"
    )
    assert not str(e).startswith(("'", '"'))  # not KeyError's quoted repr
    again = pickle.loads(pickle.dumps(e))  # e.g. from a rollout process
    assert type(again) is UnknownNameError and str(again) == str(e)
    if which in EXPECTED_TEXT:  # only built-ins there: the whole text is known
        assert str(e) == EXPECTED_TEXT[which]


@pytest.mark.parametrize("which", sorted(REGISTRIES))
def test_every_registry_lists_its_built_ins_sorted_and_refuses_a_second_entry_under_a_name(which):
    registry, built_ins = REGISTRIES[which]
    names = registry.names()
    assert names == sorted(names) and built_ins <= set(names)
    assert all(name in registry for name in built_ins) and "nope" not in registry
    name = sorted(built_ins)[0]
    taken = registry.get(name)
    with pytest.raises(
        ValueError, match=rf"^{registry.kind} '{name}' is already registered \(.*replace=True"
    ):
        registry.register(name)(object())
    assert registry.get(name) is taken
    assert registry.register(name)(taken) is taken  # the same object again: a no-op


def test_a_registry_registers_gets_replaces_and_unregisters():
    reg: Registry[object] = Registry("number", "n", "@reg.register")
    assert reg.names() == [] and "one" not in reg
    with pytest.raises(ValueError, match="a number needs a name"):
        reg.register("")

    @reg.register("one")
    def one() -> int:
        return 1

    reg.register("two")(2)
    assert reg.names() == ["one", "two"] and "one" in reg and reg.get("one") is one
    with pytest.raises(ValueError, match=r"number 'two' is already registered \(2\)"):
        reg.register("two")(3)
    reg.register("two", replace=True)(3)
    assert reg.get("two") == 3
    reg.unregister("two")
    reg.unregister("never")  # absent: nothing to do
    with pytest.raises(UnknownNameError, match=r"^n: unknown number 'two'; registered: one \(add one with "):
        reg.get("two")
    empty: Registry[int] = Registry("thing", "", "x")
    with pytest.raises(KeyError) as caught:
        empty.get("a")
    assert str(caught.value) == "unknown thing 'a'; registered: none (add one with x)"


def test_a_registry_imports_the_modules_that_register_its_built_ins_before_the_first_lookup(
    tmp_path, monkeypatch
):
    home = types.ModuleType("registry_home_for_test")
    home.REG = Registry("thing", "t", "x", modules=["late_entries_for_test"])  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "registry_home_for_test", home)
    reg = home.REG  # type: ignore[attr-defined]
    with pytest.raises(ModuleNotFoundError, match="late_entries_for_test"):
        reg.names()  # the module is missing: the error, and the next lookup tries again
    (tmp_path / "late_entries_for_test.py").write_text(
        "import registry_home_for_test as home\nhome.REG.register('late')(7)\n", encoding="utf-8"
    )
    monkeypatch.syspath_prepend(tmp_path)
    monkeypatch.delitem(sys.modules, "late_entries_for_test", raising=False)
    reg.register("early")(1)  # registering imports nothing
    assert "late_entries_for_test" not in sys.modules
    assert reg.get("late") == 7 and reg.names() == ["early", "late"]


def test_a_fresh_interpreter_sees_the_built_in_estimators_and_losses_without_importing_their_modules():
    code = (
        "from textgym.algorithms.registry import ADVANTAGES, POLICY_LOSSES\n"
        "print(ADVANTAGES.names(), POLICY_LOSSES.names())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == (
        "['grpo', 'grpo_process', 'reinforce_pp', 'rloo'] ['cispo', 'gspo', 'gspo_token', 'ppo_clip']"
    )
