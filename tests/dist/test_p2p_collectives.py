"""All-gather and reduce-scatter by point-to-point messages on gloo
(``hyper_shard/platform/torch/p2p.py``, [Note: collectives on gloo]): every form the
torch platform runs them in — the list all-gather and the reduce-scatter of the
redistribution executor, FSDP's flat ``all_gather_into`` / ``reduce_scatter_into``
(synchronous and asynchronous) — against the values computed on one process from every
rank's inputs, on 2 and 4 ranks, for a mesh whose coordinate order is the group's and one
whose order is reversed; and a ``Partial`` -> ``Shard`` / ``Shard`` -> ``Replicate``
redistribution of a DTensor large enough to take the route, forward and backward.
"""

from __future__ import annotations

import pytest
import torch

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.platform.torch import p2p

multiproc = pytest.mark.multiproc

K = p2p.MIN_NUMEL + 3  # one rank's shard: above the threshold, odd


def _inputs(world: int, numel: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(numel, generator=g) for _ in range(world)]


def _check_group(rank: int, world: int, order: list[int]) -> None:
    mesh = DeviceMesh("cpu", order)
    plat, group = mesh._platform, mesh._group(0)
    coord = order.index(rank)
    assert group.p2p_coord(K) == coord, "gloo groups take the point-to-point route"
    assert group.p2p_coord(p2p.MIN_NUMEL - 1) is None, "small tensors keep gloo's"

    # the redistribution executor's all-gather (list, coordinate order)
    xs = _inputs(world, K, 1)  # xs[c]: coordinate c's shard
    got = plat.all_gather(xs[coord], group, world)
    for c in range(world):
        torch.testing.assert_close(got[c], xs[c], rtol=0, atol=0)

    # the executor's reduce-scatter: every rank's input, pieces in coordinate order
    full = _inputs(world, world * K, 2)  # full[c]: coordinate c's whole input
    for op, ref in (("sum", torch.sum), ("avg", torch.mean), ("max", None), ("min", None)):
        pieces = list(full[coord].split(K))
        out = plat.reduce_scatter(pieces, op, group)
        mine = torch.stack([f.split(K)[coord] for f in full])
        if ref is not None:
            want = ref(mine, 0)
        else:
            want = mine.amax(0) if op == "max" else mine.amin(0)
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6, msg=op)

    # FSDP's flat buffers, synchronous and asynchronous
    for async_op in (False, True):
        flat = torch.empty(world * K)
        flat.narrow(0, coord * K, K).copy_(xs[coord])
        work = plat.all_gather_into(flat, flat.narrow(0, coord * K, K), group, async_op)
        if async_op:
            work.wait()
        else:
            assert work is None
        torch.testing.assert_close(flat, torch.cat(xs), rtol=0, atol=0)

        out = torch.empty(K)
        work = plat.reduce_scatter_into(out, full[coord].clone(), "avg", group, async_op)
        if async_op:
            work.wait()
        want = torch.stack([f.split(K)[coord] / world for f in full]).sum(0)
        torch.testing.assert_close(out, want, rtol=1e-6, atol=1e-6)


def _p2p_groups(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    _check_group(rank, world, list(range(world)))
    _check_group(rank, world, list(reversed(range(world))))


def _p2p_redistribute(rank: int, world: int) -> None:
    torch.set_num_threads(1)
    mesh = DeviceMesh("cpu", list(range(world)))
    rows = world * 40
    g = torch.Generator().manual_seed(3)
    parts = [torch.randn(rows, 128, generator=g) for _ in range(world)]
    from hyper_shard import DTensor

    local = parts[rank].clone().requires_grad_()
    x = DTensor.from_local(local, mesh, [Partial()])
    y = x.redistribute(mesh, [Shard(0)])
    want = torch.stack(parts).sum(0)
    torch.testing.assert_close(y.full_tensor(), want, rtol=1e-6, atol=1e-6)
    z = y.redistribute(mesh, [Replicate()])
    torch.testing.assert_close(z.to_local(), want, rtol=1e-6, atol=1e-6)
    w = torch.arange(rows * 128, dtype=torch.float32).reshape(rows, 128) / 1000
    (z.to_local() * w).sum().backward()
    # d/d local of sum(full * w) where full = sum of the ranks' locals: w on every rank
    torch.testing.assert_close(local.grad, w, rtol=1e-6, atol=1e-6)


@multiproc
def test_p2p_collectives_2_ranks(dist2):
    dist2.run(_p2p_groups)
    dist2.run(_p2p_redistribute)


@multiproc
def test_p2p_collectives_4_ranks(dist4):
    dist4.run(_p2p_groups)
    dist4.run(_p2p_redistribute)
