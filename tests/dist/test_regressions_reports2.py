"""Public DTensor bug reports, second sweep (``pytorch/pytorch#N`` unless another repository
is named; "PR" marks a pull request whose description carries the reproducer). Each case
runs the report's program on hyper_shard and compares it with plain torch on the same
values (forward, and gradients where the report is about them).

Already right in hyper_shard (kept as regression checks; what PyTorch did wrong is in each
case's comment): #163193 / #149768, #162692, #168940 / PR #175776, #167072 / PR #173936,
PR #179059, PR #159856, #172684 / PR #172696, PR #165962, PR #169171 / PR #175463,
PR #163879 / PR #168057 / PR #167547, PR #133545, PR #159189, #124990, #131992, PR #172041,
PR #111750, #161147, #185362, #174276 / PR #115250, #118596 / #118219, PR #176037,
PR #121653, #139681, #190746, #172932, #103306, #164543.

Fixed here (hyper_shard raised OpNotRegisteredError or a ShardingError before): the ops
PR #177336 gives strategies to — ``Tensor.unfold``, ``torch.allclose``, ``torch.histogram``,
``torch.linspace``/``logspace`` with tensor ends, ``nn.functional.unfold``/``fold`` — and,
found replaying them, ``torch.einsum`` with a repeated label (``"ii->i"``),
``Tensor.masked_scatter``, ``torch.linalg.multi_dot``, ``torch.vander``,
``torch.combinations``, and from #119930's list ``grid_sample``, ``affine_grid``,
``diagflat``, ``Tensor.put`` (:func:`check_fixed`; each failed before the fix); and in
:func:`check_mesh_of_4`, ``DeviceMesh.get_group()`` on a rank outside the mesh (PR #118614:
an AttributeError, now ``None``) and a mesh dim by index (``mesh[-1]``, #143194's program).

Also checked: #128365 (PrepareModuleInput keyword DTensor inputs), #127213 (TP on a mesh of
size 1), #126530 (n-d mesh slicing).
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from hyper_shard import (
    DeviceMesh,
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep

pytestmark = pytest.mark.multiproc


def _pair(got, ref, **kw):
    for a, b in zip(got, ref):
        _eq(a, b, **kw)


def check_values(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    # #163193 / #149768: Partial(sum) + python scalar added the scalar once per rank
    # (torch: 45 + 10 = 55, PyTorch gave 65 on 2 ranks)
    t = torch.arange(10.0).reshape(10, 1)
    s = distribute_tensor(t, mesh, [Shard(0)]).sum()
    for got, ref in (
        (s + 10, t.sum() + 10),
        (10 + s, 10 + t.sum()),
        (s - 3, t.sum() - 3),
        (3 - s, 3 - t.sum()),
        (s + torch.tensor(10), t.sum() + 10),
        (torch.add(s, 2, alpha=3), t.sum() + 6),
    ):
        _eq(got, ref)
    # #162692: mean of an uneven S(0) (3, 4) was the mean of the local means; (1, 4) gave NaN
    for n in (3, 1):
        u = torch.arange(4.0 * n).reshape(n, 4)
        d = distribute_tensor(u, mesh, [Shard(0)])
        _eq(d.mean(), u.mean())
        _eq(d.mean(0), u.mean(0))
        _eq(torch.var(d, 1), torch.var(u, 1))
    # #168940 / PR #175776: max.dim over a sharded dim returned local indices; a P(max)
    # input must not give P(max) indices
    x = torch.randn(4, 4, generator=g)
    for pl in (Shard(1), Shard(0)):
        d = distribute_tensor(x, mesh, [pl])
        _pair(torch.max(d, dim=1), torch.max(x, dim=1))
        _pair(torch.min(d, dim=1), torch.min(x, dim=1))
    pmax = DTensor.from_local(x.clone() if rank == 0 else x - 5, mesh, [Partial("max")])
    _pair(torch.max(pmax, dim=1), torch.max(x, dim=1))
    # #167072 / PR #173936: argmax/argmin over a sharded dim (P(max) of local indices)
    v = torch.tensor([10.0, 5, 3, 8])
    dv = distribute_tensor(v, mesh, [Shard(0)])
    _eq(torch.argmax(dv), torch.argmax(v))
    _eq(torch.argmin(dv, 0, keepdim=True), torch.argmin(v, 0, keepdim=True))
    # PR #179059: cartesian_prod of two S(0) vectors raised in the _StridedShard redistribution
    a, b = torch.tensor([1, 2, 3, 4]), torch.tensor([10, 20])
    da = DTensor.from_local(a.chunk(world)[rank], mesh, [Shard(0)])
    db = DTensor.from_local(b.chunk(world)[rank], mesh, [Shard(0)])
    _eq(torch.cartesian_prod(da, db), torch.cartesian_prod(a, b))
    # PR #159856: vector_norm of a Partial(sum) was the sum of the local norms
    loc = torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])
    full = torch.tensor([3.0, 4.0])
    p = DTensor.from_local(loc, mesh, [Partial()])
    for o in (2, 1, float("inf")):
        _eq(torch.linalg.vector_norm(p, o), torch.linalg.vector_norm(full, o))
    _eq(torch._foreach_norm([p])[0], full.norm())
    # #172684 / PR #172696: a dtype cast of Partial(sum) to int/bool kept Partial
    # (trunc(a) + trunc(b) != trunc(a + b))
    q = DTensor.from_local(
        torch.tensor([0.6, 1.5]) if rank == 0 else torch.tensor([0.6, 1.7]), mesh, [Partial()]
    )
    qf = torch.tensor([1.2, 3.2])
    _eq(q.to(torch.int64), qf.to(torch.int64))
    _eq(q.to(torch.bool), qf.to(torch.bool))
    _eq(q.round(), qf.round())
    # PR #165962: max/min/prod of a Partial(sum) reduced the addends, not the value
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
    # PR #169171 / PR #175463: flip / roll on the sharded dim (no strategy before)
    y = torch.arange(30.0).reshape(5, 6)
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(y, mesh, [pl])
        _eq(torch.flip(d, [0, 1]), torch.flip(y, [0, 1]))
        _eq(torch.roll(d, 2, 0), torch.roll(y, 2, 0))
        _eq(torch.roll(d, 3), torch.roll(y, 3))
        # PR #133545: triu/tril (replicate-only before)
        _eq(torch.triu(d, 1), torch.triu(y, 1))
        _eq(torch.tril(d, -1), torch.tril(y, -1))
    # PR #163879 / PR #168057 / PR #167547: logsumexp, std, var_mean over sharded dims
    z = torch.randn(5, 6, generator=g)
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(z, mesh, [pl])
        _eq(torch.logsumexp(d, (0, 1)), torch.logsumexp(z, (0, 1)))
        _eq(d.std(), z.std())
        _pair(torch.var_mean(d, 0), torch.var_mean(z, 0))
        # PR #159189: sort / topk along and across the sharded dim
        for dim in (0, 1):
            _pair(torch.sort(d, dim), torch.sort(z, dim))
            _pair(torch.topk(d, 2, dim), torch.topk(z, 2, dim))
    # #124990: nonzero / diagonal of a sharded DTensor
    m = torch.arange(8).view(4, 2) % 3
    dm = distribute_tensor(m, mesh, [Shard(0)])
    _eq(torch.nonzero(dm), torch.nonzero(m))
    _eq(torch.diagonal(dm), torch.diagonal(m))
    # #131992: vector_norm of an S(0) DTensor is the global norm, bit-equal on every rank
    n = torch.linalg.vector_norm(distribute_tensor(z, mesh, [Shard(0)])).full_tensor()
    every = [torch.zeros(()) for _ in range(world)]
    dist.all_gather(every, n)
    assert all(torch.equal(e, every[0]) for e in every)
    _eq(n, torch.linalg.vector_norm(z))
    # PR #172041: P(sum) -> P(avg) was a silent no-op (the value doubled); refused, named,
    # and nothing changed
    with pytest.raises(RuntimeError, match=r"P to P\(avg\)"):
        p.redistribute(mesh, [Partial("avg")])
    _eq(p, full)
    # PR #111750: Shard(-1) normalizes to Shard(2); S(2) <-> S(-1) is a no-op
    w = torch.arange(24.0).reshape(2, 3, 4)
    dw = distribute_tensor(w, mesh, [Shard(-1)])
    assert dw.placements == (Shard(2),)
    _eq(distribute_tensor(w, mesh, [Shard(2)]).redistribute(mesh, [Shard(-1)]), w)
    # #161147: views of unevenly sharded tensors ((5, 6) on 2 ranks)
    for pl in (Shard(0), Shard(1)):
        d = distribute_tensor(y, mesh, [pl])
        _eq(d.view(30), y.view(30))
        _eq(d.view(10, 3), y.view(10, 3))
        _eq(d.unflatten(1, (2, 3)), y.unflatten(1, (2, 3)))
    return 1


class _KwOnly(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, *, x):
        return self.lin(x)


def check_gradients(rank, world):
    from hyper_shard.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        SequenceParallel,
        loss_parallel,
        parallelize_module,
    )

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    # #185362: cumprod / cummax / cummin backward on the sharded dim raised
    x = torch.rand(12, 8, generator=g) + 0.1
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
    # #174276 / PR #115250: layer_norm with the normalized dim sharded (and a cached
    # decision reused for another normalized_shape)
    xl = torch.randn(3, 4, 8, generator=g)
    wl, bl = torch.randn(8, generator=g), torch.randn(8, generator=g)
    for pl in (Shard(2), Shard(1)):
        d = distribute_tensor(xl, mesh, [pl]).requires_grad_()
        dw, db = _rep(wl, mesh).requires_grad_(), _rep(bl, mesh).requires_grad_()
        r, rw, rb = (t.clone().requires_grad_() for t in (xl, wl, bl))
        o, ro = F.layer_norm(d, (8,), dw, db), F.layer_norm(r, (8,), rw, rb)
        _eq(o, ro.detach(), atol=1e-5, rtol=1e-5)
        o.pow(2).sum().backward()
        ro.pow(2).sum().backward()
        for a, b in ((d, r), (dw, rw), (db, rb)):
            _eq(a.grad, b.grad, atol=1e-4, rtol=1e-4)
        _eq(F.layer_norm(d, (4, 8)), F.layer_norm(xl, (4, 8)), atol=1e-5, rtol=1e-5)
        _eq(F.layer_norm(d, (8,)), F.layer_norm(xl, (8,)), atol=1e-5, rtol=1e-5)
    # #118596 / #118219: permute -> contiguous -> linear -> permute (non-contiguous output)
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
    # PR #176037: index_select with a sharded index, backward to the sharded input
    t = torch.arange(30.0).reshape(5, 6)
    idx = torch.tensor([4, 0, 2, 2, 1, 3])
    for pl in (Shard(0), Shard(1)):
        for dim in (0, 1):
            d, r = distribute_tensor(t, mesh, [pl]).requires_grad_(), t.clone().requires_grad_()
            o = torch.index_select(d, dim, distribute_tensor(idx, mesh, [Shard(0)]))
            ro = torch.index_select(r, dim, idx)
            _eq(o, ro.detach())
            (o * o).sum().backward()
            (ro * ro).sum().backward()
            _eq(d.grad, r.grad)
    # PR #121653: a same-placement redistribute must still run the to_local grad_placements
    leaf = torch.ones(4, requires_grad=True)
    loc = (
        DTensor.from_local(leaf, mesh, [Replicate()])
        .redistribute(mesh, [Replicate()])
        .to_local(grad_placements=[Partial()])
    )
    (loc * (rank + 1)).sum().backward()
    _eq(leaf.grad, torch.full((4,), float(sum(range(1, world + 1)))))
    # #139681: SequenceParallel RMSNorm returns a DTensor (not a plain Tensor), right values
    torch.manual_seed(0)
    rms, rrms = nn.RMSNorm(8), nn.RMSNorm(8)
    with torch.no_grad():
        rms.weight.add_(torch.randn(8) * 0.1)
    rrms.load_state_dict(rms.state_dict())
    parallelize_module(rms, mesh, SequenceParallel())
    xs = torch.randn(2, 6, 8)
    o = rms(xs.chunk(world, 1)[rank])
    assert isinstance(o, DTensor)
    _eq(o, rrms(xs).detach())
    # #190746: inside loss_parallel(), a log_softmax not consumed by cross_entropy got an
    # identity gradient (DPO-style (log_softmax(x) * w).sum())
    lg, wt = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    dl, rl = distribute_tensor(lg, mesh, [Shard(1)]).requires_grad_(), lg.clone().requires_grad_()
    with loss_parallel():
        (F.log_softmax(dl, -1) * distribute_tensor(wt, mesh, [Shard(1)])).sum().backward()
    (F.log_softmax(rl, -1) * wt).sum().backward()
    _eq(dl.grad, rl.grad, atol=1e-5, rtol=1e-4)
    # #128365: PrepareModuleInput with keyword-only inputs that are already DTensors
    kw, rkw = _KwOnly(), _KwOnly()
    rkw.load_state_dict(kw.state_dict())
    parallelize_module(
        kw,
        mesh,
        PrepareModuleInput(
            input_kwarg_layouts={"x": Shard(0)},
            desired_input_kwarg_layouts={"x": Replicate()},
            use_local_output=True,
        ),
    )
    xk = torch.randn(4, 4, generator=g)
    _eq(kw(x=distribute_tensor(xk, mesh, [Shard(0)])), rkw(x=xk).detach())
    _eq(kw(x=xk.chunk(world)[rank]), rkw(x=xk).detach())
    # #127213: tensor parallel on a mesh of size 1 (TP "disabled") is the plain module
    one = DeviceMesh("cpu", [rank])
    lin, rlin = nn.Linear(10, 10), nn.Linear(10, 10)
    rlin.load_state_dict(lin.state_dict())
    parallelize_module(lin, one, ColwiseParallel())
    x1 = torch.randn(10, 10, generator=g)
    _eq(lin(x1), rlin(x1).detach())
    # #172932: to_local() + from_local(Partial) gives the gradient of the direct path
    base = torch.tensor([1.0, 2.0, 3.0, 4.0])
    grads = []
    for via_local in (False, True):
        d = distribute_tensor(base, mesh, [Shard(0)]).requires_grad_()
        s = (d * 2).sum()
        assert s.placements == (Partial(),)
        if via_local:
            s = DTensor.from_local(s.to_local(), mesh, [Partial()])
        (s * 3).full_tensor().backward()
        grads.append(d.grad.full_tensor())
    _eq(grads[0], torch.full((4,), 6.0))
    _eq(grads[1], grads[0])
    return 1


def check_fixed(rank, world):
    """PR #177336 (pytorch/pytorch, "[dtensor] Register single-dim strategies for
    view/reshape and replicate-only ops"): these ops had no DTensor strategy; hyper_shard
    raised OpNotRegisteredError for each. Now each equals plain torch (gradients too where
    the op is differentiable). ``einsum`` with a repeated label raised a ShardingError;
    masked_scatter, multi_dot, vander and combinations were unregistered."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(2)
    t = torch.randn(5, 6, generator=g)
    # Tensor.unfold: the unfolded dim gathered, the others keep their shards; a Partial
    # passes through; backward
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
    # torch.allclose: equal shapes shard by shard (AND over the mesh), broadcast shapes whole
    d0, d1 = distribute_tensor(t, mesh, [Shard(0)]), distribute_tensor(t, mesh, [Shard(1)])
    assert torch.allclose(d0, d1) is True
    assert torch.allclose(d0, distribute_tensor(t + 1e-3, mesh, [Shard(1)])) is False
    assert torch.allclose(d0, _rep(t[0], mesh)) == torch.allclose(t, t[0])
    assert d0.allclose(d1, rtol=0.0, atol=0.0)
    # torch.histogram: int bins, tensor bins, range and weight
    flat = t.flatten()
    df = distribute_tensor(flat, mesh, [Shard(0)])
    _pair(torch.histogram(df, 4), torch.histogram(flat, 4))
    edges = torch.tensor([-2.0, -0.5, 0.0, 0.7, 2.5])
    _pair(torch.histogram(df, _rep(edges, mesh)), torch.histogram(flat, edges))
    _pair(
        torch.histogram(df, 3, range=(-1.0, 1.0), weight=df.abs()),
        torch.histogram(flat, 3, range=(-1.0, 1.0), weight=flat.abs()),
    )
    # torch.linspace / logspace with 0-d DTensor ends (Partial reduced first)
    end = DTensor.from_local(torch.tensor(1.0 / world), mesh, [Partial()])
    _eq(torch.linspace(_rep(torch.tensor(0.0), mesh), end, 5), torch.linspace(0.0, 1.0, 5))
    _eq(torch.logspace(0.0, end * 2, 4, base=3.0), torch.logspace(0.0, 2.0, 4, base=3.0))
    # nn.functional.unfold / fold (im2col / col2im): the batch dim keeps its shard; backward
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
    # torch.einsum with a label repeated in one operand: a diagonal / trace
    sq = torch.randn(5, 5, generator=g)
    cube = torch.randn(3, 3, 4, generator=g)
    for pl in (Shard(0), Shard(1)):
        d, r = distribute_tensor(sq, mesh, [pl]).requires_grad_(), sq.clone().requires_grad_()
        _eq(torch.einsum("ii->i", d), torch.einsum("ii->i", sq))
        o, ro = torch.einsum("ii", d), torch.einsum("ii", r)
        _eq(o, ro.detach())
        o.backward()
        ro.backward()
        _eq(d.grad, r.grad)
        dc = distribute_tensor(cube, mesh, [Shard(2) if pl.dim else pl])
        v = distribute_tensor(torch.arange(4.0), mesh, [Shard(0)])
        _eq(torch.einsum("iij,j->i", dc, v), torch.einsum("iij,j->i", cube, torch.arange(4.0)))
    # Tensor.masked_scatter (source read in the global order of the mask)
    src = torch.arange(30.0).view(5, 6)
    _eq(
        distribute_tensor(t, mesh, [Shard(0)]).masked_scatter(
            distribute_tensor(t > 0, mesh, [Shard(1)]), _rep(src, mesh)
        ),
        t.masked_scatter(t > 0, src),
    )
    # torch.linalg.multi_dot, torch.vander, torch.combinations
    chain = [t[0], t.t().contiguous(), t[:, :4]]
    _eq(
        torch.linalg.multi_dot(
            [distribute_tensor(c, mesh, [Shard(0)]) for c in chain[:2]] + [_rep(chain[2], mesh)]
        ),
        torch.linalg.multi_dot(chain),
    )
    ar = torch.arange(5.0)
    dar = distribute_tensor(ar, mesh, [Shard(0)])
    _eq(torch.vander(dar, 4, increasing=True), torch.vander(ar, 4, increasing=True))
    assert torch.vander(dar, 4).placements == (Shard(0),)
    _eq(torch.vander(dar), torch.vander(ar))
    _eq(torch.combinations(dar, 3, with_replacement=True), torch.combinations(ar, 3, True))
    _eq(torch.combinations(dar), torch.combinations(ar))
    # #119930 (PyTorch's tracking issue of ops with no DTensor strategy): grid_sample,
    # affine_grid, diagflat, Tensor.put were unregistered here
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
    _eq(torch.diagflat(distribute_tensor(t[:2], mesh, [Shard(1)]), -2), torch.diagflat(t[:2], -2))
    at, val = torch.tensor([0, 29, 0]), torch.tensor([1.0, 2.0, 3.0])
    _eq(
        distribute_tensor(t, mesh, [Shard(0)]).put(
            _rep(at, mesh), _rep(val, mesh), accumulate=True
        ),
        t.put(at, val, accumulate=True),
    )
    return 1


def check_mesh_of_4(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    # #103306: R -> S(0) -> R of (5, 10) on 4 ranks came back (8, 10)
    x = torch.rand(5, 10, generator=g)
    y = (
        DTensor.from_local(x, mesh, [Replicate()])
        .redistribute(mesh, [Shard(0)])
        .redistribute(mesh, [Replicate()])
        .to_local()
    )
    assert y.shape == x.shape
    _eq(y, x)
    for n in (1, 3, 7):
        t = torch.arange(n * 3.0).reshape(n, 3)
        for a in (Shard(0), Shard(1)):
            for b in (Shard(0), Shard(1), Replicate()):
                _eq(distribute_tensor(t, mesh, [a]).redistribute(mesh, [b]), t)
    # #162692 with empty shards: (1, 4) and (3, 4) over 4 ranks
    for n in (1, 3):
        u = torch.arange(4.0 * n).reshape(n, 4)
        d = distribute_tensor(u, mesh, [Shard(0)]).requires_grad_()
        r = u.clone().requires_grad_()
        _eq(d.mean(), u.mean())
        d.mean().backward()
        r.mean().backward()
        _eq(d.grad, r.grad)
    # #164543: embedding with an S(0) weight and an S(0) index on a (2, 2) mesh
    mesh2 = init_device_mesh("cpu", (2, 2))
    w = torch.randn(16, 4, generator=g)
    ids = torch.randint(0, 16, (4, 6), generator=g)
    dw = distribute_tensor(w, mesh2, [Shard(0), Replicate()])
    di = distribute_tensor(ids, mesh2, [Shard(0), Replicate()])
    _eq(F.embedding(di, dw), F.embedding(ids, w))
    # fixed: PR #118614, get_group() on a rank outside a sub-mesh (DeviceMesh("cpu", [0, 2])
    # on ranks 1 and 3) raised an AttributeError; it is None there, a working group inside
    sm = DeviceMesh("cpu", [0, 2])
    grp = sm.get_group()
    if rank in (1, 3):
        assert grp is None and sm.get_coordinate() is None
    else:
        ones = torch.ones(2)
        dist.all_reduce(ones, group=grp)
        _eq(ones, torch.full((2,), 2.0))
    # #143194 / #126530: a sub-mesh of a sub-mesh and n-d slicing; fixed: a dim by index
    # (mesh[-1]) raised "'int' object is not iterable"
    root = init_device_mesh("cpu", (2, 1, 2), mesh_dim_names=("a", "b", "c"))
    sub = root["a", "c"]
    assert tuple(sub.shape) == (2, 2)
    a4 = torch.arange(8.0).reshape(4, 2)
    _eq(distribute_tensor(a4, sub, [Shard(0), Shard(1)]), a4)
    for last in (sub["c"], sub[-1], root[2]):
        assert last.mesh_dim_names == ("c",) and last.size() == 2
        _eq(distribute_tensor(torch.arange(4.0), last, [Shard(0)]), torch.arange(4.0))
    # PR #159189 with empty shards: topk with k above the local size, max.dim
    t5 = torch.randn(5, 6, generator=g)
    d5 = distribute_tensor(t5, mesh, [Shard(0)])
    _pair(torch.topk(d5, 4, 0), torch.topk(t5, 4, 0))
    t3 = torch.randn(3, 4, generator=g)
    _pair(torch.max(distribute_tensor(t3, mesh, [Shard(0)]), 0), torch.max(t3, 0))
    return 1


def check_mesh_of_2(rank, world):
    return [check_values(rank, world), check_gradients(rank, world)]


def test_reports2_mesh_of_2(dist2):
    assert dist2.run(check_mesh_of_2) == [[1, 1]] * 2


def test_reports2_fixed(dist2):
    assert dist2.run(check_fixed) == [1, 1]


def test_reports2_mesh_of_4(dist4):
    assert dist4.run(check_mesh_of_4) == [1] * 4
