"""Lazy package exports (PEP 562): a package `__init__` names its public classes without importing them."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def lazy_exports(package: str, exports: dict[str, str]) -> Callable[[str], object]:
    """A module `__getattr__` that imports `exports[name]` on first use and returns its `name`.

    Args:
        package: the package's dotted name (for the error message).
        exports: public name -> the dotted module that defines it.

    Returns:
        The function to bind as the package's `__getattr__`.

    Raises:
        AttributeError: (from the returned function) for a name not in `exports`.
    """

    def module_getattr(name: str) -> object:
        if name in exports:
            return getattr(importlib.import_module(exports[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return module_getattr
