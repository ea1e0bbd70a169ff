"""``hyper_shard.debug.CommDebugMode`` against PyTorch DTensor's
``torch.distributed.tensor.debug.CommDebugMode``, on real gloo ranks (a mesh of 2): the
same redistributions and ops with each library, counted by each library's mode; the counts,
looked up the way PyTorch's own tests look them up (``funcol`` ops as keys), must agree."""

from __future__ import annotations

import pytest
import torch

import hyper_shard as hs
from hyper_shard.debug import CommDebugMode

pytestmark = pytest.mark.multiproc


def _scenarios(L, mesh):
    """(name, fn) pairs: each fn (called inside the mode) runs a few ops of library ``L`` on
    DTensors made here, outside the mode (creating them may communicate: PyTorch's
    ``distribute_tensor`` scatters from rank 0)."""
    torch.manual_seed(0)
    x = torch.randn(8, 6)
    w1, w2 = torch.randn(6, 4), torch.randn(4, 6)
    s0 = L.distribute_tensor(x, mesh, [L.Shard(0)])
    s1 = L.distribute_tensor(x, mesh, [L.Shard(1)])
    rep = L.distribute_tensor(x, mesh, [L.Replicate()])
    part = L.DTensor.from_local(x, mesh, [L.Partial()])
    a = L.distribute_tensor(x, mesh, [L.Replicate()])
    b = L.distribute_tensor(w1, mesh, [L.Shard(1)])
    c = L.distribute_tensor(w2, mesh, [L.Shard(0)])

    def megatron_fwd():
        # column- then row-parallel matmul: one all-reduce (the output to Replicate). The
        # backward's collectives are not compared: hyper_shard's local autograd places
        # gradients by its own contract (docs/parallel.md), so they may differ in number.
        ((a @ b).relu() @ c).redistribute(mesh, [L.Replicate()])

    return [
        ("S->R", lambda: s0.redistribute(mesh, [L.Replicate()])),
        ("P->R", lambda: part.redistribute(mesh, [L.Replicate()])),
        ("P->S", lambda: part.redistribute(mesh, [L.Shard(0)])),
        ("R->S", lambda: rep.redistribute(mesh, [L.Shard(1)])),
        ("full_tensor", lambda: s1.full_tensor()),
        ("megatron", megatron_fwd),
    ]


def check_comm_debug_mode(rank, world):
    import torch.distributed._functional_collectives as funcol
    import torch.distributed.tensor as T
    from torch.distributed.tensor.debug import CommDebugMode as TorchCommDebugMode

    c10d_functional = torch.ops.c10d_functional
    keys = {
        "all_gather": c10d_functional.all_gather_into_tensor,
        "all_reduce": c10d_functional.all_reduce,
        "reduce_scatter": c10d_functional.reduce_scatter_tensor,
    }
    results = {}
    for lib, L, Mode in (("torch", T, TorchCommDebugMode), ("hyper_shard", hs, CommDebugMode)):
        mesh = L.init_device_mesh("cpu", (world,))
        for name, fn in _scenarios(L, mesh):
            with Mode() as m:
                fn()
            counts = m.get_comm_counts()
            results[(lib, name)] = (
                m.get_total_counts(),
                {k: counts[op] for k, op in keys.items()},
            )
    for name, _ in _scenarios(hs, hs.init_device_mesh("cpu", (world,))):
        assert results[("hyper_shard", name)] == results[("torch", name)], (
            name,
            results[("hyper_shard", name)],
            results[("torch", name)],
        )
    # keyed also by kind, by the funcol Python functions, and live inside the block
    mesh = hs.init_device_mesh("cpu", (world,))
    d = hs.distribute_tensor(torch.randn(4, 4), mesh, [hs.Shard(0)])
    with CommDebugMode() as m:
        d.full_tensor()
        inside = m.get_total_counts()
        d.full_tensor()
    c = m.get_comm_counts()
    assert inside == 1 and m.get_total_counts() == 2
    assert c["all_gather"] == c[funcol.all_gather_tensor] == 2 and c[funcol.all_reduce] == 0
    assert funcol.all_gather_tensor in c and funcol.all_reduce not in c
    with m:  # re-entering resets, as PyTorch's
        pass
    assert m.get_total_counts() == 0
    # nested modes count independently, as PyTorch's (equal counts once broke the exit)
    results = []
    for L, Mode in ((T, TorchCommDebugMode), (hs, CommDebugMode)):
        dm = L.distribute_tensor(
            torch.randn(4, 4), L.init_device_mesh("cpu", (world,)), [L.Shard(0)]
        )
        with Mode() as outer:
            with Mode() as inner:
                pass
            with Mode() as inner:
                dm.full_tensor()
            dm.full_tensor()
        results.append((outer.get_total_counts(), inner.get_total_counts()))
    assert results[0] == results[1] == (2, 1), results
    return 1


def test_comm_debug_mode(dist2):
    assert dist2.run(check_comm_debug_mode) == [1, 1]


def check_backward_counted(rank, world):
    """hyper_shard's mode counts backward collectives too: by the gradient contract
    (DESIGN.md, docs/parallel.md) the backward of a forward all-gather (S -> R) is a
    reduce-scatter (P -> S)."""
    mesh = hs.init_device_mesh("cpu", (world,))
    x = torch.randn(4, 4)
    s = hs.distribute_tensor(x, mesh, [hs.Shard(0)]).requires_grad_()
    with CommDebugMode() as fwd:
        y = s.redistribute(mesh, [hs.Replicate()])
    loss = (y * y).sum()
    with CommDebugMode() as bwd:
        loss.backward()
    torch.testing.assert_close(s.grad.full_tensor(), 2 * x)
    return dict(fwd.get_comm_counts()), dict(bwd.get_comm_counts())


def test_backward_counted(dist2):
    for fwd, bwd in dist2.run(check_backward_counted):
        assert fwd == {"all_gather": 1} and bwd == {"reduce_scatter": 1}, (fwd, bwd)


def check_visualize_sharding(rank, world):
    """visualize_sharding: every coordinate's slice is its torch.chunk piece; printed once
    (by coordinate 0, after the header), returned everywhere (PyTorch prints only)."""
    import contextlib
    import io

    from hyper_shard.debug import visualize_sharding

    mesh = hs.init_device_mesh("cpu", (world,))
    d = hs.distribute_tensor(torch.arange(20.0).reshape(5, 4), mesh, [hs.Shard(0)])
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        table = visualize_sharding(d, header="weights")
    starts = [0, *torch.cumsum(torch.tensor([c.shape[0] for c in torch.arange(5).chunk(world)]), 0)]
    for r in range(world):
        assert f"rank {r} ({r},): [{starts[r]}:{starts[r + 1]}, 0:4]" in table, table
    printed = buf.getvalue()
    return printed == (f"weights\n{table}\n" if rank == 0 else "")


def test_visualize_sharding(dist2):
    assert dist2.run(check_visualize_sharding) == [True, True]
