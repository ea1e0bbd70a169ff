"""The framework-neutral checkpoint core, in one process (numpy, abstract meshes):

* the checksum adds up over any partition of a chunk into boxes (rows and columns), and
  changes with one changed element, a moved row, a truncated region;
* the planner: boxes per mesh coordinate (``torch.chunk`` layout, nesting left to right),
  one writer per box balanced over its holders, and read slices that rebuild any target
  box of any saved layout (checked against numpy slicing of the global array);
* flattening equals torch.distributed.checkpoint's own;
* the index: object codec, schema and coverage errors naming the file and field;
* storage: slice reads, collective-style verification, the commit replacing the previous
  checkpoint's files only once the new index is in place.
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from hyper_shard import DeviceMesh, DTensorSpec, Partial, Replicate, Shard, TensorMeta
from hyper_shard.checkpoint import checksum as cs
from hyper_shard.checkpoint.errors import CheckpointError
from hyper_shard.checkpoint.format import (
    ChunkEntry,
    Index,
    TensorEntry,
    decode_object,
    encode_object,
    read_index,
)
from hyper_shard.checkpoint.layout import Chunk, assign_writers, chunk_of, holders, read_boxes
from hyper_shard.checkpoint.state import flatten, rename, set_element
from hyper_shard.checkpoint.storage import ShardFiles, commit, verify_reads, write_shard
from hyper_shard.spec import contiguous_stride

RNG = np.random.default_rng(0)


# ---------------------------------------------------------------------- checksum
@pytest.mark.parametrize(
    "dtype, shape",
    [(np.float32, (7, 5)), (np.float16, (4, 3, 2)), (np.int64, (9,)), (np.bool_, (3, 4)),
     (np.uint8, ()), (np.complex64, (2, 3))],
)  # fmt: skip
def test_checksum_adds_up_over_any_box_partition(dtype, shape) -> None:
    a = (RNG.standard_normal(shape) * 100).astype(dtype)
    full = cs.box_checksum(a)
    if a.ndim == 0:
        assert cs.add(full) == full
        return
    rows = sorted(set(RNG.integers(0, shape[0] + 1, 3).tolist()) | {0, shape[0]})
    parts = []
    for r0, r1 in zip(rows, rows[1:]):
        if a.ndim == 1:
            parts.append(cs.box_checksum(a[r0:r1], r0))
            continue
        cuts = sorted(set(RNG.integers(0, shape[1] + 1, 2).tolist()) | {0, shape[1]})
        for c0, c1 in zip(cuts, cuts[1:]):
            parts.append(cs.box_checksum(a[r0:r1, c0:c1], r0))
    assert cs.add(*parts) == full


def test_checksum_sees_changes() -> None:
    a = RNG.standard_normal((6, 4)).astype(np.float32)
    full = cs.box_checksum(a)
    b = a.copy()
    b[3, 2] = np.nextafter(b[3, 2], np.float32(10))  # one bit of one element
    assert cs.box_checksum(b) != full
    assert cs.box_checksum(a[[1, 0, 2, 3, 4, 5]]) != full  # two rows swapped
    z = a.copy()
    z[4:] = 0  # a zeroed (truncated) region
    assert cs.box_checksum(z) != full
    assert cs.from_hex(cs.to_hex(full)) == full


# ---------------------------------------------------------------------- planner
def _spec(mesh_shape, placements, shape) -> DTensorSpec:
    mesh = DeviceMesh.abstract(mesh_shape)
    return DTensorSpec(mesh, placements, TensorMeta(shape, contiguous_stride(shape), "f32", 4))


def test_chunks_holders_and_balanced_writers() -> None:
    spec = _spec((2, 2), [Shard(0), Replicate()], (5, 3))
    hold = holders(spec)
    assert hold == {Chunk((0, 0), (3, 3)): [0, 1], Chunk((3, 0), (2, 3)): [2, 3]}
    # Partial mesh dims hold whole (reduced) values, like Replicate
    assert holders(_spec((2, 2), [Shard(0), Partial()], (5, 3))) == hold
    # 3 rows over 4 ranks: one empty shard holds nothing
    spec = _spec((4,), [Shard(0)], (3, 2))
    assert chunk_of(spec, (3,)) is None and len(holders(spec)) == 3
    # nesting left to right: (S(0), S(0)) splits the rows in 4, mesh dim 0 first
    spec = _spec((2, 2), [Shard(0), Shard(0)], (8, 1))
    assert [chunk_of(spec, c).offsets[0] for c in itertools.product(range(2), range(2))] == [
        0, 2, 4, 6,
    ]  # fmt: skip
    # one writer per box, balanced: 4 replicated boxes of equal size on 2 ranks -> 2 each
    items = [(f"k{i}", Chunk((0,), (4,)), [0, 1], 16) for i in range(4)]
    writers = assign_writers(items)
    assert sorted(writers.values()) == [0, 0, 1, 1]


LAYOUTS = [
    ((2,), [Shard(0)]),
    ((2,), [Shard(1)]),
    ((4,), [Shard(0)]),
    ((2, 2), [Shard(0), Shard(1)]),
    ((2, 2), [Shard(1), Shard(0)]),
    ((2, 2), [Shard(0), Shard(0)]),
    ((2, 2), [Replicate(), Shard(1)]),
    ((3,), [Shard(1)]),
    ((1,), [Replicate()]),
]


@pytest.mark.parametrize("saved", LAYOUTS, ids=str)
def test_read_boxes_rebuild_every_target(saved) -> None:
    shape = (7, 5)
    glob = RNG.standard_normal(shape)
    sspec = _spec(saved[0], saved[1], shape)
    chunks = list(holders(sspec))
    for mesh_shape, placements in LAYOUTS:
        tspec = _spec(mesh_shape, placements, shape)
        for target in holders(tspec):
            out = np.full(target.sizes, np.nan)
            for r in read_boxes(chunks, target):
                c = chunks[r.chunk]
                src = glob[tuple(slice(o, o + s) for o, s in zip(c.offsets, c.sizes))]
                piece = src[tuple(slice(a, a + n) for a, n in zip(r.src, r.lengths))]
                out[tuple(slice(a, a + n) for a, n in zip(r.dst, r.lengths))] = piece
            want = glob[tuple(slice(o, o + s) for o, s in zip(target.offsets, target.sizes))]
            np.testing.assert_array_equal(out, want)


# ---------------------------------------------------------------------- flattening
def test_flatten_is_dcp_flatten() -> None:
    torch = pytest.importorskip("torch")
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    sd = {
        "model": {"a.weight": torch.zeros(2), "b": {"c": torch.ones(1)}},
        "optim": {
            "state": {"a.weight": {"step": torch.tensor(1.0), "exp_avg": torch.zeros(2)}},
            "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "params": ["a.weight"]}],
        },
        "list": [torch.zeros(1), 3],
        "scalars": [1, 2],
        "step": 4,
    }
    flat, paths = flatten(sd, lambda v: isinstance(v, torch.Tensor))
    dflat, dpaths = flatten_state_dict(sd)
    assert list(flat) == list(dflat) and paths == dpaths
    assert all(flat[k] is dflat[k] for k in flat)
    out: dict = {}
    for k, v in flat.items():
        set_element(out, paths[k], v)
    assert out["optim"]["param_groups"][0]["betas"] == (0.9, 0.99) and out["list"][1] == 3
    renamed, rpaths = rename(flat, paths, {"step": "global_step"})
    assert "global_step" in renamed and rpaths["global_step"] == ("step",)
    with pytest.raises(CheckpointError, match="'nope'"):
        rename(flat, paths, {"nope": "x"})
    with pytest.raises(CheckpointError, match="two state-dict keys"):
        rename(flat, paths, {"step": "list.1"})


# ---------------------------------------------------------------------- the index
def test_objects_round_trip() -> None:
    for v in [None, 3, 2.5, "s", [1, (2, 3)], {"a": None, "b": (0.9, 0.99)}, {1: "x", (2, 3): [4]}]:
        e = encode_object("k", v)
        assert e.pickle is None
        e2 = type(e).model_validate(e.model_dump(by_alias=True, exclude_none=True))
        assert decode_object("k", e2, Path("idx")) == v
    e = encode_object("k", {1.5j})  # not JSON: pickled
    assert e.pickle is not None and decode_object("k", e, Path("idx")) == {1.5j}
    with pytest.raises(CheckpointError, match="'fn'.*function"):
        encode_object("fn", lambda: None)


def _index(tensors: dict) -> Index:
    return Index(
        format="hyper_shard.checkpoint", version=1, save_id="abc", framework="test",
        world_size=1, tensors=tensors,
    )  # fmt: skip


def test_index_errors_name_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no committed checkpoint"):
        read_index(tmp_path)
    (tmp_path / "shard-x-r00000.safetensors").write_bytes(b"")
    with pytest.raises(CheckpointError, match="did not finish"):
        read_index(tmp_path)
    idx = tmp_path / "hyper_shard.json"
    idx.write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        read_index(tmp_path)
    idx.write_text(json.dumps({"format": "other"}))
    with pytest.raises(CheckpointError, match="not a hyper_shard.checkpoint index"):
        read_index(tmp_path)
    good = _index({"w": TensorEntry(dtype="float32", shape=[2, 2], chunks=[])})
    raw = json.loads(good.to_json())
    raw["tensors"]["w"]["shape"] = "x"
    idx.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match=r"field tensors\.w\.shape"):
        read_index(tmp_path)
    idx.write_text(good.to_json())
    with pytest.raises(CheckpointError, match="'w' cover 0 of its 4 elements"):
        read_index(tmp_path)
    raw = json.loads(good.to_json())
    raw["version"] = 99
    idx.write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="upgrade hyper_shard"):
        read_index(tmp_path)


# ---------------------------------------------------------------------- storage
def test_slices_verification_and_commit(tmp_path: Path) -> None:
    a = RNG.standard_normal((6, 4)).astype(np.float32)
    c0, c1 = a[:3], a[3:]

    def entry(name, off, arr, file):
        return ChunkEntry(
            offsets=[off, 0], sizes=list(arr.shape), file=file, entry=name,
            checksum=cs.to_hex(cs.box_checksum(arr)),
        )  # fmt: skip

    write_shard(tmp_path, "shard-abc-r00000.safetensors", {"w@0,0": c0}, "abc", 0)
    write_shard(tmp_path, "shard-abc-r00001.safetensors", {"w@3,0": c1}, "abc", 1)
    chunks = [
        entry("w@0,0", 0, c0, "shard-abc-r00000.safetensors"),
        entry("w@3,0", 3, c1, "shard-abc-r00001.safetensors"),
    ]
    index = _index({"w": TensorEntry(dtype="float32", shape=[6, 4], chunks=chunks)})
    (tmp_path / "shard-old-r00000.safetensors").write_bytes(b"stale")
    commit(tmp_path, index)
    assert not (tmp_path / "shard-old-r00000.safetensors").exists()
    index, _ = read_index(tmp_path)
    # two "ranks" read column halves of chunk 1, one reads chunk 0 whole
    with ShardFiles(tmp_path, index) as f:
        left, pl = f.read("w", index.tensors["w"].chunks[1], [0, 0], [3, 2])
        right, pr = f.read("w", index.tensors["w"].chunks[1], [0, 2], [3, 2])
        whole, pw = f.read("w", index.tensors["w"].chunks[0], [0, 0], [3, 4])
        assert f.bytes_read == a.nbytes
    np.testing.assert_array_equal(np.concatenate([left, right], 1), c1)
    np.testing.assert_array_equal(whole, c0)
    ranks = [
        {("w", 1, (0, 0), (3, 2)): pl, ("w", 0, (0, 0), (3, 4)): pw},
        {("w", 1, (0, 2), (3, 2)): pr, ("w", 0, (0, 0), (3, 4)): pw},  # a replica of chunk 0
    ]
    assert verify_reads(tmp_path, index, ranks) == []
    ranks[1][("w", 1, (0, 2), (3, 2))] ^= 1  # a rank read damaged bytes
    errs = verify_reads(tmp_path, index, ranks)
    assert len(errs) == 1 and "'w'" in errs[0] and "r00001" in errs[0] and "corrupted" in errs[0]
    partial_only = [{("w", 1, (0, 0), (3, 2)): pl ^ 1}]  # half a chunk: cannot be checked
    assert verify_reads(tmp_path, index, partial_only) == []
    # a file from another save is refused
    write_shard(tmp_path, "shard-abc-r00001.safetensors", {"w@3,0": c1}, "zzz", 1)
    with ShardFiles(tmp_path, index) as f, pytest.raises(CheckpointError, match="belongs to save"):
        f.read("w", index.tensors["w"].chunks[1], [0, 0], [3, 4])
