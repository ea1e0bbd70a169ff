"""Regression cases from public PyTorch DTensor bug reports (issue 4's list, cases 8, 9
and 11), each against plain torch on the same input, on real gloo ranks.

(13), transpose(0, 0) of a 0-d DTensor, belongs to the view family and is checked in
tests/dist/test_ops_view.py.
"""

from __future__ import annotations

import pytest
import torch

from hyper_shard import DTensor, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.errors import ShardingError
from tests._helpers import assert_dtensor_close

pytestmark = pytest.mark.multiproc


def check_uneven_roundtrip(rank, world):
    """(8) uneven (5, 10) on a 1-D mesh of 4: R -> S(0) -> R returns (5, 10) exactly."""
    mesh = init_device_mesh("cpu", (world,))
    full = torch.arange(50, dtype=torch.float32).reshape(5, 10)
    r = distribute_tensor(full, mesh, [Replicate()])
    s = r.redistribute(mesh, [Shard(0)])
    assert tuple(s.shape) == (5, 10)
    back = s.redistribute(mesh, [Replicate()])
    assert tuple(back.shape) == (5, 10) and tuple(back.to_local().shape) == (5, 10)
    assert torch.equal(back.to_local(), full)
    assert torch.equal(s.full_tensor(), full)
    return tuple(s.to_local().shape)


def check_from_local_widths(rank, world):
    """(9) from_local S(1) with local widths 2 and 3 and shape=(2, 5): torch.chunk gives
    widths 3 and 2, so the shards do not describe that tensor: a clear error on every rank
    (never silent garbage); the torch.chunk widths give the right full tensor."""
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
    return 1


def check_bool_mask_index(rank, world):
    """(11) boolean-mask indexing of (4, 32, 64) Shard(2) by a (4, 32) mask: the read has a
    data-dependent shape: with a DTensor mask it runs whole (a Replicate result equal to
    torch's), a plain mask errors clearly; the same-shape forms and the masked write work
    and equal torch."""
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    x = torch.randn(4, 32, 64)
    mask = torch.rand(4, 32) > 0.5
    dx = distribute_tensor(x, mesh, [Shard(2)])
    dmask = distribute_tensor(mask, mesh, [Replicate()])
    with pytest.raises(ShardingError, match="plain Tensor"):
        dx[mask]
    got = dx[dmask]
    assert got.placements == (Replicate(),)
    assert_dtensor_close(got, x[mask])
    # torch.repeat_interleave(repeats): the index expansion, sized by the values
    reps = torch.tensor([2, 0, 3, 1, 1])
    got = torch.repeat_interleave(distribute_tensor(reps, mesh, [Shard(0)]))
    assert_dtensor_close(got, torch.repeat_interleave(reps))
    # what works instead, equal to torch
    ref = x.masked_fill(~mask[..., None], 0.0)
    out = dx.masked_fill(~dmask[..., None], 0.0)
    assert out.placements == (Shard(2),)
    assert_dtensor_close(out, ref)
    assert_dtensor_close(torch.where(dmask[..., None], dx, 0.0), ref)
    torch.testing.assert_close(dx.full_tensor()[mask], x[mask])
    ex, e = dx.clone(), x.clone()
    ex[dmask] = -1.0
    e[mask] = -1.0
    assert ex.placements == (Shard(2),)
    assert_dtensor_close(ex, e)
    return 1


def test_uneven_roundtrip_mesh_of_4(dist4):
    assert dist4.run(check_uneven_roundtrip) == [(2, 10), (2, 10), (1, 10), (0, 10)]


def test_from_local_uneven_widths(dist2):
    assert dist2.run(check_from_local_widths) == [1, 1]


def test_bool_mask_index(dist2):
    assert dist2.run(check_bool_mask_index) == [1, 1]
