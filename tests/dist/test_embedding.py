"""torch.nn.functional.embedding on real gloo ranks against plain torch (forward values and
the dense weight gradient): batch-sharded indices, column-sharded (Shard(1)) and
row-sharded vocab-parallel (Shard(0) -> Partial(sum)) weights, Partial weights,
padding_idx (the padding row gets no gradient on the rank that owns it), scale_grad_by_freq
and max_norm; even and uneven vocabularies, an empty vocab shard on 4 ranks."""

from __future__ import annotations

import itertools
import random

import pytest
import torch
import torch.nn.functional as F

from hyper_shard import Partial, Replicate, Shard, init_device_mesh
from hyper_shard.errors import ShardingError
from tests._helpers import (
    _local_objective,
    all_combos,
    assert_dtensor_close,
    check_op,
    dt_from_global,
)

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


def _weight_layouts(r):
    """Every layout of the table max_norm accepts on an r-D mesh (rows, columns, both)."""
    opts = [Replicate(), Shard(0), Shard(1)]
    return [list(c) for c in itertools.product(opts, repeat=r)]


def check_max_norm(rank, world):
    """max_norm renormalises the looked-up rows in place (torch.embedding_renorm_) on every
    layout of the table: Replicate (every rank identically), row-sharded (each row on its
    owner), column-sharded (each row's norm completed over its column shards by an
    all-reduce) and both on a 2-D mesh. Against plain torch: the forward values, the table
    after the call and the table's gradient; norm types 2, 1, 3, inf and 0, padding_idx,
    uneven and empty column shards, batch-sharded and replicated indices."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    r = mesh.ndim
    n = 0
    for cols, kw in [
        (4, dict(max_norm=1.0)),
        (5, dict(max_norm=1.5, norm_type=1.0)),
        (3, dict(max_norm=2.0, norm_type=3.0, padding_idx=2)),  # 3 cols: an empty shard on 4
        (4, dict(max_norm=1.0, norm_type=float("inf"))),
        (4, dict(max_norm=2.5, norm_type=0)),
        (5, dict(max_norm=0.7, scale_grad_by_freq=True)),
    ]:
        g = torch.Generator().manual_seed(3 + cols)
        w = torch.randn(7, cols, generator=g) * 2
        w[4] *= 0.05  # a looked-up row under max_norm: unchanged
        ids = torch.tensor([[0, 2, 5, 4], [2, 3, 0, 6]])
        ref_w = w.clone().requires_grad_()
        ref = F.embedding(ids, ref_w, **kw)
        gout = torch.randn(ref.shape, generator=g)
        (ref * gout).sum().backward()
        for wpl in _weight_layouts(r):
            if kw.get("scale_grad_by_freq") and Shard(0) in wpl:
                continue  # refused below
            for ipl in ([Replicate()] * r, [Shard(0)] + [Replicate()] * (r - 1)):
                dw = dt_from_global(w, mesh, wpl, requires_grad=True)
                di = dt_from_global(ids, mesh, ipl)
                out = F.embedding(di, dw, **kw)
                what = f"{kw} table {wpl} ids {ipl}"
                want = [
                    Partial() if p == Shard(0) else Shard(2) if p == Shard(1) else Replicate()
                    for p in wpl
                ]
                assert list(out.placements) == want, (what, out.placements)
                assert_dtensor_close(out, ref.detach())
                assert_dtensor_close(dw.detach(), ref_w.detach())  # renormalised in place
                _local_objective(out, gout).backward()
                assert_dtensor_close(dw.grad, ref_w.grad)
                n += 1
    return n


def check_max_norm_refusals(rank, world):
    """What max_norm cannot do in place raises on every rank, leaving the table unchanged:
    a Partial table (no row has its norm on any rank), and scale_grad_by_freq with a
    row-sharded table (the counts need every index on the rows' owners)."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    w = torch.randn(6, 4, generator=torch.Generator().manual_seed(4)) * 3
    di = dt_from_global(torch.tensor([[0, 2, 5]]), mesh, [Replicate()])
    msgs = []
    for wpl, kw in [
        ([Partial()], {}),
        ([Shard(0)], dict(scale_grad_by_freq=True)),
    ]:
        dw = dt_from_global(w, mesh, wpl)
        with pytest.raises(ShardingError, match="max_norm") as e:
            F.embedding(di, dw, max_norm=1.0, **kw)
        msgs.append(str(e.value))
        torch.testing.assert_close(dw.full_tensor(), w)
    assert "Shard(1)" in msgs[0] and "scale_grad_by_freq" in msgs[1]
    return len(msgs)


def check_max_norm_repeated(rank, world):
    """A column-sharded table renormalised by two calls (the second a cache hit) and a
    training step between them equals plain torch doing the same."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(5)
    w = torch.randn(9, 6, generator=g) * 2
    ref_w = torch.nn.Parameter(w.clone())
    dw = torch.nn.Parameter(dt_from_global(w, mesh, [Shard(1)]))
    opt, ref_opt = torch.optim.SGD([dw], lr=0.5), torch.optim.SGD([ref_w], lr=0.5)
    for _ in range(3):
        ids = torch.randint(0, 9, (2, 5), generator=g)
        di = dt_from_global(ids, mesh, [Replicate()])
        ref = F.embedding(ids, ref_w, max_norm=1.2)
        out = F.embedding(di, dw, max_norm=1.2)
        assert_dtensor_close(out, ref.detach())
        ref.square().sum().backward()
        out.square().sum().backward()
        ref_opt.step(), opt.step()
        ref_opt.zero_grad(), opt.zero_grad()
        assert_dtensor_close(dw.detach(), ref_w.detach())
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
    # 6 option sets x every table layout (3 on 1-D, 9 on 2-D; scale_grad_by_freq skips the
    # row-sharded ones) x 2 index layouts
    per = (5 * 3 + 2) * 2 if world == 2 else (5 * 9 + 4) * 2
    assert pool.run(check_max_norm) == [per] * world


@pytest.mark.parametrize("world", [2, 4])
def test_max_norm_refusals(world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    assert pool.run(check_max_norm_refusals) == [2] * world


def test_max_norm_repeated(dist2):
    assert dist2.run(check_max_norm_repeated) == [1, 1]
