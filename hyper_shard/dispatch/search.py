"""Sharding-strategy search: the cheapest input placements that fit a rule on every mesh dim.

A rule gives *single-dim strategies*: for ONE mesh dim, a list of
``(output placements, input placements)`` pairs (one placement per output tensor and per
DTensor input). On an N-D mesh a strategy picks one single-dim strategy per mesh dim. The
all-Replicate strategy is always allowed.

The search is Dijkstra over the joint state (every input's placements). A step changes one
placement of one input on one mesh dim, exactly as the redistribution planner's steps, with
the same alpha-beta cost on that input's current shard. The first popped state whose
placements match a single-dim strategy on every mesh dim (and that the rule accepts) is the
answer. Where the joint search cannot apply (too many inputs), :func:`full_expansion`
enumerates every N-D strategy and prices each input's move with the planner.

Pure: no framework import, no process group.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..placement import Partial, Placement, Replicate
from ..redistribute.cost import CostModel
from ..redistribute.planner import plan_redistribute, state_bytes, transitions
from ..spec import DTensorSpec

__all__ = ["SingleDimStrategy", "SearchResult", "search_strategy", "full_expansion"]

#: (output placements, input placements) for one mesh dim
SingleDimStrategy = tuple[tuple[Placement, ...], tuple[Placement, ...]]

_R = Replicate()


@dataclass(frozen=True)
class SearchResult:
    """The chosen N-D strategy.

    Attributes:
        inputs: target placements of every input (one tuple per input).
        outputs: placements of every output (one tuple per output).
        cost: modelled seconds to move the inputs there.
    """

    inputs: tuple[tuple[Placement, ...], ...]
    outputs: tuple[tuple[Placement, ...], ...]
    cost: float


def _index(strategies: Sequence[SingleDimStrategy], n_out: int, n_in: int) -> dict:
    table: dict[tuple[Placement, ...], tuple[Placement, ...]] = {}
    for outs, ins in strategies:
        if len(ins) != n_in or len(outs) != n_out:
            raise ValueError(
                f"single-dim strategy {outs} <- {ins}: expected {n_out} output and {n_in} input "
                f"placements"
            )
        table.setdefault(tuple(ins), tuple(outs))
    table.setdefault((_R,) * n_in, (_R,) * n_out)
    return table


def _partial_ops_for(
    i: int, specs: Sequence[DTensorSpec], strategies: Sequence[SingleDimStrategy]
) -> tuple[str, ...]:
    ops = ["sum"] if "bool" not in str(specs[i].tensor_meta.dtype) else []
    for p in specs[i].placements:
        if type(p) is Partial and p.reduce_op not in ops:
            ops.append(p.reduce_op)
    for _, ins in strategies:
        p = ins[i]
        if type(p) is Partial and p.reduce_op not in ops:
            ops.append(p.reduce_op)
    return tuple(ops)


def _outputs_for(
    state: Sequence[tuple[Placement, ...]], table: dict, mesh_ndim: int, n_out: int
) -> tuple[tuple[Placement, ...], ...] | None:
    per_dim = []
    for m in range(mesh_ndim):
        outs = table.get(tuple(s[m] for s in state))
        if outs is None:
            return None
        per_dim.append(outs)
    return tuple(tuple(per_dim[m][o] for m in range(mesh_ndim)) for o in range(n_out))


def search_strategy(
    specs: Sequence[DTensorSpec],
    strategies: Sequence[SingleDimStrategy],
    n_out: int,
    cost_model: CostModel,
    *,
    fixed: Sequence[int] = (),
    accept: Callable[[tuple, tuple], bool] | None = None,
    max_pops: int = 20000,
) -> SearchResult:
    """The cheapest N-D strategy reachable from the inputs' current placements.

    Args:
        specs: the DTensor inputs' specs (same mesh).
        strategies: single-dim strategies (all-Replicate is added).
        n_out: number of output tensors.
        cost_model: the alpha-beta model.
        fixed: inputs that may not move (the ``self`` of an in-place op).
        accept: optional extra check ``accept(input placements, output placements)`` for
            N-D combinations a rule must refuse (e.g. uneven nested shards of a view).
        max_pops: beyond this many expanded states, fall back to :func:`full_expansion`.

    Raises:
        ValueError: no strategy is reachable (only with ``fixed`` inputs or ``accept``).
    """
    n_in = len(specs)
    mesh = specs[0].mesh
    mnd = mesh.ndim
    mshape = mesh.shape
    table = _index(strategies, n_out, n_in)
    start = tuple(s.placements for s in specs)
    outs = _outputs_for(start, table, mnd, n_out)
    if outs is not None and (accept is None or accept(start, outs)):
        return SearchResult(start, outs, 0.0)
    ops = [_partial_ops_for(i, specs, strategies) for i in range(n_in)]
    movable = [i for i in range(n_in) if i not in set(fixed)]
    shapes = [s.shape for s in specs]
    sizes = [s.tensor_meta.itemsize for s in specs]
    nbytes: dict[tuple[int, tuple[Placement, ...]], int] = {}

    def b(i: int, st: tuple[Placement, ...]) -> int:
        k = (i, st)
        v = nbytes.get(k)
        if v is None:
            v = nbytes[k] = state_bytes(shapes[i], mshape, st, sizes[i])
        return v

    counter = itertools.count()
    heap: list = [(0.0, next(counter), start)]
    dist = {start: 0.0}
    done: set = set()
    pops = 0
    while heap:
        c, _, state = heapq.heappop(heap)
        if state in done:
            continue
        outs = _outputs_for(state, table, mnd, n_out)
        if outs is not None and (accept is None or accept(state, outs)):
            return SearchResult(state, outs, c)
        done.add(state)
        pops += 1
        if pops > max_pops:
            return full_expansion(specs, strategies, n_out, cost_model, fixed=fixed, accept=accept)
        for i in movable:
            si = state[i]
            bi = b(i, si)
            for m, q, kind in transitions(si, len(shapes[i]), ops[i]):
                ti = si[:m] + (q,) + si[m + 1 :]
                nxt = state[:i] + (ti,) + state[i + 1 :]
                if nxt in done:
                    continue
                nc = c + cost_model.step_cost(kind, m, mshape[m], bi, b(i, ti))
                if nc < dist.get(nxt, math.inf):
                    dist[nxt] = nc
                    heapq.heappush(heap, (nc, next(counter), nxt))
    raise ValueError("no sharding strategy is reachable from the inputs' placements")


def full_expansion(
    specs: Sequence[DTensorSpec],
    strategies: Sequence[SingleDimStrategy],
    n_out: int,
    cost_model: CostModel,
    *,
    fixed: Sequence[int] = (),
    accept: Callable[[tuple, tuple], bool] | None = None,
) -> SearchResult:
    """Every N-D strategy priced with the redistribution planner; the cheapest wins (ties:
    the first in enumeration order). Exponential in the mesh rank: the reference and the
    fallback for :func:`search_strategy`."""
    n_in = len(specs)
    mnd = specs[0].mesh.ndim
    table = _index(strategies, n_out, n_in)
    choices = list(table.items())
    best: SearchResult | None = None
    fixed_set = set(fixed)
    for combo in itertools.product(choices, repeat=mnd):
        ins = tuple(tuple(combo[m][0][i] for m in range(mnd)) for i in range(n_in))
        if any(ins[i] != specs[i].placements for i in fixed_set):
            continue
        outs = tuple(tuple(combo[m][1][o] for m in range(mnd)) for o in range(n_out))
        if accept is not None and not accept(ins, outs):
            continue
        try:
            cost = 0.0
            for i in range(n_in):
                if ins[i] != specs[i].placements:
                    cost += plan_redistribute(specs[i], ins[i], cost_model).cost
        except (ValueError, IndexError):
            continue  # e.g. an illegal nesting of shards on this tensor
        if best is None or cost < best.cost:
            best = SearchResult(ins, outs, cost)
    if best is None:
        raise ValueError("no sharding strategy fits the inputs")
    return best
