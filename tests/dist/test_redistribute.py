"""Redistribution on real gloo ranks: every placement pair, values and gradients, against
plain torch on the same global tensors."""

from __future__ import annotations

import itertools

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor, init_device_mesh
from hyper_shard.placement import Placement
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride
from tests._helpers import Comparisons
from tests._move import move as _move

pytestmark = pytest.mark.multiproc


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


def check_all_pairs(rank, world, mesh_shape, shape, partials, grads):
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", mesh_shape)
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


@pytest.mark.parametrize("shape", [(4, 6), (5, 3)], ids=["even", "uneven"])
def test_all_pairs_1d_mesh(dist2, shape):
    counts = dist2.run(check_all_pairs, (2,), shape, ("sum", "avg", "max", "min"), True)
    assert counts == [7 * 7, 7 * 7]  # every (src, dst) pair, on both ranks


@pytest.mark.parametrize(
    "shape,grads",
    [((4, 4), True), ((5, 3), True), ((3, 2, 5), False)],
    ids=["even", "uneven", "3d-uneven"],
)
def test_all_pairs_2d_mesh(dist4, shape, grads):
    """Every pair of (2, 2) placements. The 3-d tensor's pairs check values only: the
    gradient of a move is a move back (to the source placements, Partial ones as
    Replicate), a pair its forward sweep checks; the 2-d shapes check every gradient too."""
    counts = dist4.run(check_all_pairs, (2, 2), shape, ("sum",), grads)
    n = (len(shape) + 2) ** 2
    assert counts == [n * n] * 4


def test_all_pairs_1d_mesh_of_4_partials(dist4):
    counts = dist4.run(check_all_pairs, (4,), (6, 5), ("sum", "avg", "max"), True)
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
        cm = cost_model_for(init_device_mesh("cpu", args[0]))
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
    mesh = init_device_mesh("cpu", mesh_shape)
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


def test_grad_paths_1d(dist2):
    assert dist2.run(check_grad_paths, (2,), (5, 4)) == [True, True]


def test_grad_paths_2d(dist4):
    assert dist4.run(check_grad_paths, (2, 2), (3, 5)) == [True] * 4


def check_round_trip(rank, world, mesh_shape):
    """from_local + full_tensor round trips, uneven and empty shards included."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", mesh_shape)
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


def test_round_trip_1d(dist2):
    assert dist2.run(check_round_trip, (2,)) == [True, True]


def test_round_trip_2d(dist4):
    assert dist4.run(check_round_trip, (2, 2)) == [True] * 4


def test_round_trip_1d_of_4(dist4):
    assert dist4.run(check_round_trip, (4,)) == [True] * 4
