"""Public bug reports on ``DTensor.redistribute`` (docs/redistribute.md), each replaying the
report's program on real gloo ranks (2, and a 2x2 mesh of 4) against plain torch on the
same global values: the result's value, its placements, and every rank's local shard
against ``distribute_tensor`` of the value (each ``report_*`` names its report)."""

from __future__ import annotations

import itertools

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from tests._helpers import dt_from_global
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _same_as_distributed(d, value, mesh, placements):
    """``d`` holds ``value`` laid out by ``placements``: every rank's shard as
    ``distribute_tensor`` cuts it, and the placements themselves."""
    assert tuple(d.placements) == tuple(placements), (d.placements, placements)
    torch.testing.assert_close(d.to_local(), distribute_tensor(value, mesh, placements).to_local())
    torch.testing.assert_close(d.full_tensor(), value)


def report_partial_to_partial(rank, world):
    """PR #172041: ``Partial(sum) -> Partial(avg)`` was a silent no-op (the value halved on
    2 ranks; PyTorch now refuses it): refused here too, naming both placements; PR
    #164253: ``Partial -> the same Partial`` is allowed and keeps every local value; PR
    #170147: its backward (the gradient's placements were mislabelled)."""
    mesh = init_device_mesh("cpu", (world,))
    local = torch.tensor([1.0, 2.0]) * (rank + 1)
    value = sum(torch.tensor([1.0, 2.0]) * (r + 1) for r in range(world))
    p = DTensor.from_local(local, mesh, [Partial()])
    with pytest.raises(RuntimeError, match=r"P to P\(avg\)"):
        p.redistribute(mesh, [Partial("avg")])
    with pytest.raises(RuntimeError, match="R to P"):
        distribute_tensor(value, mesh, [Replicate()]).redistribute(mesh, [Partial()])
    same = p.redistribute(mesh, [Partial()])
    assert same.placements == (Partial(),)
    torch.testing.assert_close(same.to_local(), local)
    torch.testing.assert_close(same.full_tensor(), value)
    leaf = local.clone().requires_grad_()
    q = DTensor.from_local(leaf, mesh, [Partial()]).redistribute(mesh, [Partial()])
    (q.full_tensor() * torch.tensor([3.0, 5.0])).sum().backward()
    torch.testing.assert_close(leaf.grad, torch.tensor([3.0, 5.0]))  # d(sum of addends)/d(own)


def report_nested_and_uneven_moves_2d(rank, world):
    """PR #172610: ``(Partial, Partial) -> (Shard(0), Shard(0))`` of a dim (6) the 4 ranks
    do not divide, which PyTorch's flattened reduce-scatter had to refuse; PR #131210:
    nested shards moved to another dim on one mesh dim only (``(S(1), S(1)) -> (S(1),
    S(2))``); every pair of (Shard(0), Shard(1), Replicate) placements of an uneven (5, 7)
    value on the 2x2 mesh, against ``distribute_tensor``."""
    mesh = init_device_mesh("cpu", (2, 2))
    t = torch.arange(30.0).reshape(6, 5)
    for dst in (
        [Shard(0), Shard(0)],
        [Shard(1), Shard(1)],
        [Shard(0), Shard(1)],
        [Shard(1), Replicate()],
    ):
        p = dt_from_global(t, mesh, [Partial(), Partial()], seed=3)
        _same_as_distributed(p.redistribute(mesh, dst), t, mesh, dst)
    x = torch.arange(240.0).reshape(4, 6, 10)
    for src, dst in (
        ((Shard(1), Shard(1)), (Shard(1), Shard(2))),
        ((Shard(0), Shard(1)), (Shard(1), Shard(0))),
        ((Shard(2), Shard(2)), (Shard(2), Shard(1))),
        ((Shard(1), Shard(2)), (Shard(2), Shard(2))),
    ):
        d = distribute_tensor(x, mesh, list(src)).redistribute(mesh, list(dst))
        _same_as_distributed(d, x, mesh, list(dst))
    y = torch.arange(35.0).reshape(5, 7)
    options = (Shard(0), Shard(1), Replicate())
    for src in itertools.product(options, repeat=2):
        for dst in itertools.product(options, repeat=2):
            d = distribute_tensor(y, mesh, list(src)).redistribute(mesh, list(dst))
            _same_as_distributed(d, y, mesh, list(dst))


@reports(report_partial_to_partial)
def test_reports(report, dist2):
    dist2.run(report)


@reports(report_nested_and_uneven_moves_2d)
def test_reports_mesh_of_4(report, dist4):
    dist4.run(report)
