"""The layering contracts of pyproject.toml ([tool.importlinter], run by .ci/run as
``lint-imports``) hold for the tree, and do catch a violation: copies of the package with
a rule importing the dispatcher (lazily, inside a function), a kernel importing a platform
module, and a value module reaching the DTensor API only through a helper (an indirect
chain) each fail the strict ``layers`` contract, naming the import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")
LAYERS = "layers: entry points > platforms > features"


def _lint(pkg_parent: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pkg_parent)}
    return subprocess.run(
        [str(LINT), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=pkg_parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _broken(tmp: Path, edits: dict[str, str]) -> str:
    """lint-imports on a copy of the package with ``edits`` (relative path -> text appended,
    or the text of a new module); returns its report, asserting it failed."""
    pkg = tmp / "hyper_shard"
    shutil.copytree(ROOT / "hyper_shard", pkg, ignore=shutil.ignore_patterns("__pycache__"))
    for rel, text in edits.items():
        f = pkg / rel
        f.write_text((f.read_text() if f.exists() else "") + text)
    res = _lint(tmp)
    assert res.returncode != 0, res.stdout
    return " ".join(res.stdout.split())  # rich wraps long lines


def test_contracts_hold() -> None:
    ok = _lint(ROOT)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "0 broken" in ok.stdout


@pytest.mark.parametrize(
    "edits, importer, imported",
    [
        (  # a lazy import inside a function is an import: a rule may not reach the dispatcher
            {"rules/_bad.py": "def f():\n    from ..dispatch import dispatcher\n"},
            "hyper_shard.rules",
            "hyper_shard.dispatch.dispatcher",
        ),
        (  # a kernel may not import a platform package
            {"kernels/_bad.py": "from ..platform.torch import names  # noqa\n"},
            "hyper_shard.kernels",
            "hyper_shard.platform.torch",
        ),
        (  # indirect: a value module reaching the DTensor API through a helper
            {
                "_bad_helper.py": "from . import dtensor  # noqa\n",
                "placement.py": "\n\ndef _bad():\n    from . import _bad_helper  # noqa\n",
            },
            "hyper_shard.placement",
            "hyper_shard.dtensor",
        ),
    ],
    ids=["lazy-rule-to-dispatcher", "kernel-to-platform", "indirect-value-to-dtensor"],
)
def test_a_broken_layer_fails_the_contract(
    tmp_path: Path, edits: dict[str, str], importer: str, imported: str
) -> None:
    out = _broken(tmp_path, edits)
    assert f"{LAYERS}" in out and "BROKEN" in out, out
    assert f"{importer} is not allowed to import {imported}" in out, out


def test_no_rule_imports_the_platform_package() -> None:
    """DESIGN.md: rules never import a platform, not even for type checking (the protocols
    they call are typed ``Any`` there; a kernel answers what a rule must know of one)."""
    import ast
    from pathlib import Path

    rules = Path(__file__).resolve().parents[2] / "hyper_shard" / "rules"
    found = []
    for path in sorted(rules.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("platform"):
                found.append(f"{path.name}:{node.lineno}")
            if isinstance(node, ast.ImportFrom) and node.level and node.module is None:
                found += [f"{path.name}:{node.lineno}" for a in node.names if a.name == "platform"]
    assert found == [], f"rules import the platform package: {found}"
