"""MindSpore dispatch cost in CPU instructions (callgrind): repeatable on a loaded machine.

The MindSpore twin of ``bench_dispatch_instructions.py``. ``bench_dispatch_mindspore.py``
times the same calls, but on this shared 2-core machine a 64x64 MindSpore op swings from
90 to 200 µs between rounds, more than hyper_shard's whole overhead. This script runs
every call N times under ``valgrind --tool=callgrind`` in ONE process (MindSpore takes
minutes to import under valgrind), with instrumentation switched on only around each loop
(``callgrind_control -z`` / ``-i on`` / ``-i off`` / ``-d``), and prints instructions per
call for three variants on the same local data (as ``bench_dispatch_mindspore.py``):

* ``plain``: the MindSpore op on plain tensors;
* ``hook``: a bare Tensor subclass whose ``__fallback__`` runs the Primitive under
  ``NoFallbackGuard`` and rewraps (MindSpore's own interception, the floor of a
  ``__fallback__``-based DTensor);
* ``hs``: hyper_shard DTensors (world of one, layout-cache hit).

Instruction counts include MindSpore's worker threads (callgrind serialises them; their
polling adds a little noise); the cost of the measurement itself (an empty loop of the
same length and the ``callgrind_control`` calls around it, ~1.5k instructions per call at
1000 calls, ~12k at 100) is measured once and subtracted. CPU-cache effects (which make
the wall-clock overhead larger) are not counted. Needs valgrind (Debian: ``valgrind``);
one run takes ~10-15 min per tree.

    python benchmarks/bench_dispatch_instructions_mindspore.py [--calls 1000]
    python benchmarks/bench_dispatch_instructions_mindspore.py --tree OTHER_CHECKOUT
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
OPS = ("x + y", "mint.add", "mint.sum", "mint.matmul", "F.linear", "x.reshape")
LIBS = ("plain", "hook", "hs")

_CHILD = r"""
import os, subprocess, sys, warnings
warnings.filterwarnings("ignore")
import numpy as np, mindspore as ms
from mindspore import Tensor, mint
from mindspore._c_expression import NoFallbackGuard
ms.set_device("CPU"); ms.runtime.launch_blocking()
import hyper_shard as hs
n = int(sys.argv[1])

class Hook(Tensor):
    def __fallback__(self, func, args, kwargs=None):
        with NoFallbackGuard():
            o = func(*args, **(kwargs or {}))
        return Tensor._make_subclass(Hook, o) if isinstance(o, Tensor) else o

mesh = hs.init_device_mesh("CPU", (1,), platform="mindspore")
rs = np.random.RandomState(0)
x, y = Tensor(rs.randn(64, 64).astype(np.float32)), Tensor(rs.randn(64, 64).astype(np.float32))
w, b = Tensor(rs.randn(32, 64).astype(np.float32)), Tensor(rs.randn(32).astype(np.float32))
mk = Tensor._make_subclass
hx, hy, hw, hb = (mk(Hook, Tensor(t)) for t in (x, y, w, b))
dx = hs.distribute_tensor(x, mesh, [hs.Shard(0)])
dy = hs.distribute_tensor(y, mesh, [hs.Shard(0)])
dr = hs.distribute_tensor(y, mesh, [hs.Replicate()])
dxr = hs.distribute_tensor(x, mesh, [hs.Replicate()])
dw = hs.distribute_tensor(w, mesh, [hs.Shard(0)])
db = hs.distribute_tensor(b, mesh, [hs.Shard(0)])
lin = mint.nn.functional.linear
ops = [
    ("x + y", lambda: x + y, lambda: hx + hy, lambda: dx + dy),
    ("mint.add", lambda: mint.add(x, y), lambda: mint.add(hx, hy), lambda: mint.add(dx, dy)),
    ("mint.sum", lambda: mint.sum(x, 1), lambda: mint.sum(hx, 1), lambda: mint.sum(dx, 1)),
    ("mint.matmul", lambda: mint.matmul(x, y), lambda: mint.matmul(hx, hy), lambda: mint.matmul(dx, dr)),
    ("F.linear", lambda: lin(x, w, b), lambda: lin(hx, hw, hb), lambda: lin(dxr, dw, db)),
    ("x.reshape", lambda: x.reshape(32, 128), lambda: hx.reshape(32, 128), lambda: dx.reshape(32, 128)),
]
pid = str(os.getpid())

def cc(*a):
    subprocess.run(["callgrind_control", *a, pid], capture_output=True)

ops.insert(0, ("empty loop", lambda: None))
for name, *fns in ops:
    if name == "empty loop":
        fns = fns[:1]
    for f in fns:
        for _ in range(30):
            f()
        cc("-z"); cc("-i", "on")
        for _ in range(n):
            f()
        cc("-i", "off"); cc("-d")
"""


def _run(tree: Path, n: int) -> dict[tuple[str, str], float]:
    """Instructions per call of every (op, variant), from one valgrind run on ``tree``."""
    with tempfile.TemporaryDirectory() as d:
        child = Path(d) / "child.py"
        child.write_text(_CHILD)
        env = {**os.environ, "PYTHONPATH": str(tree), "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--instr-atstart=no",
                f"--callgrind-out-file={d}/cg.out",
                sys.executable,
                str(child),
                str(n),
            ],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        dumps = sorted(Path(d).glob("cg.out.*"), key=lambda p: int(p.suffix.lstrip(".") or 0))
        want = 1 + len(OPS) * len(LIBS)
        if proc.returncode != 0 or len(dumps) < want:
            raise RuntimeError(
                f"callgrind run on {tree} gave {len(dumps)} of {want} dumps:\n{proc.stderr[-2000:]}"
            )
        counts = []
        for dump in dumps[:want]:
            m = re.search(r"^totals: (\d+)", dump.read_text(errors="ignore"), re.M)
            if m is None:
                raise RuntimeError(f"no totals in {dump.name}")
            counts.append(int(m.group(1)) / n)
        empty = counts[0]  # the measurement's own cost per call
        keys = [(op, lib) for op in OPS for lib in LIBS]
        out = {key: c - empty for key, c in zip(keys, counts[1:])}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--calls", type=int, default=1000)
    ap.add_argument("--tree", type=Path, default=None, help="another checkout to compare")
    args = ap.parse_args()
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        sys.exit("valgrind (callgrind) is not installed; on Debian: apt-get install valgrind")
    this = _run(ROOT, args.calls)
    other = _run(args.tree.resolve(), args.calls) if args.tree is not None else None
    print("instructions per call (callgrind), MindSpore CPU, 64x64 fp32, world of one")
    head = f"{'op':12s} {'plain':>9s} {'hook':>9s} {'hs':>9s} {'hs/plain':>9s} {'hook/plain':>10s}"
    if other is not None:
        head += f" {'hs (--tree)':>12s} {'tree/plain':>10s}"
    print(head)
    for op in OPS:
        p, h, s = (this[(op, lib)] for lib in LIBS)
        line = f"{op:12s} {p:9.0f} {h:9.0f} {s:9.0f} {s / p:9.3f} {h / p:10.3f}"
        if other is not None:
            o = other[(op, "hs")]
            line += f" {o:12.0f} {o / other[(op, 'plain')]:10.3f}"
        print(line, flush=True)


if __name__ == "__main__":
    main()
