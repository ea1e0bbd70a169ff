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

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ..placement import Partial, Placement, Replicate
from ..redistribute.cost import CostModel
from ..redistribute.graph import graph_for
from ..redistribute.planner import plan_redistribute
from ..spec import DTensorSpec

__all__ = [
    "SingleDimStrategy",
    "SearchResult",
    "search_strategy",
    "full_expansion",
    "follow_inputs",
]

#: (output placements, input placements) for one mesh dim
SingleDimStrategy = tuple[tuple[Placement, ...], tuple[Placement, ...]]

_R = Replicate()
_PAVG = Partial("avg")


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


def follow_inputs(
    specs: Sequence[DTensorSpec], accept: Callable[[tuple, tuple], bool] | None = None
) -> Callable[[tuple, tuple], bool]:
    """An ``accept`` for :func:`search_strategy` that keeps every input where it is on each
    mesh dim or makes it Replicate there (and also asks ``accept``, if given).

    This is PyTorch DTensor's propagation for ops whose op dims must be whole on one rank
    (softmax, scans, sort / topk / kthvalue / median / mode, reductions without a Partial
    form such as logsumexp): an op dim sharded on a mesh dim is gathered there (one
    all-gather), the other mesh dims keep their placements; the search never moves the
    shard to another tensor dim by an all-to-all, which moves fewer bytes but leaves the
    output sharded on a dim the caller did not shard — code written for PyTorch DTensor
    reads ``to_local()`` of such an output as the whole tensor, and PyTorch's own tests
    assert the Replicate output and the one all-gather.
    """
    current = [s.placements for s in specs]

    def follows(ins: tuple, outs: tuple) -> bool:
        for cur, tgt in zip(current, ins):
            for p, q in zip(cur, tgt):
                if q != p and type(q) is not Replicate:
                    return False
        return accept is None or accept(ins, outs)

    return follows


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
    """Partial ops input ``i``'s graph holds: sum (unless bool), those its current
    placements hold, and those its strategies ask for — except ``avg`` when no input is
    ``Partial(avg)``: a linear strategy's avg variant then costs exactly its sum variant."""
    ops = ["sum"] if "bool" not in str(specs[i].tensor_meta.dtype) else []
    any_avg = any(p == _PAVG for s in specs for p in s.placements)
    for p in specs[i].placements:
        if type(p) is Partial and p.reduce_op not in ops:
            ops.append(p.reduce_op)
    for _, ins in strategies:
        p = ins[i]
        if type(p) is Partial and p.reduce_op not in ops and (p.reduce_op != "avg" or any_avg):
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
) -> SearchResult:
    """The cheapest N-D strategy reachable from the inputs' current placements.

    Each input's cost to reach a state is its own shortest path in its placement graph
    (Dijkstra from its current placements, over the planner's steps and costs). The total
    cost of an N-D strategy is the sum over inputs, so the search is a branch and bound
    over mesh dims: a partial choice is dropped as soon as the cheapest completion of every
    input already costs more than the best strategy found.

    Args:
        specs: the DTensor inputs' specs (same mesh).
        strategies: single-dim strategies (all-Replicate is added).
        n_out: number of output tensors.
        cost_model: the alpha-beta model.
        fixed: inputs that may not move (the ``self`` of an in-place op).
        accept: optional extra check ``accept(input placements, output placements)`` for
            N-D combinations a rule must refuse (e.g. uneven nested shards of a view).

    Raises:
        ValueError: no strategy is reachable (only with ``fixed`` inputs or ``accept``).
    """
    n_in = len(specs)
    mesh = specs[0].mesh
    mnd = mesh.ndim
    table = _index(strategies, n_out, n_in)
    start = tuple(s.placements for s in specs)
    outs = _outputs_for(start, table, mnd, n_out)
    if outs is not None and (accept is None or accept(start, outs)):
        return SearchResult(start, outs, 0.0)
    graphs = [
        graph_for(
            s.shape,
            mesh.shape,
            s.tensor_meta.itemsize,
            tuple(sorted(_partial_ops_for(i, specs, strategies))),
            cost_model,
        )
        for i, s in enumerate(specs)
    ]
    choices = [
        (tuple(graphs[i]._code[p] for i, p in enumerate(ins)), o)
        for ins, o in table.items()
        if all(p in graphs[i]._code for i, p in enumerate(ins))
    ]
    fixed_set = set(fixed)
    dists: list[dict[tuple[int, ...], float]] = []
    for i, (g, s) in enumerate(zip(graphs, specs)):
        src = g.encode(s.placements)
        dists.append({src: 0.0} if i in fixed_set else g.distances(src))
    # lower bounds: per input and prefix length, the cheapest state with that prefix
    bounds: list[list[dict[tuple[int, ...], float]]] = []
    for d in dists:
        per: list[dict[tuple[int, ...], float]] = [{} for _ in range(mnd + 1)]
        for st, c in d.items():
            for j in range(mnd + 1):
                pre = st[:j]
                if c < per[j].get(pre, math.inf):
                    per[j][pre] = c
        bounds.append(per)
    best_cost = math.inf
    best: tuple | None = None
    prefix: list[tuple[tuple[int, ...], tuple[Placement, ...]]] = []

    def lb(pres: list[tuple[int, ...]], j: int) -> float:
        total = 0.0
        for i in range(n_in):
            v = bounds[i][j].get(pres[i])
            if v is None:
                return math.inf
            total += v
        return total

    def dfs(j: int, pres: list[tuple[int, ...]]) -> None:
        nonlocal best_cost, best
        if j == mnd:
            cost = 0.0
            for i in range(n_in):
                cost += dists[i][pres[i]]
            if cost < best_cost:
                outs = tuple(tuple(prefix[m][1][k] for m in range(mnd)) for k in range(n_out))
                ins = tuple(graphs[i].decode(pres[i]) for i in range(n_in))
                if accept is None or accept(ins, outs):
                    best_cost, best = cost, (ins, outs)
            return
        scored: list[tuple[float, int, list, tuple, tuple]] = []
        for codes, o in choices:
            nxt = [pres[i] + (codes[i],) for i in range(n_in)]
            b = lb(nxt, j + 1)
            if b < best_cost:
                scored.append((b, len(scored), nxt, codes, o))
        scored.sort(key=lambda x: (x[0], x[1]))
        for b, _, nxt, codes, o in scored:
            if b >= best_cost:
                break
            prefix.append((codes, o))
            dfs(j + 1, nxt)
            prefix.pop()

    dfs(0, [()] * n_in)
    if best is None:
        raise ValueError("no sharding strategy is reachable from the inputs' placements")
    return SearchResult(best[0], best[1], best_cost)


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
