"""Which global slices each rank owns (to write) and needs (to read), framework-neutrally.

On torch, DCP plans this itself from the DTensors' protocol methods; this module plans
the same for platforms without DCP (MindSpore): every rank computes the same plan from
the boxes every rank holds (one all-gather of small metadata, which also finds the
replicas of a DTensor that lives on a sub-mesh).

* :func:`chunk_of`: the global box of the shard a mesh coordinate holds (the spec's own
  ``torch.chunk`` layout; ``Partial`` mesh dims hold whole values, reduced before saving).
* :func:`holders`: every box of one spec and the ranks of its mesh holding it.
* :func:`assign_writers`: one writer per distinct box among the ranks holding it (its
  replicas), balancing bytes greedily, deterministic, like DCP's ``dedup_save_plans``.
* :func:`read_boxes`: the overlaps of a target box with the saved chunks: which slice of
  which chunk lands where (as DCP's ``create_read_items_for_chunk_list``).

This module imports no framework.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import NamedTuple

from ..spec import DTensorSpec

__all__ = ["Chunk", "chunk_of", "holders", "assign_writers", "read_boxes", "Read"]


class Chunk(NamedTuple):
    """A box of a global tensor: its global offsets and sizes."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def numel(self) -> int:
        return math.prod(self.sizes)


def chunk_of(spec: DTensorSpec, coordinate: Sequence[int]) -> Chunk | None:
    """The box held at mesh ``coordinate``; None for an empty shard of a non-empty tensor."""
    sizes, offsets = spec.local_shape_and_offset(tuple(coordinate))
    if spec.ndim and 0 in sizes and 0 not in spec.shape:
        return None
    return Chunk(tuple(offsets), tuple(sizes))


def holders(spec: DTensorSpec) -> dict[Chunk, list[int]]:
    """Every distinct box of ``spec`` -> the global ranks holding it (ascending)."""
    mesh = spec.mesh
    out: dict[Chunk, list[int]] = {}
    for coord in itertools.product(*(range(n) for n in mesh.shape)):
        c = chunk_of(spec, coord)
        if c is None:
            continue
        flat = sum(i * math.prod(mesh.shape[d + 1 :]) for d, i in enumerate(coord))
        out.setdefault(c, []).append(mesh.ranks[flat])
    for ranks in out.values():
        ranks.sort()
    return out


def assign_writers(
    items: Sequence[tuple[str, Chunk, Sequence[int], int]],
) -> dict[tuple[str, Chunk], int]:
    """Pick one writer per ``(key, box)`` among its holders, balancing bytes.

    Args:
        items: ``(key, box, holder ranks, bytes)``, in the same order on every rank.

    Returns:
        ``(key, box) -> writer rank``: the holder with the fewest bytes assigned so far
        (lowest rank on ties), larger items placed first.
    """
    load: dict[int, int] = {}
    out: dict[tuple[str, Chunk], int] = {}
    order = sorted(range(len(items)), key=lambda i: (-items[i][3], i))
    for i in order:
        key, box, ranks, nbytes = items[i]
        r = min(ranks, key=lambda x: (load.get(x, 0), x))
        load[r] = load.get(r, 0) + nbytes
        out[(key, box)] = r
    return out


class Read(NamedTuple):
    """One slice to read: from saved chunk ``chunk`` (index in its key's chunk list), the
    slice at ``src`` (relative to the chunk) of ``lengths``, into ``dst`` relative to the
    target box."""

    chunk: int
    src: tuple[int, ...]
    dst: tuple[int, ...]
    lengths: tuple[int, ...]


def read_boxes(saved: Sequence[Chunk], target: Chunk) -> list[Read]:
    """The slices of the ``saved`` chunks that overlap ``target`` (every element of the
    target comes from exactly one, if the saved chunks tile the tensor)."""
    out = []
    for ci, c in enumerate(saved):
        src, dst, lengths = [], [], []
        for so, ss, to, ts in zip(c.offsets, c.sizes, target.offsets, target.sizes):
            lo, hi = max(so, to), min(so + ss, to + ts)
            if hi <= lo:
                break
            src.append(lo - so)
            dst.append(lo - to)
            lengths.append(hi - lo)
        else:
            if c.numel or not target.numel:
                out.append(Read(ci, tuple(src), tuple(dst), tuple(lengths)))
    return out
