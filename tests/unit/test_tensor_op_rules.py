"""The tensor-op, indexing and foreach rules in one process: index parsing, split/chunk
sizes and local slices against torch / brute force, and decisions on abstract meshes."""

from __future__ import annotations

import itertools

import pytest
import torch

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.errors import ShardingError
from hyper_shard.rules._index_model import local_slice, parse_index
from hyper_shard.rules.foreach import element_strategies
from hyper_shard.rules.tensor_ops import chunk_sizes_torch, split_sizes
from hyper_shard.spec import DTensorSpec, TensorMeta, chunk_sizes, contiguous_stride

R = Replicate()
MESH = DeviceMesh.abstract((2,))


class _FakeDT:
    """Stands for an index DTensor: parse_index only reads ``_spec``."""

    def __init__(self, t: torch.Tensor) -> None:
        shape = tuple(t.shape)
        self._spec = DTensorSpec(
            MESH, [R], TensorMeta(shape, contiguous_stride(shape), t.dtype, t.element_size())
        )


def _ti(*vals):
    return torch.tensor(vals if len(vals) > 1 else vals[0])


INDEXES = [
    0, -1, slice(None), slice(1, None), slice(None, None, 2), slice(1, 3), None, Ellipsis,
    (0, 1), (0, slice(None), 2), (slice(None), None, 1), (Ellipsis, 0), (None, Ellipsis, None),
    (0, Ellipsis, slice(1, 4, 2)), True, False, (0, True), (slice(None), False, 1),
    [0, 2], [[0, 1], [2, 2]], [True, False, True], (0, [1, 3]), ([0, 2], slice(None), [1, 4]),
    (slice(None), [0, 1], [2, 3]), ([0, 1], 0, [1, 2]), ([0, 1], None, [1, 2]),
    (None, [0, 1], [2, 3]), (0, slice(None), [1, 2]), ([[0], [1]], slice(None), [0, 3]),
    ("T", slice(None)), (slice(None), "T"), ("T", "T2"), ("T", slice(None), "T2"),
    (Ellipsis, "T2"), (0, "T2"), ("T0",), (slice(None), "T0", "T"),
]  # fmt: skip


def _real_and_fake(index):
    tensors = {
        "T": torch.tensor([0, 2, 1, 1]),
        "T2": torch.tensor([[1], [3]]),
        "T0": torch.tensor(1),
    }

    def conv(v, fake):
        if isinstance(v, str):
            return _FakeDT(tensors[v]) if fake else tensors[v]
        return v

    if isinstance(index, tuple):
        return tuple(conv(v, False) for v in index), tuple(conv(v, True) for v in index)
    return conv(index, False), conv(index, True)


@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence")
@pytest.mark.parametrize("index", INDEXES, ids=repr)
def test_getitem_shape_matches_torch(index):
    x = torch.zeros(3, 4, 5)
    real, fake = _real_and_fake(index)
    try:
        want = tuple(x[real].shape)
    except (IndexError, RuntimeError, TypeError):
        with pytest.raises((IndexError, TypeError, ValueError)):  # we refuse it too
            parse_index(x.shape, fake)
        return
    assert parse_index(x.shape, fake).out_shape == want


def test_getitem_keeps_untouched_dims():
    f = parse_index((3, 4, 5), (slice(None), 1, slice(0, 5)))
    assert f.keep == {0: 0, 2: 1} and 1 in f.ints
    f = parse_index((3, 4, 5), (None, slice(1, 3), Ellipsis))
    assert f.keep == {1: 2, 2: 3} and 0 in f.slices
    # an index DTensor's dims land where the advanced block goes
    f = parse_index((3, 4, 5), (slice(None), _FakeDT(torch.zeros(2, 6, dtype=torch.long))))
    assert f.out_shape == (3, 2, 6, 5) and f.adv_out == {1: {0: 1, 1: 2}}


def test_getitem_errors():
    with pytest.raises(IndexError, match="too many indices"):
        parse_index((3, 4), (0, 0, 0))
    with pytest.raises(IndexError, match="single ellipsis"):
        parse_index((3, 4), (Ellipsis, Ellipsis))
    with pytest.raises(IndexError, match="out of bounds"):
        parse_index((3, 4), (0, 4))
    with pytest.raises(TypeError, match="long, int or bool"):
        parse_index((3, 4), _FakeDT(torch.zeros(2)))
    with pytest.raises(ShardingError, match="python bool"):
        parse_index((3, 4), _FakeDT(torch.tensor(True)))
    mask = parse_index((3, 4, 5), _FakeDT(torch.zeros(3, 4, dtype=torch.bool)))
    assert mask.out_shape == (None, 5) and len(mask.masks) == 1


@pytest.mark.parametrize("n", range(0, 10))
def test_split_and_chunk_sizes_match_torch(n):
    x = torch.zeros(n)
    for s in range(1, 5):
        assert split_sizes(n, s) == [t.numel() for t in torch.split(x, s)]
    for c in range(1, 6):
        assert chunk_sizes_torch(n, c) == [t.numel() for t in torch.chunk(x, c)]


@pytest.mark.parametrize("n", range(0, 9))
def test_local_slice_brute_force(n):
    """Every rank's local slice picks exactly its part of the global slice, in order."""
    for start, stop, step in itertools.product((None, 0, 1, 3, -2), (None, 2, 5, -1), (1, 2, 3)):
        sl = slice(start, stop, step)
        picked = list(range(n))[sl]
        for ranks in (2, 3, 4):
            got: list[int] = []
            lo = 0
            for size in chunk_sizes(n, ranks):
                local, k0, cnt = local_slice(sl, n, lo, size)
                part = list(range(lo, lo + size))[local] if local is not None else []
                assert len(part) == cnt
                if cnt:
                    assert picked[k0 : k0 + cnt] == part
                got += part
                lo += size
            assert got == picked, (n, sl, ranks)


def _spec(shape, pl, mesh=MESH, dtype=torch.float32):
    return DTensorSpec(mesh, pl, TensorMeta(tuple(shape), contiguous_stride(shape), dtype, 4))


def test_foreach_element_strategies():
    shapes = [(4, 3), (3,)]
    pl = [(Shard(0),), (R,)]
    st = element_strategies(shapes, 2, "linear", True, pl)
    assert ((Shard(0),), (Shard(0), R)) in st and ((Shard(1),), (Shard(1), Shard(0))) in st
    assert ((Partial(),), (Partial(), Partial())) in st
    assert not any(o[0] == Partial() for o, _ in element_strategies(shapes, 2, "linear", False, pl))
    mul = element_strategies([(2,), (2,)], 2, "bilinear", True, pl)
    assert ((Partial(),), (Partial(), R)) in mul and ((Partial(),), (R, Partial())) in mul
    assert ((Partial(),), (Partial(), Partial())) not in mul
    cmul = element_strategies([(2,)] * 3, 3, "addcmul", True, pl)
    assert ((Partial(),), (Partial(), R, Partial())) in cmul
    assert element_strategies([(2,)], 1, "gather", True, pl) == []
