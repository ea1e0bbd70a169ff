"""Public DTensor bug reports that hyper_shard also got wrong (or crashed on), now fixed; each
checked against plain torch on the same values, on real gloo ranks (a mesh of 2).

* pytorch/pytorch#174136, #159532: in-place view ops (``squeeze_``, ``unsqueeze_``, ``t_``,
  ``transpose_``, ``swapdims_``) were unregistered. They now run in place through the view
  rules; a view that would move data (``squeeze_`` of a sharded size-1 dim) raises before
  changing anything (PyTorch left the DTensor inconsistent).
* pytorch/pytorch#180346: ``clip_grad_norm_`` (and a foreach optimizer) over parameters of
  two meshes raised; one-element DTensors of another mesh over the same ranks are now taken
  as Replicate and foreach lists spanning meshes run per mesh.
* pytorch/pytorch#41779: ``amax``/``max()`` over a sharded dim split the gradient of ties
  per rank, then per shard; now evenly over every tied element, as torch.
* a stale decision (the class of pytorch/pytorch#147180, #153603, #159289): ``torch.max(x,
  y)`` after ``torch.max(x, 1)`` returned the reduction, because a spec id in the cache key
  equalled the static int ``1``.
* pytorch/pytorch#177409's ops (index_add/index_copy/index_fill, scatter_reduce,
  select_scatter/slice_scatter, take, searchsorted) had no rule.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from hyper_shard import (
    DTensor,
    Partial,
    Replicate,
    Shard,
    ShardingError,
    distribute_tensor,
    init_device_mesh,
)
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep

pytestmark = pytest.mark.multiproc


def check_inplace_views(rank, world):
    """#174136 / #159532."""
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
    return 1


def check_two_meshes(rank, world):
    """#180346: norms, clip coefficients and optimizer states of parameters on two meshes."""
    mesh_a = init_device_mesh("cpu", (world,))
    mesh_b = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
    g = torch.Generator().manual_seed(0)
    # gradients through a scalar of mesh a used on mesh b
    xa, xb = torch.randn(4, generator=g), torch.randn(4, 3, generator=g)
    da = distribute_tensor(xa, mesh_a, [Shard(0)]).requires_grad_()
    db = distribute_tensor(xb, mesh_b, [Shard(1)]).requires_grad_()
    ra, rb = xa.clone().requires_grad_(), xb.clone().requires_grad_()
    y, yr = db * (da * da).sum(), rb * (ra * ra).sum()
    _eq(y, yr.detach())
    w = torch.randn(4, 3, generator=g)
    (y * _rep(w, mesh_b)).sum().backward()
    (yr * w).sum().backward()
    _eq(da.grad, ra.grad)
    _eq(db.grad, rb.grad)
    # a larger DTensor of another mesh still raises, naming both meshes
    with pytest.raises(ShardingError, match="different meshes"):
        db + _rep(xb, mesh_a)
    # clip_grad_norm_ and AdamW, both code paths, two steps, against one device
    for foreach in (False, True):
        w1, w2 = torch.randn(4, 4, generator=g), torch.randn(6, generator=g)
        p1 = nn.Parameter(distribute_tensor(w1, mesh_a, [Shard(0)]))
        p2 = nn.Parameter(distribute_tensor(w2, mesh_b, [Shard(0)]))
        q1, q2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())
        opt = torch.optim.AdamW([p1, p2], lr=0.1, foreach=foreach)
        opt_r = torch.optim.AdamW([q1, q2], lr=0.1, foreach=foreach)
        for _ in range(2):
            opt.zero_grad()
            opt_r.zero_grad()
            ((p1 * p1).sum()).backward()
            ((p2 * 3).sum()).backward()
            ((q1 * q1).sum()).backward()
            ((q2 * 3).sum()).backward()
            n = torch.nn.utils.clip_grad_norm_([p1, p2], 0.5, foreach=foreach)
            nr = torch.nn.utils.clip_grad_norm_([q1, q2], 0.5, foreach=foreach)
            _eq(n.full_tensor(), nr)
            opt.step()
            opt_r.step()
        _eq(p1, q1.detach())
        _eq(p2, q2.detach())
    return 1


def check_extremum_ties(rank, world):
    """#41779: ties of the maximum on both ranks (rows 0 and 3 hold 9)."""
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
    return 1


def check_static_int_vs_dtensor(rank, world):
    """The layout-cache key of torch.max(x, 1) must not equal that of torch.max(x, y) (a
    spec id once equalled the static int 1); the same for min and a list index."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(5, 3, 1, generator=g), torch.randn(5, 3, 1, generator=g)
    dx, dy = _rep(x, mesh), _rep(y, mesh)
    for k in range(4):  # whatever ids the specs got, ints 0..3 then DTensors
        for fn in (torch.max, torch.min):
            v, _ = fn(dx, k % 3)
            _eq(v, fn(x, k % 3)[0])
            _eq(fn(dx, dy), fn(x, y))
    return 1


def check_index_ops(rank, world):
    """pytorch/pytorch#177409's ops, out of place, every placement of the input."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x, src = torch.randn(6, 4, generator=g), torch.randn(3, 4, generator=g)
    index = torch.tensor([4, 0, 2])
    sidx = torch.tensor([[0, 1, 2, 3], [5, 4, 3, 2], [1, 1, 1, 1]])
    sel, sl = torch.randn(4, generator=g), torch.randn(2, 4, generator=g)
    di = _rep(index, mesh)
    for pl in (Shard(0), Shard(1), Replicate(), Partial()):
        dx = distribute_tensor(x, mesh, [pl]) if type(pl) is not Partial else _partial(x, mesh)
        spl = Shard(1) if pl == Shard(1) else Replicate()
        ds, dsi = distribute_tensor(src, mesh, [spl]), distribute_tensor(sidx, mesh, [spl])
        _eq(dx.index_add(0, di, ds, alpha=2), x.index_add(0, index, src, alpha=2))
        _eq(dx.index_copy(0, di, ds), x.index_copy(0, index, src))
        _eq(dx.index_fill(0, di, -1.0), x.index_fill(0, index, -1.0))
        for red in ("sum", "amax", "mean"):
            _eq(dx.scatter_reduce(0, dsi, ds, red), x.scatter_reduce(0, sidx, src, red))
        _eq(
            torch.take(dx, _rep(torch.tensor([0, 7, 23]), mesh)),
            torch.take(x, torch.tensor([0, 7, 23])),
        )
        _eq(torch.select_scatter(dx, _rep(sel, mesh), 0, 2), torch.select_scatter(x, sel, 0, 2))
        _eq(
            torch.slice_scatter(dx, _rep(sl, mesh), 0, 1, 5, 2),
            torch.slice_scatter(x, sl, 0, 1, 5, 2),
        )
    # index_add on a Partial(sum) input and source stays Partial(sum)
    p, ps = _partial(x, mesh), _partial(src, mesh)
    out = p.index_add(0, di, ps)
    assert out.placements == (Partial(),), out.placements
    _eq(out, x.index_add(0, index, src))
    # in place on the dims it does not write; refused on the one it writes
    t = distribute_tensor(x, mesh, [Shard(1)])
    t.index_add_(0, di, distribute_tensor(src, mesh, [Shard(1)]))
    _eq(t, x.index_add(0, index, src))
    with pytest.raises(ShardingError, match="index_add_"):
        distribute_tensor(x, mesh, [Shard(0)]).index_add_(0, di, _rep(src, mesh))
    # gradients of index_add reach input and source
    dx = distribute_tensor(x, mesh, [Shard(1)]).requires_grad_()
    ds = distribute_tensor(src, mesh, [Shard(1)]).requires_grad_()
    rx, rs = x.clone().requires_grad_(), src.clone().requires_grad_()
    wt = torch.randn(6, 4, generator=g)
    (dx.index_add(0, di, ds, alpha=3) * _rep(wt, mesh)).sum().backward()
    (rx.index_add(0, index, rs, alpha=3) * wt).sum().backward()
    _eq(dx.grad, rx.grad)
    _eq(ds.grad, rs.grad)
    # searchsorted: a 1-d sorted sequence, values sharded (or the sequence sharded)
    seq, vals = (
        torch.tensor([1.0, 3.0, 5.0, 7.0, 9.0, 11.0]),
        torch.tensor([[2.0, 8.0], [11.0, 0.0]]),
    )
    for sp, vp in ((Replicate(), Shard(0)), (Shard(0), Replicate()), (Replicate(), Shard(1))):
        out = torch.searchsorted(
            distribute_tensor(seq, mesh, [sp]), distribute_tensor(vals, mesh, [vp])
        )
        _eq(out, torch.searchsorted(seq, vals))
    return 1


def _partial(t, mesh):
    """A Partial(sum) DTensor of global value ``t`` whose two addends are not trivial."""
    coord, n = mesh.get_coordinate()[0], mesh.shape[0]
    noise = torch.randn(t.shape, generator=torch.Generator().manual_seed(7))
    local = t - (n - 1) * noise if coord == 0 else noise
    return DTensor.from_local(local, mesh, [Partial()])


def check_all(rank, world):
    return [
        f(rank, world)
        for f in (
            check_inplace_views,
            check_two_meshes,
            check_extremum_ties,
            check_static_int_vs_dtensor,
            check_index_ops,
        )
    ]


def test_fixed_reports(dist2):
    assert dist2.run(check_all) == [[1] * 5] * 2
