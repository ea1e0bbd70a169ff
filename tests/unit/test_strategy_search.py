"""The strategy search against full expansion on abstract meshes (no process group).

For mm and a pointwise add, from every (or a fixed sample of) source placements, the
Dijkstra search's cost equals the minimum over every N-D strategy priced by the
redistribution planner, and its choice is a valid strategy.
"""

from __future__ import annotations

import itertools
import random

import pytest

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.dispatch.op import OpCall
from hyper_shard.dispatch.search import full_expansion, search_strategy
from hyper_shard.redistribute import planner
from hyper_shard.redistribute.cost import DEFAULT_COST_MODEL
from hyper_shard.registry import get_registry
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride


@pytest.fixture(autouse=True, scope="module")
def _every_plan_kept():
    """full_expansion prices the same (source, target) pairs again and again across the
    sampled sources (tens of thousands of distinct pairs on a (2, 2, 2) mesh): keep every
    plan for this module instead of the planner's 4096 most recent (the same plans, with
    half the Dijkstra runs), then trim back."""
    old = planner._PLAN_CACHE_MAX
    planner._PLAN_CACHE_MAX = 1 << 20
    yield
    planner._PLAN_CACHE_MAX = old
    while len(planner._PLAN_CACHE) > old:
        planner._PLAN_CACHE.popitem(last=False)


def _spec(mesh, pl, shape):
    return DTensorSpec(mesh, pl, TensorMeta(shape, contiguous_stride(shape), "float32", 4))


def _call(name, specs, roles):
    return OpCall(name, name, list(specs), roles, {}, {}, False, False, (), {})


def _states(mesh_ndim, ndim):
    opts = [Replicate(), *[Shard(d) for d in range(ndim)], Partial()]
    return list(itertools.product(opts, repeat=mesh_ndim))


CASES = [
    ((4,), None),
    ((2, 2), None),
    ((2, 2, 2), 150),
    ((4, 4, 4), 100),
]


@pytest.mark.parametrize("mesh_shape,sample", CASES, ids=[str(c[0]) for c in CASES])
@pytest.mark.parametrize("opname,shapes,roles", [
    ("mm", [(64, 32), (32, 48)], ["input", "mat2"]),
    ("add", [(64, 32), (64, 32)], ["input", "other"]),
    ("linear", [(8, 16, 32), (24, 32), (24,)], ["input", "weight", "bias"]),
])  # fmt: skip
def test_search_cost_equals_full_expansion(mesh_shape, sample, opname, shapes, roles):
    mesh = DeviceMesh.abstract(mesh_shape)
    op = get_registry().entries[opname].op
    per_input = [_states(len(mesh_shape), len(s)) for s in shapes]
    pairs = list(itertools.product(*per_input))
    if opname == "linear":  # three inputs: a full expansion on a 3-D mesh is the slowest
        sample = 150 if sample is None else min(sample, 50)
    if sample is not None and len(pairs) > sample:
        pairs = random.Random(0).sample(pairs, sample)
    for srcs in pairs:
        specs = [_spec(mesh, pl, s) for pl, s in zip(srcs, shapes)]
        call = _call(opname, specs, roles)
        strategies = op.single_dim_strategies(call)
        got = search_strategy(specs, strategies, 1, DEFAULT_COST_MODEL)
        ref = full_expansion(specs, strategies, 1, DEFAULT_COST_MODEL)
        assert got.cost == pytest.approx(ref.cost, rel=1e-9, abs=1e-15), (srcs, got, ref)
        # the choice is a strategy on every mesh dim
        table = {tuple(ins): outs for outs, ins in strategies}
        table[(Replicate(),) * len(specs)] = (Replicate(),)
        for m in range(mesh.ndim):
            combo = tuple(got.inputs[i][m] for i in range(len(specs)))
            assert combo in table and table[combo] == (got.outputs[0][m],), (srcs, m, combo)


def test_inplace_keeps_self():
    mesh = DeviceMesh.abstract((2, 2))
    op = get_registry().entries["add"].op
    a = _spec(mesh, [Replicate(), Shard(0)], (8, 8))
    b = _spec(mesh, [Partial(), Shard(1)], (8, 8))
    call = _call("add", [a, b], ["input", "other"])
    res = search_strategy([a, b], op.single_dim_strategies(call), 1, DEFAULT_COST_MODEL, fixed=[0])
    assert res.inputs[0] == a.placements and res.outputs[0] == a.placements
    assert res.inputs[1] == (Replicate(), Shard(0))
