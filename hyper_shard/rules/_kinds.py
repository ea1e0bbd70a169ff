"""One table of ``kind``s per rule family (``rule: tensor_op`` / ``view`` / ``index``).

A family whose YAML entries pick an op with ``kind:`` keeps, per kind, its canonical
signature, its static arguments and the method that plans it, in one :class:`KindTable`.
A new kind is one decorated method; the YAML ``kind`` field is validated against the
table (the error lists the known kinds). Framework-neutral.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = ["Kind", "KindTable"]

F = TypeVar("F", bound=Callable[..., Any])


@dataclass(frozen=True)
class Kind:
    """One kind of a family.

    Attributes:
        name: the YAML ``kind`` value.
        signature: canonical positional argument names (torch's names).
        static: the arguments whose values enter the cache key and reach the rule.
        plan: the unbound method that plans a call of this kind.
    """

    name: str
    signature: tuple[str, ...]
    static: tuple[str, ...]
    plan: Callable[..., Any]


class KindTable:
    """The kinds of one rule family, by name.

    Args:
        family: the family's ``rule:`` name (for error messages).
    """

    def __init__(self, family: str) -> None:
        self.family = family
        self._kinds: dict[str, Kind] = {}

    def kind(
        self, name: str, signature: tuple[str, ...], static: tuple[str, ...]
    ) -> Callable[[F], F]:
        """Method decorator: register the decorated planner as kind ``name`` (stack several
        for aliases sharing one planner)."""

        def deco(fn: F) -> F:
            if name in self._kinds:
                raise ValueError(f"rule {self.family!r}: kind {name!r} is defined twice")
            self._kinds[name] = Kind(name, tuple(signature), tuple(static), fn)
            return fn

        return deco

    def __getitem__(self, name: str) -> Kind:
        return self._kinds[name]

    def __contains__(self, name: object) -> bool:
        return name in self._kinds

    def names(self) -> tuple[str, ...]:
        """Every kind's name, in definition order."""
        return tuple(self._kinds)

    def validate(self, name: str) -> str:
        """``name`` if it is a kind of this family (the pydantic field validator).

        Raises:
            ValueError: an unknown kind, listing the known ones.
        """
        if name not in self._kinds:
            raise ValueError(
                f"unknown kind {name!r} for rule {self.family!r}; known kinds: "
                f"{', '.join(self._kinds)}"
            )
        return name
