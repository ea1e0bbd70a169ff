"""Public bug reports on the DTensor API of ``test_dtensor_api.py`` (``from_local``,
``to_local``, their gradients), each replaying the report's program on 2 real gloo ranks
against plain torch on the same values (each ``report_*`` names its report)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def report_local_round_trips_and_gradients(rank, world):
    """PR #175867: ``from_local(Replicate, grad_placements=[Partial()])`` (a colwise
    Linear's replicated input whose gradient should stay per-rank partial sums, not be
    all-reduced): each rank's gradient is its own addend, their sum torch's gradient; the
    default all-reduces; PR #173865: a ``to_local`` / ``from_local`` round trip of one
    output of a multi-output op (``chunk``) whose sibling is unused: the unused output's
    gradient (None) reaches the input as zeros."""
    mesh = init_device_mesh("cpu", (world,))
    w = torch.randn(3, 4, generator=torch.Generator().manual_seed(0))
    x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1))
    ref = x.clone().requires_grad_()
    ((ref @ w) ** 2).sum().backward()
    for gp in (None, [Partial()]):
        leaf = x.clone().requires_grad_()
        d = DTensor.from_local(leaf, mesh, [Replicate()], grad_placements=gp)
        y = d @ distribute_tensor(w, mesh, [Shard(1)])
        (y.full_tensor() ** 2).sum().backward()
        if gp is None:
            torch.testing.assert_close(leaf.grad, ref.grad)
        else:
            total = leaf.grad.clone()
            dist.all_reduce(total)
            torch.testing.assert_close(total, ref.grad)
            assert not torch.allclose(leaf.grad, ref.grad)  # an addend, not the sum
    base = torch.arange(8.0).reshape(4, 2)
    d = distribute_tensor(base, mesh, [Shard(0)]).requires_grad_()
    r = base.clone().requires_grad_()
    first, _unused = d.chunk(2, dim=1)
    again = DTensor.from_local(first.to_local() * 2, mesh, [Shard(0)])
    again.sum().backward()
    (r.chunk(2, dim=1)[0] * 2).sum().backward()
    assert d.grad.placements == (Shard(0),)
    torch.testing.assert_close(d.grad.full_tensor(), r.grad)


@reports(report_local_round_trips_and_gradients)
def test_reports(report, dist2):
    dist2.run(report)
