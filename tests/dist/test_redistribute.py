"""Redistribution: every placement pair, values and gradients, against plain torch on the
same global tensors; round trips through ``from_local`` / ``full_tensor``; the public bug
reports on redistribution (``report_*``, each naming its report).

Where a check only needs the planner and the executor (the values and gradients every
plan gives), it runs on the thread-simulated platform (``tests/_sim.py``: the same check
functions, ranks as threads, every collective through the in-process exchange); the torch
platform's collectives and autograd wrapping run on real gloo ranks for an uneven 1-D and
an uneven 2-D sweep of every pair (every reduce op on the 1-D mesh), both gradient paths
and the round trips on 2 ranks.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor
from hyper_shard.placement import Placement
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride
from tests._helpers import Comparisons
from tests._helpers import assert_close_any as _eq
from tests._move import move as _move
from tests._reports import reports
from tests._sim import mesh as _mesh
from tests._sim import run_sim

multiproc = pytest.mark.multiproc


@pytest.fixture(scope="module")
def sim_ops():
    """The sim platform's op names bound (``view`` on a sim DTensor), for this module."""
    from tests.fake_platform import installed

    with installed():
        yield


def _options(ndim: int, partials: tuple[str, ...] = ("sum",)) -> list[Placement]:
    return [Replicate(), *[Shard(d) for d in range(ndim)], *[Partial(op) for op in partials]]


def _reduce_all(parts, mesh, placements, mesh_coords):
    """Global value: reduce the per-coordinate partial values over every partial mesh dim
    (right to left, matching nesting), taking coordinate 0 of non-partial dims."""
    vals = {c: parts[i] for i, c in enumerate(mesh_coords)}
    for m in reversed(range(mesh.ndim)):
        p = placements[m]
        new = {}
        for c in mesh_coords:
            if c[m] != 0:
                continue
            group = [vals[c[:m] + (k,) + c[m + 1 :]] for k in range(mesh.shape[m])]
            if type(p) is Partial:
                st = torch.stack(group)
                new[c] = {
                    "sum": st.sum(0),
                    "avg": st.mean(0),
                    "max": st.amax(0),
                    "min": st.amin(0),
                    "prod": st.prod(0),
                }[p.reduce_op]
            else:
                new[c] = group[0]
        vals = new
        mesh_coords = [c for c in mesh_coords if c[m] == 0]
    return vals[tuple(0 for _ in mesh.shape)]


def _local_values(mesh, placements, parts, mesh_coords):
    """This rank's (unsharded) local value: partial dims keep this rank's own draw; other
    dims take coordinate 0's draw (replicated along them)."""
    coord = tuple(mesh.get_coordinate())
    src = tuple(c if type(placements[m]) is Partial else 0 for m, c in enumerate(coord))
    return parts[mesh_coords.index(src)]


def make_input(mesh, placements, shape, seed):
    gen = torch.Generator().manual_seed(seed)
    mesh_coords = list(itertools.product(*[range(s) for s in mesh.shape]))
    parts = [torch.randn(shape, generator=gen) for _ in mesh_coords]
    if any(type(p) is Partial and p.reduce_op == "prod" for p in placements):
        parts = [p.abs() + 0.5 for p in parts]
    glob = _reduce_all(parts, mesh, placements, mesh_coords)
    spec = DTensorSpec(
        mesh, placements, TensorMeta(tuple(shape), contiguous_stride(shape), torch.float32, 4)
    )
    local = _local_values(mesh, placements, parts, mesh_coords)
    off, lshape = spec.global_offset(), spec.local_shape()
    for d in range(len(shape)):
        local = local.narrow(d, off[d], lshape[d])
    return glob, local.contiguous(), spec


def _pairs(mesh_ndim, tensor_ndim, partials):
    opts = _options(tensor_ndim, partials)
    states = list(itertools.product(opts, repeat=mesh_ndim))
    return states


def check_all_pairs(rank, world, mesh_shape, shape, partials, grads, platform=None):
    torch.set_num_threads(1)
    mesh = _mesh(mesh_shape, platform=platform)
    states = _pairs(len(mesh_shape), len(shape), partials)
    # the global values (each rank's shard, or its Partial group's reduction) against the
    # expected ones, all compared at the end (float32 defaults of assert_close)
    checks = Comparisons(mesh, rtol=1.3e-6, atol=1e-5)
    n_checked = 0
    for i, src in enumerate(states):
        glob, local, spec = make_input(mesh, list(src), shape, seed=1000 + i)
        for dst in states:
            x = DTensor.from_local(local, mesh, src, shape=shape, stride=contiguous_stride(shape))
            y = _move(x, dst)
            assert tuple(y.shape) == tuple(shape)
            assert tuple(y.to_local().shape) == y._spec.local_shape(), (src, dst)
            checks.add(f"{src}->{dst}", y, glob)
            if grads and not any(
                type(p) is Partial and p.reduce_op in ("max", "min", "prod") for p in src
            ):
                w = torch.randn(shape, generator=torch.Generator().manual_seed(7))
                leaf = (
                    DTensor.from_local(
                        local, mesh, src, shape=shape, stride=contiguous_stride(shape)
                    )
                    .detach()
                    .requires_grad_()
                )
                out = _move(leaf, dst)
                loss = (out.full_tensor() * w).sum()
                loss.backward()
                checks.add(f"grad {src}->{dst}", leaf.grad, w)
            n_checked += 1
    checks.flush()
    return n_checked


@multiproc
def test_all_pairs_1d_mesh_gloo(dist2):
    """Every pair on 2 gloo ranks, uneven (5, 3), every reduce op of Partial, gradients."""
    counts = dist2.run(check_all_pairs, (2,), (5, 3), ("sum", "avg", "max", "min"), True)
    assert counts == [7 * 7, 7 * 7]  # every (src, dst) pair, on both ranks


def test_all_pairs_1d_mesh_sim():
    """The same on the sim, even (4, 6)."""
    counts = run_sim(2, check_all_pairs, (2,), (4, 6), ("sum", "avg", "max", "min"), True)
    assert counts == [7 * 7, 7 * 7]


def _pairs_2d(shape):
    n = (len(shape) + 2) ** 2
    return n * n


@multiproc
def test_all_pairs_2d_mesh_gloo(dist4):
    """Every pair of (2, 2) placements on 4 gloo ranks, uneven (5, 3), gradients."""
    assert dist4.run(check_all_pairs, (2, 2), (5, 3), ("sum",), True) == [_pairs_2d((5, 3))] * 4


@pytest.mark.parametrize(
    "shape,grads", [((4, 4), True), ((3, 2, 5), False)], ids=["even", "3d-uneven"]
)
def test_all_pairs_2d_mesh_sim(shape, grads):
    """Every pair of (2, 2) placements on the sim. The 3-d tensor's pairs check values only:
    the gradient of a move is a move back (to the source placements, Partial ones as
    Replicate), a pair its forward sweep checks; the 2-d shapes check every gradient too."""
    assert run_sim(4, check_all_pairs, (2, 2), shape, ("sum",), grads) == [_pairs_2d(shape)] * 4


def test_all_pairs_1d_mesh_of_4_partials():
    counts = run_sim(4, check_all_pairs, (4,), (6, 5), ("sum", "avg", "max"), True)
    assert counts == [6 * 6] * 4


def check_all_pairs_composed(rank, world, drop, *args):
    """:func:`check_all_pairs` with the torch platform composing the collectives ``drop``
    from the others (hyper_shard/platform/compose.py), as ``HYPER_SHARD_COMPOSE=...``
    makes it at start-up (the platform reads the variable once, into
    ``native_collectives``, which the cost model and the executor read), on the shared
    pool instead of four more processes."""
    from hyper_shard.platform.select import get_platform
    from hyper_shard.redistribute.planner import cost_model_for

    plat = get_platform("torch")
    native = plat.native_collectives
    plat.native_collectives = native - set(drop)
    try:
        cm = cost_model_for(_mesh(args[0]))
        assert not set(drop) & cm.native, cm
        return check_all_pairs(rank, world, *args)
    finally:
        plat.native_collectives = native


@pytest.mark.parametrize(
    "drop, mesh_shape, shape",
    [
        # as on MindSpore CPU: all-to-all by send/recv rounds, reduce-scatter composed
        (("reduce_scatter", "all_to_all"), (2, 2), (5, 3)),
        # a ring of 4 (each round sends to c + k, receives from c - k), uneven shards
        (("reduce_scatter", "all_to_all"), (4,), (6, 5)),
        # no point-to-point either: all-to-all by all-gather + a pick
        (("reduce_scatter", "all_to_all", "send_recv"), (4,), (6, 5)),
    ],
    ids=["2x2", "ring4", "ring4-no-p2p"],
)
def test_composed_collectives(dist4, drop, mesh_shape, shape):
    """With reduce-scatter and all-to-all composed, the same results and gradients."""
    counts = dist4.run(check_all_pairs_composed, drop, mesh_shape, shape, ("sum",), True)
    n = (len(shape) + 2) ** len(mesh_shape)  # S(d) for each d, R, P(sum) per mesh dim
    assert counts == [n * n] * 4


def check_grad_paths(rank, world, mesh_shape, shape):
    """Gradients through redistribution via DTensor.backward() and via to_local()."""
    torch.set_num_threads(1)
    mesh = _mesh(mesh_shape)
    states = _pairs(len(mesh_shape), len(shape), ("sum",))
    w = torch.randn(shape, generator=torch.Generator().manual_seed(3))
    checks = Comparisons(mesh, rtol=1.3e-6, atol=1e-5)  # compared at the end
    for i, src in enumerate(states):
        glob, local, spec = make_input(mesh, list(src), shape, seed=i)
        for dst in states:
            # (a) loss computed on local shards, gradient placements as PyTorch's defaults
            leaf = (
                DTensor.from_local(local, mesh, src, shape=shape, stride=contiguous_stride(shape))
                .detach()
                .requires_grad_()
            )
            y = _move(leaf, dst)
            ly = y.to_local()
            off, ls = y._spec.global_offset(), y._spec.local_shape()
            wl = w
            for d in range(len(shape)):
                wl = wl.narrow(d, off[d], ls[d])
            (ly * wl).sum().backward()
            checks.add(f"to_local {src}->{dst}", leaf.grad, w)
            # (b) DTensor.backward() on a Replicate scalar built from the loss
            leaf2 = (
                DTensor.from_local(local, mesh, src, shape=shape, stride=contiguous_stride(shape))
                .detach()
                .requires_grad_()
            )
            full = _move(leaf2, dst).full_tensor()
            loss = DTensor.from_local((full * w).sum(), mesh, [Replicate()] * mesh.ndim)
            loss.backward()
            checks.add(f"backward {src}->{dst}", leaf2.grad, w)
    checks.flush()
    # single-process reference: d/dX sum(X * w) = w, computed by torch autograd
    x = glob.clone().requires_grad_()
    (x * w).sum().backward()
    torch.testing.assert_close(x.grad, w)
    return True


@multiproc
def test_grad_paths_1d(dist2):
    assert dist2.run(check_grad_paths, (2,), (5, 4)) == [True, True]


@multiproc
def test_grad_paths_2d(dist4):
    assert dist4.run(check_grad_paths, (2, 2), (3, 5)) == [True] * 4


def check_round_trip(rank, world, mesh_shape):
    """from_local + full_tensor round trips, uneven and empty shards included."""
    torch.set_num_threads(1)
    mesh = _mesh(mesh_shape)
    coord = mesh.get_coordinate()
    for shape in [(7, 3), (1, 5), (2, 9), (3,), (4, 1, 6)]:
        glob = torch.arange(float(torch.tensor(shape).prod())).reshape(shape)
        for pl in itertools.product(_options(len(shape), ()), repeat=mesh.ndim):
            # the local shard by nested torch.chunk, as a user would cut it
            local = glob
            for m, p in enumerate(pl):
                if type(p) is Shard:
                    chunks = list(torch.chunk(local, mesh.shape[m], dim=p.dim))
                    while len(chunks) < mesh.shape[m]:
                        empty_shape = list(local.shape)
                        empty_shape[p.dim] = 0
                        chunks.append(local.new_zeros(empty_shape))
                    local = chunks[coord[m]]
            st = contiguous_stride(shape)
            for kwargs in ({}, {"shape": shape, "stride": st}, {"run_check": True}):
                dt = DTensor.from_local(local, mesh, pl, **kwargs)
                assert tuple(dt.shape) == shape, (pl, kwargs, dt.shape)
                torch.testing.assert_close(dt.full_tensor(), glob)
            dt = distribute_tensor(glob, mesh, pl)
            torch.testing.assert_close(dt.to_local(), local)
    return True


@multiproc
def test_round_trip_1d(dist2):
    assert dist2.run(check_round_trip, (2,)) == [True, True]


def test_round_trip_2d():
    assert run_sim(4, check_round_trip, (2, 2)) == [True] * 4


def test_round_trip_1d_of_4():
    assert run_sim(4, check_round_trip, (4,)) == [True] * 4


# ---------------------------------------------------------------------- bug reports (sim)
def report_uneven_round_trip_on_4_ranks(rank, world):
    """Issue 4, case 8 (a public PyTorch DTensor report): uneven (5, 10) on a 1-D mesh of
    4: R -> S(0) -> R returns (5, 10) exactly; #103306: the same program came back (8, 10)
    in PyTorch; every 1-D move of (1, 3), (3, 3), (7, 3) on 4 ranks (empty shards)."""
    mesh = _mesh((world,))
    full = torch.arange(50, dtype=torch.float32).reshape(5, 10)
    r = distribute_tensor(full, mesh, [Replicate()])
    s = r.redistribute(mesh, [Shard(0)])
    assert tuple(s.shape) == (5, 10)
    back = s.redistribute(mesh, [Replicate()])
    assert tuple(back.shape) == (5, 10) and tuple(back.to_local().shape) == (5, 10)
    assert torch.equal(back.to_local(), full)
    assert torch.equal(s.full_tensor(), full)
    x = torch.rand(5, 10, generator=torch.Generator().manual_seed(3))
    y = (
        DTensor.from_local(x, mesh, [Replicate()])
        .redistribute(mesh, [Shard(0)])
        .redistribute(mesh, [Replicate()])
        .to_local()
    )
    assert y.shape == x.shape
    torch.testing.assert_close(y, x)
    for n in (1, 3, 7):
        t = torch.arange(n * 3.0).reshape(n, 3)
        for a in (Shard(0), Shard(1)):
            for b in (Shard(0), Shard(1), Replicate()):
                _eq(distribute_tensor(t, mesh, [a]).redistribute(mesh, [b]), t)
    return tuple(s.to_local().shape)


def report_nested_uneven_shards(rank, world):
    """#161368 / #194457: 2-d uneven sharding (5, 3) ``[S(0), S(0)]`` -> ``[R, R]`` and
    back, and -> ``[S(1), S(0)]``, on a (2, 2) mesh."""
    mesh2 = _mesh((2, 2), ("dp", "tp"))
    t2 = torch.arange(15.0).reshape(5, 3)
    d2 = distribute_tensor(t2, mesh2, [Shard(0), Shard(0)])
    _eq(d2.redistribute(mesh2, [Replicate(), Replicate()]).to_local(), t2)
    _eq(d2.redistribute(mesh2, [Shard(1), Shard(0)]), t2)


def test_reports_mesh_of_4():
    assert run_sim(4, report_uneven_round_trip_on_4_ranks) == [(2, 10), (2, 10), (1, 10), (0, 10)]
    run_sim(4, report_nested_uneven_shards)


def report_contiguous_after_gather(rank, world):
    """#143748 / #173041: an uneven ``Shard(1) -> Replicate`` leaves a contiguous local
    tensor; ``view`` works on it."""
    mesh = _mesh((world,))
    u = torch.randn(4, 31, 10, generator=torch.Generator().manual_seed(0))
    r = distribute_tensor(u, mesh, [Shard(1)]).redistribute(mesh, [Replicate()])
    assert r.to_local().is_contiguous()
    _eq(r.view(-1, 10), u.view(-1, 10))


def report_gradients_through_partial_moves(rank, world):
    """#170147 / #115967: Partial -> Partial -> Shard, and Partial -> Shard then
    ``to_local``: the gradients reaching the Partial leaves; PR #121653: a same-placement
    redistribute must still run the ``to_local`` ``grad_placements``."""
    mesh = _mesh((world,))
    leaf = (torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])).requires_grad_()
    q = DTensor.from_local(leaf, mesh, [Partial()]).redistribute(mesh, [Partial()])
    (q.redistribute(mesh, [Shard(0)]).full_tensor() * torch.tensor([2.0, 5.0])).sum().backward()
    _eq(leaf.grad, torch.tensor([2.0, 5.0]))
    leaf2 = torch.full((4, 2), float(rank + 1), requires_grad=True)
    w = torch.arange(8.0).reshape(4, 2)
    s = DTensor.from_local(leaf2, mesh, [Partial()]).redistribute(mesh, [Shard(0)])
    (s.to_local() * w.chunk(world, 0)[rank]).sum().backward()
    _eq(leaf2.grad, w)
    leaf3 = torch.ones(4, requires_grad=True)
    loc = (
        DTensor.from_local(leaf3, mesh, [Replicate()])
        .redistribute(mesh, [Replicate()])
        .to_local(grad_placements=[Partial()])
    )
    (loc * (rank + 1)).sum().backward()
    _eq(leaf3.grad, torch.full((4,), float(sum(range(1, world + 1)))))


def report_placement_normalization(rank, world):
    """PR #172041: ``P(sum) -> P(avg)`` was a silent no-op in PyTorch (the value doubled):
    refused, named, and nothing changed; PR #111750: ``Shard(-1)`` normalizes to
    ``Shard(2)``; ``S(2) <-> S(-1)`` is a no-op."""
    mesh = _mesh((world,))
    loc = torch.tensor([1.0, 3.0]) if rank == 0 else torch.tensor([2.0, 1.0])
    p = DTensor.from_local(loc, mesh, [Partial()])
    with pytest.raises(RuntimeError, match=r"P to P\(avg\)"):
        p.redistribute(mesh, [Partial("avg")])
    _eq(p, torch.tensor([3.0, 4.0]))
    w = torch.arange(24.0).reshape(2, 3, 4)
    dw = distribute_tensor(w, mesh, [Shard(-1)])
    assert dw.placements == (Shard(2),)
    _eq(distribute_tensor(w, mesh, [Shard(2)]).redistribute(mesh, [Shard(-1)]), w)


@reports(
    report_contiguous_after_gather,
    report_gradients_through_partial_moves,
    report_placement_normalization,
)
def test_reports(report, sim_ops):
    run_sim(2, report)
