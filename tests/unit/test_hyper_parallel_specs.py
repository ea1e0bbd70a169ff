"""hyper-parallel's shipped YAML directory loads unchanged through
``HYPER_PARALLEL_OPS_YAML_DIR`` (issue 15): every (op name, distributed_op_file,
distributed_op_class) triple of ``_hyper_parallel_fixture`` (written from a reading of
``mindspore-ai/hyper-parallel``) maps onto a hyper_shard rule, its ops then dispatch, and
docs/custom_ops.md section 4's own example passes ``hyper-shard validate``."""

from __future__ import annotations

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
    for name, file, cls in triples():
        target = hyper_parallel.NAME_TO_ENTRY.get(name, hyper_parallel.CLASS_TO_ENTRY[(file, cls)])
        e = by_name[name]
        if name in builtin and e.file == builtin[name].file:
            continue  # the name is a built-in entry's too: the built-in (same meaning) stays
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
        return errs
    finally:
        if old is None:
            os.environ.pop("HYPER_PARALLEL_OPS_YAML_DIR", None)
        else:
            os.environ["HYPER_PARALLEL_OPS_YAML_DIR"] = old
        reload()


@pytest.mark.multiproc
def test_hyper_parallel_ops_run(dist2, hp_dir: Path) -> None:
    for errs in dist2.run(run_hyper_parallel_ops, str(hp_dir)):
        assert max(errs) < 1e-6, errs


def test_fixture_is_hyper_parallels_form() -> None:
    # the fixture keeps hyper-parallel's own keys (loaded and ignored)
    keys = {k for _, entries in FILES.values() for *_, extra in entries for k in extra}
    assert keys == {"infer_layout_suffix", "template_name"}
