"""The ops real models call next (issue 12): convolutions, index_put / x[idx] = v, equal,
dist, vector_norm and _foreach_norm through aten, eigh/svd, interpolate, embedding with
max_norm on a row-sharded table, cross_entropy on class-sharded logits outside
loss_parallel(), and the small views/queries that come with them — values and gradients
against plain torch on the same global tensors (tests/_helpers.check_op); public bug
reports on convolutions and image ops (``report_*``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F

import hyper_shard as hs
from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor
from hyper_shard.errors import OpNotRegisteredError
from tests._helpers import assert_close_any as _eq
from tests._helpers import check_op
from tests._reports import reports

pytestmark = pytest.mark.multiproc

R, P = Replicate(), Partial()


def _r(*shape, seed=0, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def check_conv(rank, world):
    """conv1d/2d/3d and transposed forms: batch-sharded, output-channel and input-channel
    sharded (Partial output, bias added once), Partial inputs; sharded spatial dims
    (redistributed, or kept when the windows tile them); nn.Conv2d with a channel-sharded
    weight trains like a plain one."""
    mesh = hs.init_device_mesh("cpu", (world,))
    n = 0
    x, w, b = _r(2, 4, 5, 6, seed=1), _r(6, 4, 3, 3, seed=2), _r(6, seed=3)
    combos = [
        ([Shard(0)], [R], [R]),  # batch
        ([R], [Shard(0)], [Shard(0)]),  # output channels
        ([Shard(1)], [Shard(1)], [R]),  # input channels -> Partial
        ([P], [R], [R]),
        ([R], [P], [R]),
        ([Shard(1)], [R], [Shard(0)]),  # the cheapest fitting layout is found
    ]
    n += check_op(lambda a, c, d: F.conv2d(a, c, d, padding=1), [x, w, b], mesh, combos, atol=1e-4)
    n += check_op(
        lambda a, c: F.conv2d(a, c, stride=2, padding="valid", dilation=1), [x, w], mesh,
        [([Shard(0)], [R]), ([Shard(1)], [Shard(1)]), ([R], [Shard(0)])], atol=1e-4,
    )  # fmt: skip
    x1, w1, b1 = _r(3, 4, 7, seed=4), _r(5, 4, 3, seed=5), _r(5, seed=6)
    n += check_op(
        lambda a, c, d: F.conv1d(a, c, d, padding="same"), [x1, w1, b1], mesh,
        [([Shard(0)], [R], [R]), ([Shard(1)], [Shard(1)], [R]), ([R], [Shard(0)], [Shard(0)])],
        atol=1e-4,
    )  # fmt: skip
    x3, w3 = _r(2, 2, 3, 4, 4, seed=7), _r(4, 2, 2, 2, 2, seed=8)
    n += check_op(
        lambda a, c: F.conv3d(a, c), [x3, w3], mesh, [([Shard(0)], [R]), ([R], [Shard(0)])]
    )
    # transposed: weight (C_in, C_out, k)
    xt, wt, bt = _r(2, 4, 5, 5, seed=9), _r(4, 6, 3, 3, seed=10), _r(6, seed=11)
    n += check_op(
        lambda a, c, d: F.conv_transpose2d(a, c, d, stride=2, padding=1, output_padding=1),
        [xt, wt, bt], mesh,
        [([Shard(0)], [R], [R]), ([R], [Shard(1)], [Shard(0)]), ([Shard(1)], [Shard(0)], [R]),
         ([P], [R], [R])],
        atol=1e-4,
    )  # fmt: skip
    n += check_op(
        lambda a, c: F.conv_transpose1d(a, c, stride=2), [_r(2, 4, 5, seed=12), _r(4, 3, 3, seed=13)],
        mesh, [([Shard(0)], [R]), ([Shard(1)], [Shard(0)])], atol=1e-4,
    )  # fmt: skip
    # grouped (depthwise) convolution: batch-sharded, channels gathered
    n += check_op(
        lambda a, c: F.conv2d(a, c, groups=4), [x, _r(4, 1, 3, 3, seed=14)], mesh,
        [([Shard(0)], [R]), ([Shard(1)], [Shard(0)])], atol=1e-4,
    )  # fmt: skip
    # spatial shards: overlapping windows are redistributed first (values and gradients
    # as plain torch); windows that tile the dim (kernel == stride, a patch embedding)
    # convolve locally: the shard is kept and nothing is communicated
    n += check_op(
        lambda a, c, d: F.conv2d(a, c, d, padding=1), [x, w, b], mesh,
        [([Shard(2)], [R], [R]), ([Shard(3)], [Shard(0)], [R])], atol=1e-4,
    )  # fmt: skip
    xp, wp = _r(2, 3, 4, 8, seed=15), _r(5, 3, 2, 2, seed=16)
    n += check_op(
        lambda a, c: F.conv2d(a, c, stride=2), [xp, wp], mesh,
        [([Shard(3)], [R]), ([Shard(2)], [R])], atol=1e-4,
    )  # fmt: skip
    from hyper_shard.debug import CommDebugMode

    for d in (2, 3):
        xs = distribute_tensor(xp, mesh, [Shard(d)])
        wr = distribute_tensor(wp, mesh, [R])
        with CommDebugMode() as comm:
            y = F.conv2d(xs, wr, stride=2)
        assert y.placements == (Shard(d),) and comm.get_total_counts() == 0, (d, y.placements)
        torch.testing.assert_close(y.full_tensor(), F.conv2d(xp, wp, stride=2), atol=1e-4, rtol=0)
    # overlapping windows on a height shard: redistributed (here to the batch shard), never
    # into a zero-padded Partial that makes every rank convolve the whole input
    yo = F.conv2d(
        distribute_tensor(x, mesh, [Shard(2)]), distribute_tensor(w, mesh, [R]), padding=1
    )
    assert not any(p.is_partial() for p in yo.placements), yo.placements
    torch.testing.assert_close(yo.full_tensor(), F.conv2d(x, w, padding=1), atol=1e-4, rtol=0)
    # 5 columns of stride-2 windows do not tile 2 shards: gathered, still right
    xo = _r(2, 3, 4, 10, seed=17)
    y = F.conv2d(
        distribute_tensor(xo, mesh, [Shard(3)]), distribute_tensor(wp, mesh, [R]), stride=2
    )
    assert y.placements != (Shard(3),)
    torch.testing.assert_close(y.full_tensor(), F.conv2d(xo, wp, stride=2), atol=1e-4, rtol=0)
    # pools on spatial shards: a 2x2 / stride-2 pool tiles the dims (kept, no
    # communication); overlapping, adaptive and index-returning ones are redistributed
    xq = _r(2, 3, 8, 8, seed=18)
    for fn in (
        lambda a: F.max_pool2d(a, 2),
        lambda a: F.avg_pool2d(a, 2),
        lambda a: F.avg_pool2d(a, 3, stride=1, padding=1),
        lambda a: F.adaptive_avg_pool2d(a, (3, 3)),
        lambda a: F.max_pool2d(a, 2, return_indices=True)[1].float(),
    ):
        n += check_op(fn, [xq], mesh, [([Shard(2)],), ([Shard(3)],)])
    for pool in (F.max_pool2d, F.avg_pool2d):
        xd = distribute_tensor(xq, mesh, [Shard(3)])
        with CommDebugMode() as comm:
            y = pool(xd, 2)
        assert y.placements == (Shard(3),) and comm.get_total_counts() == 0
    # nn.Conv2d, output channels sharded, trains like the plain module
    torch.manual_seed(0)
    ref = torch.nn.Conv2d(4, 6, 3, padding=1)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1)
    conv.load_state_dict(ref.state_dict())
    for name, pl in (("weight", Shard(0)), ("bias", Shard(0))):
        p = getattr(conv, name)
        conv.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.detach(), mesh, [pl])))
    opt, ropt = (
        torch.optim.SGD(conv.parameters(), lr=0.1),
        torch.optim.SGD(ref.parameters(), lr=0.1),
    )
    for s in range(2):
        xi = _r(2, 4, 5, 5, seed=20 + s)
        y = conv(distribute_tensor(xi, mesh, [R]))
        ry = ref(xi)
        assert y.placements == (Shard(1),)
        torch.testing.assert_close(y.full_tensor(), ry, atol=1e-4, rtol=1e-4)
        y.full_tensor().pow(2).sum().backward()
        ry.pow(2).sum().backward()
        opt.step()
        ropt.step()
        opt.zero_grad()
        ropt.zero_grad()
    torch.testing.assert_close(conv.weight.full_tensor(), ref.weight.detach(), atol=1e-4, rtol=1e-4)
    return n


def test_conv(dist2):
    assert min(dist2.run(check_conv)) >= 34


def check_index_put(rank, world):
    """index_put / index_put_ / x[idx] = v: the target keeps its shards, indexed dims
    included; sharded and replicated indices; accumulate with duplicates; Partial targets;
    values and gradients as plain torch."""
    mesh = hs.init_device_mesh("cpu", (world,))
    x, v = _r(5, 4, seed=1), _r(3, 4, seed=2)
    idx = torch.tensor([4, 0, 1])
    dup = torch.tensor([1, 1, 3])
    n = 0
    combos = [
        ([Shard(0)], [R], [R]),  # the indexed dim sharded: each rank writes its rows
        ([Shard(1)], [R], [Shard(1)]),
        ([Shard(0)], [Shard(0)], [Shard(1)]),  # a sharded index is gathered
        ([P], [R], [P]),
        ([P], [R], [R]),
        ([R], [R], [Shard(0)]),
    ]
    for acc in (False, True):
        for i in (idx, dup):
            n += check_op(
                lambda a, j, c, acc=acc: torch.index_put(a, (j,), c, accumulate=acc),
                [x, i, v],
                mesh,
                combos,
            )
    y, w = _r(3, 4, 5, seed=3), _r(2, 5, seed=4)
    i0, i1 = torch.tensor([2, 0]), torch.tensor([3, -1])
    n += check_op(
        lambda a, j, k, c: torch.index_put(a, (j, k), c, accumulate=True), [y, i0, i1, w], mesh,
        [([Shard(0)], [R], [R], [R]), ([Shard(1)], [R], [R], [R]), ([Shard(2)], [R], [R], [Shard(1)])],
    )  # fmt: skip
    # in place, the target's placements kept; a 0-d plain index (a scalar) next to DTensors
    for pl in ([Shard(0)], [Shard(1)], [P]):
        t = distribute_tensor(x, mesh, [R]).redistribute(mesh, pl) if pl != [P] else None
        if t is None:
            t = DTensor.from_local(x / world, mesh, [P])
        if pl == [P]:
            src = DTensor.from_local(v[0] / world, mesh, [P])
        else:
            src = distribute_tensor(v[0], mesh, [R])
        out = t.index_put_((torch.tensor(2),), src)
        assert out is t and t.placements == tuple(pl)
        ref = x.clone()
        ref[2] = v[0]
        torch.testing.assert_close(t.full_tensor(), ref)
    # x[idx] = v with an index DTensor into the sharded dim (setitem), and a scalar value
    for val in (v, 7.0):
        t = distribute_tensor(x, mesh, [Shard(0)])
        t[distribute_tensor(idx, mesh, [R])] = distribute_tensor(v, mesh, [R]) if val is v else val
        ref = x.clone()
        ref[idx] = v if val is v else val
        assert t.placements == (Shard(0),)
        torch.testing.assert_close(t.full_tensor(), ref)
    pt = DTensor.from_local(x / world, mesh, [P])
    pt[distribute_tensor(idx, mesh, [R])] = 5.0
    ref = x.clone()
    ref[idx] = 5.0
    torch.testing.assert_close(pt.full_tensor(), ref)
    return n


def test_index_put(dist2):
    assert min(dist2.run(check_index_put)) >= 20


def check_reductions_and_linalg(rank, world):
    """equal, dist (p = 1, 2, inf; Partial inputs), aten linalg_vector_norm / _foreach_norm
    (named by their public names), eigh/eigvalsh/svd/svdvals (replicated and batch-sharded),
    diag, histc; an unregistered aten op names torch.ops.aten.<op>."""
    mesh = hs.init_device_mesh("cpu", (world,))
    a, b = _r(6, 4, seed=1), _r(6, 4, seed=2)
    da, db = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Shard(1)])
    assert da.equal(distribute_tensor(a, mesh, [Replicate()])) is True
    assert torch.equal(da, db) is False
    diff = distribute_tensor(a, mesh, [Shard(0)]).clone()
    if rank == 1:
        diff.to_local()[0, 0] += 1  # one rank's shard differs
    assert da.equal(diff) is False and diff.equal(da) is False
    assert da.equal(distribute_tensor(a[:3], mesh, [Shard(0)])) is False  # another shape
    pa = DTensor.from_local(a / world, mesh, [P])
    assert pa.equal(distribute_tensor(a / world * world, mesh, [Shard(1)]))
    n = 0
    for p in (1, 2, float("inf"), 3.5):
        n += check_op(
            lambda x, y, p=p: torch.dist(x, y, p), [a, b], mesh,
            [([Shard(0)], [Shard(0)]), ([Shard(0)], [Shard(1)]), ([R], [R]), ([P], [Shard(0)])],
            atol=1e-4,
        )  # fmt: skip
    assert torch.dist(da, da).full_tensor().item() == 0.0
    g = torch.ops.aten.linalg_vector_norm(da, 2)
    torch.testing.assert_close(g.full_tensor(), torch.linalg.vector_norm(a, 2))
    torch.testing.assert_close(
        torch.ops.aten.linalg_vector_norm.default(pa, 3).full_tensor(),
        torch.linalg.vector_norm(a, 3),
    )
    outs = torch.ops.aten._foreach_norm([da, db, pa], 2)
    for o, ref in zip(outs, torch._foreach_norm([a, b, a], 2)):
        torch.testing.assert_close(o.full_tensor(), ref)
    # an unbound aten op (aten.inverse, aten.diag_embed, aten.diagflat and aten.hash_tensor,
    # the examples before, have rules now)
    with pytest.raises(OpNotRegisteredError) as ei:
        torch.ops.aten.to_sparse(da)
    assert "torch.ops.aten.to_sparse" in str(ei.value) and "pybind11" not in str(ei.value)
    sym = a.T @ a + torch.eye(4)
    n += check_op(
        lambda m: torch.linalg.eigvalsh(m), [sym], mesh, [([R],), ([Shard(0)],), ([P],)], atol=1e-4
    )
    ev, vec = torch.linalg.eigh(distribute_tensor(sym, mesh, [Shard(1)]))
    rev, rvec = torch.linalg.eigh(sym)
    torch.testing.assert_close(ev.full_tensor(), rev, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(vec.full_tensor().abs(), rvec.abs(), atol=1e-4, rtol=1e-4)
    batch = torch.stack([sym, sym * 2])
    bev, _ = torch.linalg.eigh(distribute_tensor(batch, mesh, [Shard(0)]))
    assert bev.placements == (Shard(0),)  # batch dims keep their shard: no communication
    torch.testing.assert_close(bev.full_tensor(), torch.linalg.eigh(batch)[0], atol=1e-4, rtol=1e-4)
    n += check_op(lambda m: torch.linalg.svdvals(m), [a], mesh, [([R],), ([Shard(0)],)], atol=1e-4)
    for full in (True, False):
        u, s, vh = torch.linalg.svd(distribute_tensor(a, mesh, [Shard(0)]), full_matrices=full)
        ru, rs, rvh = torch.linalg.svd(a, full_matrices=full)
        assert u.shape == ru.shape and vh.shape == rvh.shape
        torch.testing.assert_close(s.full_tensor(), rs, atol=1e-4, rtol=1e-4)
        k = min(a.shape)
        rec = u.full_tensor()[:, :k] @ torch.diag(s.full_tensor()) @ vh.full_tensor()[:k]
        torch.testing.assert_close(rec, a, atol=1e-4, rtol=1e-4)
    n += check_op(lambda v: torch.diag(v, 1), [_r(4, seed=3)], mesh, [([Shard(0)],), ([P],)])
    n += check_op(lambda m: torch.diag(m, -1), [a], mesh, [([Shard(0)],), ([Shard(1)],)])
    h = torch.histc(da, bins=7, min=-1.0, max=1.0)
    assert h.placements == (Partial(),)  # local counts, no communication
    torch.testing.assert_close(h.full_tensor(), torch.histc(a, bins=7, min=-1.0, max=1.0))
    torch.testing.assert_close(torch.histc(db, bins=5).full_tensor(), torch.histc(b, bins=5))
    return n


def test_reductions_and_linalg(dist2):
    assert min(dist2.run(check_reductions_and_linalg)) >= 20


def check_nn_ops(rank, world):
    """interpolate (nearest, bilinear, bicubic; nn.Upsample modules); embedding with max_norm
    on a row-sharded table (exactly the rows torch renormalises); cross_entropy / nll_loss on
    class-sharded logits outside loss_parallel() (gathered, one hint); view_as_complex /
    view_as_real; atleast_Nd."""
    mesh = hs.init_device_mesh("cpu", (world,))
    img = _r(2, 4, 3, 5, seed=1)
    n = 0
    for kw in (
        dict(scale_factor=2, mode="nearest"),
        dict(size=(4, 7), mode="bilinear", align_corners=False),
        dict(scale_factor=(1.5, 2.0), mode="bilinear", align_corners=True),
        dict(scale_factor=2, mode="bicubic"),
    ):
        n += check_op(
            lambda x, kw=kw: F.interpolate(x, **kw), [img], mesh,
            [([Shard(0)],), ([Shard(1)],), ([Shard(2)],), ([P],)], atol=1e-4,
        )  # fmt: skip
    for m in (
        torch.nn.UpsamplingBilinear2d(scale_factor=2),
        torch.nn.UpsamplingNearest2d(scale_factor=2),
    ):
        out = m(distribute_tensor(img, mesh, [Shard(0)]))
        assert out.placements == (Shard(0),)
        torch.testing.assert_close(out.full_tensor(), m(img))
    # embedding(max_norm) on a row-sharded (vocab-parallel) table
    table = _r(10, 4, seed=2) * 3
    ids = torch.tensor([[1, 7, 7], [9, 0, 4]])
    ref_w = table.clone().requires_grad_()
    ref = F.embedding(ids, ref_w, max_norm=1.5)
    w = distribute_tensor(table, mesh, [Shard(0)]).requires_grad_()
    out = F.embedding(distribute_tensor(ids, mesh, [R]), w, max_norm=1.5)
    torch.testing.assert_close(out.full_tensor(), ref)
    torch.testing.assert_close(w.full_tensor(), ref_w.detach())  # the same rows renormalised
    (out.full_tensor() * _r(2, 3, 4, seed=3)).sum().backward()
    (ref * _r(2, 3, 4, seed=3)).sum().backward()
    torch.testing.assert_close(w.grad.full_tensor(), ref_w.grad)
    # cross_entropy / nll_loss on class-sharded logits outside loss_parallel(): computed
    logits, tgt = _r(6, 8, seed=4), torch.tensor([0, 7, 3, 3, 5, 1])
    probs = torch.softmax(_r(6, 8, seed=5), -1)
    from hyper_shard.kernels import loss_gather

    loss_gather._HINTED.clear()  # the hint is once per process: count it from here
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        for red in ("mean", "sum", "none"):
            n += check_op(
                lambda x, t, red=red: F.cross_entropy(x, t, reduction=red, label_smoothing=0.1),
                [logits, tgt], mesh, [([Shard(1)], [R]), ([Shard(1)], [Shard(0)])], atol=1e-5,
            )  # fmt: skip
            n += check_op(
                lambda x, t, red=red: F.nll_loss(torch.log_softmax(x, -1), t, reduction=red),
                [logits, tgt], mesh, [([Shard(1)], [R])],
            )  # fmt: skip
        n += check_op(
            lambda x, t, wt: F.cross_entropy(x, t, weight=wt.detach()), [logits, tgt, _r(8, seed=6).abs()],
            mesh, [([Shard(1)], [R], [Shard(0)])],
        )  # fmt: skip
        n += check_op(
            lambda x, t: F.cross_entropy(x, t), [logits, probs], mesh, [([Shard(1)], [Shard(1)])]
        )
    hints = [r for r in rec if "outside loss_parallel()" in str(r.message)]
    assert 1 <= len(hints) <= 2, [str(r.message) for r in rec]  # once per op kind
    from hyper_shard.parallel import loss_parallel

    with loss_parallel():  # the same call inside: no gather, same value
        d = F.cross_entropy(
            distribute_tensor(logits, mesh, [Shard(1)]), distribute_tensor(tgt, mesh, [R])
        )
        torch.testing.assert_close(d.full_tensor(), F.cross_entropy(logits, tgt))
    # complex views (rotary embeddings) and atleast_Nd
    xq = _r(2, 3, 4, 2, seed=7)
    n += check_op(
        lambda t: torch.view_as_real(torch.view_as_complex(t) * 2), [xq], mesh,
        [([Shard(0)],), ([Shard(2)],), ([P],)],
    )  # fmt: skip
    for fn in (torch.atleast_1d, torch.atleast_2d, torch.atleast_3d):
        for t in (_r(5, seed=8), _r(3, 4, seed=9)):
            n += check_op(fn, [t], mesh, [([Shard(0)],), ([R],)])
    return n


def test_nn_ops(dist2):
    assert min(dist2.run(check_nn_ops)) >= 30


# ---------------------------------------------------------------------- bug reports
def _rep(t, mesh):
    return distribute_tensor(t, mesh, [R])


def report_conv_input_gradients(rank, world):
    """#191926: Conv2d's ``grad_input`` placement with the input sharded on the width (it
    came back ``Shard(0)`` in PyTorch 2.13); kernel == stride keeps the width shards;
    #159959: double backward through a distributed conv (a gradient penalty)."""
    from hyper_shard.parallel import distribute_module

    mesh = hs.init_device_mesh("cpu", (world,))
    torch.manual_seed(0)
    conv, rconv = torch.nn.Conv2d(3, 8, 4, 4), torch.nn.Conv2d(3, 8, 4, 4)
    rconv.load_state_dict(conv.state_dict())
    distribute_module(conv, mesh)
    img = _r(2, 3, 8, 16, seed=0)
    for pl in (Shard(3), Shard(2), Shard(0)):
        d, r = distribute_tensor(img, mesh, [pl]).requires_grad_(), img.clone().requires_grad_()
        o, ro = conv(d), rconv(r)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
        o.sum().backward()
        ro.sum().backward()
        assert d.grad.placements == (pl,)
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-4)
    for a, b in zip(conv.parameters(), rconv.parameters()):
        _eq(a.grad, b.grad, atol=1e-4, rtol=1e-4)
    c1, rc1 = torch.nn.Conv2d(1, 1, 1), torch.nn.Conv2d(1, 1, 1)
    rc1.load_state_dict(c1.state_dict())
    distribute_module(c1, mesh)
    xi = _r(4, 1, 4, 4, seed=1)
    d, r = distribute_tensor(xi, mesh, [Shard(0)]).requires_grad_(), xi.clone().requires_grad_()
    o, ro = c1(d), rc1(r)
    (gx,) = torch.autograd.grad(o.sum(), d, create_graph=True)
    (rgx,) = torch.autograd.grad(ro.sum(), r, create_graph=True)
    _eq(gx, rgx.detach())
    (o.pow(2).sum() + gx.pow(2).sum()).backward()
    (ro.pow(2).sum() + rgx.pow(2).sum()).backward()
    for a, b in zip(c1.parameters(), rc1.parameters()):
        _eq(a.grad, b.grad, atol=1e-4, rtol=1e-4)


def report_image_ops_without_a_strategy(rank, world):
    """Unregistered here before (fixed): ``nn.functional.unfold`` / ``fold`` (im2col /
    col2im; PR #177336 gave them strategies): the batch dim keeps its shard, backward; and
    from #119930 (PyTorch's tracking issue of ops with no DTensor strategy)
    ``grid_sample`` and ``affine_grid``."""
    mesh = hs.init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(2)
    img = torch.randn(4, 3, 6, 6, generator=g)
    for pl, kw in ((Shard(0), {}), (Shard(1), {"padding": 1, "stride": 2}), (Shard(2), {})):
        d, r = distribute_tensor(img, mesh, [pl]).requires_grad_(), img.clone().requires_grad_()
        o, ro = F.unfold(d, 3, **kw), F.unfold(r, 3, **kw)
        _eq(o, ro.detach())
        back, rback = F.fold(o, (6, 6), 3, **kw), F.fold(ro, (6, 6), 3, **kw)
        _eq(back, rback.detach())
        (back * back).sum().backward()
        (rback * rback).sum().backward()
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-4)
    assert F.unfold(distribute_tensor(img, mesh, [Shard(0)]), 2).placements == (Shard(0),)
    img = torch.randn(4, 4, 6, 6, generator=g)
    grid = torch.rand(4, 3, 3, 2, generator=g) * 2 - 1
    for pi, pg in ((Shard(0), Shard(0)), (Shard(1), Replicate())):
        d, r = distribute_tensor(img, mesh, [pi]).requires_grad_(), img.clone().requires_grad_()
        dg = distribute_tensor(grid, mesh, [pg])
        o = F.grid_sample(d, dg, align_corners=True, padding_mode="border")
        ro = F.grid_sample(r, grid, align_corners=True, padding_mode="border")
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-4)
        assert o.placements == (pi,)
        (o * o).sum().backward()
        (ro * ro).sum().backward()
        _eq(d.grad, r.grad, atol=1e-5, rtol=1e-4)
    theta = torch.eye(2, 3).expand(4, 2, 3) + 0.1 * torch.randn(4, 2, 3, generator=g)
    ptheta = DTensor.from_local(theta / world, mesh, [Partial()])
    _eq(
        F.affine_grid(ptheta, [4, 1, 3, 3], align_corners=False),
        F.affine_grid(theta, [4, 1, 3, 3], align_corners=False),
    )


@reports(report_conv_input_gradients, report_image_ops_without_a_strategy)
def test_reports(report, dist2):
    dist2.run(report)
