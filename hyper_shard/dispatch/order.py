"""Shard orders through a decision (cache-miss path only; no framework import).

Rules speak placements. When an input spec carries a ``shard_order`` (a tensor dim split by
several mesh dims in an order other than left to right, e.g. an FSDP-over-TP weight),
the decision completes the rule's answer:

* A rule that declares ``keeps_shard_order`` (its local kernel works on local data only and
  every output shard comes from an input shard on the same mesh dims: pointwise, foreach,
  reductions, einsum, fills/copies, ``*_like`` factories, random fills) keeps orders: each
  input keeps its order where its placements stay, and an output dim sharded by several
  mesh dims takes the order of the input dim those shards come from. Inputs that would
  meet in one output dim with different orders are redistributed to the first one's
  (for an in-place op, ``self``'s).
* Any other rule is given left-to-right specs: ordered inputs are first redistributed to
  the left-to-right layout of the placements the rule asks for, so a rule that computes
  offsets from placements stays exact.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..placement import Shard
from ..spec import DTensorSpec, ShardOrder, ShardOrderEntry

__all__ = ["any_ordered", "left_to_right_call_specs", "ordered_targets"]


def any_ordered(specs: Sequence[DTensorSpec]) -> bool:
    """True when some spec has a non-default shard order."""
    for s in specs:
        if s.shard_order is not None:
            return True
    return False


def left_to_right_call_specs(specs: Sequence[DTensorSpec]) -> list[DTensorSpec]:
    """The specs a rule that does not keep shard orders decides on."""
    return [s if s.shard_order is None else s.with_placements(s.placements, None) for s in specs]


def ordered_targets(
    specs: Sequence[DTensorSpec],
    targets: Sequence[Sequence | None],
    outputs: Sequence[Sequence | None],
    keeps: bool,
    sources: Sequence[Sequence[int]] | None = None,
) -> tuple[list[DTensorSpec], list[ShardOrder | None]]:
    """Every input's target spec and every output's shard order.

    Args:
        specs: the inputs' actual specs.
        targets: the rule's target placements per input (None: as is).
        outputs: the rule's output placements (None: not a tensor).
        keeps: the rule keeps shard orders (see the module docstring).
        sources: per output, the inputs its shards come from (default: every input).
    """
    dst: list[DTensorSpec] = []
    for s, t in zip(specs, targets):
        pl = s.placements if t is None else tuple(t)
        dst.append(s.with_placements(pl) if keeps else s.with_placements(pl, None))
    if not keeps:
        return dst, [None] * len(outputs)
    orders: list[ShardOrder | None] = []
    for o, out in enumerate(outputs):
        if out is None:
            orders.append(None)
            continue
        srcs = range(len(specs)) if sources is None else sources[o]
        entries = []
        for d_out in range(max((p.dim for p in out if type(p) is Shard), default=-1) + 1):
            mdims = [m for m, p in enumerate(out) if type(p) is Shard and p.dim == d_out]
            if len(mdims) < 2:
                continue
            chosen: tuple[int, ...] | None = None
            for i in srcs:
                d_in = _source_dim(dst[i], mdims)
                if d_in is None:
                    continue
                mine = tuple(m for m in dst[i].split_order(d_in) if m in mdims)
                if chosen is None:
                    chosen = mine
                elif mine != chosen:  # make input i split like the first source
                    dst[i] = _reordered(dst[i], d_in, mdims, chosen)
            if chosen is not None and list(chosen) != mdims:
                entries.append(ShardOrderEntry(d_out, chosen))
        orders.append(tuple(entries) or None)
    return dst, orders


def _source_dim(spec: DTensorSpec, mdims: Sequence[int]) -> int | None:
    """The one tensor dim of ``spec`` that every mesh dim of ``mdims`` shards, else None."""
    dims = set()
    for m in mdims:
        p = spec.placements[m]
        if type(p) is not Shard:
            return None
        dims.add(p.dim)
    return dims.pop() if len(dims) == 1 else None


def _reordered(
    spec: DTensorSpec, d: int, mdims: Sequence[int], order: tuple[int, ...]
) -> DTensorSpec:
    """``spec`` with the mesh dims ``mdims`` of tensor dim ``d`` splitting in ``order``
    (other mesh dims of ``d`` keep their positions)."""
    cur = list(spec.split_order(d))
    it = iter(order)
    new = tuple(next(it) if m in mdims else m for m in cur)
    entries = [e for e in (spec.shard_order or ()) if e.tensor_dim != d]
    entries.append(ShardOrderEntry(d, new))
    return spec.with_placements(spec.placements, tuple(entries))
