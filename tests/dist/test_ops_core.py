"""Pointwise and einsum ops on real gloo ranks against plain torch (forward and backward);
public bug reports on them (``report_*``, each naming its report)."""

from __future__ import annotations

import random

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
from hyper_shard.dispatch.dispatcher import clear_cache
from tests._helpers import all_combos, check_op
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world):
    """Every combination on the 1-D mesh; a fixed random sample of ``k`` on (2, 2)."""
    return combos if world == 2 or len(combos) <= k else random.Random(0).sample(combos, k)


def check_binary_pointwise(rank, world):
    """Every placement pair on the 1-D mesh; on (2, 2) every pair for ``add`` and a fixed
    random sample of the pairs for the other functions (the same pointwise rule; add's
    full sweep covers every nested pair once)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g) + 3
    b = torch.randn(4, generator=g)
    combos = all_combos([x, y], mesh.ndim)
    n = check_op(torch.add, [x, y], mesh, combos)
    for fn in (
        torch.sub,
        torch.mul,
        torch.div,
        lambda a, c: a * 2 - c / 3 + 1,
        lambda a, c: torch.maximum(a, c),
    ):
        n += check_op(fn, [x, y], mesh, _sample(combos, 40, world))
    # broadcasting against a 1-D tensor, both orders
    combos_b = all_combos([x, b], mesh.ndim)
    n += check_op(torch.add, [x, b], mesh, combos_b)
    n += check_op(lambda a, c: c * a, [x, b], mesh, _sample(combos_b, 40, world))
    return n


def check_unary_and_scalars(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = torch.randn(6, 3, generator=torch.Generator().manual_seed(1))
    combos = all_combos([x], mesh.ndim, ("sum", "avg", "max"))
    n = 0
    for fn in (
        lambda a: a + 10,
        lambda a: 10 - a,
        lambda a: -5 * a,
        lambda a: 2 * a,
        lambda a: a / 4,
        lambda a: torch.exp(a),
        lambda a: torch.relu(a),
        lambda a: torch.nn.functional.silu(a),
        lambda a: torch.add(a, 3, alpha=2),
        lambda a: (a > 0).float() * a,
        lambda a: a * a,  # one object twice: each occurrence gets its own layout
        lambda a: torch.maximum(a, a - 1),
    ):
        n += check_op(fn, [x], mesh, combos)
    return n


def check_matmuls(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(5, 6, generator=g), torch.randn(6, 3, generator=g)
    n = check_op(torch.mm, [a, b], mesh, all_combos([a, b], mesh.ndim))  # every pair
    n += check_op(torch.matmul, [a, b], mesh, _sample(all_combos([a, b], mesh.ndim), 50, world))
    ba, bb = torch.randn(2, 3, 4, generator=g), torch.randn(2, 4, 5, generator=g)
    n += check_op(torch.bmm, [ba, bb], mesh, _sample(all_combos([ba, bb], mesh.ndim), 80, world))
    x, w, bias = (
        torch.randn(2, 3, 6, generator=g),
        torch.randn(4, 6, generator=g),
        torch.randn(4, generator=g),
    )
    n += check_op(
        torch.nn.functional.linear,
        [x, w, bias],
        mesh,
        _sample(all_combos([x, w, bias], mesh.ndim), 80, world),
    )
    c = torch.randn(5, 3, generator=g)
    n += check_op(
        lambda i, m1, m2: torch.addmm(i, m1, m2),
        [c, a, b],
        mesh,
        _sample(all_combos([c, a, b], mesh.ndim), 60, world),
    )
    v = torch.randn(6, generator=g)
    n += check_op(torch.matmul, [a, v], mesh, _sample(all_combos([a, v], mesh.ndim), 40, world))
    w2 = torch.randn(4, 5, generator=g)
    n += check_op(torch.matmul, [ba, w2], mesh, _sample(all_combos([ba, w2], mesh.ndim), 40, world))
    return n


@pytest.mark.parametrize("world", [2, 4])
def test_binary_pointwise(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_binary_pointwise)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_unary_and_scalars(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_unary_and_scalars)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_matmuls(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_matmuls)
    assert counts[0] > 0 and len(set(counts)) == 1


# ---------------------------------------------------------------------- bug reports
def _partial_locals(rank: int) -> torch.Tensor:
    # global value [1, 3] + [2, 1] = [3, 4]
    return torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])


def report_scalar_times_partial(rank, world):
    """Issue 4, case 1 (a public PyTorch DTensor report): ``-5 * p`` and ``2 * p`` of a
    Partial(sum) DTensor differ correctly (a python scalar's value is not part of the
    layout cache key, so no stale decision is reused); gradients too."""
    mesh = init_device_mesh("cpu", (world,))
    clear_cache()
    local = _partial_locals(rank).requires_grad_()
    p = DTensor.from_local(local, mesh, [Partial()])
    full = torch.tensor([3.0, 4.0])
    outs = []
    for scalar in (-5, 2, -5, 0.5, 2):  # the same decision is reused for every value
        y = scalar * p
        z = p * scalar
        assert y.placements == (Partial(),)
        torch.testing.assert_close(y.full_tensor(), scalar * full)
        torch.testing.assert_close(z.full_tensor(), full * scalar)
        outs.append(y.full_tensor().tolist())
    assert outs[0] != outs[1] and len(outs) == 5
    # gradients: d/dp sum(-5 p + 2 p) = -3 on every element of the global value, and the
    # Partial(sum) local tensors each receive it
    loss = (-5 * p + 2 * p).sum()
    loss.backward()
    ref = torch.tensor([3.0, 4.0], requires_grad=True)
    (-5 * ref + 2 * ref).sum().backward()
    torch.testing.assert_close(local.grad, ref.grad)


def report_scalars_with_reductions(rank, world):
    """#153603: a reduction times a python scalar, several scalars in a row; #163193 /
    #149768: Partial(sum) + python scalar added the scalar once per rank (torch: 45 + 10 =
    55, PyTorch gave 65 on 2 ranks); #145218: in-place ``+= 2`` of a norm (python scalar
    and tensor)."""
    mesh = init_device_mesh("cpu", (world,))
    for i in range(1, 4):
        dy = DTensor.from_local(torch.tensor([1.0 + rank]), mesh, [Shard(0)]).mean()
        _eq((dy * i).full_tensor(), torch.tensor(1.5 * i))
        _eq((i - dy).full_tensor(), torch.tensor(i - 1.5))
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
    r = torch.rand(10, 8, generator=torch.Generator().manual_seed(0))
    for two in (2, torch.tensor(2)):
        n = torch.linalg.vector_norm(distribute_tensor(r, mesh, [Shard(0)]))
        n += two
        _eq(n.full_tensor(), torch.linalg.vector_norm(r) + 2)


def report_inplace_clamp_of_partial(rank, world):
    """Issue 4, case 7, and #163374 (``clamp_`` of a Partial(sum) clamped each addend:
    PyTorch printed 144 for 2): ``clamp`` is not linear, so the in-place op cannot keep
    Partial; it raises a ShardingError naming the op, the placements and the fix
    (redistribute first, or the out-of-place op, which is right), the value unchanged."""
    mesh = init_device_mesh("cpu", (world,))
    p = DTensor.from_local(_partial_locals(rank), mesh, [Partial()])
    ref = torch.tensor([3.0, 4.0]).clamp(max=2)
    with pytest.raises(ShardingError) as ei:
        p.clamp_(max=2)
    msg = str(ei.value)
    assert "clamp_" in msg and "[P]" in msg and "redistribute" in msg, msg
    # the DTensor is untouched by the refused call
    torch.testing.assert_close(p.full_tensor(), torch.tensor([3.0, 4.0]))
    # the fixes the message names give the right value
    out = p.clamp(max=2)
    torch.testing.assert_close(out.full_tensor(), ref)
    r = p.redistribute(mesh, [Replicate()])
    r.clamp_(max=2)
    torch.testing.assert_close(r.full_tensor(), ref)
    # #163374's program
    p = DTensor.from_local(torch.tensor(3.0 + rank), mesh, [Partial()])
    full = torch.tensor(3.0 * world + sum(range(world)))
    with pytest.raises(RuntimeError, match="in-place operations that require placement"):
        p.clamp_(None, 2)
    _eq(p, full)
    _eq(p.clamp(None, 2), full.clamp(None, 2))
    p.mul_(2).add_(1)
    _eq(p, full * 2 + 1)


def report_pointwise_on_a_mesh_with_a_size_1_dim(rank, world):
    """mindspore-ai/hyper-parallel#711: a 1-d tensor on a 2-d mesh (world, 1)."""
    mesh2 = init_device_mesh("cpu", (world, 1), mesh_dim_names=("dp", "tp"))
    v = torch.arange(6.0)
    for pl in ([Shard(0), Replicate()], [Replicate(), Shard(0)], [Shard(0), Shard(0)]):
        _eq(distribute_tensor(v, mesh2, pl) * 2 + 1, v * 2 + 1)


def report_matmul_gradients(rank, world):
    """#117728 / #118043: ``addmm`` / ``mm`` with a zero-size contraction;
    mindspore-ai/hyper-parallel#685: chained ``(x @ A^T) @ B^T`` through a Partial
    intermediate, and #494: ``Add(Partial, Replicate)`` must not scale the replicate's
    gradient; #180486: a Replicate parameter whose gradient arrives transposed (a
    non-contiguous Partial: autograd's layout fix-up all-reduced it in PyTorch)."""
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(1)
    a, b, c = torch.randn(12, 0), torch.randn(0, 4), torch.randn(4, generator=g)
    da = distribute_tensor(a, mesh, [Shard(0)])
    _eq(torch.addmm(_rep(c, mesh), da, _rep(b, mesh)), torch.addmm(c, a, b))
    xv, A, B, R = (torch.randn(*s, generator=g) for s in ((3, 8), (2, 8), (5, 2), (3, 5)))
    dx = distribute_tensor(xv, mesh, [Shard(1)]).requires_grad_()
    dA = distribute_tensor(A, mesh, [Shard(1)]).requires_grad_()
    dB, dR = (_rep(t, mesh).requires_grad_() for t in (B, R))
    rx, rA, rB, rR = (t.clone().requires_grad_() for t in (xv, A, B, R))
    out = (dx @ dA.t()) @ dB.t() + dR
    ref = (rx @ rA.t()) @ rB.t() + rR
    _eq(out.full_tensor(), ref.detach())
    wt = torch.randn(3, 5, generator=g)
    (out * _rep(wt, mesh)).sum().backward()
    (ref * wt).sum().backward()
    for d, r in ((dx, rx), (dA, rA), (dB, rB), (dR, rR)):
        _eq(d.grad.full_tensor(), r.grad)
    w6 = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    xs = distribute_tensor(
        torch.randn(8, 4, generator=torch.Generator().manual_seed(3)), mesh, [Shard(0)]
    )
    dw, rw = _rep(w6, mesh).requires_grad_(), w6.clone().requires_grad_()
    (xs @ dw.t()).pow(2).sum().backward()
    (xs.full_tensor() @ rw.t()).pow(2).sum().backward()
    _eq(dw.grad, rw.grad, atol=1e-4, rtol=1e-4)


def report_products_without_a_strategy(rank, world):
    """#142190 / #157631: matmul / einsum under ``torch.inference_mode()`` (PyTorch had no
    strategy there); fixed here (a ShardingError or an unregistered op before):
    ``torch.einsum`` with a label repeated in one operand (a diagonal / trace, found
    replaying PR #177336) and ``torch.linalg.multi_dot``."""
    mesh = init_device_mesh("cpu", (world,))
    a = torch.randn(8, 16, generator=torch.Generator().manual_seed(4))
    b = torch.randn(16, 16, generator=torch.Generator().manual_seed(5))
    da, db = _rep(a, mesh), distribute_tensor(b, mesh, [Shard(0)])
    with torch.inference_mode():
        _eq(torch.matmul(da, db), a @ b, atol=1e-5, rtol=1e-5)
        _eq(torch.ops.aten.matmul.default(da, db), a @ b, atol=1e-5, rtol=1e-5)
        _eq(torch.einsum("ij,jk->ik", da, db), a @ b, atol=1e-5, rtol=1e-5)
    g = torch.Generator().manual_seed(2)
    t = torch.randn(5, 6, generator=g)
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
    chain = [t[0], t.t().contiguous(), t[:, :4]]
    _eq(
        torch.linalg.multi_dot(
            [distribute_tensor(c, mesh, [Shard(0)]) for c in chain[:2]] + [_rep(chain[2], mesh)]
        ),
        torch.linalg.multi_dot(chain),
    )


@reports(
    report_scalar_times_partial,
    report_scalars_with_reductions,
    report_inplace_clamp_of_partial,
    report_pointwise_on_a_mesh_with_a_size_1_dim,
    report_matmul_gradients,
    report_products_without_a_strategy,
)
def test_reports(report, dist2):
    dist2.run(report)


def report_matmul_on_a_2d_mesh(rank, world):
    """#166598: A ``[S(1), S(1)]`` @ B ``[S(0), S(0)]`` / ``[S(0), R]`` / ``[R, S(0)]`` on
    a (2, 2) mesh."""
    mesh2 = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    A = torch.arange(16.0).view(4, 4)
    dA = distribute_tensor(A, mesh2, [Shard(1), Shard(1)])
    for pl in ([Shard(0), Shard(0)], [Shard(0), Replicate()], [Replicate(), Shard(0)]):
        _eq((dA @ distribute_tensor(A, mesh2, pl)).full_tensor(), A @ A)


@reports(report_matmul_on_a_2d_mesh)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
