"""hyper_shard's dispatch overhead on MindSpore, as a ratio to the plain MindSpore op.

One process (a world of one: ``init_device_mesh("CPU", (1,))``, so no collective runs and
only the dispatch is measured), PyNative, ``mindspore.runtime.launch_blocking()`` (on a
CPU with few cores MindSpore's asynchronous launch makes every number 10x noisier). For
each op, three variants run on the same local data in interleaved rounds:

* ``plain``: the MindSpore op on plain tensors;
* ``hook``: the op on a Tensor subclass whose ``__fallback__`` just runs the Primitive
  under ``NoFallbackGuard`` and rewraps the result (MindSpore's own interception cost);
* ``hyper_shard``: the op on hyper_shard DTensors (layout-cache hit: key, lookup, local
  call, wrap).

Times are the best round's mean per call (µs); ``ratio`` = hyper_shard / plain. The
``Dense fwd+bwd`` row is ``mindspore.value_and_grad`` of ``sum(linear(x, w, b))`` w.r.t. the
weights (hyper_shard: its ``value_and_grad`` wrapper, DTensor parameters).

    python benchmarks/bench_dispatch_mindspore.py [--quick]
    python benchmarks/bench_dispatch.py --backend mindspore [--quick]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["run", "run_mindspore", "measure"]


def _rounds(fns: dict[str, Callable[[], Any]], n: int, rounds: int) -> dict[str, float]:
    """Best-round mean time per call (µs) of each function, in interleaved rounds."""
    for f in fns.values():
        for _ in range(max(20, n // 10)):
            f()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best[k] = min(best[k], (time.perf_counter() - t0) / n * 1e6)
    return best


def measure(quick: bool = False) -> list[dict[str, Any]]:
    """The per-op table as a list of rows (op, plain, hook, hyper_shard, ratio)."""
    import mindspore as ms
    from mindspore import Parameter, Tensor, mint
    from mindspore._c_expression import NoFallbackGuard

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard
    from hyper_shard.platform.mindspore.autograd import value_and_grad

    ms.set_device("CPU")
    ms.runtime.launch_blocking()

    class Hook(Tensor):
        def __new__(cls, data: Any, *args: Any, **kwargs: Any) -> Any:  # for Parameter(hook)
            return Tensor._make_subclass(cls, data)

        def __fallback__(self, func: Any, args: tuple, kwargs: Any = None) -> Any:
            with NoFallbackGuard():
                out = func(*args, **(kwargs or {}))
            return Tensor._make_subclass(Hook, out) if isinstance(out, Tensor) else out

    mesh = hs.init_device_mesh("CPU", (1,), platform="mindspore")
    rs = np.random.RandomState(0)
    x_np = rs.randn(64, 64).astype(np.float32)
    y_np = rs.randn(64, 64).astype(np.float32)
    w_np = rs.randn(32, 64).astype(np.float32)
    b_np = rs.randn(32).astype(np.float32)
    x, y, w, b = Tensor(x_np), Tensor(y_np), Tensor(w_np), Tensor(b_np)
    hx, hy = Tensor._make_subclass(Hook, Tensor(x_np)), Tensor._make_subclass(Hook, Tensor(y_np))
    dx = hs.distribute_tensor(x, mesh, [Shard(0)])
    dy = hs.distribute_tensor(y, mesh, [Shard(0)])
    dr = hs.distribute_tensor(y, mesh, [Replicate()])
    ops: list[tuple[str, Callable, Callable, Callable]] = [
        ("AddExt (x + y)", lambda: x + y, lambda: hx + hy, lambda: dx + dy),
        (
            "MatMulExt",
            lambda: mint.matmul(x, y),
            lambda: mint.matmul(hx, hy),
            lambda: mint.matmul(dx, dr),
        ),
        (
            "SumExt (dim=1)",
            lambda: mint.sum(x, 1),
            lambda: mint.sum(hx, 1),
            lambda: mint.sum(dx, 1),
        ),
        (
            "Reshape",
            lambda: x.reshape(32, 128),
            lambda: hx.reshape(32, 128),
            lambda: dx.reshape(32, 128),
        ),
    ]
    n, rounds = (200, 3) if quick else (1000, 5)
    rows = []
    for name, plain, hook, hsd in ops:
        r = _rounds({"plain": plain, "hook": hook, "hyper_shard": hsd}, n, rounds)
        rows.append({"op": name, **r})
    # Dense forward + backward, gradients w.r.t. the weights
    pw, pb = Parameter(Tensor(w_np), name="pw"), Parameter(Tensor(b_np), name="pb")
    hw = Parameter(Tensor._make_subclass(Hook, Tensor(w_np)), name="hw")
    hb = Parameter(Tensor._make_subclass(Hook, Tensor(b_np)), name="hb")
    dw = Parameter(hs.distribute_tensor(w, mesh, [Shard(0)]), name="dw")
    db = Parameter(hs.distribute_tensor(b, mesh, [Shard(0)]), name="db")
    lin = mint.nn.functional.linear
    g_plain = ms.value_and_grad(lambda a: lin(a, pw, pb).sum(), None, [pw, pb])
    g_hook = ms.value_and_grad(lambda a: lin(a, hw, hb).sum(), None, [hw, hb])
    d_in = hs.distribute_tensor(x, mesh, [Replicate()])
    g_hs = value_and_grad(lambda a: lin(a, dw, db).sum(), None, [dw, db])
    m = max(50, n // 5)
    r = _rounds(
        {
            "plain": lambda: g_plain(x),
            "hook": lambda: g_hook(hx),
            "hyper_shard": lambda: g_hs(d_in),
        },
        m,
        rounds,
    )
    rows.append({"op": "Dense fwd+bwd", **r})
    for row in rows:
        row["ratio"] = row["hyper_shard"] / row["plain"]
    return rows


def run(quick: bool = False) -> list[dict[str, Any]]:
    """Measure and print the table (see the module docstring); returns the rows."""
    rows = measure(quick)
    print("hyper_shard dispatch on MindSpore (CPU, PyNative, launch_blocking, world of one)")
    print(
        f"{'op':18s} {'plain µs':>9s} {'hook µs':>9s} {'hs µs':>9s} {'hs - plain':>10s} {'ratio':>6s}"
    )
    for r in rows:
        print(
            f"{r['op']:18s} {r['plain']:9.1f} {r['hook']:9.1f} {r['hyper_shard']:9.1f} "
            f"{r['hyper_shard'] - r['plain']:10.1f} {r['ratio']:6.2f}"
        )
    return rows


run_mindspore = run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer iterations")
    run(ap.parse_args().quick)


if __name__ == "__main__":
    main()
