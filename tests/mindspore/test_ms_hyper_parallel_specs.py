"""hyper-parallel's shipped YAML directory (every version's (file, class) pairs, the
fixture of tests/unit/_hyper_parallel_fixture.py) loaded through
``HYPER_PARALLEL_OPS_YAML_DIR`` on MindSpore ranks: the Primitives its entries name run on
DTensors and equal plain MindSpore (SliceExt, a name only hyper-parallel's directory binds,
through the slice rule its class maps to), and a directory that also names a class the
table does not know still loads, that op raising the clear error on every rank."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tests.unit._hyper_parallel_fixture import write_dir

pytestmark = [pytest.mark.mindspore, pytest.mark.multiproc]


def check_hp_ops(rank: int, world: int, yaml_dir: str) -> dict:
    from mindspore import Tensor
    from mindspore.ops.auto_generate import gen_ops_prim as prims

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.registry import get_registry, reload

    old = os.environ.get("HYPER_PARALLEL_OPS_YAML_DIR")
    os.environ["HYPER_PARALLEL_OPS_YAML_DIR"] = yaml_dir
    out: dict = {}
    try:
        reload()
        mesh = hs.init_device_mesh("CPU", (world,))
        x = np.arange(48, dtype=np.float32).reshape(6, 8) / 7 - 3
        idx = (np.arange(12).reshape(6, 2) * 3 % 8).astype(np.int64)
        calls = {  # fn(x, index)
            "SliceExt": lambda t, i: prims.SliceExt()(t, 1, 1, 7, 2),
            "SliceExt0": lambda t, i: prims.SliceExt()(t, 0, 1, 5, 1),
            "ReduceMax": lambda t, i: prims.ReduceMax(keep_dims=False)(t, (1,)),
            "SumExt": lambda t, i: prims.SumExt()(t, (0,), False, None),
            "LessEqual": lambda t, i: prims.LessEqual()(t, t * 0.5),
            "TransposeExtView": lambda t, i: prims.TransposeExtView()(t, 0, 1),
            "GatherD": lambda t, i: prims.GatherD()(t, 1, i),
        }
        for pl in (Shard(0), Shard(1), Replicate()):
            for name, fn in calls.items():
                want = fn(Tensor(x), Tensor(idx)).asnumpy()
                got = fn(
                    hs.distribute_tensor(Tensor(x), mesh, [pl]),
                    hs.distribute_tensor(Tensor(idx), mesh, [Replicate()]),
                )
                err = float(np.abs(got.full_tensor().asnumpy().astype(np.float64) - want).max())
                out[f"{name} {pl}"] = err
        entries = get_registry().entries
        out["SliceExt rule"] = type(entries["SliceExt"].op).__name__
        if "new_ops" in yaml_dir:
            try:  # a Primitive bound by an entry naming a class the table does not know
                prims.Cummin(0)(hs.distribute_tensor(Tensor(x), mesh, [Shard(1)]))
                out["unknown"] = "no error"
            except Exception as e:
                out["unknown"] = f"{type(e).__name__}: {e}"
        return out
    finally:
        if old is None:
            os.environ.pop("HYPER_PARALLEL_OPS_YAML_DIR", None)
        else:
            os.environ["HYPER_PARALLEL_OPS_YAML_DIR"] = old
        reload()


def test_hyper_parallel_directory_on_mindspore(ms2, tmp_path: Path) -> None:
    hp = tmp_path / "hp"
    write_dir(hp)
    extra = tmp_path / "new_ops"
    extra.mkdir()
    (extra / "new_ops.yaml").write_text(
        "Cummin:\n  distributed_op_class: CumminDistributedOp\n"
        "  distributed_op_file: parallel_reduce\n"
    )
    for res in ms2.run(check_hp_ops, str(hp)):
        assert res["SliceExt rule"] == "IndexOp"
        bad = {k: v for k, v in res.items() if isinstance(v, float) and v > 1e-5}
        assert not bad and len(res) == 22, res
    for res in ms2.run(check_hp_ops, os.pathsep.join([str(hp), str(extra)])):
        assert res["unknown"].startswith("ShardingError"), res["unknown"]
        assert "CumminDistributedOp (parallel_reduce)" in res["unknown"], res["unknown"]
        assert "override: true" in res["unknown"], res["unknown"]
