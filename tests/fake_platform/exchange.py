"""Collectives between threads: the ranks of one simulated world meet in an
:class:`Exchange`; a :class:`SimGroup` is one rank's view of a communication group."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from hyper_shard.platform.base import GroupRanks

__all__ = ["Exchange", "SimGroup"]


class Exchange:
    """Where the threads of one world meet. Every collective is one all-gather of python
    objects within a group: each member deposits its value, all wait, all read, all wait
    (so the slot is free for the group's next collective)."""

    def __init__(self, world: int) -> None:
        self.world = world
        self._lock = threading.Lock()
        self._slots: dict[tuple[int, ...], dict[int, Any]] = {}
        self._barriers: dict[tuple[int, ...], threading.Barrier] = {}

    def gather(self, group: SimGroup, value: Any) -> list[Any]:
        """Every member's ``value``, in the group's mesh-coordinate order."""
        key = group.ranks
        if len(key) == 1:
            return [value]
        with self._lock:
            bar = self._barriers.setdefault(key, threading.Barrier(len(key), timeout=60))
            slot = self._slots.setdefault(key, {})
        slot[group.me] = value
        bar.wait()
        out = [slot[r] for r in key]
        bar.wait()
        return out

    def abort(self) -> None:
        """Release every waiting thread (a rank failed): their collectives raise."""
        with self._lock:
            for b in self._barriers.values():
                b.abort()


class SimGroup(GroupRanks):
    """A group's ranks (mesh-coordinate order), the rank holding this view and the
    exchange its collectives go through."""

    __slots__ = ("me", "exchange")

    def __init__(self, ranks: Sequence[int], me: int, exchange: Exchange) -> None:
        super().__init__(ranks)
        self.me = me
        self.exchange = exchange

    @property
    def coordinate(self) -> int:
        """This rank's index in the group."""
        return self.ranks.index(self.me)

    def __repr__(self) -> str:
        return f"SimGroup({list(self.ranks)}, me={self.me})"
