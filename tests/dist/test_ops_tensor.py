"""Tensor ops on real gloo ranks against plain torch on the same global inputs, forward and
backward: cat/stack/split/chunk/unbind/narrow/select/flip/repeat, triu/tril, indexing
(``__getitem__``/``__setitem__``, index_select, gather, scatter), masked_fill/where,
fill_/zero_/copy_/clone/type_as/to and the ``*_like`` factories. Every placement
combination on 2 ranks (Partial(sum) and Partial(max) included), a fixed random sample on
a (2, 2) mesh; even and uneven shapes."""

from __future__ import annotations

import random

import pytest
import torch

from hyper_shard import DTensor, Partial, Replicate, Shard, init_device_mesh
from hyper_shard.errors import ShardingError
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global

pytestmark = pytest.mark.multiproc

PARTIALS = ("sum", "max")


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _combos(tensors, mesh, k, partials=PARTIALS):
    """Every combination on a 1-D mesh; a fixed random sample of ``k`` on a 2-D one."""
    combos = all_combos(tensors, mesh.ndim, partials)
    if mesh.ndim == 1 or len(combos) <= k:
        return combos
    return random.Random(0).sample(combos, k)


def _check(mesh, cases, k=12, partials=PARTIALS):
    """``cases``: (function, inputs); each over the (sampled) placement combinations."""
    n = 0
    for fn, ins in cases:
        n += check_op(fn, ins, mesh, _combos(ins, mesh, k, partials))
    return n


def _placements(mesh, *pl):
    return [pl[m] if m < len(pl) else Replicate() for m in range(mesh.ndim)]


# ---------------------------------------------------------------------- join / split
def check_join_split(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(5, 4, generator=g), torch.randn(3, 4, generator=g)  # uneven rows
    z = torch.randn(2, 3, 6, generator=g)
    cases = [
        (lambda a, b: torch.cat([a, b]), [x, y]),
        (lambda a, b: torch.cat((a.t(), b.t()), dim=-1), [x, y]),
        (lambda a, b: torch.concat([a, b, a], 0), [x, y]),
        (lambda a: torch.cat([a, a * 2], 1), [z]),
        (lambda a, b: torch.stack([a, b[:1].expand(5, 4) * 0 + a]), [x, y]),
        (lambda a: torch.stack([a, a * 3], dim=1), [x]),
        (lambda a: torch.stack([a, -a], dim=-1), [z]),
        (lambda a: torch.split(a, 2), [x]),
        (lambda a: a.split([1, 3], dim=1), [x]),
        (lambda a: a.split_with_sizes(split_sizes=[4, 1]), [x]),
        (lambda a: torch.split(a, [2, 4], -1), [z]),
        (lambda a: a.chunk(3), [x]),
        (lambda a: torch.chunk(a, 4, dim=2), [z]),
        (lambda a: a.unbind(1), [x]),
        (lambda a: torch.unbind(a), [z]),
        (lambda a: a.narrow(0, 1, 3), [x]),
        (lambda a: torch.narrow(a, -1, 2, 3), [z]),
        (lambda a: a.select(1, -1), [x]),
        (lambda a: torch.select(a, 0, 4), [x]),
        (lambda a: a.flip(0), [x]),
        (lambda a: torch.flip(a, (0, 2)), [z]),
        (lambda a: a.repeat(2, 1, 1), [x]),
        (lambda a: a.repeat(1, 2, 1), [z]),
    ]
    n = _check(mesh, cases)
    # shards on untouched dims survive: no communication for them
    xs = dt_from_global(x, mesh, _placements(mesh, Shard(1)))
    assert torch.cat([xs, xs]).placements == xs.placements
    assert all(p.placements == xs.placements for p in torch.split(xs, 2))
    assert xs.narrow(0, 1, 3).placements == xs.placements
    zs = dt_from_global(z, mesh, _placements(mesh, Shard(2), Shard(1)))
    assert torch.stack([zs, zs], 1).placements == tuple(_placements(mesh, Shard(3), Shard(2)))
    assert zs.select(0, 1).placements == tuple(_placements(mesh, Shard(1), Shard(0)))
    with pytest.raises(ShardingError, match="sum exactly"):
        xs.split([1, 1], 0)
    return n


# ---------------------------------------------------------------------- triu / tril
def check_triangular(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 7, generator=g)
    z = torch.randn(2, 6, 5, generator=g)
    cases = []
    for k in (-2, 0, 1, 3):
        cases += [
            (lambda a, k=k: torch.triu(a, k), [x]),
            (lambda a, k=k: a.tril(diagonal=k), [x]),
            (lambda a, k=k: torch.tril(a, k), [z]),
            (lambda a, k=k: a.clone().triu_(k), [z]),
        ]
    n = _check(mesh, cases, k=10)
    # sharded rows and columns stay sharded (the diagonal is shifted per rank)
    for pl in ([Shard(0)], [Shard(1)], [Shard(1), Shard(0)]):
        pl = _placements(mesh, *pl)
        d = dt_from_global(x, mesh, pl)
        out = torch.triu(d, 1)
        assert out.placements == tuple(pl)
        assert_dtensor_close(out, torch.triu(x, 1))
    return n


# ---------------------------------------------------------------------- indexing
def check_getitem(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(5, 4, generator=g)
    z = torch.randn(3, 5, 6, generator=g)
    idx = torch.tensor([4, 0, 2, 2, 1, 3])
    idx2 = torch.tensor([[0, 2], [1, 1], [2, 0]])
    cases = [
        (lambda a: a[1], [x]),
        (lambda a: a[-1, 1:], [x]),
        (lambda a: a[1:4:2], [x]),
        (lambda a: a[::2, None, ..., 1], [x]),
        (lambda a: a[..., ::3], [z]),
        (lambda a: a[:, 1], [z]),
        (lambda a: a[None, :, True, 2:], [x]),
        (lambda a: a[[0, 2, 2]], [x]),
        (lambda a: a[:, [3, 0]], [x]),
        (lambda a: a[0, :, [1, 5]], [z]),
        (lambda a: a[[0, 2], :, [1, 5]], [z]),
        (lambda a: a[[True, False, True, True, False]], [x]),
        (lambda a, i: a[i], [x, idx]),
        (lambda a, i: a[:, i], [z, idx]),
        (lambda a, i: a[i, 1:3], [x, idx]),
        (lambda a, i: a[:, i, i], [z, idx2]),
        (lambda a, i: a[i, :, i], [z, idx2]),
        (lambda a, i: a[..., i[:, 0]], [z, idx2]),
    ]
    n = _check(mesh, cases, k=10)
    # untouched dims keep their shards; a sharded index tensor shards the result
    zs = dt_from_global(z, mesh, _placements(mesh, Shard(2), Shard(0)))
    assert zs[:, 1].placements == tuple(_placements(mesh, Shard(1), Shard(0)))
    xr = dt_from_global(x, mesh, _placements(mesh))
    ids = dt_from_global(idx2, mesh, _placements(mesh, Shard(0)))
    out = xr[ids]
    assert out.placements == tuple(_placements(mesh, Shard(0)))
    assert_dtensor_close(out, x[idx2])
    # a boolean mask read has a data-dependent shape: run whole, a Replicate result
    mask = dt_from_global(x > 0, mesh, _placements(mesh))
    for xin in (xr, dt_from_global(x, mesh, _placements(mesh, Shard(1)))):
        got = xin[mask]
        assert got.placements == tuple(_placements(mesh))
        assert_dtensor_close(got, x[x > 0])
    with pytest.raises(IndexError, match="too many indices"):
        xr[0, 0, 0]
    with pytest.raises(IndexError, match="out of bounds"):
        xr[5]
    return n


def _set(a, index_fn, value):
    a[index_fn(a)] = value
    return a


def check_setitem(rank, world):
    """In-place writes: the target keeps its placements; values as plain torch (the target
    cloned from a DTensor input so gradients flow to both the target and the value)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 6, generator=g)
    v = torch.randn(2, 6, generator=g)
    c = torch.randn(6, generator=g)
    z = torch.randn(3, 4, 5, generator=g)

    def write(index, value=None):
        def fn(a, *vals):
            out = a.clone()
            out[index] = vals[0] if vals else value
            return out

        return fn

    cases = [
        (write(1, 2.5), [x]),
        (write((slice(None), 3), -1.0), [x]),
        (write(slice(1, 5, 2)), [x, v]),
        (write((slice(1, 4, 2), slice(None))), [x, v[:, :1]]),
        (write(slice(0, 5, 3)), [x, c]),
        (write((Ellipsis, 2)), [x, x[:, 0]]),
        (write((1, slice(None), slice(2, 5))), [z, z[0, :, :3]]),
    ]
    n = _check(mesh, cases, k=10)
    # through an index list: the indexed dim of the target must not be sharded (in place)
    for fn, ins, d in (
        (write([0, 3]), [x, v], 0),
        (write((slice(None), [4, 1])), [x, x[:, :2]], 1),
    ):
        combos = [c for c in _combos(ins, mesh, 10) if Shard(d) not in c[0]]
        n += check_op(fn, ins, mesh, combos)
    # the target's placements never change; a sharded target is written by its owners
    for pl in ([Shard(0)], [Shard(1)], [Partial()], [Shard(0), Shard(1)], [Partial("max")]):
        pl = _placements(mesh, *pl)
        d = dt_from_global(x, mesh, pl, seed=7)
        e = x.clone()
        d[2:5:2, 1] = 4.0
        e[2:5:2, 1] = 4.0
        d[0] = dt_from_global(c, mesh, _placements(mesh))
        e[0] = c
        assert d.placements == tuple(pl)
        assert_dtensor_close(d, e)
        n += 1
    # a boolean mask DTensor aligned with the target's shards: x[mask] = value
    for pl in ([Shard(0)], [Shard(1), Shard(0)], [Replicate()], [Partial()]):
        pl = _placements(mesh, *pl)
        d = dt_from_global(z, mesh, pl, seed=3)
        mpl = [p if type(p) is Shard else Replicate() for p in pl]
        mask = dt_from_global(z > 0.3, mesh, mpl)
        e = z.clone()
        d[mask] = -2.0
        e[z > 0.3] = -2.0
        m2 = dt_from_global(z[0] > 0, mesh, _placements(mesh, Shard(0)))  # (4, 5) over dims 1, 2
        d[1, m2] = 7.0
        e[1, z[0] > 0] = 7.0
        assert d.placements == tuple(pl)
        assert_dtensor_close(d, e)
        n += 1
    # writing through an index tensor into a sharded dim in place: each rank writes the
    # rows it holds (index_put's rule), the target keeps its shards
    d = dt_from_global(x, mesh, _placements(mesh, Shard(0)))
    ids = dt_from_global(torch.tensor([0, 3]), mesh, _placements(mesh))
    d[ids] = 1.0
    e = x.clone()
    e[torch.tensor([0, 3])] = 1.0
    assert d.placements == tuple(_placements(mesh, Shard(0)))
    assert_dtensor_close(d, e)
    return n + 1


def check_index_ops(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(5, 4, generator=g)
    sel = torch.tensor([3, 0, 3, 1, 2, 4, 0])
    gi = torch.randint(0, 5, (5, 4), generator=g)
    gi_small = torch.randint(0, 4, (3, 4), generator=g)
    si = torch.stack([torch.randperm(4, generator=g) for _ in range(5)])
    src = torch.randn(5, 4, generator=g)
    mask = torch.rand(5, 4, generator=g) > 0.5
    rowmask = torch.tensor([True, False, True, False])
    cases = [
        (lambda a, i: torch.index_select(a, 0, i), [x, sel]),
        (lambda a, i: a.index_select(1, i[:3]), [x, sel]),
        (lambda a, i: torch.gather(a, 0, i), [x, gi]),
        (lambda a, i: a.gather(1, i), [x, gi % 4]),
        (lambda a, i: torch.gather(a, 1, i), [x, gi_small]),
        (lambda a, i, s: torch.scatter(a, 1, i, s), [x, si, src]),
        (lambda a, i, s: a.scatter_add(1, i, s), [x, si, src]),
        (lambda a, i: a.scatter(1, i, 0.5), [x, si]),
        (lambda a, m: a.masked_fill(m, -1.0), [x, mask]),
        (lambda m, a: torch.where(m, a, 0.0), [mask, x]),
        (lambda m, a, b: torch.where(m, a, b), [rowmask, x, src]),
    ]
    n = _check(mesh, cases, k=12)
    # masked_fill_ in place: a Partial target cannot take the fill once (a clear error)
    fn = lambda a, m: a.clone().masked_fill_(m, 3.0)  # noqa: E731
    combos = _combos([x, rowmask], mesh, 12)
    n += check_op(
        fn, [x, rowmask], mesh, [c for c in combos if not any(p.is_partial() for p in c[0])]
    )
    with pytest.raises(ShardingError, match="in-place target"):
        dt_from_global(x, mesh, _placements(mesh, Partial())).masked_fill_(
            dt_from_global(rowmask, mesh, _placements(mesh)), 3.0
        )
    # torch.where(cond) is nonzero(as_tuple=True): value-dependent, run whole
    got = torch.where(dt_from_global(mask, mesh, _placements(mesh, Shard(0))))
    for g, want in zip(got, torch.where(mask)):
        assert g.placements == tuple(_placements(mesh))
        assert_dtensor_close(g, want)
    # a sharded index shards the output; the input is gathered on the indexed dim only
    xs = dt_from_global(x, mesh, _placements(mesh, Shard(1)))
    ids = dt_from_global(sel, mesh, _placements(mesh, Shard(0)))
    assert xs.index_select(0, ids).placements == tuple(_placements(mesh, Shard(1)))
    xr = dt_from_global(x, mesh, _placements(mesh))
    assert torch.index_select(xr, 0, ids).placements == tuple(_placements(mesh, Shard(0)))
    return n


# ---------------------------------------------------------------------- overwrite / copy
def check_fill_copy(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(5)
    x = torch.randn(5, 4, generator=g)
    row = torch.randn(4, generator=g)
    cases = [
        (lambda a: a.clone(), [x]),
        (lambda a: torch.clone(a) * 2, [x]),
        (lambda a: a.conj(), [x]),
        (lambda a: a * 1 + a.clone().fill_(2.0), [x]),
        (lambda a: a.clone().zero_() + a, [x]),
        (lambda a, b: a.clone().copy_(b), [x, x * 0.5]),
        (lambda a, b: a.clone().copy_(b), [x, row]),
        (lambda a: a.to(torch.float64), [x]),
        (lambda a: a.to(dtype=torch.float64).sum(0), [x]),
        (lambda a, b: a.type_as(b), [x, row.double()]),
        (lambda a: a.to("cpu") * 3, [x]),
        (lambda a: torch.zeros_like(a) + a, [x]),
        (lambda a: torch.ones_like(a) * a, [x]),
        (lambda a: torch.full_like(a, 0.5) - a, [x]),
    ]
    n = _check(mesh, cases, k=12)
    # in place: the placements never change, values as plain torch (Partial included)
    for pl in ([Shard(0)], [Replicate()], [Partial()], [Partial("max")], [Shard(1), Partial()]):
        pl = _placements(mesh, *pl)
        for src_pl in ([Replicate()], [Shard(0)], [Partial()], [Shard(1), Shard(0)]):
            src_pl = _placements(mesh, *src_pl)
            d = dt_from_global(x, mesh, pl, seed=1)
            s = dt_from_global(
                row * 2,
                mesh,
                [p if type(p) is not Shard or p.dim == 0 else Replicate() for p in src_pl],
                seed=2,
            )
            d.copy_(s)
            assert d.placements == tuple(pl)
            assert_dtensor_close(d, (row * 2).expand(5, 4))
            d.fill_(1.5)
            assert_dtensor_close(d, torch.full((5, 4), 1.5))
            d.fill_(dt_from_global(torch.tensor(-2.0), mesh, _placements(mesh), seed=3))
            assert_dtensor_close(d, torch.full((5, 4), -2.0))
            d.copy_(3.0 * torch.ones(()))
            assert_dtensor_close(d, torch.full((5, 4), 3.0))
            d.zero_()
            assert d.placements == tuple(pl)
            assert_dtensor_close(d, torch.zeros(5, 4))
            n += 1
        # *_like factories: shards kept, Partial -> Replicate (ones_like of a Partial is 1)
        d = dt_from_global(x, mesh, pl, seed=1)
        for fn, want in ((torch.zeros_like, 0.0), (torch.ones_like, 1.0)):
            out = fn(d)
            assert out.placements == tuple(Replicate() if type(p) is Partial else p for p in pl)
            assert_dtensor_close(out, torch.full((5, 4), want))
    return n


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize(
    "check",
    [check_join_split, check_triangular, check_getitem, check_setitem, check_index_ops,
     check_fill_copy],
    ids=lambda f: f.__name__.removeprefix("check_"),
)  # fmt: skip
def test_tensor_ops(check, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check)
    assert counts[0] > 0 and len(set(counts)) == 1


def check_split_outputs(rank, world):
    """split/chunk/unbind return tuples of DTensors whose untouched dim stays sharded."""
    mesh = _mesh(world)
    t = torch.randn(6, 4)
    d = dt_from_global(t, mesh, _placements(mesh, Shard(1)))
    for parts, ref in (
        (torch.split(d, 4), torch.split(t, 4)),
        (d.chunk(3), t.chunk(3)),
        (d.unbind(0), t.unbind(0)),
    ):
        assert len(parts) == len(ref)
        for p, r in zip(parts, ref):
            assert isinstance(p, DTensor)
            assert p.placements == tuple(_placements(mesh, Shard(r.ndim - 1)))
            assert_dtensor_close(p, r)
    return 1


@pytest.mark.parametrize("world", [2, 4])
def test_split_outputs(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    assert pool.run(check_split_outputs) == [1] * world
