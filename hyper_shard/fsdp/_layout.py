"""Which bytes go where: the flat-buffer layout of one FSDP unit (pure planning).

A unit's parameters are sharded along dim 0 over the ``n`` ranks of the shard mesh dim
with ``torch.chunk`` semantics (every chunk ``ceil(rows / n)`` rows except the last
non-empty one; trailing chunks may be empty). One collective moves the whole unit:

* **all-gather**: rank ``c`` writes its shard of parameter ``i`` into slot ``i`` of its
  chunk of the flat buffer (``n * S`` elements, chunk ``c`` at ``c * S``); each slot has
  room for the largest shard (``ceil(rows_i / n) * row_numel_i`` elements) so every rank's
  chunk has the same size ``S``. After the collective, parameter ``i``'s rows from
  coordinate ``c`` are at ``c * S + offset_i``; copied out rank-major into a buffer of
  ``n * slot_i`` elements, its first ``numel_i`` elements are the unsharded parameter.
* **reduce-scatter**: the gradients, chunked the same way (pad rows zero), laid out
  rank-major (``pack_chunks``); after the collective, this rank's flat ``S`` elements hold
  every parameter's reduced shard at its slot offset.

Everything here is plain integers: no framework, no process group.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import NamedTuple

from ..spec import chunk_sizes

__all__ = ["ParamSlot", "FlatLayout"]


class ParamSlot(NamedTuple):
    """One parameter's place in a unit's flat buffers.

    Attributes:
        shape: the unsharded shape (what the module computes with; a tensor-parallel
            parameter's local shape).
        rows: ``torch.chunk`` rows of dim 0 held by each shard coordinate.
        row_numel: elements per row (``prod(shape[1:])``).
        offset: start of the slot in each rank's chunk of the flat buffer.
    """

    shape: tuple[int, ...]
    rows: tuple[int, ...]
    row_numel: int
    offset: int

    @property
    def slot_numel(self) -> int:
        """Elements reserved per rank (the largest shard)."""
        return self.rows[0] * self.row_numel

    @property
    def numel(self) -> int:
        """Elements of the unsharded parameter."""
        return math.prod(self.shape)

    def row_start(self, c: int) -> int:
        """First unsharded row held by coordinate ``c``."""
        return sum(self.rows[:c])

    def shard_shape(self, c: int) -> tuple[int, ...]:
        """Shape of coordinate ``c``'s shard."""
        return (self.rows[c], *self.shape[1:])

    def shard_numel(self, c: int) -> int:
        return self.rows[c] * self.row_numel


class FlatLayout:
    """The slots of a unit's parameters over ``n`` shard ranks (see the module docstring).

    Args:
        shapes: each parameter's unsharded shape (rank >= 1).
        n: ranks of the shard mesh dim.

    Raises:
        ValueError: a 0-d shape, or ``n < 1``.
    """

    __slots__ = ("n", "slots", "chunk_numel")

    def __init__(self, shapes: Sequence[Sequence[int]], n: int) -> None:
        if n < 1:
            raise ValueError(f"FlatLayout: n must be >= 1, got {n}")
        slots = []
        off = 0
        for shape in shapes:
            shape = tuple(int(s) for s in shape)
            if not shape:
                raise ValueError("FlatLayout: a 0-d parameter cannot be sharded along dim 0")
            row = math.prod(shape[1:])
            rows = tuple(chunk_sizes(shape[0], n))
            slot = ParamSlot(shape, rows, row, off)
            slots.append(slot)
            off += slot.slot_numel
        self.n = n
        self.slots: tuple[ParamSlot, ...] = tuple(slots)
        self.chunk_numel = off

    @property
    def total_numel(self) -> int:
        """Elements of the whole flat buffer (``n * S``)."""
        return self.n * self.chunk_numel

    def flat_index(self, i: int, unsharded_index: int) -> int:
        """Where element ``unsharded_index`` (row-major) of parameter ``i`` sits in the
        gathered flat buffer."""
        slot = self.slots[i]
        row, col = divmod(unsharded_index, slot.row_numel) if slot.row_numel else (0, 0)
        c, start = 0, 0
        while row >= start + slot.rows[c]:
            start += slot.rows[c]
            c += 1
        return c * self.chunk_numel + slot.offset + (row - start) * slot.row_numel + col

    def __repr__(self) -> str:
        return f"FlatLayout(n={self.n}, S={self.chunk_numel}, params={len(self.slots)})"
