"""Regression cases from public PyTorch DTensor bug reports (issue 4, cases 1, 7 and 10), on
real gloo ranks (a mesh of 2), each checked against plain torch on the same values.

1. ``-5 * p`` and ``2 * p`` of a Partial(sum) DTensor differ correctly (a python scalar's
   value is not part of the layout cache key, so no stale decision is reused).
7. in-place ``clamp_(max=2)`` on a Partial(sum) DTensor: ``clamp`` is not linear, so the
   in-place op cannot keep Partial; it raises a ShardingError naming the op, the placements
   and the fix (redistribute first, or use the out-of-place op, which is right).
10. ``to_local()`` then ``DTensor.from_local(..., [Partial()])`` keeps the gradients.
"""

from __future__ import annotations

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, ShardingError, init_device_mesh
from hyper_shard.dispatch.dispatcher import clear_cache

pytestmark = pytest.mark.multiproc


def _partial_locals(rank: int) -> torch.Tensor:
    # global value [1, 3] + [2, 1] = [3, 4]
    return torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])


def check_scalar_times_partial(rank, world):
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
    assert outs[0] != outs[1]
    # gradients: d/dp sum(-5 p + 2 p) = -3 on every element of the global value, and the
    # Partial(sum) local tensors each receive it
    loss = (-5 * p + 2 * p).sum()
    loss.backward()
    ref = torch.tensor([3.0, 4.0], requires_grad=True)
    (-5 * ref + 2 * ref).sum().backward()
    torch.testing.assert_close(local.grad, ref.grad)
    return len(outs)


def check_inplace_clamp_partial(rank, world):
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
    return 1


def check_to_local_from_local_partial(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(6, 3, generator=g)
    w = torch.randn(4, 3, generator=g)
    # plain torch: loss = sum(((a @ b) * 2) * w)
    ra, rb = a.clone().requires_grad_(), b.clone().requires_grad_()
    ((ra @ rb) * 2 * w).sum().backward()
    from hyper_shard import distribute_tensor

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
    # a leaf local tensor wrapped as Partial receives the whole gradient, as in torch
    leaf = _partial_locals(rank).requires_grad_()
    x = DTensor.from_local(leaf, mesh, [Partial()])
    y = DTensor.from_local(x.to_local() * 3, mesh, [Partial()])
    (y.full_tensor() ** 2).sum().backward()
    ref = torch.tensor([3.0, 4.0], requires_grad=True)
    ((ref * 3) ** 2).sum().backward()
    torch.testing.assert_close(leaf.grad, ref.grad)
    return 1


@pytest.mark.parametrize(
    "fn",
    [check_scalar_times_partial, check_inplace_clamp_partial, check_to_local_from_local_partial],
)
def test_regression(fn, dist2):
    assert dist2.run(fn) == [1 if fn is not check_scalar_times_partial else 5] * 2
