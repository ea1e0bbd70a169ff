"""The misc family (op_specs/misc.yaml) on real gloo ranks against plain torch: Tensor.to,
the *_like factories, dtype queries, and lerp/addcmul/addcdiv (the single-tensor AdamW
update), forward and backward, every placement combination on 2 ranks and a fixed sample on
a (2, 2) mesh; public bug reports on casts, comparisons and ranges (``report_*``)."""

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
from tests._helpers import all_combos, check_op, dt_from_global
from tests._helpers import assert_close_any as _eq
from tests._helpers import replicate as _rep
from tests._reports import reports

pytestmark = pytest.mark.multiproc


def _mesh(world):
    torch.set_num_threads(1)
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, world):
    return combos if world == 2 or len(combos) <= k else random.Random(0).sample(combos, k)


def check_to(rank, world):
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 4, generator=g)
    combos = _sample(all_combos([x], mesh.ndim, ("sum", "avg")), 30, world)
    n = 0
    for fn in (
        lambda a: a.to(torch.float64),
        lambda a: a.to(torch.float32),  # no conversion
        lambda a: a.to("cpu", torch.float64),
        lambda a: a.to(dtype=torch.float64) * 2,
    ):
        n += check_op(fn, [x], mesh, combos)
    other = torch.randn(3, generator=g, dtype=torch.float64)  # only lends its dtype
    n += check_op(
        lambda a, b: a.to(b),
        [x, other],
        mesh,
        _sample(all_combos([x, other], mesh.ndim), 30, world),
    )
    return n


def check_like_factories(rank, world):
    mesh = _mesh(world)
    x = torch.randn(5, 3, generator=torch.Generator().manual_seed(1))
    combos = _sample(all_combos([x], mesh.ndim, ("sum", "max")), 30, world)
    n = 0
    for fn in (
        torch.zeros_like,
        torch.ones_like,
        lambda a: torch.full_like(a, 2.5),
        lambda a: torch.zeros_like(a, dtype=torch.int64),
    ):
        n += check_op(fn, [x], mesh, combos, grad=False)
    for (pl,) in combos:  # empty_like: only the layout is defined (Partial kept, as PyTorch)
        dt = dt_from_global(x, mesh, pl)
        out = torch.empty_like(dt)
        assert isinstance(out, DTensor) and out.shape == x.shape
        assert out.placements == dt.placements
        assert out.to_local().shape == dt.to_local().shape
        n += 1
    return n


def check_dtype_queries(rank, world):
    mesh = _mesh(world)
    n = 0
    for t in (
        torch.randn(4, 2, generator=torch.Generator().manual_seed(2)),
        torch.arange(8).reshape(4, 2),
    ):
        for combo in all_combos([t], mesh.ndim):
            dt = dt_from_global(t, mesh, combo[0])
            for fn in (torch.is_complex, torch.is_floating_point):
                got = fn(dt)
                assert type(got) is bool and got == fn(t), (fn, combo)
                n += 1
    return n


def check_optimizer_updates(rank, world):
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(3)
    a, b, c = (torch.randn(4, 3, generator=g) for _ in range(3))
    c = c.abs() + 1
    w = torch.rand(3, generator=g)  # broadcast weight
    combos3 = _sample(all_combos([a, b, c], mesh.ndim), 40, world)
    # an in-place update keeps its target's placements: a Partial target is refused (below)
    inplace3 = [c_ for c_ in combos3 if not any(isinstance(p, Partial) for p in c_[0])]
    n = 0
    for fn, combos in (
        (lambda x, y, z: torch.addcmul(x, y, z, value=0.5), combos3),
        (lambda x, y, z: torch.addcdiv(x, y, z, value=-2.0), combos3),
        (lambda x, y, z: x.clone().addcmul_(y, y, value=0.1) + z, inplace3),  # exp_avg_sq
        (lambda x, y, z: x.clone().addcdiv_(y, z, value=-0.01), inplace3),  # the parameter
    ):
        n += check_op(fn, [a, b, c], mesh, combos)
    combos2 = _sample(all_combos([a, b], mesh.ndim), 30, world)
    inplace2 = [c_ for c_ in combos2 if not any(isinstance(p, Partial) for p in c_[0])]
    n += check_op(lambda x, y: torch.lerp(x, y, 0.3), [a, b], mesh, combos2)
    n += check_op(lambda x, y: x.clone().lerp_(y, 0.1), [a, b], mesh, inplace2)  # exp_avg
    n += check_op(
        lambda x, y, z: torch.lerp(x, y, z),
        [a, b, w],
        mesh,
        _sample(all_combos([a, b, w], mesh.ndim), 40, world),
    )
    target = dt_from_global(a, mesh, (Partial(),) * mesh.ndim)
    with pytest.raises(ShardingError, match="in-place"):
        target.addcdiv_(dt_from_global(b, mesh, (Replicate(),) * mesh.ndim), target)
    return n + 1


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(
    "check", [check_to, check_like_factories, check_dtype_queries, check_optimizer_updates]
)
def test_misc_ops(check, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check)
    assert counts[0] > 0 and len(set(counts)) == 1


# ---------------------------------------------------------------------- bug reports
def report_casts_of_partial_values(rank, world):
    """#172684 / PR #172696: a dtype cast of Partial(sum) to int / bool kept Partial in
    PyTorch (``trunc(a) + trunc(b) != trunc(a + b)``); ``round`` too."""
    mesh = init_device_mesh("cpu", (world,))
    q = DTensor.from_local(
        torch.tensor([0.6, 1.5]) if rank == 0 else torch.tensor([0.6, 1.7]), mesh, [Partial()]
    )
    qf = torch.tensor([1.2, 3.2])
    _eq(q.to(torch.int64), qf.to(torch.int64))
    _eq(q.to(torch.bool), qf.to(torch.bool))
    _eq(q.round(), qf.round())


def report_allclose_and_ranges_with_dtensor_ends(rank, world):
    """PR #177336 gave ``torch.allclose`` and ``torch.linspace`` / ``logspace`` with tensor
    ends strategies; hyper_shard raised OpNotRegisteredError (fixed here): ``allclose`` of
    equal shapes shard by shard (an AND over the mesh), broadcast shapes whole; 0-d DTensor
    ends (a Partial one reduced first)."""
    mesh = init_device_mesh("cpu", (world,))
    t = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    d0, d1 = distribute_tensor(t, mesh, [Shard(0)]), distribute_tensor(t, mesh, [Shard(1)])
    assert torch.allclose(d0, d1) is True
    assert torch.allclose(d0, distribute_tensor(t + 1e-3, mesh, [Shard(1)])) is False
    assert torch.allclose(d0, _rep(t[0], mesh)) == torch.allclose(t, t[0])
    assert d0.allclose(d1, rtol=0.0, atol=0.0)
    end = DTensor.from_local(torch.tensor(1.0 / world), mesh, [Partial()])
    _eq(torch.linspace(_rep(torch.tensor(0.0), mesh), end, 5), torch.linspace(0.0, 1.0, 5))
    _eq(torch.logspace(0.0, end * 2, 4, base=3.0), torch.logspace(0.0, 2.0, 4, base=3.0))


@reports(report_casts_of_partial_values, report_allclose_and_ranges_with_dtensor_ends)
def test_reports(report, dist2):
    dist2.run(report)
