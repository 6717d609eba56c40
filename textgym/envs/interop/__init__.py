"""Other ecosystems' environments as textgym envs (the optional `[interop]` extra).

Each id is registered on `import textgym.envs`; its module imports the other library only when
the env is made, so textgym works without the extra and the error names what to install.

| id | library | module |
|---|---|---|
| `textgym/ReasoningGym-v0` | reasoning-gym | `textgym.envs.interop.reasoning_gym` |
| `textgym/TextWorld-v0` | textworld | `textgym.envs.interop.textworld` |
| `textgym/TextArena-v0` | textarena | `textgym.envs.interop.textarena` |
| `textgym/OpenEnv-v0` | openenv-core (client: httpx) | `textgym.envs.interop.openenv` |
"""

from __future__ import annotations

from gymnasium.envs.registration import register

INTEROP_IDS = (
    "textgym/ReasoningGym-v0",
    "textgym/TextWorld-v0",
    "textgym/TextArena-v0",
    "textgym/OpenEnv-v0",
)
"""The ids of this package: each needs its library (the extra) and kwargs (dataset=, game=, base_url=)."""


def register_interop() -> None:
    """Register the interop ids (entry points are import strings: nothing heavy is imported here)."""
    register(id="textgym/ReasoningGym-v0", entry_point="textgym.envs.interop.reasoning_gym:ReasoningGymEnv")
    register(id="textgym/TextWorld-v0", entry_point="textgym.envs.interop.textworld:TextWorldEnv")
    register(id="textgym/TextArena-v0", entry_point="textgym.envs.interop.textarena:TextArenaEnv")
    register(id="textgym/OpenEnv-v0", entry_point="textgym.envs.interop.openenv:OpenEnvEnv")


def require(package: str, import_name: str) -> None:
    """Raise an ImportError that says how to install `package` when `import_name` is missing.

    Raises:
        ImportError: naming the pip command (`pip install 'textgym[interop]'`).
    """
    import importlib.util

    if importlib.util.find_spec(import_name) is None:
        raise ImportError(
            f"this environment needs the {package!r} package: pip install 'textgym[interop]' "
            f"(or pip install {package})"
        )
