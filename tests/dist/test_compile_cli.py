"""The main job's ``--compile``: ``examples/train_llama_tp.py --compile aot_eager --check``
compiles the tensor-parallel model whole (and the single-device one), and ``--check``
holds every step's TP loss to the single-device loss (1e-4 relative). Run as a
subprocess, as a user would; a few steps (each graph costs seconds to build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .test_llama_example import EXAMPLE, ROW, _check_rows

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]


def test_llama_tp_sp_compiled_check_passes(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--check", "--out-dir", str(tmp_path), "--steps", "3"]
        + ["--sp", "--compile", "aot_eager"],
        capture_output=True,
        text=True,
        timeout=900,  # compiling costs most of it
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    assert "--check passed" in proc.stdout
    _check_rows([m.groups() for line in proc.stdout.splitlines() if (m := ROW.match(line))], 3)
