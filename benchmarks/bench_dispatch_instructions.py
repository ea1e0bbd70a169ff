"""Dispatch cost in CPU instructions (callgrind): repeatable on a loaded, shared machine.

Wall-clock microbenchmarks (``bench_dispatch.py``) swing by 2x when other processes share
the two cores; an instruction count does not. For each op, this script runs the call N
times under ``valgrind --tool=callgrind`` with instrumentation switched on only around the
loop (``callgrind_control -i on/off``), and subtracts a run of 0 calls, for: the plain torch
op on the local shard, hyper_shard's DTensor, and torch.distributed.tensor's DTensor (a
fake process group, rank 0 of 2: no collective runs). It prints instructions per call and
the overheads' ratio (hyper_shard / torch DTensor). Needs valgrind (Debian: ``valgrind``).

    python benchmarks/bench_dispatch_instructions.py [--ops add,mm] [--calls 2000]
    python benchmarks/bench_dispatch_instructions.py --tree OTHER_CHECKOUT   # A/B a change

``--tree DIR`` measures hyper_shard from another checkout too (its ``hyper_shard`` package
first on the path) and prints both, e.g. to show that a change to the hot path costs
nothing.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import os, subprocess, sys, warnings
warnings.filterwarnings("ignore")
import torch, torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
torch.set_num_threads(1)
lib, op, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
if lib == "torch_dt":
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    mesh = init_device_mesh("cpu", (2,))
    x = distribute_tensor(torch.randn(64, 64), mesh, [Shard(0)], src_data_rank=None)
    w = distribute_tensor(torch.randn(64, 64), mesh, [Replicate()], src_data_rank=None)
else:
    import hyper_shard as hs
    mesh = hs.init_device_mesh("cpu", (2,))
    x = hs.distribute_tensor(torch.randn(64, 64), mesh, [hs.Shard(0)], src_data_rank=None)
    w = hs.distribute_tensor(torch.randn(64, 64), mesh, [hs.Replicate()], src_data_rank=None)
    if lib == "plain":
        x, w = x.to_local(), w.to_local()
calls = {
    "add": lambda: torch.add(x, x),
    "mm": lambda: torch.mm(x, w),
    "sum": lambda: x.sum(dim=1),
    "view": lambda: x.view(-1),
    "relu": lambda: torch.relu(x),
    "transpose": lambda: x.transpose(0, 1),
}
f = calls[op]
for _ in range(200):
    f()
pid = str(os.getpid())
subprocess.run(["callgrind_control", "-i", "on", pid], capture_output=True)
for _ in range(n):
    f()
subprocess.run(["callgrind_control", "-i", "off", pid], capture_output=True)
"""

OPS = ("add", "mm", "sum", "view", "relu", "transpose")


def _count(child: Path, tree: Path, lib: str, op: str, n: int) -> int:
    with tempfile.TemporaryDirectory() as d:
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={d}/cg.out",
                sys.executable,
                str(child),
                lib,
                op,
                str(n),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
    m = re.search(r"Collected : (\d+)", proc.stderr)
    if m is None:
        raise RuntimeError(f"callgrind gave no count for {lib} {op}:\n{proc.stderr[-2000:]}")
    return int(m.group(1))


def _per_call(child: Path, tree: Path, lib: str, op: str, n: int) -> float:
    return (_count(child, tree, lib, op, n) - _count(child, tree, lib, op, 0)) / n


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--ops", default=",".join(OPS), help=f"comma-separated, of {OPS}")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--tree", type=Path, default=None, help="another checkout to compare")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (callgrind) is not installed; on Debian: apt-get install valgrind")
    ops = [o for o in args.ops.split(",") if o]
    with tempfile.TemporaryDirectory() as d:
        child = Path(d) / "child.py"
        child.write_text(_CHILD)
        head = f"{'op':10s} {'plain':>9s} {'torch DT':>9s} {'hs':>9s} {'hs/tDT overhead':>16s}"
        if args.tree is not None:
            head += f" {'hs (--tree)':>12s} {'tree/this':>10s}"
        print("instructions per call (callgrind), 64x64 fp32, mesh of 2, rank 0")
        print(head)
        for op in ops:
            plain = _per_call(child, ROOT, "plain", op, args.calls)
            tdt = _per_call(child, ROOT, "torch_dt", op, args.calls)
            hs = _per_call(child, ROOT, "hyper_shard", op, args.calls)
            line = (
                f"{op:10s} {plain:9.0f} {tdt:9.0f} {hs:9.0f} {(hs - plain) / (tdt - plain):16.2f}"
            )
            if args.tree is not None:
                other = _per_call(child, args.tree.resolve(), "hyper_shard", op, args.calls)
                line += f" {other:12.0f} {other / hs:10.3f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
