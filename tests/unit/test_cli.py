"""The ``hyper-shard`` command line: ``ops list``, ``validate`` and ``explain``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import hyper_shard.registry.loader as L
from hyper_shard import Partial, Replicate, Shard
from hyper_shard.cli import main, parse_placement, parse_placements, parse_shape

PLUGIN = Path(__file__).resolve().parents[2] / "plugins" / "scaled_add"


@pytest.fixture(autouse=True)
def _isolated(monkeypatch):
    """No environment dirs; the CLI's changes to the env and sys.path are undone."""
    monkeypatch.setenv(L.YAML_ENV, "")
    monkeypatch.setenv(L.PY_ENV, "")
    saved = list(sys.path)
    sys.modules.pop("scaled_add_ops", None)  # imported afresh from --python-path
    yield
    sys.path[:] = saved
    sys.modules.pop("scaled_add_ops", None)


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


# ---------------------------------------------------------------------- parsing
def test_parse_placements_and_shapes() -> None:
    assert parse_placement("S(0)") == Shard(0) and parse_placement("Shard(dim=-1)") == Shard(-1)
    assert parse_placement("R") == Replicate() and parse_placement("Replicate()") == Replicate()
    assert parse_placement("P") == Partial("sum") and parse_placement("Partial('max')") == Partial(
        "max"
    )
    assert parse_placements("S(0), P(avg),R") == (Shard(0), Partial("avg"), Replicate())
    assert parse_shape("8x4") == (8, 4) and parse_shape("8,4") == (8, 4) and parse_shape("()") == ()
    for bad in ("X", "S(a)", "P(median)"):
        with pytest.raises(ValueError):
            parse_placement(bad)
    with pytest.raises(ValueError):
        parse_shape("8xfoo")


# ---------------------------------------------------------------------- ops list
def test_ops_list_all_platforms(capsys) -> None:
    code, out, _ = run(capsys, "ops", "list")
    assert code == 0
    lines = {ln.split()[0]: ln for ln in out.splitlines() if ln.strip()}
    assert "rule: pointwise" in lines["add"] and "pointwise.yaml" in lines["add"]
    assert "torch: torch.add" in lines["add"] and "mindspore: AddExt" in lines["add"]
    assert "rule: einsum" in lines["mm"] and "torch.mm" in lines["mm"]
    assert "entries" in out.splitlines()[-1]


def test_ops_list_one_platform_and_filter(capsys) -> None:
    code, out, _ = run(capsys, "ops", "list", "--platform", "mindspore", "--filter", "add")
    assert code == 0
    assert "AddExt" in out and "torch.add" not in out and "mm " not in out
    code, out, _ = run(capsys, "ops", "list", "--platform", "torch", "--filter", "mm")
    assert code == 0 and "torch.mm" in out and "AddExt" not in out


def test_ops_list_with_plugin(capsys) -> None:
    code, out, _ = run(
        capsys,
        "ops",
        "list",
        "--yaml-dir",
        str(PLUGIN),
        "--python-path",
        str(PLUGIN),
        "--filter",
        "scaled_add",
    )
    assert code == 0
    assert "class: scaled_add_ops:ScaledAddDistributedOp" in out
    assert "distributed_op_class: AxpbyDistributedOp" in out
    assert "scaled_add_ops.axpby" in out and "seed_ops.yaml" in out


def test_ops_list_bad_spec_exits_1(capsys, tmp_path) -> None:
    (tmp_path / "ops.yaml").write_text("my_op: {rule: nope}\n")
    code, out, err = run(capsys, "ops", "list", "--yaml-dir", str(tmp_path))
    assert code == 1 and out == ""
    assert "ops.yaml" in err and "entry 'my_op'" in err and "field 'rule'" in err


# ---------------------------------------------------------------------- validate
def test_validate_plugin_ok(capsys) -> None:
    code, out, err = run(capsys, "validate", str(PLUGIN), "--python-path", str(PLUGIN))
    assert code == 0, err
    assert out.startswith("OK: 2 entries in 2 files under")
    assert "2 torch names bound" in out
    assert "scaled_add: class: scaled_add_ops:ScaledAddDistributedOp" in out


def test_validate_plugin_without_python_path(capsys) -> None:
    code, out, err = run(capsys, "validate", str(PLUGIN))
    assert code == 1 and "OK" not in out
    assert "ops.yaml" in err and "entry 'scaled_add'" in err and "field 'class'" in err
    assert "HYPER_PARALLEL_OPS_PYTHON_PATH" in err


@pytest.mark.parametrize(
    "text, fragments",
    [
        ("my_op: {rule: einsum, equation: 'm k -> x'}\n", ["entry 'my_op'", "field 'equation'"]),
        ("my_op: {rule: pointwise, torch: [torch.nope]}\n", ["entry 'my_op'", "field 'torch'"]),
        ("add: {rule: pointwise}\n", ["entry 'add'", "already defined", "pointwise.yaml"]),
        ("my_op: [1, 2\n", ["invalid YAML", "line"]),
    ],
    ids=["bad_equation", "unknown_torch_name", "duplicate_builtin", "bad_yaml"],
)
def test_validate_errors_exit_1(capsys, tmp_path, text, fragments) -> None:
    (tmp_path / "ops.yaml").write_text(text)
    code, out, err = run(capsys, "validate", str(tmp_path))
    assert code == 1 and out == ""
    assert str(tmp_path / "ops.yaml") in err or "ops.yaml" in err
    for f in fragments:
        assert f in err, err


def test_validate_no_bind_skips_torch_names(capsys, tmp_path) -> None:
    (tmp_path / "ops.yaml").write_text("my_op: {rule: pointwise, torch: [torch.nope]}\n")
    code, out, _ = run(capsys, "validate", str(tmp_path), "--no-bind")
    assert code == 0 and out.startswith("OK: 1 entry in 1 file")


def test_validate_not_a_directory(capsys, tmp_path) -> None:
    code, _, err = run(capsys, "validate", str(tmp_path / "missing"))
    assert code == 1 and "not a directory" in err


# ---------------------------------------------------------------------- explain
def _decision(out: str) -> dict[str, str]:
    """role -> 'current -> target' and output index -> placements, from explain's output."""
    got = {}
    section = None
    for ln in out.splitlines():
        if ln.startswith("inputs"):
            section = "in"
        elif ln.startswith("outputs"):
            section = "out"
        elif ln.startswith("  ") and section is not None:
            parts = ln.split("  ")
            key = parts[1].strip()
            got[f"{section}:{key}"] = ln[ln.index("[", ln.index("]") + 1) :].strip()
        else:
            section = None if not ln.startswith("  ") else section
    return got


def test_explain_no_redistribution(capsys) -> None:
    code, out, _ = run(
        capsys, "explain", "mm", "--shapes", "8x6", "6x4", "--placements", "S(0),R", "R,S(1)",
        "--mesh", "2,2",
    )  # fmt: skip
    assert code == 0
    d = _decision(out)
    assert d["in:input"].startswith("[S(0), R] -> [S(0), R]  (keep)")
    assert d["in:mat2"].startswith("[R, S(1)] -> [R, S(1)]  (keep)")
    assert d["out:0"] == "[S(0), S(1)]"
    assert "no redistribution" in out and "op:      mm (rule: einsum)" in out


def test_explain_contraction_gives_partial(capsys) -> None:
    code, out, _ = run(
        capsys, "explain", "torch.mm", "--shapes", "8x6", "6x4", "--placements", "S(1)", "S(0)"
    )
    assert code == 0 and _decision(out)["out:0"] == "[P]"


def test_explain_redistributes(capsys) -> None:
    # input sharded on k, mat2 on n: no single-dim strategy fits, one operand must move
    code, out, _ = run(
        capsys, "explain", "mm", "--shapes", "8x6", "6x4", "--placements", "S(1)", "S(1)"
    )
    assert code == 0
    d = _decision(out)
    moved = [k for k, v in d.items() if k.startswith("in:") and "(keep)" not in v]
    assert len(moved) == 1, out
    assert "cost:" in out and "no redistribution" not in out
    assert d["out:0"] in ("[P]", "[S(1)]", "[S(0)]")


def test_explain_rank_local_overrides(capsys) -> None:
    base = ["explain", "add", "--shapes", "8x6", "--placements", "P", "--arg", "other=2"]
    code, out0, _ = run(capsys, *base, "--rank", "0")
    assert code == 0 and "overrides" not in out0  # coordinate 0 adds the scalar
    code, out1, _ = run(capsys, *base, "--rank", "1")
    assert code == 0 and "rank-local argument overrides: {'other': 0}" in out1


def test_explain_plugin_op(capsys) -> None:
    code, out, _ = run(
        capsys, "explain", "scaled_add", "--shapes", "6x4", "4", "--placements", "S(0)", "R",
        "--yaml-dir", str(PLUGIN), "--python-path", str(PLUGIN),
    )  # fmt: skip
    assert code == 0
    assert _decision(out)["out:0"] == "[S(0)]" and "no redistribution" in out


def test_explain_errors(capsys) -> None:
    code, _, err = run(capsys, "explain", "mmm", "--shapes", "2x2", "2x2")
    assert code == 2 and "did you mean" in err and "mm" in err
    code, _, err = run(capsys, "explain", "mm", "--shapes", "2x2", "2x2", "--placements", "Q", "R")
    assert code == 2 and "cannot read placement 'Q'" in err
    code, _, err = run(capsys, "explain", "mm", "--shapes", "2x2", "2x2", "--placements", "R")
    assert code == 2 and "2 shapes but 1 placements" in err
    code, _, err = run(
        capsys, "explain", "mm", "--shapes", "2x2", "2x2", "--placements", "R,R", "R", "--mesh", "2"
    )
    assert code == 2 and "2 placements" in err and "1-D mesh" in err
    code, _, err = run(capsys, "explain", "mm", "--shapes", "8x6", "7x4")
    assert code == 1 and "shapes do not match" in err


def test_help_exits_0(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "validate" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["ops"])
    assert info.value.code == 2


def test_docs_yaml_only_example_validates(capsys, tmp_path) -> None:
    """The YAML-only example of docs/custom_ops.md loads and binds as written."""
    doc = (PLUGIN.parents[1] / "docs" / "custom_ops.md").read_text()
    start = doc.index("```yaml\n# my_ops/extra_pointwise.yaml")
    block = doc[start + len("```yaml\n") : doc.index("```", start + 7)]
    (tmp_path / "extra_pointwise.yaml").write_text(block)
    code, out, err = run(capsys, "validate", str(tmp_path))
    assert code == 0, err
    assert out.startswith("OK: 3 entries in 1 file") and "8 torch names bound" in out
