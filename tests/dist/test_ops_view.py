"""View ops on real gloo ranks against plain torch on the same global input, forward and
backward: every placement combination on 2 ranks, a fixed random sample on a (2, 2) mesh,
and a 1-D mesh of 4 ranks (where ``(12, 8)`` ``Shard(1)`` ``.view(-1, 6)`` must be right);
public bug reports on views (``report_*``, each naming its report)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    ShardingError,
    distribute_tensor,
    init_device_mesh,
)
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep
from tests._reports import reports

pytestmark = pytest.mark.multiproc

PARTIALS = ("sum", "max")


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, mesh):
    """Every combination on a 1-D mesh; a fixed random sample of ``k`` on a 2-D one."""
    return combos if mesh.ndim == 1 or len(combos) <= k else random.Random(0).sample(combos, k)


def _check_all(mesh, cases, k, partials=PARTIALS):
    """``cases``: (global tensor, [functions of it]); each function over the sampled combos."""
    n = 0
    for t, fns in cases:
        combos = _sample(all_combos([t], mesh.ndim, partials), k, mesh)
        for fn in fns:
            n += check_op(fn, [t], mesh, combos)
    return n


def check_reshapes(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)  # even on 2 and 4 ranks
    u = torch.randn(5, 4, generator=g)  # uneven rows
    w = torch.randn(3, 4, generator=g)  # 3 rows over 2 ranks: flattening must gather
    v = torch.randn(12, generator=g)
    z = torch.randn(2, 3, 4, generator=g)
    cases = [
        (x, [lambda a: a.view(-1), lambda a: a.view(2, 2, 6), lambda a: a.view(8, 3),
             lambda a: a.view(6, -1), lambda a: torch.reshape(a, (3, 8)), lambda a: a.view(1, 24)]),
        (u, [lambda a: a.view(-1), lambda a: a.view(5, 2, 2), lambda a: a.view(10, 2),
             lambda a: a.reshape(20, 1)]),
        (w, [lambda a: a.view(12), lambda a: a.flatten()]),
        (v, [lambda a: a.view(4, 3), lambda a: a.view(3, 4), lambda a: a.unflatten(0, (2, -1)),
             lambda a: a.view(2, 3, 2)]),
        (z, [lambda a: a.flatten(0, 1), lambda a: torch.flatten(a, 1), lambda a: torch.ravel(a),
             lambda a: a.unflatten(-1, (2, 2)), lambda a: a.view(6, 4), lambda a: a.view(2, 12)]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6)


def check_permutes(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=g)
    z = torch.randn(3, 2, 5, generator=g)
    s = torch.randn((), generator=g)
    cases = [
        (x, [lambda a: a.transpose(0, 1), lambda a: a.t(), lambda a: a.T,
             lambda a: torch.swapaxes(a, 0, 1), lambda a: a.transpose(0, 1).contiguous()]),
        (z, [lambda a: torch.transpose(a, 0, 2), lambda a: a.swapdims(1, 2), lambda a: a.mT,
             lambda a: a.permute(2, 0, 1), lambda a: torch.movedim(a, 0, -1),
             lambda a: a.moveaxis((0, 1), (2, 0))]),
        # 0-d: transpose(0, 0) is the identity in torch (a regression case)
        (s, [lambda a: a.transpose(0, 0), lambda a: a.t(), lambda a: a.view(1),
             lambda a: a.reshape(()), lambda a: a.unsqueeze(0), lambda a: a.flatten(),
             lambda a: a.expand(3), lambda a: a.squeeze()]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6, ("sum", "avg", "max"))


def check_squeeze_expand(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 1, 3, 1, generator=g)
    p = torch.randn(2, 1, 3, generator=g)  # 2 rows over 2 ranks: size 1 locally, not squeezed
    e = torch.randn(3, 1, generator=g)
    cases = [
        (q, [lambda a: a.squeeze(), lambda a: a.squeeze(1), lambda a: torch.squeeze(a, (1, 3)),
             lambda a: a.squeeze(0), lambda a: a.unsqueeze(0), lambda a: a.unsqueeze(-1)]),
        (p, [lambda a: a.squeeze(), lambda a: a.squeeze(0), lambda a: a.unsqueeze(1)]),
        (e, [lambda a: a.expand(3, 4), lambda a: a.expand(2, 3, 4), lambda a: a.expand(-1, 5),
             lambda a: torch.broadcast_to(a, (2, 3, 5)), lambda a: a.expand(2, -1, -1) * 2]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6)


def check_as_ops(rank, world):
    """view_as / reshape_as / expand_as: ``other`` (a DTensor, any placements) gives only its
    global shape; only ``input`` is differentiated."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(3)
    x, o = torch.randn(4, 6, generator=g), torch.randn(2, 12, generator=g)
    e, eo = torch.randn(3, 1, generator=g), torch.randn(2, 3, 4, generator=g)
    n = 0
    for fn in (lambda a, b: a.view_as(b), lambda a, b: a.reshape_as(b)):
        n += check_op(fn, [x, o], mesh, _sample(all_combos([x, o], mesh.ndim), 12, mesh))
    n += check_op(
        lambda a, b: a.expand_as(b),
        [e, eo],
        mesh,
        _sample(all_combos([e, eo], mesh.ndim), 12, mesh),
    )
    return n


def check_dtype_views(rank, world):
    """``view(dtype)``: bits of a Partial sum are not the sum of the bits (reduced first); a
    changed element size needs the last dim whole. The input is the int32 bits of random
    floats (integer Partial decompositions are exact; viewed back they are those floats)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    t = torch.randn(4, 6, generator=torch.Generator().manual_seed(4)).view(torch.int32)
    opts = [Replicate(), Shard(0), Shard(1), Partial("sum")]
    combos = _sample([[pl] for pl in itertools.product(opts, repeat=mesh.ndim)], 8, mesh)
    n = 0
    for fn in (
        lambda a: a.view(torch.float32),
        lambda a: a.view(torch.int16),
        lambda a: a.view(torch.int64),
    ):
        n += check_op(fn, [t], mesh, combos, grad=False)
    return n


def check_nested(rank, world):
    """(2, 2) mesh, both mesh dims sharding one tensor dim: the combined pieces decide (6 rows
    split 2 x 2 are [2, 1, 2, 1] rows: flattening them is not torch.chunk of 24)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(6)
    a, b, c = (
        torch.randn(6, 4, generator=g),
        torch.randn(8, 3, generator=g),
        torch.randn(12, generator=g),
    )
    S0, S1, P = Shard(0), Shard(1), Partial()
    combos = [[(S0, S0)], [(S0, S1)], [(S1, S0)], [(P, S0)], [(S0, P)]]
    n = 0
    for t, fns in [
        (a, [lambda x: x.view(-1), lambda x: x.view(3, 8), lambda x: x.t().reshape(-1)]),
        (
            b,
            [
                lambda x: x.view(-1),
                lambda x: x.view(2, 12),
                lambda x: x.flatten().unflatten(0, (4, 6)),
            ],
        ),
    ]:
        for fn in fns:
            n += check_op(fn, [t], mesh, combos)
    for fn in (lambda x: x.view(4, 3), lambda x: x.view(3, 4), lambda x: x.view(2, 2, 3)):
        n += check_op(fn, [c], mesh, [[(S0, S0)], [(P, S0)], [(S0, P)]])
    return n


def check_mesh4_1d(rank, world):
    """A 1-D mesh of 4 ranks: uneven chunks (3 rows over 4 ranks, an empty shard) and the
    view PyTorch DTensor gets wrong: (12, 8) Shard(1) -> view(-1, 6)."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (4,))
    g = torch.Generator().manual_seed(5)
    t = torch.randn(12, 8, generator=g)
    x = dt_from_global(t, mesh, [Shard(1)])
    for _ in range(2):  # the second call hits the layout cache (rank-local shapes kept)
        y = x.view(-1, 6)
        assert tuple(y.shape) == (16, 6)
        assert_dtensor_close(y, t.view(-1, 6))
        torch.testing.assert_close(y.full_tensor(), t.view(-1, 6))
    u = torch.randn(6, 5, generator=g)
    w = torch.randn(3, 4, generator=g)
    cases = [
        (t, [lambda a: a.view(-1, 6), lambda a: a.view(16, 6), lambda a: a.reshape(8, 12),
             lambda a: a.view(-1), lambda a: a.view(3, 4, 8), lambda a: a.view(4, 3, 2, 4),
             lambda a: a.t(), lambda a: a.unflatten(0, (4, 3))]),
        (u, [lambda a: a.view(-1), lambda a: a.view(3, 10), lambda a: a.T, lambda a: a.unsqueeze(1)]),
        (w, [lambda a: a.view(-1), lambda a: a.view(3, 2, 2), lambda a: a.squeeze()]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 0)


_CHECKS = {
    "reshapes": check_reshapes,
    "permutes": check_permutes,
    "squeeze_expand": check_squeeze_expand,
    "as_ops": check_as_ops,
    "dtype_views": check_dtype_views,
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", list(_CHECKS))
def test_view_ops(name, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(_CHECKS[name])
    assert counts[0] > 0 and len(set(counts)) == 1


def test_nested_shards(dist4):
    counts = dist4.run(check_nested)
    assert counts[0] > 0 and len(set(counts)) == 1


def test_view_on_mesh_of_4(dist4):
    counts = dist4.run(check_mesh4_1d)
    assert counts[0] > 0 and len(set(counts)) == 1


# ---------------------------------------------------------------------- bug reports
def report_inplace_view_ops(rank, world):
    """pytorch/pytorch#174136, #159532: the in-place view ops (``squeeze_``, ``unsqueeze_``,
    ``t_``, ``transpose_``, ``swapdims_``) were unregistered (fixed here). They run in place
    through the view rules; a view that would move data (``squeeze_`` of a sharded size-1
    dim) raises before changing anything (PyTorch left the DTensor inconsistent)."""
    mesh = init_device_mesh("cpu", (world,))
    # a sharded, globally size-1 dim: refused before anything changes, the fixes work
    d = distribute_tensor(torch.arange(4.0).reshape(1, 4), mesh, [Shard(0)])
    with pytest.raises(ShardingError, match=r"squeeze_.*\[S\(0\)\].*x\.squeeze\(") as ei:
        d.squeeze_(0)
    assert "redistribute" in str(ei.value)
    assert tuple(d.shape) == (1, 4)
    _eq(d, torch.arange(4.0).reshape(1, 4))
    _eq(d.squeeze(0), torch.arange(4.0))
    r = d.redistribute(mesh, [Replicate()])
    assert r.squeeze_(0) is r and tuple(r.shape) == (4,)
    _eq(r, torch.arange(4.0))
    # squeeze_() squeezes the GLOBAL size-1 dims (rank 1's (1, 1) shard of (3, 1) keeps dim 0)
    e = distribute_tensor(torch.arange(3.0).reshape(3, 1), mesh, [Shard(0)])
    e.squeeze_()
    assert tuple(e.shape) == (3,) and e.placements == (Shard(0),)
    _eq(e, torch.arange(3.0))
    # autograd through t_ / unsqueeze_ on a non-leaf, placements carried along
    base = torch.arange(6.0).reshape(2, 3)
    x = distribute_tensor(base, mesh, [Shard(1)]).requires_grad_()
    rx = base.clone().requires_grad_()
    y, yr = x * 1, rx * 1
    y.t_()
    y.unsqueeze_(0)
    yr.t_()
    yr.unsqueeze_(0)
    assert y.placements == (Shard(1),), y.placements
    _eq(y, yr.detach())
    w = torch.arange(6.0).reshape(1, 3, 2)
    (y * _rep(w, mesh)).sum().backward()
    (yr * w).sum().backward()
    _eq(x.grad, rx.grad)
    z = distribute_tensor(torch.arange(24.0).reshape(2, 3, 4), mesh, [Shard(2)])
    z.transpose_(0, 2)
    z.swapdims_(1, 2)
    _eq(z, torch.arange(24.0).reshape(2, 3, 4).transpose(0, 2).swapdims(1, 2))


def report_uneven_views(rank, world):
    """#135054: ``view`` of an uneven (1, 2) ``Shard(0)`` tensor keeps the shard, (3, 2)
    too; #161147: views of unevenly sharded tensors ((5, 6) on 2 ranks); #163320:
    ``expand`` of a (1, 4) ``Shard(0)`` tensor held by one rank."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    for n in (1, 3):
        p = torch.randn(n, 2, generator=g)
        t2 = distribute_tensor(p, mesh, [Shard(0)]).view(n, 2)
        assert t2.placements == (Shard(0),)
        _eq(t2, p)
    y = torch.arange(30.0).reshape(5, 6)
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(y, mesh, [pl])
        _eq(d.view(30), y.view(30))
        _eq(d.view(10, 3), y.view(10, 3))
        _eq(d.unflatten(1, (2, 3)), y.unflatten(1, (2, 3)))
    e = torch.randn(1, 4, generator=g)
    _eq(distribute_tensor(e, mesh, [Shard(0)]).expand(4, 4), e.expand(4, 4))


def report_views_after_linear(rank, world):
    """#172102: ``linear`` on a sequence-sharded input with a Replicate weight, then
    view / transpose / reshape; #118596 / #118219: permute -> contiguous -> linear ->
    permute (a non-contiguous output); forward and every gradient."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    xs, W, bb = torch.randn(2, 8, 4, generator=g), torch.ones(4, 4), torch.ones(4)
    ds = distribute_tensor(xs, mesh, [Shard(1)]).requires_grad_()
    dW, db = _rep(W, mesh).requires_grad_(), _rep(bb, mesh).requires_grad_()
    rs, rW, rb = (t.clone().requires_grad_() for t in (xs, W, bb))
    o, ro = F.linear(ds, dW, db), F.linear(rs, rW, rb)
    o2 = o.view(2, 8, 2, 2).transpose(1, 2).reshape(2, 2, 16)
    ro2 = ro.view(2, 8, 2, 2).transpose(1, 2).reshape(2, 2, 16)
    _eq(o2, ro2.detach())
    o2.sum().backward()
    ro2.sum().backward()
    for d, r in ((ds, rs), (dW, rW), (db, rb)):
        _eq(d.grad.full_tensor(), r.grad)
    xi, yi, zi = (torch.randn(*s, generator=g) for s in ((4, 32, 4), (4, 32), (4,)))

    def fn(a, b, c):
        return F.linear(a.permute(0, 2, 1).contiguous(), b, c).permute(0, 2, 1)

    ins = (
        distribute_tensor(xi, mesh, [Shard(1)]).requires_grad_(),
        distribute_tensor(yi, mesh, [Shard(1)]).requires_grad_(),
        _rep(zi, mesh).requires_grad_(),
    )
    refs = tuple(t.clone().requires_grad_() for t in (xi, yi, zi))
    o, ro = fn(*ins), fn(*refs)
    _eq(o, ro.detach(), atol=1e-4, rtol=1e-4)
    o.contiguous().sum().backward()
    ro.contiguous().sum().backward()
    for a, b in zip(ins, refs):
        _eq(a.grad, b.grad, atol=1e-4, rtol=1e-4)


def report_tensor_unfold(rank, world):
    """PR #177336 gave ``Tensor.unfold`` a strategy; hyper_shard raised
    OpNotRegisteredError (fixed here): the unfolded dim gathered, the others keep their
    shards; a Partial passes through; backward."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    for pl in (Shard(0), Shard(1)):
        for dim, size, step in ((0, 2, 1), (1, 3, 2)):
            d, r = distribute_tensor(t, mesh, [pl]).requires_grad_(), t.clone().requires_grad_()
            o, ro = d.unfold(dim, size, step), r.unfold(dim, size, step)
            _eq(o, ro.detach())
            if dim != pl.dim:
                assert o.placements == (pl,)
            (o * o).sum().backward()
            (ro * ro).sum().backward()
            _eq(d.grad, r.grad)
    part = DTensor.from_local(t / world, mesh, [Partial()])
    _eq(part.unfold(1, 2, 2), t.unfold(1, 2, 2))


def report_dtype_view_and_expand_as(rank, world):
    """#144286: ``Tensor.view(dtype)`` keeps the placements; #122485: ``expand_as`` a
    sharded DTensor (a size-1 dim expanded keeps the other shards)."""
    mesh = init_device_mesh("cpu", (world,))
    z = torch.randn(6, 4, generator=torch.Generator().manual_seed(6))
    z[:, 1] = 0
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(z, mesh, [pl])
        v = d.view(torch.int32)
        assert v.dtype == torch.int32 and v.placements == (pl,)
        _eq(v, z.view(torch.int32))
        _eq(d.to(torch.bfloat16).view(torch.int16), z.to(torch.bfloat16).view(torch.int16))
    m3 = torch.randn(2, 3, 4, generator=torch.Generator().manual_seed(11))
    dm3 = distribute_tensor(m3, mesh, [Shard(0)])
    row = torch.randn(4, generator=torch.Generator().manual_seed(12))
    _eq(_rep(row, mesh).expand_as(dm3) + dm3, row + m3)
    c = torch.randn(2, 1, 4, generator=torch.Generator().manual_seed(13))
    ex = distribute_tensor(c, mesh, [Shard(0)]).expand_as(dm3)
    assert ex.placements == (Shard(0),)
    _eq(ex, c.expand_as(m3))


def _rope(t, freqs):
    tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
    return torch.view_as_real(tc * freqs[None, :, None, :]).flatten(3)


def report_complex_rotary_embedding(rank, world):
    """pytorch/torchtitan#267: complex rotary embedding (``view_as_complex`` * freqs,
    ``view_as_real``) had a wrong backward on DTensors."""
    mesh = init_device_mesh("cpu", (world,))
    xr = torch.randn(2, 6, 4, 8, generator=torch.Generator().manual_seed(6))
    freqs = torch.polar(
        torch.ones(6, 4), torch.randn(6, 4, generator=torch.Generator().manual_seed(7))
    )
    for pl in (Shard(2), Shard(0), Shard(1)):
        d, r = distribute_tensor(xr, mesh, [pl]).requires_grad_(), xr.clone().requires_grad_()
        o, ro = _rope(d, _rep(freqs, mesh)), _rope(r, freqs)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
        (o * o.detach().sign()).sum().backward()
        (ro * ro.detach().sign()).sum().backward()
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-5)


@reports(
    report_inplace_view_ops,
    report_uneven_views,
    report_views_after_linear,
    report_tensor_unfold,
    report_dtype_view_and_expand_as,
    report_complex_rotary_embedding,
)
def test_reports(report, dist2):
    dist2.run(report)


def report_views_on_4_ranks(rank, world):
    """#143372: ``Replicate -> Shard(0)`` of (6, 4) on 4 ranks (2, 2, 2, 0 rows), then
    ``view(-1)``; (5, 4) too; #179502: (12, 8) ``Shard(1)`` -> ``view(16, 6)`` needs a
    redistribution."""
    mesh = init_device_mesh("cpu", (world,))
    for n in (6, 5):
        x = torch.arange(n * 4.0).reshape(n, 4)
        d = DTensor.from_local(x, mesh, [Replicate()]).redistribute(mesh, [Shard(0)])
        _eq(d.view(-1), x.view(-1))
        _eq(d.reshape(2 * n, 2), x.reshape(2 * n, 2))
    t = torch.randn(12, 8, generator=torch.Generator().manual_seed(0))
    _eq(distribute_tensor(t, mesh, [Shard(1)]).view(16, 6), t.view(16, 6))


@reports(report_views_on_4_ranks)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
