"""View ops on real gloo ranks against plain torch on the same global input, forward and
backward: every placement combination on 2 ranks, a fixed random sample on a (2, 2) mesh,
and a 1-D mesh of 4 ranks (where ``(12, 8)`` ``Shard(1)`` ``.view(-1, 6)`` must be right)."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from hyper_shard import Partial, Replicate, Shard, init_device_mesh
from tests._helpers import all_combos, assert_dtensor_close, check_op, dt_from_global

pytestmark = pytest.mark.multiproc

PARTIALS = ("sum", "max")


def _mesh(world):
    return init_device_mesh("cpu", (2, 2) if world == 4 else (world,))


def _sample(combos, k, mesh):
    """Every combination on a 1-D mesh; a fixed random sample of ``k`` on a 2-D one."""
    return combos if mesh.ndim == 1 or len(combos) <= k else random.Random(0).sample(combos, k)


def _check_all(mesh, cases, k, partials=PARTIALS):
    """``cases``: (global tensor, [functions of it]); each function over the sampled combos."""
    n = 0
    for t, fns in cases:
        combos = _sample(all_combos([t], mesh.ndim, partials), k, mesh)
        for fn in fns:
            n += check_op(fn, [t], mesh, combos)
    return n


def check_reshapes(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g)  # even on 2 and 4 ranks
    u = torch.randn(5, 4, generator=g)  # uneven rows
    w = torch.randn(3, 4, generator=g)  # 3 rows over 2 ranks: flattening must gather
    v = torch.randn(12, generator=g)
    z = torch.randn(2, 3, 4, generator=g)
    cases = [
        (x, [lambda a: a.view(-1), lambda a: a.view(2, 2, 6), lambda a: a.view(8, 3),
             lambda a: a.view(6, -1), lambda a: torch.reshape(a, (3, 8)), lambda a: a.view(1, 24)]),
        (u, [lambda a: a.view(-1), lambda a: a.view(5, 2, 2), lambda a: a.view(10, 2),
             lambda a: a.reshape(20, 1)]),
        (w, [lambda a: a.view(12), lambda a: a.flatten()]),
        (v, [lambda a: a.view(4, 3), lambda a: a.view(3, 4), lambda a: a.unflatten(0, (2, -1)),
             lambda a: a.view(2, 3, 2)]),
        (z, [lambda a: a.flatten(0, 1), lambda a: torch.flatten(a, 1), lambda a: torch.ravel(a),
             lambda a: a.unflatten(-1, (2, 2)), lambda a: a.view(6, 4), lambda a: a.view(2, 12)]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6)


def check_permutes(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(5, 4, generator=g)
    z = torch.randn(3, 2, 5, generator=g)
    s = torch.randn((), generator=g)
    cases = [
        (x, [lambda a: a.transpose(0, 1), lambda a: a.t(), lambda a: a.T,
             lambda a: torch.swapaxes(a, 0, 1), lambda a: a.transpose(0, 1).contiguous()]),
        (z, [lambda a: torch.transpose(a, 0, 2), lambda a: a.swapdims(1, 2), lambda a: a.mT,
             lambda a: a.permute(2, 0, 1), lambda a: torch.movedim(a, 0, -1),
             lambda a: a.moveaxis((0, 1), (2, 0))]),
        # 0-d: transpose(0, 0) is the identity in torch (a regression case)
        (s, [lambda a: a.transpose(0, 0), lambda a: a.t(), lambda a: a.view(1),
             lambda a: a.reshape(()), lambda a: a.unsqueeze(0), lambda a: a.flatten(),
             lambda a: a.expand(3), lambda a: a.squeeze()]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6, ("sum", "avg", "max"))


def check_squeeze_expand(rank, world):
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(4, 1, 3, 1, generator=g)
    p = torch.randn(2, 1, 3, generator=g)  # 2 rows over 2 ranks: size 1 locally, not squeezed
    e = torch.randn(3, 1, generator=g)
    cases = [
        (q, [lambda a: a.squeeze(), lambda a: a.squeeze(1), lambda a: torch.squeeze(a, (1, 3)),
             lambda a: a.squeeze(0), lambda a: a.unsqueeze(0), lambda a: a.unsqueeze(-1)]),
        (p, [lambda a: a.squeeze(), lambda a: a.squeeze(0), lambda a: a.unsqueeze(1)]),
        (e, [lambda a: a.expand(3, 4), lambda a: a.expand(2, 3, 4), lambda a: a.expand(-1, 5),
             lambda a: torch.broadcast_to(a, (2, 3, 5)), lambda a: a.expand(2, -1, -1) * 2]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 6)


def check_as_ops(rank, world):
    """view_as / reshape_as / expand_as: ``other`` (a DTensor, any placements) gives only its
    global shape; only ``input`` is differentiated."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(3)
    x, o = torch.randn(4, 6, generator=g), torch.randn(2, 12, generator=g)
    e, eo = torch.randn(3, 1, generator=g), torch.randn(2, 3, 4, generator=g)
    n = 0
    for fn in (lambda a, b: a.view_as(b), lambda a, b: a.reshape_as(b)):
        n += check_op(fn, [x, o], mesh, _sample(all_combos([x, o], mesh.ndim), 12, mesh))
    n += check_op(
        lambda a, b: a.expand_as(b),
        [e, eo],
        mesh,
        _sample(all_combos([e, eo], mesh.ndim), 12, mesh),
    )
    return n


def check_dtype_views(rank, world):
    """``view(dtype)``: bits of a Partial sum are not the sum of the bits (reduced first); a
    changed element size needs the last dim whole. The input is the int32 bits of random
    floats (integer Partial decompositions are exact; viewed back they are those floats)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    t = torch.randn(4, 6, generator=torch.Generator().manual_seed(4)).view(torch.int32)
    opts = [Replicate(), Shard(0), Shard(1), Partial("sum")]
    combos = _sample([[pl] for pl in itertools.product(opts, repeat=mesh.ndim)], 8, mesh)
    n = 0
    for fn in (
        lambda a: a.view(torch.float32),
        lambda a: a.view(torch.int16),
        lambda a: a.view(torch.int64),
    ):
        n += check_op(fn, [t], mesh, combos, grad=False)
    return n


def check_nested(rank, world):
    """(2, 2) mesh, both mesh dims sharding one tensor dim: the combined pieces decide (6 rows
    split 2 x 2 are [2, 1, 2, 1] rows: flattening them is not torch.chunk of 24)."""
    torch.set_num_threads(1)
    mesh = _mesh(world)
    g = torch.Generator().manual_seed(6)
    a, b, c = (
        torch.randn(6, 4, generator=g),
        torch.randn(8, 3, generator=g),
        torch.randn(12, generator=g),
    )
    S0, S1, P = Shard(0), Shard(1), Partial()
    combos = [[(S0, S0)], [(S0, S1)], [(S1, S0)], [(P, S0)], [(S0, P)]]
    n = 0
    for t, fns in [
        (a, [lambda x: x.view(-1), lambda x: x.view(3, 8), lambda x: x.t().reshape(-1)]),
        (
            b,
            [
                lambda x: x.view(-1),
                lambda x: x.view(2, 12),
                lambda x: x.flatten().unflatten(0, (4, 6)),
            ],
        ),
    ]:
        for fn in fns:
            n += check_op(fn, [t], mesh, combos)
    for fn in (lambda x: x.view(4, 3), lambda x: x.view(3, 4), lambda x: x.view(2, 2, 3)):
        n += check_op(fn, [c], mesh, [[(S0, S0)], [(P, S0)], [(S0, P)]])
    return n


def check_mesh4_1d(rank, world):
    """A 1-D mesh of 4 ranks: uneven chunks (3 rows over 4 ranks, an empty shard) and the
    view PyTorch DTensor gets wrong: (12, 8) Shard(1) -> view(-1, 6)."""
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (4,))
    g = torch.Generator().manual_seed(5)
    t = torch.randn(12, 8, generator=g)
    x = dt_from_global(t, mesh, [Shard(1)])
    for _ in range(2):  # the second call hits the layout cache (rank-local shapes kept)
        y = x.view(-1, 6)
        assert tuple(y.shape) == (16, 6)
        assert_dtensor_close(y, t.view(-1, 6))
        torch.testing.assert_close(y.full_tensor(), t.view(-1, 6))
    u = torch.randn(6, 5, generator=g)
    w = torch.randn(3, 4, generator=g)
    cases = [
        (t, [lambda a: a.view(-1, 6), lambda a: a.view(16, 6), lambda a: a.reshape(8, 12),
             lambda a: a.view(-1), lambda a: a.view(3, 4, 8), lambda a: a.view(4, 3, 2, 4),
             lambda a: a.t(), lambda a: a.unflatten(0, (4, 3))]),
        (u, [lambda a: a.view(-1), lambda a: a.view(3, 10), lambda a: a.T, lambda a: a.unsqueeze(1)]),
        (w, [lambda a: a.view(-1), lambda a: a.view(3, 2, 2), lambda a: a.squeeze()]),
    ]  # fmt: skip
    return _check_all(mesh, cases, 0)


_CHECKS = {
    "reshapes": check_reshapes,
    "permutes": check_permutes,
    "squeeze_expand": check_squeeze_expand,
    "as_ops": check_as_ops,
    "dtype_views": check_dtype_views,
}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("name", list(_CHECKS))
def test_view_ops(name, world, dist2, dist4):
    pool = dist2 if world == 2 else dist4
    counts = pool.run(_CHECKS[name])
    assert counts[0] > 0 and len(set(counts)) == 1


def test_nested_shards(dist4):
    counts = dist4.run(check_nested)
    assert counts[0] > 0 and len(set(counts)) == 1


def test_view_on_mesh_of_4(dist4):
    counts = dist4.run(check_mesh4_1d)
    assert counts[0] > 0 and len(set(counts)) == 1
