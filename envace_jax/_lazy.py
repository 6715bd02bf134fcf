"""Lazy re-exports for the package ``__init__`` files.

A package lists ``{name: home module}`` and gets a module ``__getattr__`` that imports a name's home on
first use. So ``import envace_jax.chat`` (host code: plain Python) never pulls in jax just because
``envace_jax`` also offers the model, and ``from envace_jax.rl.advantages import ...`` does not import
every other RL module. tests/test_layering.py reads these tables as imports of their home modules.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package``, resolving each name of ``exports`` from its module."""

    def __getattr__(name: str) -> Any:
        home = exports.get(name)
        if home is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(home), name)
        setattr(importlib.import_module(package), name, value)  # later lookups skip this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
