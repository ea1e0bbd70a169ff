"""Public bug reports on the tensor ops of ``test_ops_tensor.py`` (joins and splits,
triangular ops, indexing reads and writes, index ops, masks, scatters), each replaying the
report's program on real gloo ranks against plain torch on the same values, forward and
the gradients where the report is about them (each ``report_*`` names its report)."""

from __future__ import annotations

import pytest
import torch

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
from tests._helpers import assert_dtensor_close
from tests._helpers import replicate as _rep
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _partial(t, mesh):
    """A Partial(sum) DTensor of global value ``t`` whose two addends are not trivial."""
    coord, n = mesh.get_coordinate()[0], mesh.shape[0]
    noise = torch.randn(t.shape, generator=_gen(7))
    local = t - (n - 1) * noise if coord == 0 else noise
    return DTensor.from_local(local, mesh, [Partial()])


def report_index_ops(rank, world):
    """#177409's ops had no rule (fixed here): ``index_add`` / ``index_copy`` /
    ``index_fill``, ``scatter_reduce``, ``select_scatter`` / ``slice_scatter``, ``take``,
    ``searchsorted``; out of place on every placement of the input, in place where they
    do not write the sharded dim, gradients of ``index_add``."""
    mesh = init_device_mesh("cpu", (world,))
    g = _gen(0)
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


def report_bool_mask_index(rank, world):
    """Issue 4, case 11 (a public PyTorch DTensor report): boolean-mask indexing of (4, 32,
    64) ``Shard(2)`` by a (4, 32) mask: the read has a data-dependent shape: with a DTensor
    mask it runs whole (a Replicate result equal to torch's), a plain mask errors clearly;
    ``repeat_interleave(repeats)``; the same-shape forms and the masked write work and
    equal torch."""
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(4, 32, 64)
    mask = torch.rand(4, 32) > 0.5
    dx = distribute_tensor(x, mesh, [Shard(2)])
    dmask = distribute_tensor(mask, mesh, [Replicate()])
    with pytest.raises(ShardingError, match="plain tensor"):
        dx[mask]
    got = dx[dmask]
    assert got.placements == (Replicate(),)
    assert_dtensor_close(got, x[mask])
    # torch.repeat_interleave(repeats): the index expansion, sized by the values
    reps = torch.tensor([2, 0, 3, 1, 1])
    got = torch.repeat_interleave(distribute_tensor(reps, mesh, [Shard(0)]))
    assert_dtensor_close(got, torch.repeat_interleave(reps))
    # what works instead, equal to torch
    ref = x.masked_fill(~mask[..., None], 0.0)
    out = dx.masked_fill(~dmask[..., None], 0.0)
    assert out.placements == (Shard(2),)
    assert_dtensor_close(out, ref)
    assert_dtensor_close(torch.where(dmask[..., None], dx, 0.0), ref)
    torch.testing.assert_close(dx.full_tensor()[mask], x[mask])
    ex, e = dx.clone(), x.clone()
    ex[dmask] = -1.0
    e[mask] = -1.0
    assert ex.placements == (Shard(2),)
    assert_dtensor_close(ex, e)


def report_masks_with_gradients(rank, world):
    """#152249: ``masked_fill_.Scalar`` (``torch.norm``'s backward with zero columns);
    #152717: boolean-mask indexing / ``masked_select`` of a sharded DTensor, backward."""
    mesh = init_device_mesh("cpu", (world,))
    z = torch.randn(6, 4, generator=_gen(6))
    z[:, 1] = 0
    mask = torch.tensor([True, False, True, False, False, True])[:, None].expand(6, 4)
    for pl in (Shard(0), Shard(1)):
        d, r = distribute_tensor(z, mesh, [pl]).requires_grad_(), z.clone().requires_grad_()
        o, ro = torch.norm(d, p=2, dim=0), torch.norm(r, p=2, dim=0)
        _eq(o, ro.detach())
        o.sum().backward()
        ro.sum().backward()
        _eq(d.grad, r.grad)
        dm = distribute_tensor(mask.contiguous(), mesh, [pl])
        got = torch.ops.aten.masked_fill_.Scalar(distribute_tensor(z, mesh, [pl]), dm, 5.0)
        _eq(got, z.clone().masked_fill_(mask, 5.0))
    emb = torch.randn(4, 32, 8, generator=_gen(8))
    bm = (torch.arange(4 * 32).reshape(4, 32) % 2).bool()
    for pl in (Shard(2), Shard(0), Replicate()):
        d, r = distribute_tensor(emb, mesh, [pl]).requires_grad_(), emb.clone().requires_grad_()
        dbm = _rep(bm, mesh)
        _eq(d[dbm], emb[bm])
        full_mask = _rep(bm[..., None].expand(4, 32, 8).contiguous(), mesh)
        _eq(torch.masked_select(d, full_mask), torch.masked_select(emb, bm[..., None]))
        (d[dbm] ** 2).sum().backward()
        (r[bm] ** 2).sum().backward()
        _eq(d.grad, r.grad)


def report_joins_and_copies(rank, world):
    """#158538: ``copy_`` with broadcasting between different placements; #129018:
    ``stack`` / ``cat`` of sharded tensors on every dim; PR #179059: ``cartesian_prod`` of
    two ``Shard(0)`` vectors raised in PyTorch's ``_StridedShard`` redistribution."""
    mesh = init_device_mesh("cpu", (world,))
    g = _gen(0)
    src = torch.randn(4, generator=g)
    for pd, ps in ((Shard(0), Shard(0)), (Shard(1), Shard(0)), (Replicate(), Shard(0))):
        d = distribute_tensor(torch.zeros(4, 4), mesh, [pd])
        d.copy_(distribute_tensor(src, mesh, [ps]))
        assert d.placements == (pd,)
        _eq(d, torch.zeros(4, 4).copy_(src))
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    for p in (Shard(0), Shard(1)):
        dx, dy2 = distribute_tensor(x, mesh, [p]), distribute_tensor(y, mesh, [p])
        for dim in (0, 1, 2):
            _eq(torch.stack([dx, dy2], dim), torch.stack([x, y], dim))
    a, b = torch.tensor([1, 2, 3, 4]), torch.tensor([10, 20])
    da = DTensor.from_local(a.chunk(world)[rank], mesh, [Shard(0)])
    db = DTensor.from_local(b.chunk(world)[rank], mesh, [Shard(0)])
    _eq(torch.cartesian_prod(da, db), torch.cartesian_prod(a, b))


def report_scatter_and_index_put(rank, world):
    """#186149: MoE routing ``zeros_like(scores).scatter_(-1, topk_ids, 1)`` on token
    shards; #170934 / #172350: ``index_put`` into the indexed, sharded dim with sharded
    index and values; #118461: backward of ``index_put`` (its backward builds zeros from
    the values' metadata), and the nanogpt ``x[:, [-1], :]`` pattern."""
    mesh = init_device_mesh("cpu", (world,))
    scores = torch.randn(6, 8, generator=_gen(0))
    ids = scores.topk(2, dim=-1).indices
    ds, di = distribute_tensor(scores, mesh, [Shard(0)]), distribute_tensor(ids, mesh, [Shard(0)])
    out = torch.zeros_like(ds).scatter_(-1, di, 1.0)
    assert out.placements == (Shard(0),)
    _eq(out, torch.zeros_like(scores).scatter_(-1, ids, 1.0))
    vals, idx = torch.arange(16.0) + 1, torch.arange(16).flip(0)
    dd = distribute_tensor(torch.zeros(16), mesh, [Shard(0)])
    dd[distribute_tensor(idx, mesh, [Shard(0)])] = distribute_tensor(vals, mesh, [Shard(0)])
    _eq(dd, torch.zeros(16).index_put((idx,), vals))
    xi, vi = torch.randn(6, 4, generator=_gen(14)), torch.randn(3, 4, generator=_gen(15))
    at = torch.tensor([4, 0, 2])
    seq = torch.randn(2, 6, 4, generator=_gen(16))
    for pl, spl in ((Shard(0), Shard(0)), (Shard(1), Shard(2)), (Replicate(), Replicate())):
        dx, rx = distribute_tensor(xi, mesh, [pl]).requires_grad_(), xi.clone().requires_grad_()
        dv, rv = _rep(vi, mesh).requires_grad_(), vi.clone().requires_grad_()
        o, ro = torch.index_put(dx * 1, (_rep(at, mesh),), dv), torch.index_put(rx * 1, (at,), rv)
        _eq(o, ro.detach())
        (o * o).sum().backward()
        (ro * ro).sum().backward()
        _eq(dx.grad, rx.grad)
        _eq(dv.grad, rv.grad)
        ds, rs = distribute_tensor(seq, mesh, [spl]).requires_grad_(), seq.clone().requires_grad_()
        o, ro = ds[:, [-1], :], rs[:, [-1], :]
        _eq(o, ro.detach())
        (o * 3).sum().backward()
        (ro * 3).sum().backward()
        _eq(ds.grad, rs.grad)


def report_indexing_reads(rank, world):
    """#179136: ``x[:, idx]`` with a DTensor index, backward (replicated and sharded x);
    #147724: ``aten.select.int`` (integer indexing) on every placement, backward; #149447:
    slicing the sharded dim (values, and the shard kept on an unsliced dim); PR #176037:
    ``index_select`` with a sharded index, backward to the sharded input."""
    mesh = init_device_mesh("cpu", (world,))
    idx = _rep(torch.tensor([1, 3, 5]), mesh)
    for pl in (Replicate(), Shard(1)):
        base = torch.arange(16.0).reshape(2, 8)
        x, rx = distribute_tensor(base, mesh, [pl]).requires_grad_(), base.clone().requires_grad_()
        x[:, idx].sum().backward()
        rx[:, torch.tensor([1, 3, 5])].sum().backward()
        _eq(x.grad, rx.grad)
    t = torch.arange(24.0).reshape(4, 6)
    for pl in (Shard(0), Shard(1), Replicate()):
        d, r = distribute_tensor(t, mesh, [pl]).requires_grad_(), t.clone().requires_grad_()
        for dim, i in ((0, 1), (1, -1), (0, 3)):
            _eq(torch.ops.aten.select.int(d, dim, i), torch.select(t, dim, i))
        (d.select(1, 2) * d.select(0, 3)[:4]).sum().backward()
        (r.select(1, 2) * r.select(0, 3)[:4]).sum().backward()
        _eq(d.grad, r.grad)
    s = torch.randn(32, 32, generator=_gen(9))
    d = distribute_tensor(s, mesh, [Shard(-1)])
    assert d[:16].placements == (Shard(1),)
    for ix in (
        (slice(None, 16),),
        (..., slice(None, 16)),
        (..., slice(8, 24)),
        (..., slice(None, None, 3)),
    ):
        _eq(d[ix], s[ix])
    v = torch.rand(256, generator=_gen(10))
    _eq(distribute_tensor(v, mesh, [Shard(-1)])[64:128], v[64:128])
    d, r = distribute_tensor(s, mesh, [Shard(1)]).requires_grad_(), s.clone().requires_grad_()
    (d[..., 5:20] ** 2).sum().backward()
    (r[..., 5:20] ** 2).sum().backward()
    _eq(d.grad, r.grad)
    t = torch.arange(30.0).reshape(5, 6)
    sel = torch.tensor([4, 0, 2, 2, 1, 3])
    for pl in (Shard(0), Shard(1)):
        for dim in (0, 1):
            d, r = distribute_tensor(t, mesh, [pl]).requires_grad_(), t.clone().requires_grad_()
            o = torch.index_select(d, dim, distribute_tensor(sel, mesh, [Shard(0)]))
            ro = torch.index_select(r, dim, sel)
            _eq(o, ro.detach())
            (o * o).sum().backward()
            (ro * ro).sum().backward()
            _eq(d.grad, r.grad)


def report_shape_ops(rank, world):
    """PR #169171 / PR #175463: ``flip`` / ``roll`` on the sharded dim (no strategy in
    PyTorch); PR #133545: ``triu`` / ``tril`` (replicate-only there); #124990: ``nonzero``
    / ``diagonal`` of a sharded DTensor; #173123: the unused output of a multi-output op
    (``split``) gets a DTensor (zero) gradient."""
    mesh = init_device_mesh("cpu", (world,))
    y = torch.arange(30.0).reshape(5, 6)
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(y, mesh, [pl])
        _eq(torch.flip(d, [0, 1]), torch.flip(y, [0, 1]))
        _eq(torch.roll(d, 2, 0), torch.roll(y, 2, 0))
        _eq(torch.roll(d, 3), torch.roll(y, 3))
        _eq(torch.triu(d, 1), torch.triu(y, 1))
        _eq(torch.tril(d, -1), torch.tril(y, -1))
    m = torch.arange(8).view(4, 2) % 3
    dm = distribute_tensor(m, mesh, [Shard(0)])
    _eq(torch.nonzero(dm), torch.nonzero(m))
    _eq(torch.diagonal(dm), torch.diagonal(m))
    base = torch.randn(4, 6, generator=_gen(1))
    d, r = distribute_tensor(base, mesh, [Shard(0)]).requires_grad_(), base.clone().requires_grad_()
    (d.split(3, dim=1)[0] * 2).sum().backward()
    (r.split(3, dim=1)[0] * 2).sum().backward()
    assert isinstance(d.grad, DTensor)
    _eq(d.grad, r.grad)


def report_ops_without_a_strategy(rank, world):
    """Unregistered here before (fixed), found replaying PR #177336 and #119930 (PyTorch's
    tracking issue of ops with no DTensor strategy): ``Tensor.masked_scatter`` (the source
    read in the global order of the mask), ``torch.vander``, ``torch.combinations``,
    ``torch.diagflat``, ``Tensor.put``."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(5, 6, generator=_gen(2))
    src = torch.arange(30.0).view(5, 6)
    _eq(
        distribute_tensor(t, mesh, [Shard(0)]).masked_scatter(
            distribute_tensor(t > 0, mesh, [Shard(1)]), _rep(src, mesh)
        ),
        t.masked_scatter(t > 0, src),
    )
    ar = torch.arange(5.0)
    dar = distribute_tensor(ar, mesh, [Shard(0)])
    _eq(torch.vander(dar, 4, increasing=True), torch.vander(ar, 4, increasing=True))
    assert torch.vander(dar, 4).placements == (Shard(0),)
    _eq(torch.vander(dar), torch.vander(ar))
    _eq(torch.combinations(dar, 3, with_replacement=True), torch.combinations(ar, 3, True))
    _eq(torch.combinations(dar), torch.combinations(ar))
    _eq(torch.diagflat(distribute_tensor(t[:2], mesh, [Shard(1)]), -2), torch.diagflat(t[:2], -2))
    at, val = torch.tensor([0, 29, 0]), torch.tensor([1.0, 2.0, 3.0])
    _eq(
        distribute_tensor(t, mesh, [Shard(0)]).put(
            _rep(at, mesh), _rep(val, mesh), accumulate=True
        ),
        t.put(at, val, accumulate=True),
    )


def report_inplace_views_and_init(rank, world):
    """PR #159532: ``squeeze_`` / ``unsqueeze_`` in place (the placements must follow the
    dims that moved); #136946: ``nn.init.eye_`` had no strategy (``aten.eye.m_out``), with
    ``dirac_`` and ``orthogonal_`` (same seed, same values as one device); PR #149071:
    ``slice_backward`` of a slice of the sharded dim and of another dim."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(1, 4, generator=_gen(11))
    d = distribute_tensor(t, mesh, [Shard(1)])
    d.squeeze_(0)
    assert d.shape == (4,) and d.placements == (Shard(0),)
    _eq(d, t.squeeze(0))
    t3 = torch.randn(4, 1, 3, generator=_gen(12))
    d = distribute_tensor(t3, mesh, [Shard(0)])
    d.unsqueeze_(1)
    d.squeeze_(2)
    assert d.shape == (4, 1, 3) and d.placements == (Shard(0),)
    _eq(d, t3.unsqueeze(1).squeeze(2))
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(torch.rand(3, 5), mesh, [pl])
        torch.nn.init.eye_(d)
        assert d.placements == (pl,)
        _eq(d, torch.eye(3, 5))
    for pl in (Shard(0), Shard(2)):
        d, r = distribute_tensor(torch.rand(4, 2, 3, 3), mesh, [pl]), torch.rand(4, 2, 3, 3)
        torch.nn.init.dirac_(d)
        _eq(d, torch.nn.init.dirac_(r))
    for pl in (Shard(0), Shard(1)):
        d, r = distribute_tensor(torch.rand(4, 6), mesh, [pl]), torch.rand(4, 6)
        torch.manual_seed(0)
        torch.nn.init.orthogonal_(d)
        torch.manual_seed(0)
        torch.nn.init.orthogonal_(r)
        _eq(d, r)
    base = torch.arange(24.0).reshape(4, 6)
    for pl in (Shard(0), Shard(1)):
        dx, rx = distribute_tensor(base, mesh, [pl]).requires_grad_(), base.clone().requires_grad_()
        ((dx[1:3, 1:5] * 3) ** 2).sum().backward()
        ((rx[1:3, 1:5] * 3) ** 2).sum().backward()
        assert dx.grad.placements == (pl,)
        _eq(dx.grad, rx.grad)


@reports(
    report_index_ops,
    report_bool_mask_index,
    report_masks_with_gradients,
    report_joins_and_copies,
    report_scatter_and_index_put,
    report_indexing_reads,
    report_shape_ops,
    report_ops_without_a_strategy,
    report_inplace_views_and_init,
)
def test_reports(report, dist2):
    dist2.run(report)
