"""Public DTensor / TP / FSDP2 bug reports, fourth sweep (``pytorch/pytorch#N`` unless another
repository is named; "PR" marks a pull request whose description carries the reproducer).
Each case runs the report's program on hyper_shard and compares it with plain torch on the
same values (forward, and gradients where the report is about them).

Already right in hyper_shard (kept as regression checks; what PyTorch did wrong is in each
case's comment): #185167, #180486, #144109, #163374, #142190 / #157631, #147724, #152249,
#144286, #147578, #146190, #152717, #149447, #122485, #118461, #191926, #159959, #128699,
#134050, pytorch/torchtitan#267, PR #120238 / PR #120910, pytorch/torchtitan PR #4637,
pytorch/torchtitan#2217.

Fixed here: #167917 (``detach_`` of an op's DTensor result raised torch's "Can't detach
views in-place", and ``aten.detach_.default`` / ``aten.detach.default`` had no binding) and
#176076 (a weight tied between two modules of one ``fully_shard([a, b])`` unit was sharded
for the first module only; the root's call then refused the second one's copy), in
:func:`check_fixed`.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep

pytestmark = pytest.mark.multiproc


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _grads_equal(got, ref, **kw):
    for a, b in zip(got, ref):
        _eq(a.grad, b.grad, **kw)


def check_values(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    # #185167: nll_loss(weight=, reduction="mean") over a batch-sharded input took the mean
    # of per-shard weighted means (the weights' sums differ between the shards)
    x = torch.randn(8, 5, generator=_gen(0)).log_softmax(-1)
    tgt, w = torch.tensor([0, 0, 0, 1, 2, 3, 4, 4]), torch.rand(5, generator=_gen(1)) + 0.1
    for red in ("mean", "sum", "none"):
        dx, rx = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_(), x.clone().requires_grad_()
        o = F.nll_loss(dx, _rep(tgt, mesh), weight=_rep(w, mesh), reduction=red)
        ro = F.nll_loss(rx, tgt, weight=w, reduction=red)
        _eq(o, ro.detach())
        o.sum().backward()
        ro.sum().backward()
        _eq(dx.grad, rx.grad)
        dt = distribute_tensor(tgt, mesh, [Shard(0)])
        ce = F.cross_entropy(dx.detach(), dt, weight=_rep(w, mesh), reduction=red)
        _eq(ce, F.cross_entropy(x, tgt, weight=w, reduction=red))
    ign = tgt.clone()
    ign[:3] = -100
    di = distribute_tensor(ign, mesh, [Shard(0)])
    dx = distribute_tensor(x, mesh, [Shard(0)])
    _eq(F.cross_entropy(dx, di, weight=_rep(w, mesh)), F.cross_entropy(x, ign, weight=w))
    _eq(F.cross_entropy(dx, di, label_smoothing=0.1), F.cross_entropy(x, ign, label_smoothing=0.1))
    # #180486: a Replicate parameter whose gradient arrives transposed (non-contiguous
    # Partial): autograd's layout fix-up all-reduced it in PyTorch
    wt = torch.randn(6, 4, generator=_gen(2))
    xs = distribute_tensor(torch.randn(8, 4, generator=_gen(3)), mesh, [Shard(0)])
    dw, rw = _rep(wt, mesh).requires_grad_(), wt.clone().requires_grad_()
    (xs @ dw.t()).pow(2).sum().backward()
    (xs.full_tensor() @ rw.t()).pow(2).sum().backward()
    _eq(dw.grad, rw.grad, atol=1e-4, rtol=1e-4)
    # #144109: from_local of shards that are not torch.chunk's layout gave a silently
    # wrong full_tensor(); hyper_shard gathers the sizes and names the mismatch
    loc = torch.arange(2.0 * (2 + rank)).reshape(2, 2 + rank)
    with pytest.raises(ValueError, match="not the torch.chunk layout"):
        DTensor.from_local(loc, mesh, [Shard(1)])
    # #163374: clamp_ of a Partial(sum) clamped each addend (PyTorch printed 144 for 2);
    # refused here, the value unchanged
    p = DTensor.from_local(torch.tensor(3.0 + rank), mesh, [Partial()])
    full = torch.tensor(3.0 * world + sum(range(world)))
    with pytest.raises(RuntimeError, match="in-place operations that require placement"):
        p.clamp_(None, 2)
    _eq(p, full)
    _eq(p.clamp(None, 2), full.clamp(None, 2))
    p.mul_(2).add_(1)
    _eq(p, full * 2 + 1)
    # #142190 / #157631: matmul / einsum under torch.inference_mode() (no strategy there)
    a, b = torch.randn(8, 16, generator=_gen(4)), torch.randn(16, 16, generator=_gen(5))
    da, db = _rep(a, mesh), distribute_tensor(b, mesh, [Shard(0)])
    with torch.inference_mode():
        _eq(torch.matmul(da, db), a @ b, atol=1e-5, rtol=1e-5)
        _eq(torch.ops.aten.matmul.default(da, db), a @ b, atol=1e-5, rtol=1e-5)
        _eq(torch.einsum("ij,jk->ik", da, db), a @ b, atol=1e-5, rtol=1e-5)
    # #147724: aten.select.int (integer indexing) on every placement, backward
    t = torch.arange(24.0).reshape(4, 6)
    for pl in (Shard(0), Shard(1), Replicate()):
        d, r = distribute_tensor(t, mesh, [pl]).requires_grad_(), t.clone().requires_grad_()
        for dim, i in ((0, 1), (1, -1), (0, 3)):
            _eq(torch.ops.aten.select.int(d, dim, i), torch.select(t, dim, i))
        (d.select(1, 2) * d.select(0, 3)[:4]).sum().backward()
        (r.select(1, 2) * r.select(0, 3)[:4]).sum().backward()
        _eq(d.grad, r.grad)
    # #152249: masked_fill_.Scalar (torch.norm's backward with zero columns)
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
    # #144286: Tensor.view(dtype) keeps the placements
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(z, mesh, [pl])
        v = d.view(torch.int32)
        assert v.dtype == torch.int32 and v.placements == (pl,)
        _eq(v, z.view(torch.int32))
        _eq(d.to(torch.bfloat16).view(torch.int16), z.to(torch.bfloat16).view(torch.int16))
    # #147578: aten.amax.default (float8 rowwise scaling), amin, backward
    y = torch.randn(5, 6, generator=_gen(7))
    for pl in (Shard(0), Shard(1)):
        d, r = distribute_tensor(y, mesh, [pl]).requires_grad_(), y.clone().requires_grad_()
        _eq(torch.amax(d, dim=-1, keepdim=True), torch.amax(y, dim=-1, keepdim=True))
        _eq(torch.ops.aten.amax.default(d, [0]), torch.amax(y, 0))
        _eq(d.abs().amax(), y.abs().amax())
        _eq(torch.amin(d, (0, 1)), y.amin((0, 1)))
        torch.amax(d, 1).sum().backward()
        torch.amax(r, 1).sum().backward()
        _eq(d.grad, r.grad)
    # #146190: dropout of a sharded DTensor draws the single-device mask
    ones = torch.ones(8, 8)
    torch.manual_seed(5)
    got = F.dropout(distribute_tensor(ones, mesh, [Shard(0)]), 0.5)
    torch.manual_seed(5)
    _eq(got, F.dropout(ones, 0.5))
    # #152717: boolean-mask indexing / masked_select of a sharded DTensor, backward
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
    # #149447: slicing the sharded dim (values, and the shard kept on an unsliced dim)
    s = torch.randn(32, 32, generator=_gen(9))
    d = distribute_tensor(s, mesh, [Shard(-1)])
    assert d[:16].placements == (Shard(1),)
    for idx in (
        (slice(None, 16),),
        (..., slice(None, 16)),
        (..., slice(8, 24)),
        (..., slice(None, None, 3)),
    ):
        _eq(d[idx], s[idx])
    v = torch.rand(256, generator=_gen(10))
    _eq(distribute_tensor(v, mesh, [Shard(-1)])[64:128], v[64:128])
    d, r = distribute_tensor(s, mesh, [Shard(1)]).requires_grad_(), s.clone().requires_grad_()
    (d[..., 5:20] ** 2).sum().backward()
    (r[..., 5:20] ** 2).sum().backward()
    _eq(d.grad, r.grad)
    # #122485: expand_as a sharded DTensor (a size-1 dim expanded keeps the other shards)
    m3 = torch.randn(2, 3, 4, generator=_gen(11))
    dm3 = distribute_tensor(m3, mesh, [Shard(0)])
    row = torch.randn(4, generator=_gen(12))
    _eq(_rep(row, mesh).expand_as(dm3) + dm3, row + m3)
    c = torch.randn(2, 1, 4, generator=_gen(13))
    ex = distribute_tensor(c, mesh, [Shard(0)]).expand_as(dm3)
    assert ex.placements == (Shard(0),)
    _eq(ex, c.expand_as(m3))
    # #118461: backward of index_put (its backward builds zeros from the values' metadata);
    # the nanogpt x[:, [-1], :] pattern
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
        _grads_equal((dx, dv), (rx, rv))
        ds, rs = distribute_tensor(seq, mesh, [spl]).requires_grad_(), seq.clone().requires_grad_()
        o, ro = ds[:, [-1], :], rs[:, [-1], :]
        _eq(o, ro.detach())
        (o * 3).sum().backward()
        (ro * 3).sum().backward()
        _eq(ds.grad, rs.grad)
    return 1


def _rope(t, freqs):
    tc = torch.view_as_complex(t.float().reshape(*t.shape[:-1], -1, 2))
    return torch.view_as_real(tc * freqs[None, :, None, :]).flatten(3)


def check_modules(rank, world):
    from hyper_shard.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        distribute_module,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    # #191926: Conv2d's grad_input placement with the input sharded on the width (it came
    # back Shard(0) in PyTorch 2.13); kernel == stride keeps the width shards
    torch.manual_seed(0)
    conv, rconv = nn.Conv2d(3, 8, 4, 4), nn.Conv2d(3, 8, 4, 4)
    rconv.load_state_dict(conv.state_dict())
    distribute_module(conv, mesh)
    img = torch.randn(2, 3, 8, 16, generator=_gen(0))
    for pl in (Shard(3), Shard(2), Shard(0)):
        d, r = distribute_tensor(img, mesh, [pl]).requires_grad_(), img.clone().requires_grad_()
        o, ro = conv(d), rconv(r)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
        o.sum().backward()
        ro.sum().backward()
        assert d.grad.placements == (pl,)
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-4)
    _grads_equal(conv.parameters(), rconv.parameters(), atol=1e-4, rtol=1e-4)
    # #159959: double backward through a distributed conv (a gradient penalty)
    c1, rc1 = nn.Conv2d(1, 1, 1), nn.Conv2d(1, 1, 1)
    rc1.load_state_dict(c1.state_dict())
    distribute_module(c1, mesh)
    xi = torch.randn(4, 1, 4, 4, generator=_gen(1))
    d, r = distribute_tensor(xi, mesh, [Shard(0)]).requires_grad_(), xi.clone().requires_grad_()
    o, ro = c1(d), rc1(r)
    (gx,) = torch.autograd.grad(o.sum(), d, create_graph=True)
    (rgx,) = torch.autograd.grad(ro.sum(), r, create_graph=True)
    _eq(gx, rgx.detach())
    (o.pow(2).sum() + gx.pow(2).sum()).backward()
    (ro.pow(2).sum() + rgx.pow(2).sum()).backward()
    _grads_equal(c1.parameters(), rc1.parameters(), atol=1e-4, rtol=1e-4)
    # #128699: layer_norm backward with its weight sharded like a column-parallel output
    torch.manual_seed(1)
    mlp = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    rmlp = nn.Sequential(nn.Linear(8, 8), nn.LayerNorm(8))
    rmlp.load_state_dict(mlp.state_dict())
    parallelize_module(mlp, mesh, {"0": ColwiseParallel(use_local_output=False)})
    for name in ("weight", "bias"):
        full = getattr(mlp[1], name).detach()
        setattr(mlp[1], name, nn.Parameter(distribute_tensor(full, mesh, [Shard(0)])))
    xl = torch.randn(4, 8, generator=_gen(2))
    o, ro = mlp(xl), rmlp(xl)
    _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
    o.full_tensor().sum().backward()
    ro.sum().backward()
    _grads_equal(mlp.parameters(), rmlp.parameters(), atol=1e-5, rtol=1e-4)
    # #134050: sdpa decided once without grad, then with grad (PyTorch's cache reused the
    # no-logsumexp decision: wrong gradients); mixed requires_grad
    q, k, v = (torch.randn(2, 4, 6, 8, generator=_gen(3 + i)) for i in range(3))
    dq, dk, dv = (distribute_tensor(t, mesh, [Shard(1)]) for t in (q, k, v))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    _eq(F.scaled_dot_product_attention(dq, dk, dv, is_causal=True), ref, atol=1e-5, rtol=1e-4)
    ins = [distribute_tensor(t, mesh, [Shard(1)]).requires_grad_() for t in (q, k, v)]
    refs = [t.clone().requires_grad_() for t in (q, k, v)]
    o = F.scaled_dot_product_attention(*ins, is_causal=True)
    ro = F.scaled_dot_product_attention(*refs, is_causal=True)
    _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
    (o * o).sum().backward()
    (ro * ro).sum().backward()
    _grads_equal(ins, refs, atol=1e-5, rtol=1e-4)
    dq2, rq2 = distribute_tensor(q, mesh, [Shard(1)]).requires_grad_(), q.clone().requires_grad_()
    F.scaled_dot_product_attention(dq2, dk, dv).sum().backward()
    F.scaled_dot_product_attention(rq2, k, v).sum().backward()
    _eq(dq2.grad, rq2.grad, atol=1e-5, rtol=1e-4)
    # pytorch/torchtitan#267: complex rotary embedding (view_as_complex * freqs) had a
    # wrong backward on DTensors
    xr = torch.randn(2, 6, 4, 8, generator=_gen(6))
    freqs = torch.polar(torch.ones(6, 4), torch.randn(6, 4, generator=_gen(7)))
    for pl in (Shard(2), Shard(0), Shard(1)):
        d, r = distribute_tensor(xr, mesh, [pl]).requires_grad_(), xr.clone().requires_grad_()
        o, ro = _rope(d, _rep(freqs, mesh)), _rope(r, freqs)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
        (o * o.detach().sign()).sum().backward()
        (ro * ro.detach().sign()).sum().backward()
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-5)
    # PR #120238 / PR #120910: clip_grad_norm_ of TP gradients, foreach=False and True
    torch.manual_seed(2)
    base = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
    xb = torch.randn(4, 8, generator=_gen(8))
    for foreach, norm_type in ((False, 2.0), (True, 2.0), (True, float("inf")), (False, 1.0)):
        tp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        one = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 8))
        tp.load_state_dict(base.state_dict())
        one.load_state_dict(base.state_dict())
        parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        tp(xb).pow(2).sum().backward()
        one(xb).pow(2).sum().backward()
        kw = {"norm_type": norm_type, "foreach": foreach}
        n = torch.nn.utils.clip_grad_norm_(tp.parameters(), 0.5, **kw)
        _eq(n, torch.nn.utils.clip_grad_norm_(one.parameters(), 0.5, **kw), atol=1e-5, rtol=1e-5)
        _grads_equal(tp.parameters(), one.parameters(), atol=1e-6, rtol=1e-5)
    # pytorch/torchtitan PR #4637: a vocab-parallel embedding's padding_idx is a global row
    # (a token mapping to local row padding_idx lost its gradient; a padding_idx beyond the
    # local rows raised); scale_grad_by_freq counts over the whole batch
    ids = torch.tensor([[5, 13, 2, 13], [5, 7, 9, 13]])
    colw = _rep(torch.arange(4.0), mesh)
    styles = (
        RowwiseParallel(input_layouts=Replicate(), use_local_output=False),
        ColwiseParallel(use_local_output=False),
    )
    for style in styles:
        for kw in ({"padding_idx": 5}, {"padding_idx": 13, "scale_grad_by_freq": True}):
            torch.manual_seed(3)
            e, re = nn.Embedding(16, 4, **kw), nn.Embedding(16, 4, **kw)
            re.load_state_dict(e.state_dict())
            parallelize_module(e, mesh, style)
            o, ro = e(ids), re(ids)
            _eq(o, ro.detach())
            (o * colw).sum().backward()
            (ro * torch.arange(4.0)).sum().backward()
            _eq(e.weight.grad, re.weight.grad)
    return 1


class _Tied(nn.Module):
    def __init__(self, vocab: int = 15, hidden: int = 4) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.mid = nn.Linear(hidden, hidden)
        self.out = nn.Linear(hidden, vocab, bias=False)
        self.out.weight = self.emb.weight

    def forward(self, x):
        return self.out(torch.tanh(self.mid(self.emb(x))))


def check_fixed(rank, world):
    from hyper_shard.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(4, 6, generator=_gen(0))
    # fixed: #167917, aten.detach_.default on a DTensor; here x.detach_() of any op's
    # result raised "Can't detach views in-place" (the DTensor is an alias of its local
    # result) and the aten overloads were unbound
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(t, mesh, [pl]).requires_grad_()
        e = d * 2
        assert e.detach_() is e
        assert not e.requires_grad and e.grad_fn is None and e.placements == (pl,)
        _eq(e, t * 2)
        f = torch.ops.aten.detach_.default(d * 3)
        assert not f.requires_grad
        _eq(f, t * 3)
        g = torch.ops.aten.detach.default(d)
        assert not g.requires_grad and g.placements == (pl,)
        _eq(g, t)
        leaf = distribute_tensor(t, mesh, [pl]).requires_grad_()
        leaf.detach_()
        assert not leaf.requires_grad and leaf.is_leaf
    # fixed: #176076, tied embedding / output weights with vocab 15 on 2 ranks (uneven
    # shards); PyTorch never updated the last rank's rows. fully_shard([emb, out]) sharded
    # the tied weight for emb only and the root call refused out's copy; now both modules
    # share it, and training matches one process in every grouping
    for group in ("root", "inner", "list"):
        torch.manual_seed(0)
        m, r = _Tied(), _Tied()
        r.load_state_dict(m.state_dict())
        if group == "inner":
            fully_shard(m.mid, mesh=mesh)
        elif group == "list":
            fully_shard([m.emb, m.out], mesh=mesh)
        fully_shard(m, mesh=mesh)
        assert m.out.weight is m.emb.weight
        opt, ropt = torch.optim.SGD(m.parameters(), lr=0.5), torch.optim.SGD(r.parameters(), lr=0.5)
        for step in range(3):
            x = torch.randint(0, 15, (world * 2, 3), generator=_gen(step))
            y = torch.randint(0, 15, (world * 2, 3), generator=_gen(10 + step))
            xl, yl = x.chunk(world)[rank], y.chunk(world)[rank]
            F.cross_entropy(m(xl).flatten(0, 1), yl.flatten()).backward()
            F.cross_entropy(r(x).flatten(0, 1), y.flatten()).backward()
            for o in (opt, ropt):
                o.step()
                o.zero_grad()
        sd, rsd = m.state_dict(), r.state_dict()
        for key, val in rsd.items():
            _eq(sd[key], val, atol=1e-5, rtol=1e-4)
    return 1


def check_mesh_of_4(rank, world):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    # pytorch/torchtitan#2217: a Replicate RMSNorm weight on a (dp, tp) mesh: its gradient
    # is reduced over both dims; to_local(grad_placements=[Partial(), Partial()]) too
    w, x = torch.randn(8, generator=_gen(0)), torch.randn(4, 6, 8, generator=_gen(1))
    dx = distribute_tensor(x, mesh, [Shard(0), Shard(1)])
    rw = w.clone().requires_grad_()
    ro = F.rms_norm(x, (8,), rw)
    ro.sum().backward()
    dw = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
    o = F.rms_norm(dx, (8,), dw)
    _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
    o.sum().backward()
    _eq(dw.grad, rw.grad, atol=1e-4, rtol=1e-4)
    dw2 = distribute_tensor(w, mesh, [Replicate(), Replicate()]).requires_grad_()
    lo = F.rms_norm(dx.to_local(), (8,), dw2.to_local(grad_placements=[Partial(), Partial()]))
    DTensor.from_local(lo, mesh, [Shard(0), Shard(1)]).sum().backward()
    _eq(dw2.grad, rw.grad, atol=1e-4, rtol=1e-4)
    return 1


def test_reports4_values(dist2):
    assert dist2.run(check_values) == [1, 1]


def test_reports4_modules(dist2):
    assert dist2.run(check_modules) == [1, 1]


def test_reports4_fixed(dist2):
    assert dist2.run(check_fixed) == [1, 1]


def test_reports4_mesh_of_4(dist4):
    assert dist4.run(check_mesh_of_4) == [1] * 4
