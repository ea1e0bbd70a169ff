"""The layering contracts of pyproject.toml ([tool.importlinter], run by .ci/run as
``lint-imports``) hold for the tree, and do catch a violation: a copy of the package with a
rule importing a platform module fails, naming the contract and the import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(pkg_parent: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pkg_parent)}
    return subprocess.run(
        [str(LINT), "--config", str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=pkg_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_contracts_hold_and_catch_a_bad_import(tmp_path: Path) -> None:
    ok = _lint(ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 broken" in ok.stdout

    shutil.copytree(ROOT / "hyper_shard", tmp_path / "hyper_shard")
    bad = tmp_path / "hyper_shard" / "rules" / "pointwise.py"
    bad.write_text(bad.read_text() + "\nfrom ..platform.torch import dispatch as _bad  # noqa\n")
    broken = _lint(tmp_path)
    assert broken.returncode != 0
    out = broken.stdout
    assert "rules and the registry never import a platform BROKEN" in out, out
    assert "hyper_shard.rules.pointwise -> hyper_shard.platform.torch" in out, out
