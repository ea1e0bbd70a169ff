"""hyper_shard DTensors through ``torch.distributed.checkpoint`` itself (the tensor-subclass
protocol), and ``hyper_shard.checkpoint`` on top of it, on a (2, 2) mesh of 4 ranks:

* uneven ``(Shard(0), Shard(1))``, half-replicated ``(Replicate(), Shard(0))``, fully
  replicated, ``(Shard(0), Partial())`` (reduced before saving), a layout with an empty
  shard, a plain replicated tensor and a python value, saved with plain ``dcp.save`` and
  with ``hyper_shard.checkpoint.save``: every chunk is written once (bytes written over all
  ranks == the state's size), and both load into other layouts (a 1-D mesh, other shard
  dims, ``Partial(sum)`` targets through ``hyper_shard.checkpoint.load``) with the values of
  the saved global tensors;
* ``async_save`` (ours, and ``dcp.async_save`` with ``DTensorStager``) is isolated from
  changes made right after it returns; a copy by DCP's default stager (sized globally) is
  refused with a clear error;
* PyTorch's own ``torch.distributed.tensor`` DTensors and ours read each other's
  checkpoints (both formats);
* Hugging Face: a tensor-parallel Llama saves a consolidated safetensors checkpoint that
  ``transformers.LlamaForCausalLM.from_pretrained`` loads in one process (same logits), and
  loads a ``save_pretrained`` checkpoint straight into its shards, each rank reading only
  its slices;
* public bug reports on checkpoints (``report_*``, each naming its report).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from tests._reports import reports

pytestmark = pytest.mark.multiproc

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _values() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    return {
        "s": torch.randn(6, 5, generator=g),
        "r": torch.randn(4, 3, generator=g),
        "rr": torch.randn(3, generator=g),
        "p": torch.randn(4, 2, generator=g),  # the global value of the Partial one
        "e": torch.randn(3, 2, generator=g).to(torch.bfloat16),
        "plain": torch.tensor([1.0, 2.0]),
    }


def _saved_state(mesh, rank: int) -> dict:
    from hyper_shard import DTensor, Partial, Replicate, Shard, distribute_tensor

    v = _values()
    coord = mesh.get_coordinate()
    pr = distribute_tensor(v["p"], mesh, [Shard(0), Replicate()]).to_local()
    part = pr * 0.25 if coord[1] == 0 else pr * 0.75  # sums to the value over mesh dim 1
    return {
        "s": distribute_tensor(v["s"], mesh, [Shard(0), Shard(1)]),
        "r": distribute_tensor(v["r"], mesh, [Replicate(), Shard(0)]),
        "rr": distribute_tensor(v["rr"], mesh, [Replicate(), Replicate()]),
        "p": DTensor.from_local(part, mesh, [Shard(0), Partial()], shape=(4, 2), stride=(2, 1)),
        "e": distribute_tensor(v["e"], mesh, [Shard(0), Shard(0)]),  # 3 rows over 4: one empty
        "plain": v["plain"].clone(),
        "n": 5,
    }


def _target(mesh1, mesh2) -> dict:
    """Other layouts: on a 1-D mesh of the 4 ranks, and transposed ones on the 2-D mesh."""
    from hyper_shard import DTensor, Partial, Replicate, Shard, zeros

    return {
        "s": zeros(6, 5, device_mesh=mesh1, placements=[Shard(1)]),
        "r": zeros(4, 3, device_mesh=mesh2, placements=[Shard(1), Replicate()]),
        "rr": zeros(3, device_mesh=mesh1, placements=[Shard(0)]),
        "p": zeros(4, 2, device_mesh=mesh2, placements=[Replicate(), Shard(1)]),
        "e": zeros(3, 2, device_mesh=mesh1, placements=[Replicate()], dtype=torch.bfloat16),
        "plain": torch.zeros(2),
        "n": 0,
        # a Partial target from local zeros (redistribute to Partial is refused, as PyTorch)
        "_partial": DTensor.from_local(
            zeros(4, 2, device_mesh=mesh2, placements=[Replicate(), Shard(0)]).to_local(),
            mesh2,
            [Partial(), Shard(0)],
            shape=(4, 2),
            stride=(2, 1),
        ),
    }


def _check(sd: dict, name: str) -> list[str]:
    v = _values()
    bad = [k for k in ("s", "r", "rr", "p", "e") if not torch.equal(sd[k].full_tensor(), v[k])]
    if not torch.equal(sd["plain"], v["plain"]) or sd["n"] != 5:
        bad.append("plain/n")
    return [f"{name}: {b}" for b in bad]


def _err(fn) -> str:
    try:
        fn()
    except BaseException as e:  # CheckpointException is a BaseException
        return f"{type(e).__name__}: {e}"
    return "no error"


def dcp_protocol(rank: int, world: int, d: str) -> dict:
    import torch.distributed.checkpoint as dcp

    import hyper_shard.checkpoint as hc
    from hyper_shard import init_device_mesh

    mesh2 = init_device_mesh("cpu", (2, 2))
    mesh1 = init_device_mesh("cpu", (4,))
    out: dict = {"bad": []}
    sd = _saved_state(mesh2, rank)
    dcp.save(sd, checkpoint_id=f"{d}/dcp")  # DCP's own writer, through the protocol
    out["bytes"] = hc.save(sd, f"{d}/hs")  # hyper_shard's format, through DCP
    for src in ("dcp", "hs"):
        t = _target(mesh1, mesh2)
        t.pop("_partial")
        reader = hc.HyperShardReader(f"{d}/{src}") if src == "hs" else None
        dcp.load(t, checkpoint_id=f"{d}/{src}", storage_reader=reader)  # into other layouts
        out["bad"] += _check(t, f"dcp.load {src}")
        t = _target(mesh1, mesh2)
        partial = t.pop("_partial")
        hc.load({**t, "p": partial}, f"{d}/{src}", strict=False)  # Partial(sum) target
        out["bad"] += [f"hc.load {src} partial"] * (
            not torch.equal(partial.full_tensor(), _values()["p"])
        )
    t = _target(mesh1, mesh2)
    out["partial_dcp"] = _err(lambda: dcp.load({"p": t["_partial"]}, checkpoint_id=f"{d}/dcp"))
    # async: changes right after async_save returns do not reach the checkpoint
    sd = _saved_state(mesh2, rank)
    fut = hc.async_save(sd, f"{d}/async")
    fut2 = dcp.async_save(sd, checkpoint_id=f"{d}/async_dcp", async_stager=hc.DTensorStager())
    with torch.no_grad():
        sd["s"].mul_(0)
        sd["p"].add_(1)
    out["async_bytes"] = fut.result(timeout=120)
    fut2.result(timeout=120)
    for src in ("async", "async_dcp"):
        t = _target(mesh1, mesh2)
        t.pop("_partial")
        hc.load(t, f"{d}/{src}")
        out["bad"] += _check(t, src)
    out["default_stager"] = _err(lambda: dcp.async_save(sd, checkpoint_id=f"{d}/nope").result())
    # PyTorch's own DTensors and ours read each other's checkpoints
    from torch.distributed.device_mesh import init_device_mesh as torch_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    tm = torch_mesh("cpu", (2, 2))
    v = _values()
    tsd = {
        "s": distribute_tensor(v["s"], tm, [Shard(1), Shard(0)]),
        "r": distribute_tensor(v["r"], tm, [Shard(0), Replicate()]),
    }
    dcp.save(tsd, checkpoint_id=f"{d}/torch_dtensor")
    t = _target(mesh1, mesh2)
    mine = {"s": t["s"], "r": t["r"]}
    hc.load(mine, f"{d}/torch_dtensor")
    out["bad"] += [f"torch->ours {k}" for k in mine if not torch.equal(mine[k].full_tensor(), v[k])]
    tt = {
        k: distribute_tensor(torch.zeros_like(v[k]), tm, [Shard(0), Shard(0)]) for k in ("s", "r")
    }
    dcp.load(tt, storage_reader=hc.HyperShardReader(f"{d}/hs"), planner=None)
    out["bad"] += [f"ours->torch {k}" for k in tt if not torch.equal(tt[k].full_tensor(), v[k])]
    return out


def test_dcp_protocol_and_formats(dist4, tmp_path: Path) -> None:
    res = dist4.run(dcp_protocol, str(tmp_path), timeout=300)
    v = _values()
    size = sum(t.numel() * t.element_size() for t in v.values())
    assert sum(r["bytes"] for r in res) == size  # every chunk written once
    assert sum(r["async_bytes"] for r in res) == size
    assert max(r["bytes"] for r in res) < size  # spread over the ranks
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(tmp_path / "dcp")).read_metadata()
    for k, t in v.items():  # DCP's own metadata: chunks tile each tensor once
        chunks = md.state_dict_metadata[k].chunks
        assert sum(c.sizes.numel() for c in chunks) == t.numel(), k
    for r in res:
        assert r["bad"] == []
        assert (
            "Partial(sum)" in r["partial_dcp"] and "hyper_shard.checkpoint.load" in r["partial_dcp"]
        )
        assert "default async stager" in r["default_stager"]
        assert "DTensorStager" in r["default_stager"]


# ---------------------------------------------------------------------- Hugging Face
def _llama_args(**over):
    sys.path.insert(0, str(EXAMPLES))
    import train_llama_tp as ex

    args = ex.parse_args(["--hidden", "32", "--ffn", "64", "--layers", "1", "--heads", "2",
                          "--kv-heads", "2", "--seq", "8"])  # fmt: skip
    for k, val in over.items():
        setattr(args, k, val)
    return ex, args


def _ids() -> torch.Tensor:
    return torch.arange(16).reshape(2, 8) * 7 % 256


class _CountingHFReader:
    """DCP's HuggingFaceStorageReader, counting the elements of the slices it reads."""

    def __new__(cls, path: str):
        from torch.distributed.checkpoint import HuggingFaceStorageReader

        class Counting(HuggingFaceStorageReader):
            elements = 0

            def _process_read_request(self, f, req, planner):
                Counting.elements += int(torch.Size(req.lengths).numel())
                return super()._process_read_request(f, req, planner)

        return Counting(path)


def _local(v):
    from hyper_shard import DTensor

    return v.to_local() if isinstance(v, DTensor) else v  # (the norms stay plain tensors)


def _full(v):
    from hyper_shard import DTensor

    return v.full_tensor() if isinstance(v, DTensor) else v


def hf_roundtrip(rank: int, world: int, d: str) -> dict:
    import torch.distributed.checkpoint as dcp

    import hyper_shard.checkpoint as hc
    from hyper_shard import Replicate, Shard, init_device_mesh
    from hyper_shard import parallel as hp

    ex, args = _llama_args(seed=1)
    mesh = init_device_mesh("cpu", (world,))
    model = ex.build_model(args)
    hp.parallelize_module(model, mesh, ex.llama_tp_plan(False, hp, Replicate, Shard))
    hc.save(model.state_dict(), f"{d}/hf_out", format="hf")
    if rank == 0:
        model.config.save_pretrained(f"{d}/hf_out")
    logits = model(input_ids=_ids()).logits.full_tensor().detach()
    # a save_pretrained checkpoint (written by the test process) straight into the shards
    model2 = ex.build_model(args)
    hp.parallelize_module(model2, mesh, ex.llama_tp_plan(False, hp, Replicate, Shard))
    reader = _CountingHFReader(f"{d}/hf_in")
    sd = model2.state_dict()
    dcp.load(sd, storage_reader=reader)
    local = sum(_local(v).numel() for v in sd.values())
    full = {k: _full(v) for k, v in sd.items()}
    model3 = ex.build_model(args)
    hp.parallelize_module(model3, mesh, ex.llama_tp_plan(False, hp, Replicate, Shard))
    hc.load(model3.state_dict(), f"{d}/hf_in")  # auto-detected, checked, atomic
    same = all(torch.equal(_full(v), full[k]) for k, v in model3.state_dict().items())
    return {
        "logits": logits,
        "read": type(reader).elements,
        "local": local,
        "full": full if rank == 0 else None,
        "same": same,
    }


def test_hugging_face_round_trip(dist2, tmp_path: Path) -> None:
    from transformers import LlamaForCausalLM

    ex, args = _llama_args(seed=2)
    src = ex.build_model(args)
    src.save_pretrained(tmp_path / "hf_in")
    res = dist2.run(hf_roundtrip, str(tmp_path), timeout=300)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path / "hf_out")  # one process, one device
    with torch.no_grad():
        ref = loaded(input_ids=_ids()).logits
    torch.testing.assert_close(res[0]["logits"], ref, rtol=1e-5, atol=1e-5)
    for k, v in src.state_dict().items():
        torch.testing.assert_close(res[0]["full"][k], v, rtol=0, atol=0, msg=k)
    total = sum(v.numel() for v in src.state_dict().values())
    for r in res:
        assert r["same"]
        assert r["read"] == r["local"] < total  # each rank read only its shards' slices


# ---------------------------------------------------------------------- bug reports
def report_empty_shards_saved_and_loaded(rank, world, tmp):
    """#108869 / #150862: save (6,) and (5, 3) with empty shards (2, 2, 2, 0 / 2, 2, 1, 0
    rows on 4 ranks), load into other layouts, with ``hyper_shard.checkpoint`` and with
    DCP."""
    import os

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import hyper_shard.checkpoint as hc
    from hyper_shard import Replicate, Shard, distribute_tensor, init_device_mesh
    from tests._helpers import assert_close_any as _eq

    mesh = init_device_mesh("cpu", (world,))
    a, b = torch.arange(6.0), torch.arange(15.0).reshape(5, 3)
    sd = {"a": distribute_tensor(a, mesh, [Shard(0)]), "b": distribute_tensor(b, mesh, [Shard(0)])}
    hc.save(sd, os.path.join(tmp, "hc"))
    dcp.save(sd, checkpoint_id=os.path.join(tmp, "dcp"))
    for pa, pb in (([Replicate()], [Shard(1)]), ([Shard(0)], [Replicate()])):
        for load in (
            lambda s: hc.load(s, os.path.join(tmp, "hc")),
            lambda s: dcp.load(s, checkpoint_id=os.path.join(tmp, "dcp")),
        ):
            tgt = {
                "a": distribute_tensor(torch.zeros(6), mesh, pa),
                "b": distribute_tensor(torch.zeros(5, 3), mesh, pb),
            }
            load(tgt)
            _eq(tgt["a"], a)
            _eq(tgt["b"], b)
    dist.barrier()


def report_nested_shards_across_world_sizes(rank, world, tmp, save):
    """ROCm/Megatron-LM PR #63: a weight sharded twice on its rows (each of the TP ranks'
    rows split again: ``(Shard(0), Shard(0))``) came back in the wrong chunk order when
    loaded on another number of ranks. Saved on a (2, 2) mesh (8 and 7 rows: uneven), with
    ``hyper_shard.checkpoint`` and with DCP, loaded on 2 ranks (rows, columns) and on 4
    (rows, and the transposed nesting ``(Shard(1), Shard(0))``)."""
    import os

    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp

    import hyper_shard.checkpoint as hc
    from hyper_shard import Shard, distribute_tensor, init_device_mesh
    from tests._helpers import assert_close_any as _eq

    values = {"w": torch.arange(24.0).reshape(8, 3), "u": torch.arange(21.0).reshape(7, 3)}
    if save:
        mesh = init_device_mesh("cpu", (2, 2))
        sd = {k: distribute_tensor(v, mesh, [Shard(0), Shard(0)]) for k, v in values.items()}
        hc.save(sd, os.path.join(tmp, "hc_nested"))
        dcp.save(sd, checkpoint_id=os.path.join(tmp, "dcp_nested"))
        dist.barrier()
        layouts = [((2, 2), [Shard(1), Shard(0)]), ((world,), [Shard(0)])]
    else:
        layouts = [((world,), [Shard(0)]), ((world,), [Shard(1)])]
    for shape, pl in layouts:
        mesh = init_device_mesh("cpu", shape)
        for load in (
            lambda s: hc.load(s, os.path.join(tmp, "hc_nested")),
            lambda s: dcp.load(s, checkpoint_id=os.path.join(tmp, "dcp_nested")),
        ):
            tgt = {k: distribute_tensor(torch.zeros_like(v), mesh, pl) for k, v in values.items()}
            load(tgt)
            for k, v in values.items():
                _eq(tgt[k], v)
    dist.barrier()


@reports(report_empty_shards_saved_and_loaded)
def test_reports_mesh_of_4(report, dist4, tmp_path: Path) -> None:
    dist4.run(report, str(tmp_path))


def test_report_nested_shards_across_world_sizes(dist4, dist2, tmp_path: Path) -> None:
    dist4.run(report_nested_shards_across_world_sizes, str(tmp_path), True)
    dist2.run(report_nested_shards_across_world_sizes, str(tmp_path), False)
