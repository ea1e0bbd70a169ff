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


def report_mesh_names_and_flatten(rank, world):
    """PR #108326: ``init_device_mesh`` with a repeated ``mesh_dim_names`` entry (and names
    of another length than the shape) must raise, naming them; PR #161106: flattening a
    1-D mesh returns it under its own name, or under the name asked (review: "what if the
    user requests a different name"); a 2-D mesh flattened and sliced by the new name."""
    from hyper_shard.mesh import MeshError

    with pytest.raises(MeshError, match="unique"):
        init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "dp"))
    with pytest.raises(MeshError, match="same length"):
        init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp",))
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    tp = mesh["tp"]
    assert tp._flatten().mesh_dim_names == ("tp",)
    assert tp._flatten("foo").mesh_dim_names == ("foo",)
    flat = mesh._flatten("dp_tp")
    assert flat.mesh_dim_names == ("dp_tp",) and flat.mesh.tolist() == [0, 1, 2, 3]
    assert mesh["dp_tp"].mesh.tolist() == [0, 1, 2, 3]
    assert mesh["dp"].get_coordinate() == (rank // 2,) and mesh.get_local_rank("tp") == rank % 2


@reports(report_local_round_trips_and_gradients)
def test_reports(report, dist2):
    dist2.run(report)


@reports(report_mesh_names_and_flatten)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
