"""Shard order (a tensor dim split by several mesh dims in an order other than left to
right, as FSDP over tensor parallelism needs), in one process on abstract meshes.

* Local shapes and global offsets against an independent recursion with ``torch.chunk``.
* Redistribution plans into, out of and between ordered layouts, *executed* on the sim
  platform (tests/fake_platform: every rank of the mesh is a thread of this process, the
  collectives meet through an in-process exchange), so each rank's result is checked
  against its box of the global tensor (forward) and the transposed plan against the
  gradient contract (backward).
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.redistribute.executor import backward_plan, execute_plan
from hyper_shard.redistribute.planner import plan_redistribute
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride
from tests.fake_platform import run_ranks, sim_mesh


def _boxes(shape, mesh_shape, placements, order):
    """Independent: every coordinate's (offset, shape), by splitting index ranges with
    torch.chunk in each tensor dim's split order."""
    split = {d: [m for m, p in enumerate(placements) if p == Shard(d)] for d in range(len(shape))}
    for d, ms in order or ():
        split[d] = list(ms)
    out = {}
    for coord in itertools.product(*[range(s) for s in mesh_shape]):
        off, ln = [], []
        for d, n in enumerate(shape):
            idx = torch.arange(n)
            for m in split[d]:
                chunks = list(idx.chunk(mesh_shape[m])) + [idx[:0]] * mesh_shape[m]
                idx = chunks[coord[m]]
            ln.append(idx.numel())
            off.append(int(idx[0]) if idx.numel() else None)
        out[coord] = (off, ln)
    return out


def _meta(shape):
    return TensorMeta(tuple(shape), contiguous_stride(shape), torch.float32, 4)


@pytest.mark.parametrize("mesh_shape", [(2, 2), (2, 3), (3, 2), (2, 2, 2)])
@pytest.mark.parametrize("shape", [(7, 5), (4, 9), (3, 1)])
def test_local_shapes_and_offsets_follow_the_split_order(mesh_shape, shape):
    mnd = len(mesh_shape)
    mesh = DeviceMesh.abstract(mesh_shape)
    for dims in itertools.product(range(-1, len(shape)), repeat=mnd):
        pl = [Shard(d) if d >= 0 else Replicate() for d in dims]
        by_dim = {d: [m for m in range(mnd) if dims[m] == d] for d in set(dims) if d >= 0}
        for perms in itertools.product(*[itertools.permutations(v) for v in by_dim.values()]):
            order = tuple((d, p) for d, p in zip(by_dim, perms))
            spec = DTensorSpec(mesh, pl, _meta(shape), order)
            want = _boxes(shape, mesh_shape, pl, order)
            for coord, (off, ln) in want.items():
                got_shape, got_off = spec.local_shape_and_offset(coord)
                assert list(got_shape) == ln, (pl, order, coord)
                for d in range(len(shape)):
                    if ln[d]:
                        assert got_off[d] == off[d], (pl, order, coord, d)


def test_shard_order_is_canonical_and_validated():
    mesh = DeviceMesh.abstract((2, 2))
    meta = _meta((8, 4))
    a = DTensorSpec(mesh, [Shard(0), Shard(0)], meta, [(0, (0, 1))])  # left to right: None
    assert a.shard_order is None and a == DTensorSpec(mesh, [Shard(0), Shard(0)], meta)
    b = DTensorSpec(mesh, [Shard(0), Shard(0)], meta, [(0, (1, 0))])
    assert b.shard_order == ((0, (1, 0)),) and b != a and hash(b) != hash(a)
    assert "shard_order=0:[1, 0]" in repr(b)
    assert b.full_shard_order == ((0, (1, 0)),)
    # placements that keep the dim's mesh dims keep the order; the others drop it
    assert b.with_placements([Shard(0), Shard(0)]).shard_order == b.shard_order
    assert b.with_placements([Shard(0), Replicate()]).shard_order is None
    assert b.with_placements([Shard(0), Shard(0)], shard_order=None).shard_order is None
    with pytest.raises(ValueError, match="exactly those"):
        DTensorSpec(mesh, [Shard(0), Shard(1)], meta, [(0, (1, 0))])
    with pytest.raises(ValueError, match="twice"):
        DTensorSpec(mesh, [Shard(0), Shard(0)], meta, [(0, (1, 0)), (0, (1, 0))])


# ---------------------------------------------------------------------- the simulator
def _run_ranks(mesh_shape, fn):
    """``fn(mesh, plat)`` on every rank of the sim platform (tests/fake_platform: a thread
    each, collectives through an in-process exchange); results by coordinate."""

    def rank(r):
        mesh = sim_mesh(mesh_shape)
        return mesh.get_coordinate(), fn(mesh, mesh.platform)

    return dict(run_ranks(math.prod(mesh_shape), rank))


def _local(full, spec, coord):
    shape, off = spec.local_shape_and_offset(coord)
    t = full
    for d, (o, ln) in enumerate(zip(off, shape)):
        t = t.narrow(d, o, ln)
    return t.contiguous()


S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()
CASES = [  # (mesh shape, tensor shape, src placements, src order, dst placements, dst order)
    ((2, 2), (7, 5), (S0, S0), ((0, (1, 0)),), (R, R), None),
    ((2, 3), (7, 5), (R, R), None, (S0, S0), ((0, (1, 0)),)),
    ((2, 3), (9, 4), (S0, S0), ((0, (1, 0)),), (S0, S0), None),
    ((3, 2), (7, 5), (S0, S1), None, (S0, S0), ((0, (1, 0)),)),
    ((2, 2), (7, 5), (S0, S0), ((0, (1, 0)),), (S1, S0), None),
    ((2, 3), (7, 5), (S0, S0), ((0, (1, 0)),), (S0, R), None),
    ((2, 2), (7, 5), (P, S0), None, (S0, S0), ((0, (1, 0)),)),
    ((2, 2, 2), (9, 3), (S0, S0, S0), ((0, (2, 0, 1)),), (S0, S0, S0), ((0, (1, 2, 0)),)),
    ((2, 2, 2), (9, 3), (S0, R, S0), ((0, (2, 0)),), (S1, S0, S0), ((0, (2, 1)),)),
]


@pytest.mark.parametrize("case", CASES, ids=[str(i) for i in range(len(CASES))])
def test_ordered_plans_move_every_element_to_its_box(case):
    """Forward: each rank ends with its box of the global value. Backward: the executed
    transpose satisfies <A x, y> = <x, A^T y> summed over ranks for arbitrary per-rank
    gradients y (the local-derivative contract: backward is the transpose on local data)."""
    mesh_shape, shape, src_pl, src_order, dst_pl, dst_order = case
    g = torch.Generator().manual_seed(0)
    value = torch.randn(*shape, generator=g)
    terms = torch.randn(mesh_shape[0], *shape, generator=g)  # Partial (mesh dim 0) terms
    partial = any(p == P for p in src_pl)
    total = terms.sum(0) if partial else value

    def fn(mesh, plat):  # noqa: ANN001, ANN202
        src = DTensorSpec(mesh, src_pl, _meta(shape), src_order)
        coord = mesh.get_coordinate()
        held = src.with_placements([R if p == P else p for p in src_pl], shard_order=src_order)
        local = _local(terms[coord[0]] if partial else value, held, coord)
        plan = plan_redistribute(src, dst_pl, shard_order=dst_order)
        assert plan.ordered
        out = execute_plan(plat, local, src, plan)
        seed = sum(c * 10**m for m, c in enumerate(coord))
        y = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed))
        back = backward_plan(plat, y, src, plan)
        dst = src.with_placements(dst_pl, shard_order=dst_order)
        return dst, local, out, y, back

    res = _run_ranks(mesh_shape, fn)
    lhs = rhs = 0.0
    for coord, (dst, x, out, y, back) in res.items():
        want = _boxes(shape, mesh_shape, dst.placements, dst.shard_order)[coord]
        assert list(out.shape) == want[1]
        torch.testing.assert_close(out, _local(total, dst, coord), msg=f"coordinate {coord}")
        assert back.shape == x.shape
        lhs += float((out * y).sum())
        rhs += float((x * back).sum())
    assert abs(lhs - rhs) <= 1e-4 * max(1.0, abs(lhs)), (lhs, rhs)
