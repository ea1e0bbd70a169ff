"""torch.nn.functional.embedding on real gloo ranks against plain torch (forward values and
the dense weight gradient): batch-sharded indices, column-sharded (Shard(1)) and
row-sharded vocab-parallel (Shard(0) -> Partial(sum)) weights, Partial weights,
padding_idx (the padding row gets no gradient on the rank that owns it), scale_grad_by_freq
and max_norm; even and uneven vocabularies, an empty vocab shard on 4 ranks."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import Partial, Replicate, Shard, init_device_mesh
from hyper_shard.errors import ShardingError
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global

pytestmark = pytest.mark.multiproc


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _combos(tensors, mesh, k):
    combos = all_combos(tensors, mesh.ndim, ("sum", "max"))
    return combos if mesh.ndim == 1 or len(combos) <= k else random.Random(0).sample(combos, k)


def check_lookup(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    n = 0
    for vocab in (8, 7):  # even and uneven rows
        w = torch.randn(vocab, 6, generator=g)
        ids = torch.randint(0, vocab, (3, 5), generator=g)
        ids[0, :3] = torch.tensor([2, vocab - 1, 2])  # padding rows present
        cases = [
            lambda i, ww: F.embedding(i, ww),
            lambda i, ww: F.embedding(i, ww, padding_idx=2),
            lambda i, ww: F.embedding(i, ww, padding_idx=-1) * 2,
            lambda i, ww: F.embedding(i, ww, scale_grad_by_freq=True),
            lambda i, ww: F.embedding(i[0], ww, 0),
        ]
        for fn in cases:
            n += check_op(fn, [ids, w], mesh, _combos([ids, w], mesh, 14))
    return n


def check_layouts(rank, world):
    """The decided layouts: no gather of a sharded weight, the output sharded or Partial."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    r = mesh.ndim
    g = torch.Generator().manual_seed(1)
    w = torch.randn(9, 4, generator=g)
    ids = torch.randint(0, 9, (4, 3), generator=g)

    def pl(*ps):
        return [ps[m] if m < len(ps) else Replicate() for m in range(r)]

    cases = [
        (pl(Replicate()), pl(Shard(0)), pl(Partial())),  # vocab-parallel
        (pl(Replicate()), pl(Shard(1)), pl(Shard(2))),  # column-parallel
        (pl(Shard(0)), pl(Replicate()), pl(Shard(0))),  # batch-sharded indices
        (pl(Replicate()), pl(Partial()), pl(Partial())),  # a row selection of a Partial
    ]
    if r == 2:
        cases += [
            ([Shard(0), Replicate()], [Replicate(), Shard(0)], [Shard(0), Partial()]),
            ([Replicate(), Replicate()], [Shard(0), Shard(1)], [Partial(), Shard(2)]),
            ([Replicate(), Replicate()], [Shard(0), Shard(0)], [Partial(), Partial()]),
        ]
    n = 0
    for ipl, wpl, opl in cases:
        di = dt_from_global(ids, mesh, ipl)
        dw = dt_from_global(w, mesh, wpl, requires_grad=True)
        out = F.embedding(di, dw, padding_idx=3)
        assert out.placements == tuple(opl), (ipl, wpl, out.placements)
        assert_dtensor_close(out, F.embedding(ids, w, padding_idx=3))
        n += 1
    return n


def check_small_vocab(rank, world):
    """3 rows over 4 vocab shards: one rank holds no row (an empty local weight)."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    w = torch.randn(3, 5, generator=torch.Generator().manual_seed(2))
    ids = torch.tensor([[0, 2, 1, 2], [1, 1, 0, 2]])
    combos = [[[Replicate()], [Shard(0)]], [[Shard(1)], [Replicate()]], [[Replicate()], [Shard(1)]]]
    return check_op(lambda i, ww: F.embedding(i, ww, padding_idx=1), [ids, w], mesh, combos)


def check_max_norm(rank, world):
    """max_norm renormalises the looked-up rows in place: a Replicate weight does it
    identically on every rank (indices gathered); a row-sharded one on each row's owner
    (vocab-parallel lookup); a column-sharded one (rows split) is refused."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    r = mesh.ndim
    g = torch.Generator().manual_seed(3)
    w = torch.randn(6, 4, generator=g) * 3
    ids = torch.tensor([[0, 2, 5], [2, 3, 0]])
    ref_w = w.clone()
    ref = F.embedding(ids, ref_w, max_norm=1.0)
    dw = dt_from_global(w, mesh, [Replicate()] * r)
    di = dt_from_global(ids, mesh, [Shard(0)] + [Replicate()] * (r - 1))
    out = F.embedding(di, dw, max_norm=1.0)
    assert_dtensor_close(out, ref)
    assert_dtensor_close(dw, ref_w)  # the same rows renormalised in place
    rw = dt_from_global(w, mesh, [Shard(0)] * r)
    assert_dtensor_close(F.embedding(di, rw, max_norm=1.0), ref)
    assert_dtensor_close(rw, ref_w)  # exactly the rows torch renormalises, on their owners
    with pytest.raises(ShardingError, match="max_norm"):
        F.embedding(di, dt_from_global(w, mesh, [Shard(1)] * r), max_norm=1.0)
    return 1


@pytest.mark.parametrize("world", [2, 4])
def test_lookup(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(check_lookup)
    assert counts[0] > 0 and len(set(counts)) == 1


@pytest.mark.parametrize("world", [2, 4])
def test_layouts(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    assert pool.run(check_layouts) == [4 if world == 2 else 7] * world


def test_small_vocab(dist4):
    assert dist4.run(check_small_vocab) == [3] * 4


@pytest.mark.parametrize("world", [2, 4])
def test_max_norm(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    assert pool.run(check_max_norm) == [1] * world
