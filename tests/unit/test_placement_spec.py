"""Placements, meshes and specs in one process: values, errors, and local shapes/offsets
against nested torch.chunk on a real tensor."""

from __future__ import annotations

import itertools
import pickle

import pytest
import torch

from hyper_shard import DeviceMesh, Partial, Replicate, Shard
from hyper_shard.placement import grad_placement, normalize_placements
from hyper_shard.spec import DTensorSpec, TensorMeta, chunk_sizes, contiguous_stride


def test_placements_are_values():
    assert Shard(1) == Shard(1) and Shard(1) != Shard(0) and Shard(0) != Replicate()
    assert len({Shard(1), Shard(1), Replicate(), Replicate(), Partial(), Partial("sum")}) == 3
    assert Partial("mean") == Partial("avg") and Partial("max") != Partial()
    assert repr(Shard(-1)) == "Shard(dim=-1)" and repr(Partial("max")) == "Partial(max)"
    assert str(Shard(2)) == "S(2)" and str(Replicate()) == "R" and str(Partial()) == "P"
    for p in (Shard(3), Replicate(), Partial("prod")):
        assert pickle.loads(pickle.dumps(p)) == p
    with pytest.raises(AttributeError):
        Shard(0).dim = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="use one of"):
        Partial("median")
    with pytest.raises(TypeError):
        Shard(1.0)  # type: ignore[arg-type]


def test_normalize_placements():
    assert normalize_placements([Shard(-1), Replicate()], 2, 3) == (Shard(2), Replicate())
    with pytest.raises(ValueError, match="one placement per mesh dimension"):
        normalize_placements([Shard(0)], 2, 2)
    with pytest.raises(IndexError, match="out of range"):
        normalize_placements([Shard(2)], 1, 2)
    with pytest.raises(TypeError, match="Replicate\\(\\)"):
        normalize_placements([Replicate], 1, 2)  # type: ignore[list-item]


def test_grad_placements():
    assert grad_placement(Shard(1)) == Shard(1)
    assert grad_placement(Replicate()) == Partial("sum")
    assert grad_placement(Partial()) == Replicate()
    assert grad_placement(Partial("avg")) == Partial("sum")


@pytest.mark.parametrize("extent,n", [(10, 4), (5, 4), (1, 4), (0, 2), (8, 2), (3, 3)])
def test_chunk_sizes_match_torch_chunk(extent, n):
    got = chunk_sizes(extent, n)
    want = [c.shape[0] for c in torch.chunk(torch.arange(extent), n)] if extent else []
    want += [0] * (n - len(want))
    assert got == want


def test_mesh_queries():
    mesh = DeviceMesh.abstract((2, 3), ("dp", "tp"), rank=4)
    assert mesh.shape == (2, 3) and mesh.ndim == 2 and mesh.size() == 6 and mesh.size(1) == 3
    assert mesh.get_coordinate() == (1, 1)
    assert mesh.get_local_rank("tp") == 1
    assert mesh.mesh == [[0, 1, 2], [3, 4, 5]]
    sub = mesh["tp"]
    assert sub.mesh == [3, 4, 5] and sub.get_coordinate() == (1,)
    assert mesh["dp"].mesh == [1, 4]
    assert mesh[("tp", "dp")].mesh == [[0, 3], [1, 4], [2, 5]]
    assert mesh == DeviceMesh.abstract((2, 3), ("dp", "tp"), rank=4)
    # the rank holding a mesh is part of its identity (ranks may be threads of one process:
    # docs/architecture.md, "Ranks as threads")
    assert mesh != DeviceMesh.abstract((2, 3), ("dp", "tp"))
    with pytest.raises(KeyError, match="has dims"):
        mesh["pp"]
    with pytest.raises(RuntimeError, match="abstract"):
        mesh.get_group(0)
    with pytest.raises(ValueError, match="ragged"):
        DeviceMesh("cpu", [[0, 1], [2]], _abstract=True)
    with pytest.raises(ValueError, match="twice"):
        DeviceMesh("cpu", [0, 0], _abstract=True)


def _nested_chunk(t, mesh_shape, placements, coord):
    for m, p in enumerate(placements):
        if isinstance(p, Shard):
            chunks = list(torch.chunk(t, mesh_shape[m], dim=p.dim))
            shape = list(t.shape)
            shape[p.dim] = 0
            chunks += [t.new_empty(shape)] * (mesh_shape[m] - len(chunks))
            t = chunks[coord[m]]
    return t


@pytest.mark.parametrize("mesh_shape", [(4,), (2, 2), (2, 3), (2, 2, 2)])
@pytest.mark.parametrize("shape", [(7,), (5, 3), (1, 4), (6, 0), (3, 5, 2), (9, 2, 4)])
def test_local_shape_and_offset_match_nested_torch_chunk(mesh_shape, shape):
    """Every placement combination, every coordinate: shape and offset of the shard equal
    those of nested torch.chunk of an arange tensor (offset read from its first element)."""
    glob = torch.arange(int(torch.tensor(shape).prod())).reshape(shape)
    mesh = DeviceMesh.abstract(mesh_shape)
    opts = [Replicate(), Partial(), *[Shard(d) for d in range(len(shape))]]
    meta = TensorMeta(shape, contiguous_stride(shape), torch.int64, 8)
    for pl in itertools.product(opts, repeat=len(mesh_shape)):
        spec = DTensorSpec(mesh, pl, meta)
        for coord in itertools.product(*[range(s) for s in mesh_shape]):
            want = _nested_chunk(glob, mesh_shape, pl, coord)
            lshape, off = spec.local_shape_and_offset(coord)
            assert lshape == tuple(want.shape), (pl, coord)
            if want.numel():
                first = int(want.reshape(-1)[0])
                assert off == tuple(
                    int(i) for i in torch.unravel_index(torch.tensor(first), shape)
                ), (pl, coord)
                # the shard is the slice [off, off + lshape) of the global tensor
                sl = glob[tuple(slice(o, o + s) for o, s in zip(off, lshape))]
                assert torch.equal(sl, want)


def test_alias_form_round_trip():
    mesh = DeviceMesh.abstract((2, 4), ("dp", "tp"))
    meta = TensorMeta((8, 6, 4), contiguous_stride((8, 6, 4)), "f32", 4)
    for pl in itertools.product([Replicate(), Partial(), Shard(0), Shard(1), Shard(2)], repeat=2):
        spec = DTensorSpec(mesh, pl, meta)
        alias = spec.to_alias()
        back = DTensorSpec.from_alias(mesh, alias.tensor_map, meta, alias.partial)
        assert back == spec, (pl, alias)
    spec = DTensorSpec(mesh, [Shard(0), Shard(0)], meta)
    alias = spec.to_alias()
    assert alias.tensor_map == (("dp", "tp"), "None", "None")
    assert alias.tensor_map_ints == ((1, 0), -1, -1)
    spec = DTensorSpec(mesh, [Shard(1), Partial()], meta)
    assert spec.to_alias().tensor_map_ints == (-1, 1, -1) and spec.to_alias().partial == {
        "tp": "sum"
    }
    # a tuple against the mesh order is a shard order (tp splits first), both ways
    rev = DTensorSpec.from_alias(mesh, [("tp", "dp"), "None", "None"], meta)
    assert rev.placements == (Shard(0), Shard(0)) and rev.split_order(0) == (1, 0)
    assert rev.to_alias().tensor_map == (("tp", "dp"), "None", "None")
    assert rev != DTensorSpec(mesh, [Shard(0), Shard(0)], meta)
    with pytest.raises(ValueError, match="not one of"):
        DTensorSpec.from_alias(mesh, ["pp", "None", "None"], meta)


def test_spec_hash_and_key():
    mesh = DeviceMesh.abstract((2,))
    meta = TensorMeta((4, 4), (4, 1), "f32", 4)
    a, b = DTensorSpec(mesh, [Shard(-1)], meta), DTensorSpec(mesh, [Shard(1)], meta)
    assert a == b and hash(a) == hash(b) and a.placements == (Shard(1),)
    assert a != DTensorSpec(mesh, [Shard(0)], meta)
