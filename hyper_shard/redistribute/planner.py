"""The redistribution planner: the cheapest sequence of steps between two placement lists.

A *state* is the tuple of placements (one per mesh dim). A *step* changes the placement
of one mesh dim; the kinds (chunk, partition, pad, all_gather, all_to_all, all_reduce,
reduce_scatter), their legality and their costs are the step table of
:mod:`hyper_shard.redistribute.steps`.

Partial ops reachable in a plan are those of the source and target, plus ``sum`` (pad or
partition into zeros, then reduce: exact, and sometimes cheaper) except for bool tensors.

Costs come from :class:`CostModel` on the bytes of the largest local shard of the state
a step leaves and enters. The plan is the shortest path (Dijkstra). Plans are pure
values, cached per (source spec, target placements, cost model). No framework import.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

from ..placement import Partial, Placement, Shard, normalize_placements
from ..spec import DTensorSpec, ShardOrder, normalize_shard_order, split_orders
from .cost import DEFAULT_COST_MODEL, CostModel
from .graph import OrderedPlacementGraph, clear_graphs, graph_for

__all__ = [
    "Step",
    "Plan",
    "plan_redistribute",
    "state_bytes",
    "clear_plan_cache",
    "plan_cache_info",
]


@dataclass(frozen=True)
class Step:
    """One redistribution step on one mesh dim."""

    mesh_dim: int
    src: Placement
    dst: Placement
    kind: str

    def __repr__(self) -> str:
        return f"{self.kind}[m{self.mesh_dim}: {self.src}->{self.dst}]"


@dataclass(frozen=True)
class Plan:
    """A sequence of steps and its total modelled cost (seconds). ``ordered``: the plan
    moves between specs with split orders (the executor tracks them, see
    :class:`~hyper_shard.redistribute.steps.OrderedState`)."""

    steps: tuple[Step, ...]
    cost: float
    ordered: bool = False

    def __len__(self) -> int:
        return len(self.steps)


def state_bytes(
    shape: Sequence[int], mesh_shape: Sequence[int], state: Sequence[Placement], itemsize: int
) -> int:
    """Bytes of the largest local shard of a tensor of global ``shape`` in ``state``."""
    ext = list(shape)
    for m, p in enumerate(state):
        if type(p) is Shard:
            ext[p.dim] = -(-ext[p.dim] // mesh_shape[m])
    return math.prod(ext) * itemsize


def _partial_ops(*states: Sequence[Placement], allow_sum: bool = True) -> tuple[str, ...]:
    """Partial ops the search may visit: those of the states, plus ``sum`` (the exact
    intermediate of pad/partition paths) unless the dtype cannot be summed (bool)."""
    ops: list[str] = ["sum"] if allow_sum else []
    for s in states:
        for p in s:
            if type(p) is Partial and p.reduce_op not in ops:
                ops.append(p.reduce_op)
    return tuple(ops)


def _dijkstra(
    src: tuple[Placement, ...],
    dst: tuple[Placement, ...],
    shape: tuple[int, ...],
    mesh_shape: tuple[int, ...],
    itemsize: int,
    cost_model: CostModel,
    allow_sum: bool = True,
    orders: tuple[ShardOrder | None, ShardOrder | None] | None = None,
) -> Plan:
    g = graph_for(
        shape,
        mesh_shape,
        itemsize,
        tuple(sorted(_partial_ops(src, dst, allow_sum=allow_sum))),
        cost_model,
        ordered=orders is not None,
    )
    pl = g.placements
    if orders is None:
        cost, steps = g.shortest(g.encode(src), g.encode(dst))
        return Plan(tuple(Step(m, pl[a], pl[b], kind) for m, a, b, kind in steps), cost)
    assert isinstance(g, OrderedPlacementGraph)
    nd = len(shape)
    a = g.encode_ordered(src, split_orders(src, nd, orders[0]))
    b = g.encode_ordered(dst, split_orders(dst, nd, orders[1]))
    cost, steps = g.shortest(a, b)
    return Plan(tuple(Step(m, pl[x], pl[y], kind) for m, x, y, kind in steps), cost, True)


_PLAN_CACHE: OrderedDict[tuple, Plan] = OrderedDict()
_PLAN_CACHE_MAX = 4096
_stats = {"hits": 0, "misses": 0}


def plan_redistribute(
    src: DTensorSpec,
    dst_placements: Sequence[Placement],
    cost_model: CostModel | None = None,
    shard_order: Any = "keep",
) -> Plan:
    """The cheapest plan from ``src`` to ``dst_placements`` on the same mesh.

    Args:
        src: the current spec (mesh, placements, global shape, itemsize, shard order).
        dst_placements: the target placements, one per mesh dim.
        cost_model: the alpha-beta model; default: the mesh platform's, or the default.
        shard_order: the target's split order: ``"keep"`` (default) as
            :meth:`DTensorSpec.with_placements` keeps it, or an explicit one (None: left
            to right). Plans between left-to-right specs use the plain placement graph;
            others the :class:`~hyper_shard.redistribute.graph.OrderedPlacementGraph`.

    Returns:
        A :class:`Plan` (empty when the placements and orders already match).

    Raises:
        ValueError / IndexError: target placements or orders that do not fit the mesh or
            tensor.
    """
    local_cache = src._plans
    raw = (
        dst_placements if type(dst_placements) is tuple else tuple(dst_placements),
        cost_model,
        shard_order,
    )
    if local_cache is not None:
        plan = local_cache.get(raw)
        if plan is not None:
            _stats["hits"] += 1
            return plan
    else:
        local_cache = src._plans = {}
    dst = normalize_placements(dst_placements, src.mesh.ndim, src.ndim)
    if cost_model is None:
        cost_model = cost_model_for(src.mesh)
    if shard_order == "keep":
        dst_order = src._kept_order(dst) if src.shard_order else None
    else:
        dst_order = normalize_shard_order(dst, src.ndim, shard_order)
    key = (src.key, dst, cost_model, dst_order)
    plan = _PLAN_CACHE.get(key)
    if plan is not None:
        _stats["hits"] += 1
        with suppress(KeyError):  # evicted meanwhile by another thread
            _PLAN_CACHE.move_to_end(key)
        local_cache[raw] = plan
        return plan
    _stats["misses"] += 1
    if src.placements == dst and src.shard_order == dst_order:
        plan = Plan((), 0.0)
    else:
        plan = _dijkstra(
            src.placements,
            dst,
            src.shape,
            src.mesh.shape,
            src.tensor_meta.itemsize,
            cost_model,
            "bool" not in str(src.tensor_meta.dtype),
            None if src.shard_order is None and dst_order is None else (src.shard_order, dst_order),
        )
    _PLAN_CACHE[key] = plan
    local_cache[raw] = plan
    if len(_PLAN_CACHE) > _PLAN_CACHE_MAX:
        with suppress(KeyError):  # emptied meanwhile by another thread
            _PLAN_CACHE.popitem(last=False)
    return plan


def cost_model_for(mesh) -> CostModel:  # type: ignore[no-untyped-def]
    """The cost model of a mesh: its platform's (native collectives) or the default."""
    cm = getattr(mesh, "_cost_model", None)
    if cm is None:
        cm = DEFAULT_COST_MODEL if mesh.is_abstract else mesh.platform.cost_model(mesh)
        mesh._cost_model = cm
    return cm


def clear_plan_cache() -> None:
    """Forget every cached plan (and reset the counters)."""
    _PLAN_CACHE.clear()
    clear_graphs()
    _stats["hits"] = _stats["misses"] = 0


def plan_cache_info() -> dict[str, int]:
    """Hits, misses and size of the plan cache."""
    return {**_stats, "size": len(_PLAN_CACHE)}
