"""The view family in one process: the pure dim mapping against brute force on real tensors,
global shapes and errors against torch, and every rank of abstract meshes simulated (rule
decision + the local torch op with its rank-local arguments) against the plain op."""

from __future__ import annotations

import itertools
import math
import random

import pytest
import torch

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.dispatch.op import OpCall
from hyper_shard.errors import ShardingError
from hyper_shard.platform.torch.names import resolve_torch_op
from hyper_shard.registry import get_registry
from hyper_shard.rules import _view_dims as vd
from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride

R = Replicate()


# ---------------------------------------------------------------------- brute force
def _pieces(t: torch.Tensor, dim: int, splits) -> list[torch.Tensor]:
    """Nested torch.chunk pieces of ``t`` along ``dim`` (padded with empty pieces), in mesh
    coordinate order."""
    pieces = [t]
    for n in splits:
        nxt = []
        for p in pieces:
            cs = list(torch.chunk(p, n, dim)) if p.shape[dim] else []
            nxt += cs + [p.narrow(dim, 0, 0)] * (n - len(cs))
        pieces = nxt
    return pieces


def _exact(a, b, d, o, splits) -> bool:
    """Does every rank's torch.chunk piece of input dim ``d`` hold exactly (same elements,
    same order) its piece of output dim ``o`` after ``reshape(a -> b)``?"""
    x = torch.arange(math.prod(a)).reshape(a)
    y = x.reshape(b)
    return all(
        torch.equal(p.reshape(-1), q.reshape(-1))
        for p, q in zip(_pieces(x, d, splits), _pieces(y, o, splits))
    )


def _factorizations(n: int, k: int) -> list[tuple[int, ...]]:
    if k == 1:
        return [(n,)]
    return [
        (f, *rest) for f in range(1, n + 1) if n % f == 0 for rest in _factorizations(n // f, k - 1)
    ]


_SPLITS = [[2], [3], [4], [2, 2], [2, 3], [3, 2]]


def test_reshape_shard_target_matches_brute_force():
    """Sound: a kept shard is exact. Complete: whenever a non-size-1 input dim's pieces are
    exactly some non-size-1 output dim's pieces, the shard is kept."""
    rng = random.Random(0)
    checked = kept = 0
    for numel in (6, 8, 12, 24, 36):
        shapes = [s for k in (1, 2, 3) for s in _factorizations(numel, k)]
        pairs = [(a, b) for a in shapes for b in shapes]
        for a, b in rng.sample(pairs, min(60, len(pairs))):
            dmap = vd.reshape_map(a, b)
            for d, splits in itertools.product(range(len(a)), _SPLITS):
                mine = vd.shard_target(dmap, d, splits)
                exact = {o for o in range(len(b)) if _exact(a, b, d, o, splits)}
                if mine is not None:
                    assert mine in exact, (a, b, d, splits, mine)
                    kept += 1
                if a[d] > 1 and any(b[o] > 1 for o in exact):
                    assert mine is not None, (a, b, d, splits, exact)
                checked += 1
    assert kept > 50 and checked > 1000


def test_reshape_map_groups():
    """Groups are minimal and hold equal products; size-1 dims stand alone."""
    rng = random.Random(1)
    for _ in range(300):
        a = tuple(rng.choice([1, 2, 3, 4, 6]) for _ in range(rng.randint(0, 4)))
        shapes = [s for k in (1, 2, 3, 4) for s in _factorizations(math.prod(a), k)]
        b = rng.choice(shapes)
        dmap = vd.reshape_map(a, b)
        assert sorted(i for g in dmap.groups for i in g.ins) == list(range(len(a)))
        assert sorted(j for g in dmap.groups for j in g.outs) == list(range(len(b)))
        for g in dmap.groups:
            assert math.prod(a[i] for i in g.ins) == math.prod(b[j] for j in g.outs)
            if len(g.ins) + len(g.outs) > 2:  # a proper prefix never closes a group early
                pa = [math.prod(a[i] for i in g.ins[:k]) for k in range(1, len(g.ins))]
                pb = [math.prod(b[j] for j in g.outs[:k]) for k in range(1, len(g.outs))]
                assert not set(pa) & set(pb), (a, b, g)


def test_nested_chunks_is_nested_torch_chunk():
    for extent, splits in itertools.product(range(0, 13), _SPLITS):
        want = [p.shape[0] for p in _pieces(torch.arange(extent), 0, splits)]
        assert vd.nested_chunks(extent, splits) == want


# ---------------------------------------------------------------------- shapes vs torch
_SHAPE_CASES = [
    ((4, 6), lambda t: t.view(-1, 8), lambda s: vd.infer_shape((-1, 8), math.prod(s))),
    ((4, 6), lambda t: t.view(2, -1, 3), lambda s: vd.infer_shape((2, -1, 3), math.prod(s))),
    ((0, 4), lambda t: t.view(2, 0, 3), lambda s: vd.infer_shape((2, 0, 3), math.prod(s))),
    ((), lambda t: t.view(-1), lambda s: vd.infer_shape((-1,), 1)),
    ((2, 3, 4), lambda t: t.flatten(), lambda s: vd.flatten_shape(s)),
    ((2, 3, 4), lambda t: t.flatten(1), lambda s: vd.flatten_shape(s, 1)),
    ((2, 3, 4), lambda t: t.flatten(0, -2), lambda s: vd.flatten_shape(s, 0, -2)),
    ((), lambda t: t.flatten(), lambda s: vd.flatten_shape(s)),
    ((2, 12), lambda t: t.unflatten(1, (3, -1)), lambda s: vd.unflatten_shape(s, 1, (3, -1))),
    ((2, 12), lambda t: t.unflatten(-1, (2, 2, 3)), lambda s: vd.unflatten_shape(s, -1, (2, 2, 3))),
    (
        (2, 3, 4),
        lambda t: t.movedim(0, -1),
        lambda s: tuple(s[p] for p in vd.movedim_perm(3, 0, -1)),
    ),
    (
        (2, 3, 4, 5),
        lambda t: t.movedim((0, 1), (3, 0)),
        lambda s: tuple(s[p] for p in vd.movedim_perm(4, (0, 1), (3, 0))),
    ),
    (
        (2, 3, 4),
        lambda t: t.transpose(-1, 0),
        lambda s: tuple(s[p] for p in vd.transpose_perm(3, -1, 0)),
    ),
    ((), lambda t: t.transpose(0, -1), lambda s: tuple(s[p] for p in vd.transpose_perm(0, 0, -1))),
    (
        (2, 3, 4),
        lambda t: t.permute(2, 0, 1),
        lambda s: tuple(s[p] for p in vd.check_perm((2, 0, 1), 3)),
    ),
    (
        (2, 1, 3, 1),
        lambda t: t.squeeze(),
        lambda s: vd.squeeze_map(s, vd.squeeze_dims(s)).out_shape,
    ),
    (
        (2, 1, 3, 1),
        lambda t: t.squeeze(0),
        lambda s: vd.squeeze_map(s, vd.squeeze_dims(s, 0)).out_shape,
    ),
    (
        (2, 1, 3, 1),
        lambda t: t.squeeze((1, -1)),
        lambda s: vd.squeeze_map(s, vd.squeeze_dims(s, (1, -1))).out_shape,
    ),
    ((), lambda t: t.squeeze(0), lambda s: vd.squeeze_map(s, vd.squeeze_dims(s, 0)).out_shape),
    (
        (2, 3),
        lambda t: t.unsqueeze(-1),
        lambda s: vd.unsqueeze_map(s, vd.unsqueeze_dim(2, -1)).out_shape,
    ),
    (
        (2, 3),
        lambda t: t.unsqueeze(0),
        lambda s: vd.unsqueeze_map(s, vd.unsqueeze_dim(2, 0)).out_shape,
    ),
    ((3, 1), lambda t: t.expand(2, -1, 4), lambda s: vd.expand_shape(s, (2, -1, 4))),
    ((3, 1), lambda t: t.expand(0, 3, 1), lambda s: vd.expand_shape(s, (0, 3, 1))),
    ((2, 4), lambda t: t.view(torch.float16), lambda s: vd.dtype_view_map(s, 4, 2).out_shape),
    ((2, 4), lambda t: t.view(torch.float64), lambda s: vd.dtype_view_map(s, 4, 8).out_shape),
]


@pytest.mark.parametrize("case", range(len(_SHAPE_CASES)))
def test_shapes_match_torch(case):
    shape, fn, ours = _SHAPE_CASES[case]
    assert tuple(fn(torch.empty(shape)).shape) == tuple(ours(shape))


_ERROR_CASES = [
    ((4, 6), lambda t: t.view(5, -1), lambda s: vd.infer_shape((5, -1), 24)),
    ((4, 6), lambda t: t.view(-1, -1), lambda s: vd.infer_shape((-1, -1), 24)),
    ((4, 6), lambda t: t.view(4, 7), lambda s: vd.infer_shape((4, 7), 24)),
    ((0, 4), lambda t: t.view(-1, 0), lambda s: vd.infer_shape((-1, 0), 0)),
    ((0, 4), lambda t: t.view(2, 0, -1), lambda s: vd.infer_shape((2, 0, -1), 0)),
    ((2, 3), lambda t: t.flatten(1, 0), lambda s: vd.flatten_shape(s, 1, 0)),
    ((2, 3), lambda t: t.flatten(0, 2), lambda s: vd.flatten_shape(s, 0, 2)),
    ((2, 12), lambda t: t.unflatten(1, (5, -1)), lambda s: vd.unflatten_shape(s, 1, (5, -1))),
    ((2, 3), lambda t: t.transpose(0, 2), lambda s: vd.transpose_perm(2, 0, 2)),
    ((2, 3), lambda t: t.permute(0, 0), lambda s: vd.check_perm((0, 0), 2)),
    ((2, 3), lambda t: t.permute(0), lambda s: vd.check_perm((0,), 2)),
    ((2, 3, 4), lambda t: t.movedim((0, 1), 2), lambda s: vd.movedim_perm(3, (0, 1), 2)),
    ((2, 3), lambda t: t.squeeze(2), lambda s: vd.squeeze_dims(s, 2)),
    ((2, 3), lambda t: t.unsqueeze(3), lambda s: vd.unsqueeze_dim(2, 3)),
    ((3, 2), lambda t: t.expand(3, 4), lambda s: vd.expand_shape(s, (3, 4))),
    ((3, 2), lambda t: t.expand(2), lambda s: vd.expand_shape(s, (2,))),
    ((3, 2), lambda t: t.expand(-1, 3, 2), lambda s: vd.expand_shape(s, (-1, 3, 2))),
    ((2, 3), lambda t: t.view(torch.float64), lambda s: vd.dtype_view_map(s, 4, 8)),
]


@pytest.mark.parametrize("case", range(len(_ERROR_CASES)))
def test_errors_where_torch_errors(case):
    shape, fn, ours = _ERROR_CASES[case]
    with pytest.raises((RuntimeError, IndexError, ValueError, TypeError)):
        fn(torch.empty(shape))
    with pytest.raises((IndexError, ValueError)):
        ours(shape)


# ---------------------------------------------------------------------- rank simulation
def _entry(pname: str):
    for e in get_registry().entries.values():
        if pname in e.torch:
            return e
    raise LookupError(pname)


def _slices(spec: DTensorSpec) -> tuple[slice, ...]:
    off, ls = spec.global_offset(), spec.local_shape()
    return tuple(slice(o, o + n) for o, n in zip(off, ls))


def _meta(t: torch.Tensor, shape=None) -> TensorMeta:
    shape = tuple(t.shape if shape is None else shape)
    return TensorMeta(shape, contiguous_stride(shape), t.dtype, t.element_size())


def simulate(pname, x, mesh_shape, placements, args=(), kwargs=None, other=None):
    """Decide the layout and run the local op on every rank of an abstract mesh as the
    dispatcher would (redistribute to the decided input placements, apply the rank-local
    overrides or implementation); assert every rank's local result is its slice of the
    plain op's result. ``other`` (a tensor, placements) is a second DTensor argument.

    Returns the (input, output) placements every rank decided (Shard/Replicate inputs only).
    """
    kwargs = dict(kwargs or {})
    entry = _entry(pname)
    op, func = entry.op, resolve_torch_op(pname)
    ref = func(x, *args, **kwargs) if other is None else func(x, other[0])
    decided = set()
    for r in range(math.prod(mesh_shape)):
        mesh = DeviceMesh.abstract(mesh_shape, rank=r)
        spec = DTensorSpec(mesh, placements, _meta(x))
        specs, roles, full_args = [spec], ["input"], (x, *args)
        if other is not None:
            ospec = DTensorSpec(mesh, other[1], _meta(other[0]))
            specs, roles, full_args = [spec, ospec], ["input", "other"], (x, other[0])
        static = {n: op.binder.get(full_args, kwargs, n) for n in op.static_names}
        call = OpCall(entry.name, pname, specs, roles, static, {}, False, False, full_args, kwargs)
        lay = op.infer_layout(call)
        assert tuple(lay.shapes[0]) == tuple(ref.shape)
        assert all(type(p) is not Partial for p in lay.inputs[0])
        local_args = (x[_slices(spec.with_placements(lay.inputs[0]))], *args)
        if other is not None:
            assert lay.inputs[1] is None  # other only gives a shape: never moved
            local_args = (local_args[0], other[0][_slices(specs[1])])
        a, k = local_args, dict(kwargs)
        for name, v in (lay.overrides or {}).items():
            a, k = op.binder.replace(a, k, name, v)
        out = (lay.impl or func)(*a, **k)
        ospec = DTensorSpec(mesh, lay.outputs[0], _meta(ref, lay.shapes[0]))
        want = ref[_slices(ospec)]
        assert out.shape == want.shape and torch.equal(out, want), (r, lay)
        decided.add((tuple(lay.inputs[0]), tuple(lay.outputs[0])))
    assert len(decided) == 1, decided  # every rank takes the same decision
    return decided.pop()


_OPS = [  # (torch function name, input shape, args)
    ("Tensor.view", (4, 6), (-1,)),
    ("Tensor.view", (4, 6), (2, 2, 6)),
    ("Tensor.view", (4, 6), (8, 3)),
    ("Tensor.view", (4, 6), (6, -1)),
    ("Tensor.view", (5, 4), (10, 2)),
    ("Tensor.view", (5, 4), (-1, 1)),
    ("Tensor.view", (3, 4), (12,)),
    ("Tensor.view", (12, 8), (-1, 6)),
    ("Tensor.view", (12,), (4, 3)),
    ("Tensor.view", (12,), (3, 4)),
    ("Tensor.view", (12,), (2, 3, 2)),
    ("Tensor.view", (10,), (5, 2)),
    ("Tensor.view", (6, 1, 4), (6, 4, 1)),
    ("Tensor.view", (1, 6), (6,)),
    ("Tensor.view", (2, 3, 4), (3, 8)),
    ("Tensor.view", (0, 4), (2, 0, 2)),
    ("Tensor.view", (), (1, 1)),
    ("torch.reshape", (6, 4), ((4, 3, 2),)),
    ("Tensor.reshape", (7, 3), (21,)),
    ("Tensor.flatten", (2, 3, 4), ()),
    ("Tensor.flatten", (4, 3, 2), (0, 1)),
    ("Tensor.flatten", (3, 1, 4), (1,)),
    ("torch.ravel", (6, 2), ()),
    ("Tensor.unflatten", (12, 2), (0, (4, -1))),
    ("Tensor.unflatten", (2, 12), (1, (2, 2, 3))),
    ("Tensor.transpose", (4, 3, 2), (0, 2)),
    ("torch.swapaxes", (4, 3), (0, 1)),
    ("Tensor.t", (5, 3), ()),
    ("Tensor.T.__get__", (5, 3), ()),
    ("Tensor.mT.__get__", (2, 5, 3), ()),
    ("Tensor.permute", (4, 3, 2), (2, 0, 1)),
    ("torch.movedim", (4, 3, 2), ((0, 1), (2, 0))),
    ("Tensor.squeeze", (4, 1, 3), ()),
    ("Tensor.squeeze", (2, 1, 3), (0,)),
    ("Tensor.squeeze", (4, 1, 1), ((1, 2),)),
    ("Tensor.unsqueeze", (4, 3), (1,)),
    ("Tensor.unsqueeze", (4, 3), (-1,)),
    ("Tensor.expand", (3, 1), (3, 4)),
    ("Tensor.expand", (4, 1), (2, -1, 3)),
    ("torch.broadcast_to", (1, 4), ((3, 4),)),
    ("Tensor.contiguous", (4, 3), ()),
    ("Tensor.view", (2, 1), (1, 2)),
    ("Tensor.transpose", (1, 4), (0, 1)),
    ("Tensor.expand", (1, 4), (1, 4)),
    ("Tensor.squeeze", (1, 4), ()),
    ("Tensor.unsqueeze", (), (0,)),
    ("Tensor.flatten", (), ()),
    ("Tensor.T.__get__", (), ()),
    ("Tensor.view", (4, 6), (torch.int32,)),
    ("Tensor.view", (4, 6), (torch.float16,)),
]


def _combos(ndim: int, mesh_ndim: int):
    return list(itertools.product([R, *[Shard(d) for d in range(ndim)]], repeat=mesh_ndim))


@pytest.mark.parametrize("mesh_shape", [(2,), (3,), (4,), (2, 2), (2, 3)])
def test_every_rank_matches_plain_torch(mesh_shape):
    rng = random.Random(0)
    n = 0
    for pname, shape, args in _OPS:
        x = torch.arange(math.prod(shape), dtype=torch.float32).reshape(shape)
        combos = _combos(len(shape), len(mesh_shape))
        if len(combos) > 12:
            combos = rng.sample(combos, 12)
        for pl in combos:
            simulate(pname, x, mesh_shape, pl, args)
            n += 1
    assert n > 100


@pytest.mark.parametrize("pname", ["Tensor.view_as", "Tensor.reshape_as", "Tensor.expand_as"])
def test_as_ops_use_the_other_global_shape(pname):
    x = (
        torch.arange(24.0).reshape(4, 6)
        if pname != "Tensor.expand_as"
        else torch.arange(4.0)[:, None]
    )
    o = torch.zeros((2, 12) if pname != "Tensor.expand_as" else (3, 4, 5))
    for mesh_shape in [(2,), (2, 2)]:
        for pl in _combos(x.ndim, len(mesh_shape)):
            for opl in _combos(o.ndim, len(mesh_shape))[:3]:
                simulate(pname, x, mesh_shape, pl, other=(o, opl))


# ---------------------------------------------------------------------- decisions
# Expected placements below follow from torch.chunk arithmetic, worked out in the comments.
S0, S1, S2 = Shard(0), Shard(1), Shard(2)


def _decide(pname, shape, args, mesh_shape, placements):
    entry = _entry(pname)
    mesh = DeviceMesh.abstract(mesh_shape)
    x = torch.empty(shape)
    spec = DTensorSpec(mesh, placements, _meta(x))
    full_args = (x, *args)
    static = {n: entry.op.binder.get(full_args, {}, n) for n in entry.op.static_names}
    call = OpCall(entry.name, pname, [spec], ["input"], static, {}, False, False, full_args, {})
    return entry.op.infer_layout(call)


@pytest.mark.parametrize(
    "pname, shape, args, mesh_shape, placements, want_out",
    [
        # 4 rows over 2 ranks = 2 rows of 6 = 12 elements each = chunk(24, 2)
        ("Tensor.view", (4, 6), (-1,), (2,), (S0,), (S0,)),
        # 8 rows over 4: 2 rows * 3 = 6 = chunk(24, 4); flattening (2, 4) into 8 over 2
        ("Tensor.view", (8, 3), (-1,), (4,), (S0,), (S0,)),
        ("Tensor.flatten", (2, 4, 3), (1,), (2,), (S1,), (S1,)),
        # split 12 -> (4, 3): chunk(12, 2) = [6, 6] = chunk(4, 2) * 3
        ("Tensor.view", (12,), (4, 3), (2,), (S0,), (S0,)),
        ("Tensor.unflatten", (2, 12), (1, (4, 3)), (2,), (S1,), (S1,)),
        # uneven but aligned: chunk(5, 2) = [3, 2] rows of 4 = chunk(5, 2) rows of (2, 2)
        ("Tensor.view", (5, 4), (5, 2, 2), (2,), (S0,), (S0,)),
        # nested: 8 rows -> [2, 2, 2, 2] rows * 3 = 6 each = nested chunks of 24
        ("Tensor.view", (8, 3), (24,), (2, 2), (S0, S0), (S0, S0)),
        ("Tensor.transpose", (4, 6), (0, 1), (2, 2), (S0, S1), (S1, S0)),
        ("Tensor.movedim", (4, 6, 2), (0, -1), (2, 2), (S0, S1), (S2, S0)),
        ("Tensor.permute", (2, 4, 6), (2, 0, 1), (2,), (Partial(),), (Partial(),)),
        ("Tensor.view", (4, 6), (2, 12), (2, 2), (Partial("max"), S0), (Partial("max"), S0)),
        ("Tensor.transpose", (), (0, 0), (2,), (Partial(),), (Partial(),)),
        ("Tensor.expand", (4, 1), (2, 4, 3), (2,), (S0,), (S1,)),
        ("Tensor.expand", (4, 1), (2, 4, 3), (2,), (Partial(),), (Partial(),)),
        ("Tensor.squeeze", (4, 1, 3), (), (2,), (S2,), (S1,)),
        ("Tensor.unsqueeze", (4, 3), (0,), (2,), (S1,), (S2,)),
        # same element size: a dtype view keeps shards
        ("Tensor.view", (4, 6), (torch.int32,), (2,), (S1,), (S1,)),
    ],
)
def test_shards_kept(pname, shape, args, mesh_shape, placements, want_out):
    lay = _decide(pname, shape, args, mesh_shape, placements)
    assert tuple(lay.inputs[0]) == placements and tuple(lay.outputs[0]) == want_out
    assert lay.cost == 0.0


@pytest.mark.parametrize(
    "pname, shape, args, mesh_shape, placements, moved",
    [
        # rows chunk(3, 2) = [2, 1] * 4 = [8, 4] != chunk(12, 2) = [6, 6]
        ("Tensor.view", (3, 4), (12,), (2,), (S0,), 0),
        # a sharded non-leading dim of a flattened group holds strided data
        ("Tensor.view", (12, 8), (-1, 6), (4,), (S1,), 0),
        ("Tensor.flatten", (4, 3, 2), (1,), (2, 2), (S0, S2), 1),
        # split 12 -> (3, 4): chunk(3, 2) * 4 = [8, 4] != [6, 6]
        ("Tensor.view", (12,), (3, 4), (2,), (S0,), 0),
        # nested: 6 rows -> [2, 1, 2, 1] rows * 4 = [8, 4, 8, 4] != [6, 6, 6, 6], although
        # either mesh dim alone (chunk(6, 2) * 4 = [12, 12] = chunk(24, 2)) would be exact
        ("Tensor.view", (6, 4), (24,), (2, 2), (S0, S0), 1),
        # bits of a partial sum are not the sum of the bits
        ("Tensor.view", (4, 6), (torch.int32,), (2,), (Partial(),), 0),
        # the last dim of a dtype view that changes the element size
        ("Tensor.view", (4, 6), (torch.float16,), (2,), (S1,), 0),
        # a broadcast dim, a squeezed dim
        ("Tensor.expand", (3, 1), (3, 4), (2,), (S1,), 0),
        ("Tensor.squeeze", (4, 1, 3), (), (2,), (S1,), 0),
        # a size-1 dim paired with no output dim
        ("Tensor.view", (2, 1), (1, 2), (2,), (S1,), 0),
    ],
)
def test_shards_moved(pname, shape, args, mesh_shape, placements, moved):
    """The placement on mesh dim ``moved`` cannot stay; nothing Partial is introduced."""
    lay = _decide(pname, shape, args, mesh_shape, placements)
    got = tuple(lay.inputs[0])
    assert got[moved] != placements[moved] and lay.cost > 0
    assert all(type(p) is not Partial for m, p in enumerate(got) if p != placements[m])
    for m, p in enumerate(got):  # the other mesh dims keep what they can
        if m != moved and type(placements[m]) is not Shard:
            assert p == placements[m]


@pytest.mark.parametrize(
    "pname, shape, args, exc, match",
    [
        (
            "Tensor.view",
            (4, 6),
            (5, -1),
            ShardingError,
            r"Tensor.view\(input=DTensor\[4, 6\]\[S\(0\)\]\).*GLOBAL",
        ),
        ("Tensor.transpose", (4, 6), (0, 2), IndexError, "Tensor.transpose.*out of range"),
        ("Tensor.expand", (3, 2), (3, 4), ShardingError, "Tensor.expand.*non-singleton"),
        ("Tensor.t", (2, 3, 4), (), ShardingError, r"t\(\) expects"),
        ("Tensor.mT.__get__", (3,), (), ShardingError, "mT"),
        ("Tensor.view", (4, 6), ("a",), TypeError, "Tensor.view"),
    ],
)
def test_errors_name_the_op(pname, shape, args, exc, match):
    entry = _entry(pname)
    mesh = DeviceMesh.abstract((2,))
    x = torch.empty(shape)
    spec = DTensorSpec(mesh, [Shard(0)], _meta(x))
    full_args = (x, *args)
    static = {n: entry.op.binder.get(full_args, {}, n) for n in entry.op.static_names}
    call = OpCall(entry.name, pname, [spec], ["input"], static, {}, False, False, full_args, {})
    with pytest.raises(exc, match=match):
        entry.op.infer_layout(call)
