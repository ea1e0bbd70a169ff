"""``hyper_shard.experimental.local_map`` against PyTorch DTensor's
``torch.distributed.tensor.experimental.local_map`` and plain torch, on real gloo ranks
(a mesh of 2): the same function, the same global inputs, imports switched.

Values and gradients are compared with the plain single-process computation; placements,
shapes and the errors raised with PyTorch DTensor's. One deliberate difference: with
uneven shards PyTorch 2.13 infers an output's global shape as local x mesh size
(pytorch/pytorch#172812); hyper_shard's is the true one.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

import hyper_shard as hs
from hyper_shard.experimental import LocalMapError, local_map
from tests._helpers import assert_dtensor_close

pytestmark = pytest.mark.multiproc


def _libs(world):
    """(name, mesh, distribute_tensor, Shard, Replicate, Partial, local_map) per library."""
    import torch.distributed.tensor as T
    from torch.distributed.tensor.experimental import local_map as t_local_map

    tmesh = T.init_device_mesh("cpu", (world,))
    hmesh = hs.init_device_mesh("cpu", (world,))
    return [
        ("torch", tmesh, T.distribute_tensor, T.Shard, T.Replicate, T.Partial, t_local_map),
        ("hyper_shard", hmesh, hs.distribute_tensor, hs.Shard, hs.Replicate, hs.Partial, local_map),
    ]


def _mm_allreduce(w, x):
    """Megatron row-parallel matmul written on local tensors: local mm, then all-reduce."""
    y = torch.mm(w, x)
    dist.all_reduce(y)
    return y


def check_local_map(rank, world):
    torch.manual_seed(0)
    W, X = torch.randn(6, 8), torch.randn(8, 5)
    A = torch.randn(5, 4, requires_grad=True)  # 5 rows: uneven on 2 ranks
    B = torch.randn(4, 3, requires_grad=True)
    ref_ab = A @ B
    ref_ab.sum().backward()
    for name, mesh, distribute, Shard, Replicate, Partial, lmap in _libs(world):
        # PyTorch's docstring example: column-wise W, row-wise X, all-reduce inside
        f = lmap(
            _mm_allreduce, out_placements=[Replicate()], in_placements=([Shard(1)], [Shard(0)])
        )
        y = f(distribute(W, mesh, [Shard(1)]), distribute(X, mesh, [Shard(0)]))
        assert tuple(y.placements) == (Replicate(),), name
        torch.testing.assert_close(y.full_tensor(), W @ X, rtol=1e-5, atol=1e-5)

        # gradients through local_map: A sharded by rows (uneven), B replicated
        a = distribute(A.detach(), mesh, [Shard(0)]).requires_grad_()
        b = distribute(B.detach(), mesh, [Replicate()]).requires_grad_()
        # b's local gradient is this rank's row-block contribution: a Partial(sum) gradient
        g = lmap(
            torch.mm,
            out_placements=[Shard(0)],
            in_placements=([Shard(0)], [Replicate()]),
            in_grad_placements=([Shard(0)], [Partial()]),
        )
        out = g(a, b)
        out.sum().backward()
        torch.testing.assert_close(a.grad.full_tensor(), A.grad)
        torch.testing.assert_close(b.grad.full_tensor(), B.grad)
        if name == "hyper_shard":
            # the true global shape of an uneven output (PyTorch 2.13: 6 rows, #172812)
            assert tuple(out.shape) == (5, 3)
            assert_dtensor_close(out, ref_ab.detach())

        # a mismatched input raises unless redistribute_inputs=True
        xr = distribute(X, mesh, [Replicate()])
        h = lmap(torch.neg, out_placements=[Shard(0)], in_placements=([Shard(0)],))
        with pytest.raises(ValueError, match="redistribute_inputs"):
            h(xr)
        h2 = lmap(
            torch.neg,
            out_placements=[Shard(0)],
            in_placements=([Shard(0)],),
            redistribute_inputs=True,
        )
        z = h2(xr)
        assert tuple(z.placements) == (Shard(0),)
        torch.testing.assert_close(z.full_tensor(), -X)

        # decorator form, nested arguments, several outputs with a non-tensor one
        @lmap(out_placements=([Shard(0)], None), in_placements=([Shard(0)], [Shard(0)], None))
        def pair_sum(pair, k):
            u, v = pair
            return u + k * v, "tag"

        xs = distribute(X, mesh, [Shard(0)])
        s, tag = pair_sum((xs, xs), 2.0)
        assert tag == "tag"
        torch.testing.assert_close(s.full_tensor(), 3 * X)

        # a DTensor given None placements: AssertionError in both (PyTorch's type)
        with pytest.raises(AssertionError, match="expects placements"):
            lmap(torch.add, out_placements=[Shard(0)], in_placements=([Shard(0)], None))(xs, xs)
        # a tensor output with None placements is wrapped as Replicate (from_local's default)
        r = lmap(torch.neg, out_placements=None)(distribute(X, mesh, [Replicate()]))
        assert tuple(r.placements) == (Replicate(),), name
        torch.testing.assert_close(r.full_tensor(), -X)

        # no DTensor argument: func's result, unwrapped
        plain = lmap(torch.neg, out_placements=[Shard(0)])(X)
        assert type(plain) is torch.Tensor
        torch.testing.assert_close(plain, -X)

        # in_grad_placements: func's result per rank is a partial sum of the gradient
        p = distribute(X, mesh, [Replicate()]).requires_grad_()
        k = lmap(
            lambda t: t * 1.0,
            out_placements=[Partial()],
            in_placements=([Replicate()],),
            in_grad_placements=([Partial()],),
        )
        k(p).full_tensor().sum().backward()
        torch.testing.assert_close(p.grad.full_tensor(), torch.full_like(X, float(world)))
    # hyper_shard's errors name the argument and the fix
    hmesh = hs.init_device_mesh("cpu", (world,))
    xs = hs.distribute_tensor(X, hmesh, [hs.Shard(0)])
    with pytest.raises(TypeError, match="must return local tensors"):
        local_map(lambda t: hs.distribute_tensor(t, hmesh, [hs.Replicate()]), [hs.Replicate()])(xs)
    with pytest.raises(AssertionError, match="one entry per argument leaf"):
        local_map(torch.neg, [hs.Shard(0)], in_placements=([hs.Shard(0)], None))(xs)
    return 1


def test_local_map(dist2):
    assert dist2.run(check_local_map) == [1, 1]


def report_nested_placements(rank, world):
    """#182031 (PR #184483): local_map flattens a list argument but took placements only
    as a flat list, one per flattened leaf: placements may now also mirror the arguments
    (a list of placements for a list argument) and the output (a dict for a dict
    output); the flat form still works. Values and gradients against plain torch."""
    mesh = hs.init_device_mesh("cpu", (world,))
    S = hs.Shard
    a, b, c = (torch.randn(4, 3, generator=torch.Generator().manual_seed(i)) for i in range(3))

    def f(xs, y):
        return {"sum": xs[0] + xs[1] * y, "pair": (y * 2, y - xs[0])}

    for in_pl, out_pl in (
        (([S(0)], [S(0)], [S(0)]), ([S(0)], [S(0)], [S(0)])),
        (([[S(0)], [S(0)]], [S(0)]), {"sum": [S(0)], "pair": ([S(0)], [S(0)])}),
    ):
        ds = [hs.distribute_tensor(t, mesh, [S(0)]).requires_grad_() for t in (a, b, c)]
        rs = [t.clone().requires_grad_() for t in (a, b, c)]
        out = local_map(f, out_placements=out_pl, in_placements=in_pl)(ds[:2], ds[2])
        ref = f(rs[:2], rs[2])
        assert_dtensor_close(out["sum"], ref["sum"].detach())
        assert_dtensor_close(out["pair"][1], ref["pair"][1].detach())
        (out["sum"].sum() + (out["pair"][0] * out["pair"][1]).sum()).backward()
        (ref["sum"].sum() + (ref["pair"][0] * ref["pair"][1]).sum()).backward()
        for d, r in zip(ds, rs):
            assert_dtensor_close(d.grad, r.grad)
    with pytest.raises(LocalMapError, match="one entry per argument leaf"):
        local_map(f, out_placements=[S(0)], in_placements=([S(0)], [S(0)]))(ds[:2], ds[2])


def test_reports(dist2):
    dist2.run(report_nested_placements)
