"""hyper-parallel's shipped YAML directory loads unchanged through
``HYPER_PARALLEL_OPS_YAML_DIR`` (issue 15): every (op name, distributed_op_file,
distributed_op_class) triple of ``_hyper_parallel_fixture`` (written from a reading of
``mindspore-ai/hyper-parallel``) maps onto a hyper_shard rule, its ops then dispatch, and
docs/custom_ops.md section 4's own example passes ``hyper-shard validate``."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from hyper_shard.errors import OpSpecError, ShardingError
from hyper_shard.registry import Registry, hyper_parallel
from hyper_shard.registry.loader import load_all
from tests.unit._hyper_parallel_fixture import FILES, triples, write_dir

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hp_dir(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("hyper_parallel_yaml")
    write_dir(d)
    return d


def test_every_builtin_pair_is_mapped() -> None:
    pairs = {(f, c) for _, f, c in triples()}
    assert pairs == set(hyper_parallel.CLASS_TO_ENTRY), pairs ^ set(hyper_parallel.CLASS_TO_ENTRY)
    assert len(pairs) >= 40  # the "about 40" built-in classes, and more


def test_directory_loads_and_maps_every_triple(hp_dir: Path) -> None:
    entries = load_all([hp_dir])
    reg = Registry(entries)
    builtin = {e.name: e for e in load_all()}
    by_name = {e.name: e for e in entries}
    unsupported = hyper_parallel.unsupported_op_class()
    for name, *_ in triples():
        e = by_name[name]  # a name in several files (versions): its first file's entry
        if name in builtin and e.file == builtin[name].file:
            continue  # the name is a built-in entry's too: the built-in (same meaning) stays
        file, cls = e.entry.distributed_op_file, e.entry.distributed_op_class
        target = hyper_parallel.NAME_TO_ENTRY.get(name, hyper_parallel.CLASS_TO_ENTRY[(file, cls)])
        if target is None:
            assert type(e.op) is unsupported, (name, type(e.op))
        else:
            assert type(e.op) is type(builtin[target].op), (name, file, cls, type(e.op))
            assert e.op.params == builtin[target].op.params
    # op names a built-in binds stay the built-in's: e.g. ReLU is the relu entry's
    assert reg.names("mindspore")["ReLU"].name == "relu"
    assert reg.names("mindspore")["SplitTensor"].name == "split"  # a built-in binds it now
    assert reg.names("mindspore")["TopkExt"].name == "TopkExt"  # new: the topk rule
    assert type(reg.entries["TopkExt"].op).__name__ == "TensorOp"
    assert reg.entries["TopkExt"].op.params.kind == "topk"
    assert reg.entries["Swiglu"].op.params.kind == "glu"  # halves its axis, unlike Softmax


def test_torch_binding_skips_names_torch_lacks(hp_dir: Path) -> None:
    from hyper_shard.platform.torch.dispatch import build_torch_table

    reg = Registry(load_all([hp_dir]))
    table = build_torch_table(reg)  # torch.floor_div, ms_custom_ops.* ... are skipped
    import torch

    assert table[torch.nonzero].op.name == "nonzero"  # bound: runs whole (data_dependent)
    assert torch.relu in table and table[torch.relu].op.name == "relu"


def test_unsupported_class_raises_naming_it() -> None:
    from hyper_shard import DeviceMesh, Replicate
    from hyper_shard.dispatch.op import OpCall
    from hyper_shard.spec import DTensorSpec, TensorMeta

    op = hyper_parallel.unsupported_op_class()(
        "Slice", origin="SliceDistributedOp (parallel_slice)"
    )
    mesh = DeviceMesh.abstract((2,))
    spec = DTensorSpec(mesh, (Replicate(),), TensorMeta((4,), (1,), "float32", 4))
    call = OpCall("Slice", "Slice", [spec], ["input"], {}, {}, False, False, (), {})
    with pytest.raises(
        ShardingError, match=r"Slice.*SliceDistributedOp \(parallel_slice\).*no hyper_shard rule"
    ):
        op.infer_layout(call)


#: pairs of hyper-parallel modules this table does not know: a module it may add later,
#: and a class added later to a module it maps
_UNKNOWN = [
    ("NpuFusedNewOp", "parallel_npu_fused_new", "NpuFusedNewDistributedOp"),
    ("Cummin", "parallel_reduce", "CumminDistributedOp"),
    ("histogramdd", "parallel_histogramdd", "HistogramddDistributedOp"),  # a torch function
]


def _write_unknown(d: Path) -> None:
    import yaml

    doc = {n: {"distributed_op_class": c, "distributed_op_file": f} for n, f, c in _UNKNOWN}
    (d / "new_ops.yaml").write_text(yaml.safe_dump(doc))


def _call(name: str):
    from hyper_shard import DeviceMesh, Replicate
    from hyper_shard.dispatch.op import OpCall
    from hyper_shard.spec import DTensorSpec, TensorMeta

    spec = DTensorSpec(
        DeviceMesh.abstract((2,)), (Replicate(),), TensorMeta((4,), (1,), "float32", 4)
    )
    return OpCall(name, name, [spec], ["input"], {}, {}, False, False, (), {})


def test_unknown_hyper_parallel_pair_loads_the_rest(tmp_path: Path) -> None:
    """One class the table does not know, of a hyper-parallel module, never fails the
    directory: the other entries load with their rules, and the unknown one raises when
    called, naming the class and how to bind the op."""
    write_dir(tmp_path)
    _write_unknown(tmp_path)
    entries = load_all([tmp_path])
    reg = Registry(entries)
    by_name = {e.name: e for e in entries}
    assert {n for n, *_ in triples()} <= set(by_name)  # every other entry loaded
    assert reg.names("mindspore")["TopkExt"].name == "TopkExt"
    assert type(by_name["SliceExt"].op).__name__ == "IndexOp"  # mapped: slice_dim's rule
    for name, file, cls in _UNKNOWN:
        op = by_name[name].op
        assert type(op) is hyper_parallel.unsupported_op_class(), name
        with pytest.raises(ShardingError) as e:
            op.infer_layout(_call(name))
        msg = str(e.value)
        assert f"{cls} ({file})" in msg and "does not map" in msg, msg
        assert f"'{name}: {{rule:" in msg and "override: true" in msg, msg


def test_user_modules_still_fail_at_load(tmp_path: Path, monkeypatch) -> None:
    """A user's own module that is missing, or a user's own parallel_* module (importable)
    without the class, fails at load naming the entry, as any user module."""
    d1 = tmp_path / "missing"
    d1.mkdir()
    (d1 / "mine.yaml").write_text(
        "my_op:\n  distributed_op_class: MyDistributedOp\n  distributed_op_file: my_ops\n"
    )
    with pytest.raises(OpSpecError, match=r"my_op.*module 'my_ops' not found"):
        load_all([d1])
    pkg = tmp_path / "py"
    pkg.mkdir()
    (pkg / "parallel_mine.py").write_text("class OtherDistributedOp:\n    pass\n")
    monkeypatch.syspath_prepend(str(pkg))
    d2 = tmp_path / "own"
    d2.mkdir()
    (d2 / "mine.yaml").write_text(
        "Mine:\n  distributed_op_class: MineDistributedOp\n  distributed_op_file: parallel_mine\n"
    )
    with pytest.raises(OpSpecError, match=r"Mine.*has no class 'MineDistributedOp'"):
        load_all([d2])


def test_dunder_op_names_only_in_seed_entries(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("__defualt__: {rule: pointwise}\n")
    with pytest.raises(OpSpecError, match="unknown special key"):
        load_all([tmp_path])


def test_custom_ops_doc_example_validates(tmp_path: Path, capsys) -> None:
    from hyper_shard.cli import main

    doc = (ROOT / "docs" / "custom_ops.md").read_text()
    section = doc.split("## 4.", 1)[1].split("## 5.", 1)[0]
    example = re.search(r"```yaml\n(.*?)```", section, re.S).group(1)
    (tmp_path / "hp.yaml").write_text(example)
    code = main(["validate", str(tmp_path), "--python-path", str(ROOT / "plugins" / "scaled_add")])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("OK:"), out
    assert "scaled_add_ops.axpby" in out and "ReLU" in out


def run_hyper_parallel_ops(rank: int, world: int, yaml_dir: str) -> list[float]:
    """With hyper-parallel's directory in HYPER_PARALLEL_OPS_YAML_DIR, ops its files name
    run on DTensors and equal the plain ops (torch ranks)."""
    import os

    import torch

    import hyper_shard as hs
    from hyper_shard import Shard
    from hyper_shard.registry import reload

    old = os.environ.get("HYPER_PARALLEL_OPS_YAML_DIR")
    os.environ["HYPER_PARALLEL_OPS_YAML_DIR"] = yaml_dir
    try:
        reload()
        mesh = hs.init_device_mesh("cpu", (world,))
        x = torch.arange(24, dtype=torch.float32).reshape(6, 4) / 7 - 1
        d = hs.distribute_tensor(x, mesh, [Shard(0)])
        errs = [
            (torch.relu(d).full_tensor() - torch.relu(x)).abs().max().item(),
            (d.reshape(4, 6).full_tensor() - x.reshape(4, 6)).abs().max().item(),
            (torch.softmax(d, 1).full_tensor() - torch.softmax(x, 1)).abs().max().item(),
            (d.sum(0).full_tensor() - x.sum(0)).abs().max().item(),
            (torch.cat([d, d], 1).full_tensor() - torch.cat([x, x], 1)).abs().max().item(),
        ]
        # the built-in data_dependent entry for nonzero comes first (merge keeps the
        # earlier binding): it runs whole on every rank, a Replicate result
        nz = torch.nonzero(d)
        errs.append(0.0 if torch.equal(nz.full_tensor(), torch.nonzero(x)) else 1.0)
        # names of the other versions' entries (max, prod, all, gather: built-in entries)
        errs += [
            (torch.max(d, 1).values.full_tensor() - torch.max(x, 1).values).abs().max().item(),
            (d.prod(0).full_tensor() - x.prod(0)).abs().max().item(),
            float(not torch.equal(torch.all(d > 0, 1).full_tensor(), torch.all(x > 0, 1))),
        ]
        if len(yaml_dir.split(os.pathsep)) > 1:  # with an unknown hyper-parallel pair
            try:
                torch.histogramdd(d, bins=2)
                errs.append(1.0)
            except ShardingError as e:
                ok = "HistogramddDistributedOp (parallel_histogramdd)" in str(e)
                errs.append(0.0 if ok and "override: true" in str(e) else 1.0)
        return errs
    finally:
        if old is None:
            os.environ.pop("HYPER_PARALLEL_OPS_YAML_DIR", None)
        else:
            os.environ["HYPER_PARALLEL_OPS_YAML_DIR"] = old
        reload()


@pytest.mark.multiproc
def test_hyper_parallel_ops_run(dist2, hp_dir: Path, tmp_path: Path) -> None:
    for errs in dist2.run(run_hyper_parallel_ops, str(hp_dir)):
        assert len(errs) == 9 and max(errs) < 1e-5, errs
    # with a directory naming a hyper-parallel class the table does not know: the other
    # ops still run, and the unknown one raises the clear error on every rank
    _write_unknown(tmp_path)
    dirs = os.pathsep.join([str(hp_dir), str(tmp_path)])
    for errs in dist2.run(run_hyper_parallel_ops, dirs):
        assert len(errs) == 10 and max(errs) < 1e-5, errs


def test_fixture_is_hyper_parallels_form() -> None:
    # the fixture keeps hyper-parallel's own keys (loaded and ignored)
    keys = {k for _, entries in FILES.values() for *_, extra in entries for k in extra}
    assert keys == {"infer_layout_suffix", "template_name"}
