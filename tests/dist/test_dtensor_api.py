"""The DTensor API on real gloo ranks, against plain torch on the same inputs; public bug
reports on it (``report_*``, each naming its report)."""

from __future__ import annotations

import copy

import pytest
import torch

import hyper_shard as hs
from hyper_shard import (
    DeviceMesh,
    DTensor,
    Partial,
    Replicate,
    Shard,
    distribute_tensor,
    init_device_mesh,
)
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def check_from_local_uneven(rank, world):
    mesh = init_device_mesh("cpu", (2,))
    glob = torch.arange(10.0).reshape(2, 5)
    # torch.chunk layout: widths 3 and 2; inferred without `shape`
    local = glob[:, :3] if rank == 0 else glob[:, 3:]
    dt = DTensor.from_local(local, mesh, [Shard(1)])
    assert tuple(dt.shape) == (2, 5)
    torch.testing.assert_close(dt.full_tensor(), glob)
    # widths 2 and 3 (not the torch.chunk layout) with shape=(2, 5): a clear error on both
    bad = glob[:, :2] if rank == 0 else glob[:, 2:]
    with pytest.raises(ValueError, match="torch.chunk"):
        DTensor.from_local(bad, mesh, [Shard(1)], shape=(2, 5), stride=(5, 1))
    # ... and without shape: the gathered sizes are checked, the same error on both ranks
    with pytest.raises(ValueError, match=r"local sizes \[2, 3\]"):
        DTensor.from_local(bad, mesh, [Shard(1)])
    # local shapes that differ outside the sharded dim form no tensor: raised on both
    # ranks from the same gather (PyTorch DTensor returns a different shape on each rank)
    odd = torch.zeros(2, 2) if rank == 0 else torch.zeros(2, 3)
    with pytest.raises(ValueError, match=r"differ outside the sharded tensor dim 0"):
        DTensor.from_local(odd, mesh, [Shard(0)])
    # the process group is still usable afterwards
    torch.testing.assert_close(dt.redistribute(mesh, [Shard(0)]).full_tensor(), glob)
    return True


def test_from_local_uneven(dist2):
    assert dist2.run(check_from_local_uneven) == [True, True]


def check_distribute_and_factories(rank, world):
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    # every rank has a different tensor: distribute_tensor takes rank 0's
    torch.manual_seed(rank)
    t = torch.randn(5, 6)
    ref = t.clone()
    torch.distributed.broadcast(ref, 0)
    for pl in (
        [Shard(0), Shard(1)],
        [Replicate(), Shard(0)],
        [Shard(1), Shard(1)],
        [Partial(), Replicate()],
    ):
        dt = distribute_tensor(t, mesh, pl)
        torch.testing.assert_close(dt.full_tensor(), ref)
        assert dt.is_leaf and not dt.requires_grad
    dt = distribute_tensor(t.requires_grad_(), mesh, [Shard(0), Replicate()])
    assert dt.requires_grad and dt.is_leaf
    # factories equal plain torch for the same seed
    for name in ("zeros", "ones", "rand", "randn"):
        torch.manual_seed(11)
        d = getattr(hs, name)(5, 3, device_mesh=mesh, placements=[Shard(0), Shard(1)])
        torch.manual_seed(11)
        want = getattr(torch, name)(5, 3)
        torch.testing.assert_close(d.full_tensor(), want)
    f = hs.full(
        (3, 4), 2.5, device_mesh=mesh, placements=[Replicate(), Shard(1)], dtype=torch.float64
    )
    torch.testing.assert_close(f.full_tensor(), torch.full((3, 4), 2.5, dtype=torch.float64))
    e = hs.empty(4, 4, device_mesh=mesh, placements=[Shard(0), Replicate()])
    assert tuple(e.shape) == (4, 4) and tuple(e.to_local().shape) == (2, 4)
    z = hs.zeros((6, 2), device_mesh=mesh, requires_grad=True)
    assert z.requires_grad and z.placements == (Replicate(), Replicate())
    return True


def test_distribute_and_factories(dist4):
    assert dist4.run(check_distribute_and_factories) == [True] * 4


def check_tensor_protocol(rank, world):
    mesh = init_device_mesh("cpu", (2,))
    glob = torch.randn(5, 4, generator=torch.Generator().manual_seed(0))
    dt = distribute_tensor(glob, mesh, [Shard(0)])
    # metadata is global
    assert dt.shape == torch.Size([5, 4]) and dt.size() == (5, 4) and dt.size(0) == 5
    assert dt.dim() == 2 and dt.ndim == 2 and dt.numel() == 20 and len(dt) == 5
    assert dt.dtype == torch.float32 and dt.device.type == "cpu"
    assert dt.to_local().shape == ((3, 4) if rank == 0 else (2, 4))
    # parameters: nn.Parameter keeps the DTensor, deepcopy keeps the spec
    p = torch.nn.Parameter(dt)
    assert isinstance(p, torch.nn.Parameter) and isinstance(p, DTensor) and p.requires_grad
    q = copy.deepcopy(p)
    assert isinstance(q, DTensor) and q.placements == p.placements and q.requires_grad
    torch.testing.assert_close(q.full_tensor(), glob)
    # detach keeps the layout; repr names the placements
    d = p.detach()
    assert isinstance(d, DTensor) and not d.requires_grad and d.placements == (Shard(0),)
    assert "Shard(dim=0)" in repr(d)
    # .grad is a DTensor whose full tensor is the single-device gradient
    w = torch.randn(5, 4, generator=torch.Generator().manual_seed(1))
    (p.full_tensor() * w).sum().backward()
    assert isinstance(p.grad, DTensor) and p.grad.placements == (Shard(0),)
    torch.testing.assert_close(p.grad.full_tensor(), w)
    r = distribute_tensor(glob, mesh, [Replicate()]).requires_grad_()
    (r.full_tensor() * w).sum().backward()
    assert r.grad.placements == (Partial(),)
    torch.testing.assert_close(r.grad.full_tensor(), w)
    r.grad = None
    assert r.grad is None
    # setting a grad converts it to the leaf's gradient form
    r.grad = distribute_tensor(w, mesh, [Shard(1)])
    torch.testing.assert_close(r.grad.full_tensor(), w)
    # item / tolist gather the whole value
    s = DTensor.from_local(torch.tensor(float(rank + 1)), mesh, [Partial()])
    assert s.item() == 3.0
    # an op with no rule yet raises a clear error, and nothing hangs (torch.inverse,
    # torch.diag_embed, torch.diagflat and torch.hash_tensor, the examples here before, are
    # bound now)
    with pytest.raises(NotImplementedError, match=r"torch\.histogramdd.*S\(0\)"):
        torch.histogramdd(dt[:, :2], bins=3)
    # moving to another mesh is refused clearly
    other = DeviceMesh("cpu", [1, 0])
    with pytest.raises(ValueError, match="another mesh"):
        dt.redistribute(other, [Replicate()])
    return True


def test_tensor_protocol(dist2):
    assert dist2.run(check_tensor_protocol) == [True, True]


def check_permuted_mesh(rank, world):
    """A mesh whose ranks are not in row-major order: collectives follow coordinates."""
    mesh = DeviceMesh("cpu", [[0, 2], [3, 1]])
    glob = torch.arange(24.0).reshape(4, 6)
    for src in ([Shard(0), Shard(1)], [Shard(1), Shard(0)], [Replicate(), Shard(1)]):
        dt = distribute_tensor(glob, mesh, src)
        for dst in (
            [Replicate(), Replicate()],
            [Shard(1), Shard(0)],
            [Shard(0), Shard(0)],
        ):
            torch.testing.assert_close(dt.redistribute(mesh, dst).full_tensor(), glob)
        # a Partial target is internal (as PyTorch); the executor still moves it right
        from hyper_shard.dtensor import redistribute_local

        with pytest.raises(RuntimeError, match="Can not redistribute"):
            dt.redistribute(mesh, [Partial(), Shard(1)])
        tgt = dt._spec.with_placements([Partial(), Shard(1)])
        p = DTensor.from_local(
            redistribute_local(mesh.platform, dt.to_local(), dt._spec, tgt),
            mesh,
            tgt.placements,
            shape=glob.shape,
            stride=glob.stride(),
        )
        torch.testing.assert_close(p.full_tensor(), glob)
    return True


def test_permuted_mesh(dist4):
    assert dist4.run(check_permuted_mesh) == [True] * 4


def check_partial_backward_seed(rank, world):
    """loss.backward() on a Partial or Replicate scalar DTensor counts the loss once."""
    mesh = init_device_mesh("cpu", (2,))
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    dt = distribute_tensor(x, mesh, [Shard(0)]).requires_grad_()
    local = dt.to_local()
    part = DTensor.from_local((local * local).sum(), mesh, [Partial()])  # sum of squares
    part.backward()
    torch.testing.assert_close(dt.grad.full_tensor(), 2 * x)  # d/dx sum(x^2) = 2x
    dt.grad = None
    local = dt.to_local()
    part = DTensor.from_local((local * local).sum(), mesh, [Partial()])
    part.redistribute(mesh, [Replicate()]).backward()
    torch.testing.assert_close(dt.grad.full_tensor(), 2 * x)
    return True


def test_partial_backward_seed(dist2):
    assert dist2.run(check_partial_backward_seed) == [True, True]


def check_out_variants(rank, world):
    """out= writes into the out DTensor in its own placements (as PyTorch DTensor: the
    result is redistributed into it); an out of another global shape raises, untouched."""
    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    da, db = distribute_tensor(a, mesh, [Shard(0)]), distribute_tensor(b, mesh, [Shard(0)])
    out = distribute_tensor(torch.zeros(5, 4), mesh, [Shard(0)])
    res = torch.add(da, db, out=out)
    assert res is out
    torch.testing.assert_close(out.full_tensor(), a + b)
    rep = distribute_tensor(torch.zeros(5, 4), mesh, [Replicate()])
    res = torch.add(da, db, out=rep)
    assert res is rep and rep.placements == (Replicate(),)
    torch.testing.assert_close(rep.to_local(), a + b)  # every rank holds the whole sum
    col = distribute_tensor(torch.zeros(5, 4), mesh, [Shard(1)])
    torch.mul(da, db, out=col)
    assert col.placements == (Shard(1),)
    torch.testing.assert_close(col.full_tensor(), a * b)
    wrong = distribute_tensor(torch.zeros(4, 4), mesh, [Replicate()])
    with pytest.raises(ValueError, match="out= is .* but the result is"):
        torch.add(da, db, out=wrong)
    torch.testing.assert_close(wrong.full_tensor(), torch.zeros(4, 4))  # nothing written
    return True


def test_out_variants(dist2):
    assert dist2.run(check_out_variants) == [True, True]


def check_inplace_keeps_target(rank, world):
    """In-place ops keep the target's placements (the other operand moves), as torch."""
    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    da, db = distribute_tensor(a, mesh, [Replicate()]), distribute_tensor(b, mesh, [Shard(0)])
    out = da.mul_(db)
    assert out is da and da.placements == (Replicate(),)
    torch.testing.assert_close(da.full_tensor(), a * b)
    return True


def test_inplace_keeps_target(dist2):
    assert dist2.run(check_inplace_keeps_target) == [True, True]


def check_optimizer_reduces_gradient_once(rank, world):
    """A Replicate parameter's Partial(sum) gradient is all-reduced once per optimizer step
    (the data-parallel all-reduce), however many optimizer ops read it; the step equals
    plain AdamW on the same data."""
    from hyper_shard.debug import comm_counter

    mesh = init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(8)
    x, w0 = torch.randn(6, 4, generator=g), torch.randn(4, 3, generator=g)
    w = distribute_tensor(w0, mesh, [Replicate()]).requires_grad_()
    ref = w0.clone().requires_grad_()
    opt = torch.optim.AdamW([w], lr=0.1, foreach=False)
    ref_opt = torch.optim.AdamW([ref], lr=0.1, foreach=False)
    dx = distribute_tensor(x, mesh, [Shard(0)])
    for _ in range(2):
        torch.mm(dx, w).to_local().sum().backward()
        assert w.grad.placements == (Partial(),)
        with comm_counter() as c:
            opt.step()
        assert c["all_reduce"] == 1, dict(c)
        opt.zero_grad()
        (x @ ref).sum().backward()
        ref_opt.step()
        ref_opt.zero_grad()
        torch.testing.assert_close(w.full_tensor(), ref.detach())
    return True


def test_optimizer_reduces_gradient_once(dist2):
    assert dist2.run(check_optimizer_reduces_gradient_once) == [True, True]


def check_save_load(rank, world, tmp):
    """torch.save / torch.load (weights_only, torch's default) of a TP model's state_dict and
    its optimizer state, one file per rank, as with PyTorch DTensor: the loaded model and
    optimizer continue exactly like the saved ones; another rank's file is refused."""
    import os

    from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (2,))

    def build(seed):
        torch.manual_seed(seed)
        m = torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 5))
        parallelize_module(m, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        return m, torch.optim.AdamW(m.parameters(), lr=0.1)

    m, opt = build(0)
    g = torch.Generator().manual_seed(3)
    xs = [torch.randn(3, 5, generator=g) for _ in range(3)]
    m(xs[0]).pow(2).sum().backward()
    opt.step()
    opt.zero_grad()
    path = os.path.join(tmp, f"rank{rank}.pt")
    torch.save({"model": m.state_dict(), "opt": opt.state_dict()}, path)
    torch.distributed.barrier()
    sd = torch.load(path)
    w = sd["model"]["0.weight"]
    assert isinstance(w, DTensor) and w.placements == (Shard(0),)
    m2, opt2 = build(1)
    m2.load_state_dict(sd["model"])
    opt2.load_state_dict(sd["opt"])
    for x in xs[1:]:  # both continue identically
        for mm, oo in ((m, opt), (m2, opt2)):
            mm(x).pow(2).sum().backward()
            oo.step()
            oo.zero_grad()
        torch.testing.assert_close(m2(x), m(x))
    # a copy keeps the layout and the values
    c = copy.deepcopy(m.state_dict()["0.weight"])
    torch.testing.assert_close(c.full_tensor(), m.state_dict()["0.weight"].full_tensor())
    with pytest.raises(ValueError, match="its own rank saved"):
        torch.load(os.path.join(tmp, f"rank{1 - rank}.pt"))
    return True


def test_save_load(dist2, tmp_path):
    assert dist2.run(check_save_load, str(tmp_path)) == [True, True]


# ---------------------------------------------------------------------- bug reports
def report_to_local_from_local_partial(rank, world):
    """Issue 4, case 10 (a public PyTorch DTensor report): ``to_local()`` then
    ``DTensor.from_local(..., [Partial()])`` keeps the gradients; a leaf local tensor
    wrapped as Partial receives the whole gradient, as in torch."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)
    w = torch.randn(4, 3, generator=g)
    # plain torch: loss = sum(((a @ b) * 2) * w)
    ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ((ra @ rb) * 2 * w).sum().backward()
    da = distribute_tensor(a, mesh, [Shard(1)]).detach().requires_grad_()
    db = distribute_tensor(b, mesh, [Shard(0)]).detach().requires_grad_()
    p = da @ db  # contracted dim sharded: Partial(sum)
    assert p.placements == (Partial(),)
    local = p.to_local()  # each rank's addend
    q = DTensor.from_local(local * 2, mesh, [Partial()], shape=(4, 3), stride=(3, 1))
    loss = (q.full_tensor() * w).sum()
    loss.backward()
    assert da.grad is not None and db.grad is not None
    torch.testing.assert_close(da.grad.full_tensor(), ra.grad)
    torch.testing.assert_close(db.grad.full_tensor(), rb.grad)
    leaf = (torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])).requires_grad_()
    x = DTensor.from_local(leaf, mesh, [Partial()])
    y = DTensor.from_local(x.to_local() * 3, mesh, [Partial()])
    (y.full_tensor() ** 2).sum().backward()
    ref = torch.tensor([3.0, 4.0], requires_grad=True)
    ((ref * 3) ** 2).sum().backward()
    torch.testing.assert_close(leaf.grad, ref.grad)


def report_from_local_shards_that_are_not_chunks(rank, world):
    """Issue 4, case 9: ``from_local`` ``Shard(1)`` with local widths 2 and 3 and
    ``shape=(2, 5)``: ``torch.chunk`` gives widths 3 and 2, so the shards do not describe
    that tensor: a clear error on every rank (never silent garbage); #144109: shards that
    are not ``torch.chunk``'s layout gave a silently wrong ``full_tensor()`` in PyTorch;
    #110762: ``from_local`` of ``torch.chunk`` shards infers the uneven global shape."""
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(10, dtype=torch.float32).reshape(2, 5)
    wrong = full[:, :2] if rank == 0 else full[:, 2:]  # widths 2 and 3
    with pytest.raises(ValueError, match="torch.chunk"):
        DTensor.from_local(wrong, mesh, [Shard(1)], shape=(2, 5), stride=(5, 1))
    with pytest.raises(ValueError, match="torch.chunk"):
        DTensor.from_local(wrong, mesh, [Shard(1)])  # inferred shape: refused too
    right = torch.chunk(full, world, 1)[rank]  # widths 3 and 2
    d = DTensor.from_local(right, mesh, [Shard(1)], shape=(2, 5), stride=(5, 1))
    assert torch.equal(d.full_tensor(), full)
    loc = torch.arange(2.0 * (2 + rank)).reshape(2, 2 + rank)
    with pytest.raises(ValueError, match="not the torch.chunk layout"):
        DTensor.from_local(loc, mesh, [Shard(1)])
    full = torch.arange(10.0).reshape(5, 2)
    d = DTensor.from_local(full.chunk(world, 0)[rank], mesh, [Shard(0)])
    assert tuple(d.shape) == (5, 2)
    torch.testing.assert_close(d.full_tensor(), full)


def report_partial_gradients_through_local_tensors(rank, world):
    """#175867: ``from_local(grad_placements=[Partial()])`` keeps the gradient partial;
    #172932: ``to_local()`` + ``from_local(Partial)`` gives the gradient of the direct path;
    #144054: ``item()`` / ``float()`` of a Partial reduction is the global value."""
    mesh = init_device_mesh("cpu", (world,))
    leaf3 = torch.ones(3, requires_grad=True)
    x3 = DTensor.from_local(leaf3, mesh, [Replicate()], grad_placements=[Partial()])
    (x3 * distribute_tensor(torch.tensor([1.0, 2.0, 3.0]), mesh, [Replicate()])).sum().backward()
    tot = leaf3.grad.clone()
    torch.distributed.all_reduce(tot)
    torch.testing.assert_close(tot, torch.tensor([1.0, 2.0, 3.0]))
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
    torch.testing.assert_close(grads[0], torch.full((4,), 6.0))
    torch.testing.assert_close(grads[1], grads[0])
    s = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Shard(0)]).sum()
    assert s.placements == (Partial(),) and s.item() == 28.0 and float(s) == 28.0


def report_detach_in_place(rank, world):
    """#167917 (fixed here): ``aten.detach_.default`` on a DTensor; ``x.detach_()`` of any
    op's result raised "Can't detach views in-place" (the DTensor is an alias of its local
    result) and the aten overloads ``detach_`` / ``detach`` were unbound."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(t, mesh, [pl]).requires_grad_()
        e = d * 2
        assert e.detach_() is e
        assert not e.requires_grad and e.grad_fn is None and e.placements == (pl,)
        torch.testing.assert_close(e.full_tensor(), t * 2)
        f = torch.ops.aten.detach_.default(d * 3)
        assert not f.requires_grad
        torch.testing.assert_close(f.full_tensor(), t * 3)
        g = torch.ops.aten.detach.default(d)
        assert not g.requires_grad and g.placements == (pl,)
        torch.testing.assert_close(g.full_tensor(), t)
        leaf = distribute_tensor(t, mesh, [pl]).requires_grad_()
        leaf.detach_()
        assert not leaf.requires_grad and leaf.is_leaf


@reports(
    report_to_local_from_local_partial,
    report_from_local_shards_that_are_not_chunks,
    report_partial_gradients_through_local_tensors,
    report_detach_in_place,
)
def test_reports(report, dist2):
    dist2.run(report)
