"""Random ops on DTensors against plain torch on the full tensor for the same seed, on real
gloo ranks: dropout (and its feature/in-place/eval forms, with gradients), rand_like,
randn_like, randint_like, bernoulli, the in-place fills and nn.init functions on sharded
parameters, for Shard(0)/Shard(1)/Replicate/Partial on 2 ranks and nested layouts on a
(2, 2) mesh, uneven sizes included. After each op the generator must be where the
single-device run leaves it (the next draw agrees too). Plus hyper_shard.random's seed
check, state sync and the tracker's counters; public bug reports on random ops
(``report_*``).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hyper_shard.random as hr
from hyper_shard import (
    Partial,
    Replicate,
    Shard,
    ShardingError,
    distribute_tensor,
    init_device_mesh,
)
from tests._helpers import _local_objective, assert_dtensor_close, dt_from_global
from tests._reports import reports

pytestmark = pytest.mark.multiproc

R = Replicate()


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _layouts(world, ndim=2, partial=True):
    if world == 4:
        out = [(Shard(0), Shard(1)), (Shard(1), Shard(1)), (R, Shard(0)), (Shard(0), Shard(0))]
        if partial:
            out.append((Partial(), Shard(1)))
        return out
    out = [(R,), *((Shard(d),) for d in range(ndim))]
    if partial:
        out.append((Partial(),))
    return out


def _same_as_torch(fn, x, mesh, pl, seed, grad=False):
    """fn on the DTensor equals fn on the full tensor for the same seed; the generator is
    left in the same state; with ``grad``, gradients of sum(out * w) agree too."""
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1))
    ref_in = x.clone().requires_grad_(grad)
    torch.manual_seed(seed)
    ref = fn(ref_in)
    ref_next = torch.rand(4)
    d = dt_from_global(x, mesh, pl, seed=seed, requires_grad=grad)
    hr.manual_seed(seed)
    out = fn(d)
    torch.testing.assert_close(torch.rand(4), ref_next)  # generators still in lockstep
    # bit-identical, except that a Partial input's random addends round differently
    tol = 1e-6 if any(type(p) is Partial for p in pl) else 0.0
    assert_dtensor_close(out, ref.detach(), rtol=tol, atol=tol)
    if grad:
        (ref * w).sum().backward()
        _local_objective(out, w).backward()
        assert_dtensor_close(d.grad, ref_in.grad, rtol=1e-6, atol=1e-6)


def check_dropout(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(0))
    x4 = torch.randn(3, 5, 2, 3, generator=torch.Generator().manual_seed(1))
    n = 0
    for pl in _layouts(world):
        for i, fn in enumerate(
            (
                lambda a: F.dropout(a, 0.3),
                lambda a: F.dropout(a, p=0.5, training=True),
                lambda a: torch.dropout(a, 0.2, True),
                lambda a: F.dropout1d(a, 0.4),
                lambda a: F.dropout(a, 1.0),
            )
        ):
            _same_as_torch(fn, x, mesh, pl, seed=10 + i, grad=True)
            n += 1
        # eval mode and p=0 are the identity and draw nothing
        _same_as_torch(lambda a: F.dropout(a, 0.3, training=False), x, mesh, pl, 20, grad=True)
        _same_as_torch(lambda a: F.dropout(a, 0.0), x, mesh, pl, 21, grad=True)
        n += 2
    for pl in _layouts(world, ndim=4):
        _same_as_torch(lambda a: F.dropout2d(a, 0.5), x4, mesh, pl, 22, grad=True)
        _same_as_torch(lambda a: F.dropout(a, 0.25), x4, mesh, pl, 23, grad=True)
        n += 2
    # in place: the input DTensor itself is overwritten, as in torch
    for pl in _layouts(world, partial=False):
        torch.manual_seed(30)
        ref = F.dropout(x.clone(), 0.3, inplace=True)
        d = distribute_tensor(x, mesh, pl)
        torch.manual_seed(30)
        out = F.dropout(d, 0.3, inplace=True)
        assert_dtensor_close(d, ref, rtol=0, atol=0)
        assert_dtensor_close(out, ref, rtol=0, atol=0)
        n += 1
    return n


def check_random_like(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    x = torch.randn(5, 7, generator=torch.Generator().manual_seed(2))
    probs = torch.rand(5, 7, generator=torch.Generator().manual_seed(3))
    n = 0
    for pl in _layouts(world):
        for i, fn in enumerate(
            (
                torch.rand_like,
                torch.randn_like,
                lambda a: torch.randn_like(a, dtype=torch.float64),
                lambda a: torch.randint_like(a, 3, 9),
                lambda a: torch.bernoulli(a, 0.3),
                lambda a: a.bernoulli(0.6),
            )
        ):
            _same_as_torch(fn, x, mesh, pl, seed=40 + i)
            n += 1
        # probabilities from the values: a sharded probability tensor is gathered first
        _same_as_torch(torch.bernoulli, probs, mesh, pl, seed=50)
        d = distribute_tensor(x, mesh, [R] * mesh.ndim)
        out = torch.rand_like(dt_from_global(x, mesh, pl))
        assert all(type(p) is not Partial for p in out.placements)  # a draw is not Partial
        n += 2
        del d
    return n


def check_inplace_init(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    n = 0
    inits = (
        lambda t: nn.init.normal_(t, 0.1, 2.0),
        lambda t: nn.init.uniform_(t, -1.0, 1.0),
        lambda t: nn.init.kaiming_uniform_(t, a=5**0.5),
        lambda t: nn.init.kaiming_normal_(t),
        lambda t: nn.init.xavier_normal_(t),
        lambda t: nn.init.xavier_uniform_(t),
        lambda t: t.uniform_(-2, 3),
        lambda t: t.normal_(1.0, 0.5),
        lambda t: t.exponential_(),
        lambda t: t.bernoulli_(0.3),
    )
    for shape in ((6, 5), (5, 3)):  # even and uneven
        for pl in _layouts(world, partial=False):
            for i, init in enumerate(inits):
                ref = torch.empty(shape)
                torch.manual_seed(60 + i)
                with torch.no_grad():
                    init(ref)
                ref_next = torch.rand(3)
                p = nn.Parameter(distribute_tensor(torch.zeros(shape), mesh, pl))
                torch.manual_seed(60 + i)
                with torch.no_grad():
                    init(p)
                torch.testing.assert_close(torch.rand(3), ref_next)
                assert p.placements == tuple(pl)
                assert_dtensor_close(p, ref, rtol=0, atol=0)
                n += 1
    # nn.Linear.reset_parameters (kaiming_uniform_ on the weight, fan-in bound for the
    # bias) on DTensor parameters equals the single-device module's
    ref_lin, dev_lin = nn.Linear(6, 5), nn.Linear(6, 5)
    dev_lin.weight = nn.Parameter(distribute_tensor(torch.zeros(5, 6), mesh, _layouts(world)[1]))
    dev_lin.bias = nn.Parameter(distribute_tensor(torch.zeros(5), mesh, [R] * mesh.ndim))
    torch.manual_seed(70)
    dev_lin.reset_parameters()
    torch.manual_seed(70)
    ref_lin.reset_parameters()
    assert_dtensor_close(dev_lin.weight, ref_lin.weight.detach(), rtol=0, atol=0)
    assert_dtensor_close(dev_lin.bias, ref_lin.bias.detach(), rtol=0, atol=0)
    # an in-place fill of a Partial DTensor is refused with the fix in the message
    part = dt_from_global(torch.zeros(4, 3), mesh, [Partial()] * mesh.ndim)
    with pytest.raises(ShardingError, match="redistribute"):
        part.uniform_()
    return n + 1


def check_seed_api_and_tracker(rank, world):
    mesh = init_device_mesh("cpu", (world,))
    hr.manual_seed(123, mesh)  # same seed everywhere: fine
    assert hr.rng_synced(mesh)
    with pytest.raises(ValueError, match="different seeds"):
        hr.manual_seed(100 + rank, mesh)
    torch.manual_seed(1000 + rank)  # out of step on purpose
    assert not hr.rng_synced(mesh)
    hr.sync_rng_state(mesh)
    assert hr.rng_synced(mesh)
    r = torch.rand(3)
    gathered = [torch.empty(3) for _ in range(world)]
    torch.distributed.all_gather(gathered, r)
    for g in gathered:
        torch.testing.assert_close(g, gathered[0])
    tracker = hr.get_rng_tracker()
    before = (tracker.stats.draws, tracker.stats.elements, tracker.stats.kept)
    d = distribute_tensor(torch.zeros(6, 4), mesh, [Shard(0)])
    F.dropout(d, 0.5)
    after = (tracker.stats.draws, tracker.stats.elements, tracker.stats.kept)
    assert after[0] == before[0] + 1
    assert after[1] == before[1] + 24  # the global draw
    assert after[2] == before[2] + 24 // world  # this rank's box
    return 1


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("fn", [check_dropout, check_random_like, check_inplace_init])
def test_random(fn, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(fn)
    assert counts[0] > 0 and len(set(counts)) == 1


def test_seed_api_and_tracker(dist2):
    assert dist2.run(check_seed_api_and_tracker) == [1, 1]


# ---------------------------------------------------------------------- bug reports
def report_dropout_draws_the_single_device_mask(rank, world):
    """#146190: dropout of a sharded DTensor draws the single-device mask."""
    mesh = init_device_mesh("cpu", (world,))
    ones = torch.ones(8, 8)
    torch.manual_seed(5)
    got = F.dropout(distribute_tensor(ones, mesh, [Shard(0)]), 0.5)
    torch.manual_seed(5)
    assert_dtensor_close(got, F.dropout(ones, 0.5))


def report_like_factories_with_dtype(rank, world):
    """PR #112576: ``rand_like`` / ``randn_like`` / ``randint_like`` had no strategy, and the
    review asked the ``dtype`` keyword into the cache key: the same DTensor drawn with and
    without ``dtype=`` in turn gives each call's dtype and the single-device values."""
    mesh = init_device_mesh("cpu", (world,))
    base = torch.rand(5, 7, generator=torch.Generator().manual_seed(3))
    calls = (
        lambda t: torch.rand_like(t),
        lambda t: torch.rand_like(t, dtype=torch.float64),
        lambda t: torch.randn_like(t, dtype=torch.float64),
        lambda t: torch.randint_like(t, 0, 100),
        lambda t: torch.randint_like(t, 3, 9, dtype=torch.int64),
        lambda t: torch.rand_like(t),
    )
    for pl in (Shard(0), Shard(1), Replicate()):
        d = distribute_tensor(base, mesh, [pl])
        for f in calls:
            torch.manual_seed(11)
            got = f(d)
            torch.manual_seed(11)
            ref = f(base)
            assert got.dtype == ref.dtype and got.placements == (pl,)
            assert_dtensor_close(got, ref)


@reports(report_dropout_draws_the_single_device_mask, report_like_factories_with_dtype)
def test_reports(report, dist2):
    dist2.run(report)
