"""The dispatcher's context switches, as ``ContextVar``s (nestable; local to the thread or
asyncio task that entered them, and to a generator suspended inside the block).

* implicit replication (:func:`hyper_shard.experimental.implicit_replication`): plain
  tensors mixed with DTensors are taken as ``Replicate`` DTensors;
* the decomposition stack: the composite functions being run as their parts (for the
  not-registered message, which names the outermost public function).

The cache-hit path must not pay a ``ContextVar.get`` per call: :data:`ACTIVE` counts the
implicit-replication blocks open in any thread, and the hot path reads the ContextVar only
while that count is non-zero (then the slow path, which reads it, handles the call).

``loss_parallel()`` has its own ContextVar in :mod:`hyper_shard.rules.loss` (it changes no
decision, only what the loss kernel may do). Framework-neutral.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

__all__ = [
    "ACTIVE",
    "implicit_replication_enabled",
    "implicit_replication_block",
    "decomposing",
    "decomposition_stack",
]

_IMPLICIT: ContextVar[bool] = ContextVar("hyper_shard_implicit_replication", default=False)
_DECOMPOSING: ContextVar[tuple[str, ...]] = ContextVar("hyper_shard_decomposing", default=())
_LOCK = threading.Lock()


class _Active:
    """How many switch blocks are open in the whole process (any thread): the hot path's
    one cheap test (``if ACTIVE.n``)."""

    __slots__ = ("n",)

    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> None:
        with _LOCK:
            self.n += k


ACTIVE = _Active()


def implicit_replication_enabled() -> bool:
    """True inside :func:`hyper_shard.experimental.implicit_replication` in this context."""
    return _IMPLICIT.get()


@contextmanager
def implicit_replication_block(on: bool = True) -> Iterator[None]:
    """Set implicit replication for the block (restored on exit, also on error)."""
    token = _IMPLICIT.set(on)
    ACTIVE.add(1)
    try:
        yield
    finally:
        ACTIVE.add(-1)
        _IMPLICIT.reset(token)


@contextmanager
def decomposing(name: str) -> Iterator[None]:
    """Record that composite function ``name`` runs as its parts inside the block."""
    token = _DECOMPOSING.set((*_DECOMPOSING.get(), name))
    try:
        yield
    finally:
        _DECOMPOSING.reset(token)


def decomposition_stack() -> tuple[str, ...]:
    """The composite functions being decomposed in this context, outermost first."""
    return _DECOMPOSING.get()
