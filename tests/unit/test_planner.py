"""The redistribution planner against brute force, on abstract meshes (no process group).

The brute force is written independently of the planner: its own edge rules and an
all-pairs Floyd-Warshall over every placement state, with the same alpha-beta model.
"""

from __future__ import annotations

import itertools
import math

import pytest

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.redistribute import CostModel, plan_redistribute
from hyper_shard.redistribute.cost import DEFAULT_COST_MODEL
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride


def _bytes(shape, mesh_shape, state, itemsize=4):
    ext = list(shape)
    for m, p in enumerate(state):
        if isinstance(p, Shard):
            ext[p.dim] = math.ceil(ext[p.dim] / mesh_shape[m])
    return math.prod(ext) * itemsize


def _edges(state, ndim, ops):
    """Independent statement of the legal steps (see the planner's docstring)."""

    def nested_right(m, d):
        return any(isinstance(q, Shard) and q.dim == d for q in state[m + 1 :])

    for m, p in enumerate(state):
        targets = []
        if isinstance(p, Replicate):
            targets += [(Shard(d), "chunk") for d in range(ndim) if not nested_right(m, d)]
            targets += [(Partial(o), "partition") for o in ops]
        elif isinstance(p, Shard):
            if nested_right(m, p.dim):
                continue
            targets.append((Replicate(), "all_gather"))
            targets += [
                (Shard(e), "all_to_all")
                for e in range(ndim)
                if e != p.dim and not nested_right(m, e)
            ]
            if "sum" in ops:
                targets.append((Partial("sum"), "pad"))
        else:
            targets.append((Replicate(), "all_reduce"))
            if p.reduce_op in ("sum", "avg"):
                targets += [
                    (Shard(d), "reduce_scatter") for d in range(ndim) if not nested_right(m, d)
                ]
        for q, kind in targets:
            yield m, q, kind, state[:m] + (q,) + state[m + 1 :]


def _all_states(mesh_ndim, ndim, ops):
    opts = [Replicate(), *[Shard(d) for d in range(ndim)], *[Partial(o) for o in ops]]
    return list(itertools.product(opts, repeat=mesh_ndim))


def _floyd(states, shape, mesh_shape, ops, cm):
    idx = {s: i for i, s in enumerate(states)}
    n = len(states)
    inf = float("inf")
    d = [[inf] * n for _ in range(n)]
    for s in states:
        i = idx[s]
        d[i][i] = 0.0
        for m, _q, kind, t in _edges(s, len(shape), ops):
            c = cm.step_cost(
                kind, m, mesh_shape[m], _bytes(shape, mesh_shape, s), _bytes(shape, mesh_shape, t)
            )
            j = idx[t]
            d[i][j] = min(d[i][j], c)
    for k in range(n):
        dk = d[k]
        for i in range(n):
            dik = d[i][k]
            if dik == inf:
                continue
            di = d[i]
            for j in range(n):
                v = dik + dk[j]
                if v < di[j]:
                    di[j] = v
    return idx, d


CASES = [
    ((4,), (8,)), ((4,), (6, 5)), ((4,), (3, 4, 5)),
    ((2, 2), (7,)), ((2, 2), (4, 6)), ((2, 2), (5, 3, 4)),
    ((2, 2, 2), (9,)), ((2, 2, 2), (4, 4)), ((2, 2, 2), (3, 5, 2)),
]  # fmt: skip


# every case with Partial(sum); Partial(max) too where the state space stays small
CASES_OPS = [(m, s, ("sum",)) for m, s in CASES] + [
    (m, s, ("sum", "max")) for m, s in CASES if len(m) * len(s) <= 6
]


@pytest.mark.parametrize(
    "mesh_shape,shape,ops", CASES_OPS, ids=[f"{m}-{s}-{'+'.join(o)}" for m, s, o in CASES_OPS]
)
def test_planner_is_optimal_for_every_pair(mesh_shape, shape, ops):
    mesh = DeviceMesh.abstract(mesh_shape)
    cm = CostModel(
        alpha=(1e-5, 3e-5, 7e-5)[: len(mesh_shape)], beta=(1e-9, 2e-9, 5e-9)[: len(mesh_shape)]
    )
    states = _all_states(len(mesh_shape), len(shape), ops)
    idx, dist = _floyd(states, shape, mesh_shape, ops, cm)
    meta = TensorMeta(shape, contiguous_stride(shape), "f32", 4)
    for s in states:
        spec = DTensorSpec(mesh, s, meta)
        for t in states:
            # the planner admits sum plus the partial ops of source and target
            sub_ops = tuple(
                o
                for o in ops
                if o == "sum" or any(isinstance(p, Partial) and p.reduce_op == o for p in s + t)
            )
            plan = plan_redistribute(spec, t, cm)
            best = (
                dist[idx[s]][idx[t]]
                if sub_ops == ops
                else _restricted(s, t, shape, mesh_shape, sub_ops, cm)
            )
            assert _close(plan.cost, best), (s, t, plan, best)
            # the plan is a legal walk from s to t whose step costs add up to its cost
            cur, total = s, 0.0
            for st in plan.steps:
                legal = _legal(cur, len(shape), sub_ops)
                nxt = legal.get((st.mesh_dim, st.dst, st.kind))
                assert nxt is not None, (s, t, st)
                total += cm.step_cost(st.kind, st.mesh_dim, mesh_shape[st.mesh_dim],
                                      _bytes(shape, mesh_shape, cur), _bytes(shape, mesh_shape, nxt))  # fmt: skip
                cur = nxt
            assert cur == t
            assert _close(total, plan.cost), (s, t, plan, total)


def _close(a: float, b: float) -> bool:
    """``a == pytest.approx(b, rel=1e-9, abs=1e-15)`` (without its per-call cost: the
    sweeps compare tens of thousands of costs)."""
    return a == b or abs(a - b) <= max(1e-9 * abs(b), 1e-15)


_LEGAL: dict = {}


def _legal(state, ndim, ops):
    """The legal steps from ``state``: (mesh dim, target placement, kind) -> next state
    (:func:`_edges`, kept per state: a plan's walk asks for the same states again)."""
    key = (state, ndim, ops)
    out = _LEGAL.get(key)
    if out is None:
        out = _LEGAL[key] = {(m, q, k): nxt for m, q, k, nxt in _edges(state, ndim, ops)}
    return out


_RESTRICTED: dict = {}


def _restricted(s, t, shape, mesh_shape, ops, cm):
    key = (shape, mesh_shape, ops, cm)
    if key not in _RESTRICTED:
        st = _all_states(len(mesh_shape), len(shape), ops)
        _RESTRICTED[key] = _floyd(st, shape, mesh_shape, ops, cm)
    idx, dist = _RESTRICTED[key]
    return dist[idx[s]][idx[t]]


@pytest.mark.parametrize(
    "mesh_shape,shape", [((4,), (6, 5)), ((2, 2), (5, 3, 4)), ((2, 2, 2), (4, 4))]
)
def test_costs_obey_triangle_inequality(mesh_shape, shape):
    mesh = DeviceMesh.abstract(mesh_shape)
    meta = TensorMeta(shape, contiguous_stride(shape), "f32", 4)
    states = _all_states(len(mesh_shape), len(shape), ("sum",))
    cost = {}
    for s in states:
        spec = DTensorSpec(mesh, s, meta)
        for t in states:
            cost[s, t] = plan_redistribute(spec, t, DEFAULT_COST_MODEL).cost
    for a, b, c in itertools.product(states, repeat=3):
        assert cost[a, c] <= cost[a, b] + cost[b, c] + 1e-12, (a, b, c)


def test_plan_examples_are_the_textbook_ones():
    mesh = DeviceMesh.abstract((4,))
    meta = TensorMeta((8, 8), (8, 1), "f32", 4)
    spec = lambda p: DTensorSpec(mesh, p, meta)  # noqa: E731
    kinds = lambda s, t: [st.kind for st in plan_redistribute(spec(s), t).steps]  # noqa: E731
    assert kinds([Shard(0)], [Replicate()]) == ["all_gather"]
    assert kinds([Partial()], [Replicate()]) == ["all_reduce"]
    assert kinds([Partial()], [Shard(1)]) == ["reduce_scatter"]
    assert kinds([Shard(0)], [Shard(1)]) == ["all_to_all"]
    assert kinds([Replicate()], [Shard(1)]) == ["chunk"]
    assert kinds([Replicate()], [Partial()]) == ["partition"]
    assert kinds([Partial("max")], [Shard(0)]) == ["all_reduce", "chunk"]
    assert plan_redistribute(spec([Shard(0)]), [Shard(0)]).steps == ()


def test_composed_collectives_change_the_plan():
    """Without a native all-to-all, S(0)->S(1) of a large tensor is gather + chunk."""
    mesh = DeviceMesh.abstract((4,))
    meta = TensorMeta((64, 64), (64, 1), "f32", 4)
    spec = DTensorSpec(mesh, [Shard(0)], meta)
    native = plan_redistribute(spec, [Shard(1)], DEFAULT_COST_MODEL)
    composed = plan_redistribute(
        spec, [Shard(1)], DEFAULT_COST_MODEL.with_native({"all_gather", "all_reduce"})
    )
    assert [s.kind for s in native.steps] == ["all_to_all"]
    assert composed.cost > native.cost
    assert [s.kind for s in composed.steps] in (["all_to_all"], ["all_gather", "chunk"])
