"""Errors, not garbage: every bad checkpoint input raises ``CheckpointError`` naming the
key and the file, on every rank (no rank hangs: the pool call returns), and leaves the
state dict's tensors exactly as they were. Cases: a missing key, a checkpoint of another
model, a global shape that differs, a dtype change without ``allow_dtype_cast`` (and the
cast with it), a truncated shard file, flipped bytes in a shard file's data, a corrupted
index, a directory with no committed checkpoint, and saves that fail half-way (the
previous checkpoint stays the committed one; a fresh directory gets none). Plain
``dcp.load`` through ``HyperShardReader`` of a corrupted checkpoint also changes nothing."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiproc

W = torch.arange(30, dtype=torch.float32).reshape(6, 5) / 7
B = torch.linspace(-1, 1, 6)


def _state(mesh, w=W, b=B, step=3):
    from hyper_shard import Replicate, Shard, distribute_tensor

    return {
        "w": distribute_tensor(w.clone(), mesh, [Shard(0)]),
        "b": distribute_tensor(b.clone(), mesh, [Replicate()]),
        "t": torch.tensor(2.5),
        "step": step,
    }


def save_good(rank: int, world: int, d: str) -> int:
    import hyper_shard.checkpoint as hc
    from hyper_shard import init_device_mesh

    return hc.save(_state(init_device_mesh("cpu", (world,))), d)


def _err(fn) -> str:
    try:
        fn()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def try_bad(rank: int, world: int, dirs: dict) -> dict:
    import hyper_shard.checkpoint as hc
    from hyper_shard import Shard, distribute_tensor, init_device_mesh

    mesh = init_device_mesh("cpu", (world,))
    zeros = torch.zeros(6, 5)
    target = {**_state(mesh, w=zeros, b=torch.zeros(6), step=0), "t": torch.tensor(0.0)}
    out: dict = {}
    good = dirs["good"]
    out["missing"] = _err(lambda: hc.load({**target, "extra.weight": torch.zeros(2)}, good))
    other = {"encoder.w": distribute_tensor(zeros, mesh, [Shard(1)]), "step": 0}
    out["other_model"] = _err(lambda: hc.load(other, good))
    wrong = {**target, "w": distribute_tensor(torch.zeros(6, 4), mesh, [Shard(1)])}
    out["shape"] = _err(lambda: hc.load(wrong, good))
    f64 = {**target, "w": distribute_tensor(zeros.double(), mesh, [Shard(1)])}
    out["dtype"] = _err(lambda: hc.load(f64, good))
    for case in ("truncated", "corrupted", "bad_index", "empty"):
        out[case] = _err(lambda c=case: hc.load(target, dirs[c]))
    out["unchanged"] = (
        torch.equal(target["w"].full_tensor(), zeros)
        and torch.equal(target["b"].full_tensor(), torch.zeros(6))
        and target["step"] == 0
        and float(target["t"]) == 0.0
        and torch.equal(f64["w"].full_tensor(), zeros.double())
    )
    # plain dcp.load through HyperShardReader writes nothing either (it verifies every
    # rank's reads before copying any), python values included
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # (a BaseException)

    plain = {**_state(mesh, w=zeros, b=torch.zeros(6), step=0), "t": torch.tensor(0.0)}
    reader = hc.HyperShardReader(dirs["corrupted"])
    try:
        dcp.load(plain, storage_reader=reader)
        out["plain_dcp"] = "no error"
    except CheckpointException as e:
        out["plain_dcp"] = str(e)
    out["plain_unchanged"] = (
        torch.equal(plain["w"].full_tensor(), zeros)
        and torch.equal(plain["b"].full_tensor(), torch.zeros(6))
        and plain["step"] == 0
        and float(plain["t"]) == 0.0
    )
    # a save that fails half-way (an unsaveable value) over the good checkpoint
    bad_save = {**_state(mesh, w=W * 100), "fn": lambda: None}
    out["half_save"] = _err(lambda: hc.save(bad_save, good))
    hc.load(target, good)  # the previous checkpoint is still the committed one
    out["after_half_save"] = torch.equal(target["w"].full_tensor(), W) and target["step"] == 3
    # the explicit cast loads
    hc.load(f64, good, allow_dtype_cast=True)
    out["cast"] = torch.equal(f64["w"].full_tensor(), W.double())
    # a fresh directory whose save fails: shard files, no committed index
    out["half_fresh_save"] = _err(
        lambda: hc.save({**_state(mesh), "fn": lambda: None}, dirs["half_fresh2"])
    )
    out["half_fresh_load"] = _err(lambda: hc.load(target, dirs["half_fresh2"]))
    return out


def test_bad_checkpoints_raise_on_every_rank(dist2, tmp_path: Path) -> None:
    good = tmp_path / "good"
    dist2.run(save_good, str(good))
    shards = sorted(good.glob("shard-*.safetensors"))
    assert len(shards) == 2  # w's two row shards; b, t, step written once by one rank each
    dirs = {"good": str(good)}
    for name in ("truncated", "corrupted", "bad_index"):
        shutil.copytree(good, tmp_path / name)
        dirs[name] = str(tmp_path / name)
    trunc = tmp_path / "truncated" / shards[1].name
    os.truncate(trunc, trunc.stat().st_size // 2)
    corrupt = tmp_path / "corrupted" / shards[0].name
    data = bytearray(corrupt.read_bytes())
    data[-8:] = bytes(b ^ 0x5A for b in data[-8:])  # the last bytes of the data region
    corrupt.write_bytes(bytes(data))
    index = tmp_path / "bad_index" / "hyper_shard.json"
    index.write_text(index.read_text()[:-40])
    (tmp_path / "empty").mkdir()
    dirs["empty"] = str(tmp_path / "empty")
    dirs["half_fresh2"] = str(tmp_path / "half_fresh2")

    res = dist2.run(try_bad, dirs)
    for r in res:  # every rank raised the same error
        assert r == res[0]
        assert (r["unchanged"], r["after_half_save"], r["cast"]) == (True, True, True), r
        assert r["plain_unchanged"] and "does not match its checksum" in r["plain_dcp"], r
        for case in (
            "missing", "other_model", "shape", "dtype", "truncated", "corrupted", "bad_index",
            "empty", "half_save", "half_fresh_save", "half_fresh_load",
        ):  # fmt: skip
            assert r[case].startswith("CheckpointError"), (case, r[case])
        idx = str(good / "hyper_shard.json")
        assert "'extra.weight'" in r["missing"] and "missing key" in r["missing"]
        assert idx in r["missing"]
        assert "another model" in r["other_model"] and "'encoder.w'" in r["other_model"]
        assert "unexpected key" in r["other_model"] and "'w'" in r["other_model"]
        assert "'w'" in r["shape"] and "[6, 5]" in r["shape"] and "[6, 4]" in r["shape"]
        assert idx in r["shape"]
        assert "'w'" in r["dtype"] and "allow_dtype_cast" in r["dtype"]
        assert "float64" in r["dtype"] and "float32" in r["dtype"]
        assert str(trunc) in r["truncated"] and "truncated" in r["truncated"]
        assert "'w'" in r["truncated"]
        assert str(corrupt) in r["corrupted"] and "corrupted" in r["corrupted"]
        assert any(f"'{k}'" in r["corrupted"] for k in ("w", "b", "t"))
        assert "hyper_shard.json" in r["bad_index"] and "JSON" in r["bad_index"]
        assert "no committed checkpoint" in r["empty"]
        assert "'fn'" in r["half_save"] and "function" in r["half_save"]
        assert "no committed checkpoint" in r["half_fresh_load"]
        assert "did not finish" in r["half_fresh_load"]
