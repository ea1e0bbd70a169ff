"""The main job resumes on another tensor-parallel degree: ``examples/train_llama_tp.py``'s
``train_tp`` trains 3 steps on 2 ranks and ``--save``s (model, AdamW state, step count);
on 4 ranks ``--resume`` loads that into the 4-way plan and trains steps 3..5. Every step's
loss equals the single-process run of the same 6 steps (same seed, same batches)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.multiproc

EXAMPLE_DIR = Path(__file__).resolve().parents[2] / "examples"
SMALL = ["--hidden", "64", "--ffn", "128", "--layers", "1", "--heads", "4", "--kv-heads", "4",
         "--seq", "16", "--batch", "4"]  # fmt: skip


def _example():
    sys.path.insert(0, str(EXAMPLE_DIR))
    import train_llama_tp as ex

    return ex


def run_tp(rank: int, world: int, argv: list[str]) -> dict:
    ex = _example()
    args = ex.parse_args(SMALL + argv)
    return ex.train_tp(args, ex.load_data(), torch.device("cpu"))


def test_llama_resume_other_tp(dist2, dist4, tmp_path: Path) -> None:
    ckpt = str(tmp_path / "ckpt")
    first = dist2.run(run_tp, ["--steps", "3", "--save", ckpt])[0]
    second = dist4.run(run_tp, ["--steps", "6", "--resume", ckpt])[0]
    assert first["start"] == 0 and second["start"] == 3
    ex = _example()
    args = ex.parse_args(SMALL + ["--steps", "6"])
    single = ex.train_single(args, ex.load_data(), torch.device("cpu"))["losses"]
    got = first["losses"] + second["losses"]
    assert len(got) == 6
    torch.testing.assert_close(torch.tensor(got), torch.tensor(single), rtol=1e-4, atol=0)
