"""Reductions on real gloo ranks against plain torch on the same global input (forward and
backward): sharded and unsharded reduced dims, uneven and empty shards (dims of sizes 5, 3
and 1 on 2 ranks and on a (2, 2) mesh), Partial inputs, keepdim both ways, negative and
tuple dims, dtype=, and the regressions the rule exists for.
"""

from __future__ import annotations

import random

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, init_device_mesh
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global

pytestmark = pytest.mark.multiproc


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world, must=()):
    """Every combination on the 1-D mesh; on (2, 2) the combinations ``must`` plus a fixed
    random sample of ``k``."""
    if world == 2 or len(combos) <= k:
        return combos
    return [c for c in must] + random.Random(0).sample(combos, k)


S0, S1, S2 = Shard(0), Shard(1), Shard(2)
#: (2, 2) cases with nested uneven and empty shards (dims of sizes 5, 3, 1)
NESTED = [((S0, S0),), ((S2, S2),), ((S1, S1),), ((S1, S2),), ((S2, S0),)]


def _x(seed=0, shape=(5, 3, 1)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_sum_mean(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _x(0)
    combos = _sample(all_combos([x], mesh.ndim, ("sum", "avg")), 16, world, NESTED)
    fns = [
        lambda a: a.sum(),
        lambda a: torch.sum(a, 0),
        lambda a: a.sum(-1, keepdim=True),
        lambda a: torch.sum(a, (0, 2)),
        lambda a: a.sum(dim=(2, 1), keepdim=True),
        lambda a: a.mean(),
        lambda a: torch.mean(a, 1),
        lambda a: a.mean((0, -1), keepdim=True),
        lambda a: torch.mean(a, dim=0, keepdim=True),
        lambda a: a.mean(dtype=torch.float64),
        lambda a: a.sum(1, dtype=torch.float64),
    ]
    n = 0
    for fn in fns:
        n += check_op(fn, [x], mesh, combos)
    # integer input (no Partial decomposition): sum keeps Partial(sum), mean with dtype=
    xi = torch.randint(-5, 6, (5, 3, 1), generator=torch.Generator().manual_seed(3))
    icombos = _sample(all_combos([xi], mesh.ndim), 8, world, NESTED)
    for fn in (lambda a: a.sum(), lambda a: a.sum(0), lambda a: a.mean(0, dtype=torch.float32)):
        n += check_op(fn, [xi], mesh, icombos, grad=False)
    return n


def check_extrema(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _x(1)
    combos = _sample(
        all_combos([x], mesh.ndim, ("sum", "max", "min")),
        16,
        world,
        [*NESTED, ((Partial("max"), S2),)],
    )
    fns = [
        lambda a: a.amax(),
        lambda a: torch.amax(a, 0),
        lambda a: a.amax((0, 2), keepdim=True),
        lambda a: torch.amin(a, -1),
        lambda a: a.amin(dim=(1, 0)),
        lambda a: torch.max(a),
        lambda a: a.min(),
        lambda a: torch.max(a, 1),  # (values, indices)
        lambda a: a.max(dim=0, keepdim=True),
        lambda a: torch.min(a, -1),
        lambda a: a.min(2, True),
    ]
    n = 0
    for fn in fns:
        n += check_op(fn, [x], mesh, combos)
    # the elementwise form max(x, other) / min(x, other)
    y = _x(2)
    pairs = _sample(all_combos([x, y], mesh.ndim, ()), 16, world)
    n += check_op(torch.max, [x, y], mesh, pairs)
    n += check_op(lambda a, b: a.min(b), [x, y], mesh, pairs)
    n += check_op(lambda a, b: torch.max(a, other=b), [x, y], mesh, pairs[:3])
    # integers: an empty shard of a reduced dim is filled with the dtype's min/max
    xi = torch.randint(-50, 50, (5, 3, 1), generator=torch.Generator().manual_seed(4))
    icombos = _sample(all_combos([xi], mesh.ndim), 8, world, NESTED)
    for fn in (lambda a: a.amax(), lambda a: a.amin(2), lambda a: torch.max(a), lambda a: a.max(0)):
        n += check_op(fn, [xi], mesh, icombos, grad=False)
    return n


def check_other_reductions(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = _x(5)
    combos = _sample(all_combos([x], mesh.ndim, ("sum", "max")), 12, world, NESTED)
    fns = [
        lambda a: a.argmax(),
        lambda a: torch.argmax(a, 0),
        lambda a: a.argmin(dim=1, keepdim=True),
        lambda a: torch.argmin(a, -1),
        lambda a: a.prod(0),
        lambda a: torch.prod(a, 1, keepdim=True),
        lambda a: a.std(),
        lambda a: torch.std(a, 0, True, True),
        lambda a: a.var((0, 1), correction=0),
        lambda a: torch.var(a, dim=-2, keepdim=True),
        lambda a: torch.logsumexp(a, (0, 1)),
        lambda a: torch.linalg.vector_norm(a),
        lambda a: torch.linalg.vector_norm(a, 1, dim=0, keepdim=True),
        lambda a: torch.linalg.vector_norm(a, float("inf"), (0, 2)),
        lambda a: torch.norm(a, dim=1),
        lambda a: a.norm(),
    ]
    n = 0
    for fn in fns:
        n += check_op(fn, [x], mesh, combos)
    b = x > 0
    bcombos = _sample(all_combos([b], mesh.ndim), 6, world)
    for fn in (
        lambda a: a.all(),
        lambda a: torch.any(a, 0),
        lambda a: a.all(dim=(0, 1), keepdim=True),
        lambda a: torch.any(a, ()),
        lambda a: a.sum(0),
    ):
        n += check_op(fn, [b], mesh, bcombos, grad=False)
    return n


def check_regressions(rank, world):
    """Values computed by plain torch on the same global input."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    S0 = [Shard(0)] * mesh.ndim
    # (a) a Partial(sum) scalar plus a python scalar counts the scalar once
    a = torch.arange(10.0).reshape(10, 1)
    out = dt_from_global(a, mesh, S0).sum() + 10
    torch.testing.assert_close(out.full_tensor(), a.sum() + 10)
    # (b) mean of uneven shards, and of a (1, 4) tensor whose other shards are empty
    for t in (torch.arange(12.0).reshape(3, 4), torch.arange(4.0).reshape(1, 4) + 1):
        dt = dt_from_global(t, mesh, S0, requires_grad=True)
        m = dt.mean()
        got = m.full_tensor()
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, t.mean())
        m.backward()
        assert_dtensor_close(dt.grad, torch.full_like(t, 1.0 / t.numel()))
        assert_dtensor_close(dt_from_global(t, mesh, S0).mean(0), t.mean(0))
    # (c) max over a sharded dim returns global indices
    t = torch.randn(4, 4, generator=torch.Generator().manual_seed(7))
    vals, idx = torch.max(dt_from_global(t, mesh, [Shard(1)] * mesh.ndim), dim=1)
    ref = torch.max(t, dim=1)
    assert_dtensor_close(vals, ref.values)
    assert_dtensor_close(idx, ref.indices)
    # (d) argmax of a sharded vector is a global index
    v = torch.tensor([10.0, 5.0, 3.0, 8.0])
    got_idx = dt_from_global(v, mesh, S0).argmax()
    assert got_idx.full_tensor().item() == torch.argmax(v).item()
    # (e) norm and amax of a Partial(sum) value are taken of the reduced value
    pl = [Partial("sum")] + [Replicate()] * (mesh.ndim - 1)
    # on (2, 2) only mesh dim 0 is partial: the replicas along mesh dim 1 hold the same part
    loc = torch.tensor([1.0, 3.0]) if mesh.get_coordinate()[0] == 0 else torch.tensor([2.0, 1.0])
    p = DTensor.from_local(loc, mesh, pl, shape=(2,), stride=(1,))
    full = torch.tensor([1.0, 3.0]) + torch.tensor([2.0, 1.0])
    torch.testing.assert_close(torch.linalg.vector_norm(p).full_tensor(), full.norm())
    torch.testing.assert_close(p.amax().full_tensor(), full.amax())
    torch.testing.assert_close(p.sum().full_tensor(), full.sum())
    return 1


def check_errors(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    dt = dt_from_global(_x(0), mesh, [Shard(0)] * mesh.ndim)
    msgs = []
    for fn, exc in (
        (lambda: dt.sum(3), IndexError),
        (lambda: dt.amax((0, 0)), RuntimeError),
        (lambda: torch.max(dt, -4), IndexError),
    ):
        with pytest.raises(exc) as info:
            fn()
        msgs.append(str(info.value))
    assert "S(0)" in msgs[0] and "out of range" in msgs[0], msgs[0]
    assert "multiple times" in msgs[1], msgs[1]
    assert "torch.max" in msgs[2] and "[-3, 2]" in msgs[2], msgs[2]
    return len(msgs)


def _run(pool, fn):
    counts = pool.run(fn)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_sum_mean(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_sum_mean)


@pytest.mark.parametrize("world", [2, 4])
def test_extrema(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_extrema)


@pytest.mark.parametrize("world", [2, 4])
def test_other_reductions(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_other_reductions)


@pytest.mark.parametrize("world", [2, 4])
def test_regressions(world, dist2, dist4):
    _run(dist2 if world == 2 else dist4, check_regressions)


def test_errors(dist2):
    _run(dist2, check_errors)
