"""Sharding-rule families: each module is one family usable from YAML alone.

``RULES`` maps a YAML ``rule:`` name to its DistributedOp subclass; a family registers
itself with :func:`register_rule`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from ..dispatch.op import DistributedOp

__all__ = ["RULES", "register_rule"]

RULES: dict[str, type[DistributedOp]] = {}

T = TypeVar("T", bound=type[DistributedOp])


def register_rule(name: str) -> Callable[[T], T]:
    """Class decorator: make a DistributedOp subclass available as ``rule: name``."""

    def deco(cls: T) -> T:
        if name in RULES and RULES[name] is not cls:
            raise ValueError(f"rule {name!r} is already registered by {RULES[name].__name__}")
        RULES[name] = cls
        return cls

    return deco


def _load_families() -> None:
    import importlib
    import pkgutil

    for mod in pkgutil.iter_modules(__path__):
        if not mod.name.startswith("_"):
            importlib.import_module(f"{__name__}.{mod.name}")


_load_families()
