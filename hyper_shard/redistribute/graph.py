"""The placement-state graph of one tensor geometry, shared by the planner and the search.

A geometry is (global shape, mesh shape, itemsize, reachable partial ops, cost model).
Placements are coded as small ints (``0`` = Replicate, ``1 + d`` = Shard(d), then one code
per partial op) and a state is a tuple of codes, one per mesh dim. Each state's outgoing
steps (next state, cost, mesh dim, kind) are computed once and kept, so the many searches
that touch the same geometry (every layer of a model has the same shapes) cost little.

The legal steps and their costs come from the step table,
:mod:`hyper_shard.redistribute.steps`.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import suppress

from ..placement import Partial, Placement, Replicate, Shard
from .cost import CostModel
from .steps import STEPS_FROM, StepKind

__all__ = ["PlacementGraph", "OrderedPlacementGraph", "graph_for"]


class PlacementGraph:
    """States and steps of one geometry (see the module docstring)."""

    __slots__ = (
        "shape",
        "mesh_shape",
        "itemsize",
        "ops",
        "cm",
        "ndim",
        "placements",
        "_code",
        "_edges",
        "_bytes",
        "_dist",
        "_move_cache",
    )

    def __init__(
        self,
        shape: tuple[int, ...],
        mesh_shape: tuple[int, ...],
        itemsize: int,
        ops: tuple[str, ...],
        cost_model: CostModel,
    ) -> None:
        self.shape = shape
        self.mesh_shape = mesh_shape
        self.itemsize = itemsize
        self.ops = ops
        self.cm = cost_model
        self.ndim = len(shape)
        self.placements: list[Placement] = [
            Replicate(),
            *[Shard(d) for d in range(self.ndim)],
            *[Partial(o) for o in ops],
        ]
        self._code = {p: i for i, p in enumerate(self.placements)}
        self._edges: dict[tuple[int, ...], list[tuple[tuple[int, ...], float, int, str]]] = {}
        self._bytes: dict[tuple[int, ...], int] = {}
        self._dist: dict[tuple[int, ...], dict[tuple[int, ...], float]] = {}
        self._move_cache: dict[tuple[int, frozenset[int]], list[tuple[StepKind, int]]] = {}

    def encode(self, placements: Sequence[Placement]) -> tuple[int, ...]:
        """Codes of normalised placements (KeyError for a partial op outside ``ops``)."""
        return tuple(self._code[p] for p in placements)

    def decode(self, state: tuple[int, ...]) -> tuple[Placement, ...]:
        pl = self.placements
        return tuple(pl[c] for c in state)

    def nbytes(self, state: tuple[int, ...]) -> int:
        """Bytes of the largest local shard in ``state``."""
        v = self._bytes.get(state)
        if v is None:
            ext = list(self.shape)
            nd = self.ndim
            for m, c in enumerate(state):
                if 1 <= c <= nd:
                    ext[c - 1] = -(-ext[c - 1] // self.mesh_shape[m])
            v = self._bytes[state] = math.prod(ext) * self.itemsize
        return v

    def edges(self, state: tuple[int, ...]) -> list[tuple[tuple[int, ...], float, int, str]]:
        """Every legal step from ``state``: (next state, cost, mesh dim, kind), as the step
        table (:data:`~hyper_shard.redistribute.steps.STEPS`) defines them."""
        e = self._edges.get(state)
        if e is not None:
            return e
        nd = self.ndim
        out: list[tuple[tuple[int, ...], float, int, str]] = []
        bs = self.nbytes(state)
        ms = self.mesh_shape
        cm = self.cm
        for m, c in enumerate(state):
            # tensor dims sharded by mesh dims to the right (shards nest left to right)
            blocked = frozenset(x - 1 for x in state[m + 1 :] if 1 <= x <= nd)
            for kind, q in self._moves(c, blocked):
                t = state[:m] + (q,) + state[m + 1 :]
                out.append((t, kind.cost(cm, m, ms[m], bs, self.nbytes(t)), m, kind.name))
        self._edges[state] = out
        return out

    def _moves(self, c: int, blocked: frozenset[int]) -> list[tuple[StepKind, int]]:
        """(kind, target code) of every step from placement code ``c`` on a mesh dim whose
        right-hand mesh dims shard the tensor dims ``blocked`` (kept per graph)."""
        key = (c, blocked)
        mv = self._move_cache.get(key)
        if mv is None:
            p = self.placements[c]
            code = self._code
            mv = self._move_cache[key] = [
                (kind, code[q])
                for kind in STEPS_FROM[type(p)]
                for q in kind.targets(p, self.ndim, blocked, self.ops)
            ]
        return mv

    def shortest(
        self, src: tuple[int, ...], dst: tuple[int, ...]
    ) -> tuple[float, list[tuple[int, int, int, str]]]:
        """Dijkstra from ``src`` to ``dst``: (cost, [(mesh dim, from code, to code, kind)])."""
        if src == dst:
            return 0.0, []
        dist = {src: 0.0}
        prev: dict[tuple[int, ...], tuple[tuple[int, ...], int, str]] = {}
        heap: list[tuple[float, int, tuple[int, ...]]] = [(0.0, 0, src)]
        done: set[tuple[int, ...]] = set()
        n = 0
        while heap:
            c, _, s = heapq.heappop(heap)
            if s in done:
                continue
            if s == dst:
                steps = []
                while s != src:
                    p, m, kind = prev[s]
                    steps.append((m, p[m], s[m], kind))
                    s = p
                steps.reverse()
                return c, steps
            done.add(s)
            for t, w, m, kind in self.edges(s):
                if t in done:
                    continue
                nc = c + w
                if nc < dist.get(t, math.inf):
                    dist[t] = nc
                    prev[t] = (s, m, kind)
                    n += 1
                    heapq.heappush(heap, (nc, n, t))
        raise RuntimeError(f"no path from {self.decode(src)} to {self.decode(dst)}")  # unreachable

    def distances(self, src: tuple[int, ...]) -> dict[tuple[int, ...], float]:
        """Cost of the cheapest plan from ``src`` to every state (single-source Dijkstra,
        kept per source)."""
        d = self._dist.get(src)
        if d is not None:
            return d
        dist = {src: 0.0}
        done: dict[tuple[int, ...], float] = {}
        heap: list[tuple[float, int, tuple[int, ...]]] = [(0.0, 0, src)]
        n = 0
        while heap:
            c, _, s = heapq.heappop(heap)
            if s in done:
                continue
            done[s] = c
            for t, w, _m, _k in self.edges(s):
                if t in done:
                    continue
                nc = c + w
                if nc < dist.get(t, math.inf):
                    dist[t] = nc
                    n += 1
                    heapq.heappush(heap, (nc, n, t))
        if len(self._dist) > 256:
            self._dist.clear()
        self._dist[src] = done
        return done


class OrderedPlacementGraph(PlacementGraph):
    """The graph of states that also carry every tensor dim's split order (used when a
    source or target spec has a non-default ``shard_order``).

    A state is the placement codes followed by one more element: per tensor dim, the mesh
    dims that shard it in split order. Sharding a tensor dim on a mesh dim appends that
    mesh dim (it splits the pieces last); only the mesh dim that split a tensor dim last
    may gather, pad or move it. Left-to-right nesting is the special case where appends
    happen in mesh order, so every state of the default graph is here too.
    """

    __slots__ = ()

    def encode_ordered(
        self, placements: Sequence[Placement], orders: Sequence[Sequence[int]]
    ) -> tuple:
        return self.encode(placements) + (tuple(tuple(o) for o in orders),)

    def decode(self, state: tuple) -> tuple[Placement, ...]:
        return super().decode(state[:-1])

    def nbytes(self, state: tuple) -> int:
        return super().nbytes(state[:-1])

    def edges(self, state: tuple) -> list:  # type: ignore[override]
        e = self._edges.get(state)
        if e is not None:
            return e
        nd = self.ndim
        codes, orders = state[:-1], state[-1]
        out: list = []
        bs = self.nbytes(state)
        ms = self.mesh_shape
        cm = self.cm
        none: frozenset[int] = frozenset()
        for m, c in enumerate(codes):
            src_dim = c - 1 if 1 <= c <= nd else None
            blocked = none
            if src_dim is not None and orders[src_dim][-1] != m:
                blocked = frozenset((src_dim,))
            for kind, q in self._moves(c, blocked):
                new = list(orders)
                if src_dim is not None:
                    new[src_dim] = orders[src_dim][:-1]
                if 1 <= q <= nd:
                    new[q - 1] = new[q - 1] + (m,)
                t = codes[:m] + (q,) + codes[m + 1 :] + (tuple(new),)
                out.append((t, kind.cost(cm, m, ms[m], bs, self.nbytes(t)), m, kind.name))
        self._edges[state] = out
        return out


_GRAPHS: OrderedDict[tuple, PlacementGraph] = OrderedDict()
_MAX_GRAPHS = 512


def graph_for(
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    itemsize: int,
    ops: tuple[str, ...],
    cost_model: CostModel,
    ordered: bool = False,
) -> PlacementGraph:
    """The (cached) graph of a geometry; ``ops`` should be sorted for reuse. ``ordered``:
    the :class:`OrderedPlacementGraph` (states carry split orders)."""
    key = (shape, mesh_shape, itemsize, ops, cost_model, ordered)
    g = _GRAPHS.get(key)
    if g is None:
        cls = OrderedPlacementGraph if ordered else PlacementGraph
        g = _GRAPHS[key] = cls(shape, mesh_shape, itemsize, ops, cost_model)
        if len(_GRAPHS) > _MAX_GRAPHS:
            with suppress(KeyError):  # emptied meanwhile by another thread
                _GRAPHS.popitem(last=False)
    return g


def clear_graphs() -> None:
    _GRAPHS.clear()
