"""Reductions on real gloo ranks against plain torch on the same global input (forward and
backward): sharded and unsharded reduced dims, uneven and empty shards (dims of sizes 5, 3
and 1 on 2 ranks and on a (2, 2) mesh), Partial inputs, keepdim both ways, negative and
tuple dims, dtype=, and the regressions the rule exists for; public bug reports on
reductions, scans and sorts (``report_*``, each naming its report).
"""

from __future__ import annotations

import random

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep
from tests._reports import reports

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


# ---------------------------------------------------------------------- bug reports
def _pair(got, ref, **kw):
    for a, b in zip(got, ref):
        _eq(a, b, **kw)


def report_gradient_of_tied_extrema(rank, world):
    """#41779: ``amax`` / ``max()`` over a sharded dim split the gradient of ties per rank,
    then per shard; now evenly over every tied element, as torch (fixed here). Ties of the
    maximum on both ranks (rows 0 and 3 hold 9)."""
    mesh = init_device_mesh("cpu", (world,))
    a = torch.tensor([[9.0, 2.0, 9.0], [-2.0, -3.0, -4.0], [7.0, 8.0, -9.0], [1.0, 0.0, 9.0]])
    fns = (
        lambda t: t.amax(),
        lambda t: torch.amax(t, dim=0).sum(),
        lambda t: t.max(),
        lambda t: t.min(),
        lambda t: torch.linalg.vector_norm(t, float("inf")),
    )
    for pl in (Shard(0), Shard(1)):
        for fn in fns:
            d = distribute_tensor(a, mesh, [pl]).requires_grad_()
            r = a.clone().requires_grad_()
            out, ref = fn(d), fn(r)
            _eq(out.full_tensor(), ref.detach())
            out.backward()
            ref.backward()
            _eq(d.grad, r.grad)


def report_static_int_vs_dtensor_in_the_cache_key(rank, world):
    """A stale decision (the class of #147180, #153603, #159289; fixed here): ``torch.max(x,
    y)`` after ``torch.max(x, 1)`` returned the reduction, because a spec id in the layout
    cache key equalled the static int ``1``; the same for min and a list index."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, 1, generator=g), torch.randn(5, 3, 1, generator=g)
    dx, dy = _rep(x, mesh), _rep(y, mesh)
    for k in range(4):  # whatever ids the specs got, ints 0..3 then DTensors
        for fn in (torch.max, torch.min):
            v, _ = fn(dx, k % 3)
            _eq(v, fn(x, k % 3)[0])
            _eq(fn(dx, dy), fn(x, y))


def report_means_and_indices(rank, world):
    """#162692: mean of an uneven ``Shard(0)`` (3, 4) was the mean of the local means;
    (1, 4) gave NaN; #168940 / PR #175776: ``max.dim`` over a sharded dim returned local
    indices, and a ``Partial("max")`` input must not give ``Partial("max")`` indices;
    #167072 / PR #173936: ``argmax`` / ``argmin`` over a sharded dim."""
    mesh = init_device_mesh("cpu", (world,))
    for n in (3, 1):
        u = torch.arange(4.0 * n).reshape(n, 4)
        d = distribute_tensor(u, mesh, [Shard(0)])
        _eq(d.mean(), u.mean())
        _eq(d.mean(0), u.mean(0))
        _eq(torch.var(d, 1), torch.var(u, 1))
    x = torch.randn(4, 4, generator=torch.Generator().manual_seed(0))
    for pl in (Shard(1), Shard(0)):
        d = distribute_tensor(x, mesh, [pl])
        _pair(torch.max(d, dim=1), torch.max(x, dim=1))
        _pair(torch.min(d, dim=1), torch.min(x, dim=1))
    pmax = DTensor.from_local(x.clone() if rank == 0 else x - 5, mesh, [Partial("max")])
    _pair(torch.max(pmax, dim=1), torch.max(x, dim=1))
    v = torch.tensor([10.0, 5, 3, 8])
    dv = distribute_tensor(v, mesh, [Shard(0)])
    _eq(torch.argmax(dv), torch.argmax(v))
    _eq(torch.argmin(dv, 0, keepdim=True), torch.argmin(v, 0, keepdim=True))


def report_reductions_of_partial_values(rank, world):
    """PR #159856: ``vector_norm`` of a Partial(sum) was the sum of the local norms (and
    ``_foreach_norm``); PR #165962: ``max`` / ``min`` / ``prod`` of a Partial(sum) reduced
    the addends, not the value."""
    mesh = init_device_mesh("cpu", (world,))
    loc = torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])
    full = torch.tensor([3.0, 4.0])
    p = DTensor.from_local(loc, mesh, [Partial()])
    for o in (2, 1, float("inf")):
        _eq(torch.linalg.vector_norm(p, o), torch.linalg.vector_norm(full, o))
    _eq(torch._foreach_norm([p])[0], full.norm())
    pl_ = (
        torch.tensor([[1.0, -3.0], [2.0, 0.5]])
        if rank == 0
        else torch.tensor([[-2.0, 4.0], [1.0, -2.5]])
    )
    pf = torch.tensor([[-1.0, 1.0], [3.0, -2.0]])
    pp = DTensor.from_local(pl_, mesh, [Partial()])
    for got, ref in ((pp.max(), pf.max()), (pp.min(), pf.min()), (pp.amax(0), pf.amax(0))):
        _eq(got, ref)
    _eq(pp.prod(), pf.prod())
    _eq(pp.abs().sum(), pf.abs().sum())


def report_statistics_sorts_and_norms(rank, world):
    """PR #163879 / PR #168057 / PR #167547: ``logsumexp``, ``std``, ``var_mean`` over
    sharded dims; PR #159189: ``sort`` / ``topk`` along and across the sharded dim; #131992:
    ``vector_norm`` of a ``Shard(0)`` DTensor is the global norm, bit-equal on every rank;
    #147578: ``aten.amax.default`` (float8 rowwise scaling), ``amin``, backward."""
    mesh = init_device_mesh("cpu", (world,))
    z = torch.randn(5, 6, generator=torch.Generator().manual_seed(0))
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(z, mesh, [pl])
        _eq(torch.logsumexp(d, (0, 1)), torch.logsumexp(z, (0, 1)))
        _eq(d.std(), z.std())
        _pair(torch.var_mean(d, 0), torch.var_mean(z, 0))
        for dim in (0, 1):
            _pair(torch.sort(d, dim), torch.sort(z, dim))
            _pair(torch.topk(d, 2, dim), torch.topk(z, 2, dim))
    n = torch.linalg.vector_norm(distribute_tensor(z, mesh, [Shard(0)])).full_tensor()
    every = [torch.zeros(()) for _ in range(world)]
    torch.distributed.all_gather(every, n)
    assert all(torch.equal(e, every[0]) for e in every)
    _eq(n, torch.linalg.vector_norm(z))
    y = torch.randn(5, 6, generator=torch.Generator().manual_seed(7))
    for pl in (Shard(0), Shard(1)):
        d, r = distribute_tensor(y, mesh, [pl]).requires_grad_(), y.clone().requires_grad_()
        _eq(torch.amax(d, dim=-1, keepdim=True), torch.amax(y, dim=-1, keepdim=True))
        _eq(torch.ops.aten.amax.default(d, [0]), torch.amax(y, 0))
        _eq(d.abs().amax(), y.abs().amax())
        _eq(torch.amin(d, (0, 1)), y.amin((0, 1)))
        torch.amax(d, 1).sum().backward()
        torch.amax(r, 1).sum().backward()
        _eq(d.grad, r.grad)


def report_scan_gradients(rank, world):
    """#185362: ``cumprod`` / ``cummax`` / ``cummin`` backward on the sharded dim raised
    (and ``logcumsumexp``); a zero row on the shard boundary."""
    mesh = init_device_mesh("cpu", (world,))
    x = torch.rand(12, 8, generator=torch.Generator().manual_seed(1)) + 0.1
    x[6].zero_()
    for op in ("cumprod", "cummax", "cummin", "logcumsumexp"):
        d, r = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_(), x.clone().requires_grad_()
        od, orr = getattr(torch, op)(d, dim=0), getattr(torch, op)(r, dim=0)
        if isinstance(orr, tuple):
            _eq(od[1], orr[1])
            od, orr = od[0], orr[0]
        _eq(od, orr.detach())
        od.sum().backward()
        orr.sum().backward()
        _eq(d.grad, r.grad)


def report_histogram(rank, world):
    """PR #177336 gave ``torch.histogram`` a strategy; hyper_shard raised
    OpNotRegisteredError (fixed here): int bins, tensor bins, range and weight."""
    mesh = init_device_mesh("cpu", (world,))
    flat = torch.randn(5, 6, generator=torch.Generator().manual_seed(2)).flatten()
    df = distribute_tensor(flat, mesh, [Shard(0)])
    _pair(torch.histogram(df, 4), torch.histogram(flat, 4))
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.7, 2.5])
    _pair(torch.histogram(df, _rep(edges, mesh)), torch.histogram(flat, edges))
    _pair(
        torch.histogram(df, 3, range=(-1.0, 1.0), weight=df.abs()),
        torch.histogram(flat, 3, range=(-1.0, 1.0), weight=flat.abs()),
    )


@reports(
    report_gradient_of_tied_extrema,
    report_static_int_vs_dtensor_in_the_cache_key,
    report_means_and_indices,
    report_reductions_of_partial_values,
    report_statistics_sorts_and_norms,
    report_scan_gradients,
    report_histogram,
)
def test_reports(report, dist2):
    dist2.run(report)


def report_empty_shards_on_4_ranks(rank, world):
    """#162692 with empty shards: the mean of (1, 4) and (3, 4) over 4 ranks, backward;
    PR #159189 with empty shards: ``topk`` with k above the local size, ``max.dim``."""
    mesh = init_device_mesh("cpu", (world,))
    for n in (1, 3):
        u = torch.arange(4.0 * n).reshape(n, 4)
        d = distribute_tensor(u, mesh, [Shard(0)]).requires_grad_()
        r = u.clone().requires_grad_()
        _eq(d.mean(), u.mean())
        d.mean().backward()
        r.mean().backward()
        _eq(d.grad, r.grad)
    g = torch.Generator().manual_seed(3)
    t5 = torch.randn(5, 6, generator=g)
    d5 = distribute_tensor(t5, mesh, [Shard(0)])
    _pair(torch.topk(d5, 4, 0), torch.topk(t5, 4, 0))
    t3 = torch.randn(3, 4, generator=g)
    _pair(torch.max(distribute_tensor(t3, mesh, [Shard(0)]), 0), torch.max(t3, 0))


@reports(report_empty_shards_on_4_ranks)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
