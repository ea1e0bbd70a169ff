"""The main job end to end: ``examples/train_llama_tp.py --check`` trains a Hugging Face
``LlamaForCausalLM`` with tensor parallelism on 2 spawned gloo ranks and, in the same run,
the same model in one process; ``--check`` fails unless every step's losses agree to 1e-4
relative. Run as a subprocess, exactly as a user would."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.multiproc, pytest.mark.slow]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "train_llama_tp.py"
ROW = re.compile(r"^\s*(\d+)\s+(\d+\.\d+)\s+(\d+\.\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s*$")


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, list[tuple]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--check", "--out-dir", str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
    )
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr[-4000:]}"
    rows = [m.groups() for line in proc.stdout.splitlines() if (m := ROW.match(line))]
    return proc, rows


def _check_rows(rows: list[tuple], steps: int) -> None:
    assert [int(r[0]) for r in rows] == list(range(steps))  # every step is in the table
    for _, tp, single, rel, _, _ in rows:
        tp_loss, single_loss = float(tp), float(single)
        assert abs(tp_loss - single_loss) <= 1e-4 * abs(single_loss)
        assert float(rel) <= 1e-4
        assert 0.0 < single_loss < 10.0  # a cross-entropy over 256 byte values


def test_llama_tp_check_passes(tmp_path: Path) -> None:
    proc, rows = _run(tmp_path, "--steps", "3")
    assert "--check passed" in proc.stdout
    _check_rows(rows, 3)
    assert "TP over 2 ranks" in proc.stdout
    png = tmp_path / "train_llama_tp_loss.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def check_sequence_parallel_plan(rank, world, steps):
    """The example's ``--sp`` plan, run in the test's rank pool: TP losses against the
    single-device model trained on the same batches in each rank."""
    import torch

    sys.path.insert(0, str(EXAMPLE.parent))
    import train_llama_tp as ex

    args = ex.parse_args(["--sp", "--steps", str(steps), "--seq", "32"])
    data = ex.load_data()
    tp = ex.train_tp(args, data, torch.device("cpu"))["losses"]
    single = ex.train_single(args, data, torch.device("cpu"))["losses"]
    assert len(tp) == len(single) == steps
    for a, b in zip(tp, single):
        assert abs(a - b) <= 1e-4 * abs(b), (tp, single)
    return tp


def test_llama_tp_sequence_parallel_matches_single_device(dist2) -> None:
    tp0, tp1 = dist2.run(check_sequence_parallel_plan, 4, timeout=240)
    assert tp0 == tp1  # every rank saw the same (replicated) loss


def check_fsdp_tp_plan(rank, world, steps):
    """The example's ``--dp 2 --tp 2`` (FSDP units on mesh["dp"] over the TP plan on
    mesh["tp"]), run in the test's 4-rank pool: losses against the single-device model."""
    import torch

    sys.path.insert(0, str(EXAMPLE.parent))
    import train_llama_tp as ex

    args = ex.parse_args(["--dp", "2", "--tp", "2", "--steps", str(steps), "--seq", "32"])
    ex.validate(args, world)
    data = ex.load_data()
    got = ex.train_tp(args, data, torch.device("cpu"))["losses"]
    single = ex.train_single(args, data, torch.device("cpu"))["losses"]
    assert len(got) == len(single) == steps
    for a, b in zip(got, single):
        assert abs(a - b) <= 1e-4 * abs(b), (got, single)
    return got


def test_llama_fsdp_x_tp_matches_single_device(dist4) -> None:
    out = dist4.run(check_fsdp_tp_plan, 3, timeout=240)
    assert all(o == out[0] for o in out)  # the dp-mean loss is the same on every rank
