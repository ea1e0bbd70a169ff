"""``torch.ops.prims``' elementwise ops on DTensors (``op_specs/prims.yaml``): the
primitives PyTorch's decompositions and inductor lower to, called directly (as PyTorch's
``test_math_ops`` does), against the same prims on the global tensors; shards are kept."""

from __future__ import annotations

import pytest
import torch

from hyper_shard import Replicate, Shard, distribute_tensor, init_device_mesh

multiproc = pytest.mark.multiproc


def _prims(rank: int, world: int) -> bool:
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)
    x, y = (torch.randn(4 * world, 8, generator=g) for _ in range(2))
    dx, dy = (distribute_tensor(t, mesh, [Shard(0)]) for t in (x, y))
    prims = torch.ops.prims
    unary = [prims.bessel_i0e, prims.bessel_i1, prims.bessel_i1e, prims.bessel_j0,
             prims.bessel_j1, prims.erfcx, prims.ndtri, prims.spherical_bessel_j0]  # fmt: skip
    for op in unary:
        got = op(dx.abs().clamp(0.1, 3.0))
        want = op(x.abs().clamp(0.1, 3.0))
        torch.testing.assert_close(got.full_tensor(), want, equal_nan=True, msg=str(op))
        assert got.placements == (Shard(0),), op
    for op in (prims.div, prims.ne):
        assert torch.equal(op(dx, dy).full_tensor(), op(x, y)), op
    got = prims.gcd(dx.int(), dy.int())
    assert torch.equal(got.full_tensor(), prims.gcd(x.int(), y.int()))
    rx = distribute_tensor(x, mesh, [Replicate()])
    got = prims.ndtri(rx.abs().clamp(0.1, 0.9))
    assert got.placements == (Replicate(),)
    torch.testing.assert_close(got.to_local(), prims.ndtri(x.abs().clamp(0.1, 0.9)))
    got = prims.view_of(dx)
    assert got.placements == (Shard(0),) and torch.equal(got.full_tensor(), x)
    return True


@multiproc
def test_prims_on_dtensors(dist2):
    assert dist2.run(_prims) == [True] * 2
