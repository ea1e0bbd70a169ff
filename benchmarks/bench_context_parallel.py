"""Context-parallel attention: ring vs all-gather vs all-to-all (Ulysses) vs one process.

Causal ``scaled_dot_product_attention`` forward + backward on a long sequence (2k to 16k
tokens, small heads so it runs on CPU), with query, key and value sharded along the
sequence over 2 gloo ranks (127.0.0.1, ``torch.set_num_threads(1)``) in the head-tail
load-balanced layout that ``hyper_shard.experimental.context_parallel`` gives them:
hyper_shard's attention rule runs each method forced with
``set_context_parallel_method``, and the cost model's own choice (``auto``) is printed
next to them. One process runs the same attention on the whole sequence with torch's
kernel (rank 0; the other rank waits).

Per method and length: the time of forward + backward (the fastest of the repeats, of the
slower rank: the least disturbed by other load on a shared machine; ``ratio`` = time /
one process's, < 1 is faster), the CPU time of the busier rank (``time.process_time``:
what a loaded machine does not inflate; its ratio is the share of one process's work a
rank does, 0.5 at best on 2 ranks), the bytes each rank sends
(counted from the tensors handed to the platform's collectives: an all-gather or
all-to-all of a piece sends ``n - 1`` of its ``n`` parts, a send/recv its tensor) and the
largest key/value bytes the method holds at once (ring: the kernel's own record,
:func:`hyper_shard.kernels.ring_attention.record_memory`, plus its own piece; all-gather:
the whole key and value; all-to-all: the whole sequence for ``H / n`` heads).

    python benchmarks/bench_context_parallel.py                      # about 2 minutes
    python benchmarks/bench_context_parallel.py --seqs 2048,4096     # quicker
    python benchmarks/bench_context_parallel.py --heads 8 --head-dim 32 --repeats 3
    python benchmarks/bench_context_parallel.py --compile aot_eager --seqs 2048,4096

``--compile BACKEND`` also times each method with the attention call under
``torch.compile`` (forward and backward compiled: the ring's shifts as functional
collectives), in the same ranks and run, and prints compiled / eager per method.

Times on a shared machine are noisy: the first line prints the load average.
"""

from __future__ import annotations

import argparse
import os
import socket
import time
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

METHODS = ("ring", "allgather", "ulysses")
_COUNTED = (
    "all_gather", "all_reduce", "reduce_scatter", "all_to_all", "send_recv", "send_recv_start",
)  # fmt: skip


class _Bytes:
    """Wraps a platform's collectives to count the bytes this rank sends."""

    def __init__(self, plat: Any) -> None:
        self.plat, self.sent = plat, 0

    def __enter__(self) -> _Bytes:
        p, n_of = self.plat, lambda g: len(g.ranks)

        def part(t: Any, g: Any) -> int:  # (n-1)/n of a tensor that is split n ways
            return t.numel() * t.element_size() * (n_of(g) - 1) // n_of(g)

        counts = {
            "all_gather": lambda t, g, n: t.numel() * t.element_size() * (n - 1),
            "all_reduce": lambda t, op, g: 2 * part(t, g),
            "reduce_scatter": lambda pieces, op, g: sum(
                x.numel() * x.element_size() for x in pieces[1:]
            ),
            "all_to_all": lambda pieces, g: sum(x.numel() * x.element_size() for x in pieces[1:]),
            "send_recv": lambda t, *a, **k: t.numel() * t.element_size(),
            "send_recv_start": lambda t, *a, **k: t.numel() * t.element_size(),
        }
        assert tuple(counts) == _COUNTED
        for name, count in counts.items():
            fn = getattr(p, name)

            def wrapped(*a: Any, _fn: Any = fn, _count: Any = count, **k: Any) -> Any:
                self.sent += _count(*a, **k)
                return _fn(*a, **k)

            setattr(p, name, wrapped)
        return self

    def __exit__(self, *exc: Any) -> None:
        for name in _COUNTED:
            delattr(self.plat, name)


def _timed(fn: Any, repeats: int) -> tuple[list[float], list[float]]:
    """Wall and CPU seconds of every repeat (CPU: this process, every thread)."""
    wall, cpu = [], []
    for _ in range(repeats):
        dist.barrier()
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return wall, cpu


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, q: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    from hyper_shard import DTensor, Shard, init_device_mesh
    from hyper_shard.dispatch.dispatcher import _CACHE
    from hyper_shard.experimental import set_context_parallel_method
    from hyper_shard.kernels.attention_layout import HEAD_TAIL, using_layout
    from hyper_shard.kernels.ring_attention import record_memory
    from hyper_shard.spec import contiguous_stride

    mesh = init_device_mesh("cpu", (world,))
    plat = mesh.platform
    h, e = args.heads, args.head_dim
    rows = []
    for s in args.seqs:
        shape = (1, h, s, e)
        gen = torch.Generator().manual_seed(s)
        whole = [torch.randn(shape, generator=gen) for _ in range(3)]
        order = torch.tensor(HEAD_TAIL.order(s, world))
        n = s // world
        pieces = [t.index_select(2, order).narrow(2, rank * n, n).contiguous() for t in whole]
        piece_kv = 2 * pieces[1].numel() * pieces[1].element_size()

        def sharded(pieces: list = pieces, shape: tuple = shape, attn: Any = None) -> Any:
            ds = [
                DTensor.from_local(
                    p.clone().requires_grad_(), mesh, [Shard(2)], shape=shape,
                    stride=contiguous_stride(shape),
                )
                for p in pieces
            ]  # fmt: skip
            with using_layout(HEAD_TAIL):
                out = (attn or _causal)(*ds)
                out.backward(torch.ones_like(out))
            return out

        for method in (*args.methods, "auto"):
            set_context_parallel_method(method)
            if args.compile and method != "auto":
                torch._dynamo.reset()
                attn = torch.compile(_causal, backend=args.compile)
                compiled_run = partial(sharded, attn=attn)
                compiled_run()  # compile
                wall, cpu = _timed(compiled_run, args.repeats)
                rows.append((s, method + "+c", max_all(wall), max_all(cpu), 0, 0, ""))
            sharded()  # warm-up (and the decision)
            chosen = {type(d.impl).__name__ for d in _CACHE.values() if d.impl is not None}
            wall, cpu = _timed(sharded, args.repeats) if method != "auto" else ([0.0], [0.0])
            with _Bytes(plat) as b, record_memory() as rec:
                sharded()
            held = {
                "ring": piece_kv + max((x for p_, _, x in rec if p_ == "forward"), default=0),
                "allgather": world * piece_kv,
                "ulysses": 2 * whole[1].numel() * whole[1].element_size() // world,
            }.get(method, 0)
            row = (s, method, max_all(wall), max_all(cpu), b.sent, held)
            rows.append((*row, ",".join(sorted(chosen))))
        # one process: rank 0, the whole sequence, torch's kernel
        if rank == 0:
            ws = [t.clone().requires_grad_() for t in whole]

            def single(ws: list = ws) -> None:
                out = F.scaled_dot_product_attention(*ws, is_causal=True)
                out.backward(torch.ones_like(out))

            single()
            w1, c1 = [], []
            for _ in range(args.repeats):
                t0, c0 = time.perf_counter(), time.process_time()
                single()
                w1.append(time.perf_counter() - t0)
                c1.append(time.process_time() - c0)
            one, one_cpu = min(w1), min(c1)
        else:
            one = one_cpu = 0.0
        dist.barrier()
        kv_whole = 2 * whole[1].numel() * whole[1].element_size()
        rows.append((s, "one process", max_all([one]), max_all([one_cpu]), 0, kv_whole, ""))
    set_context_parallel_method("auto")
    if rank == 0:
        q.put(rows)
    dist.destroy_process_group()


def _causal(q: Any, k: Any, v: Any) -> Any:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def max_all(times: list[float]) -> float:
    """The fastest of ``times``, the largest over the ranks."""
    t = torch.tensor([min(times)])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", default="2048,4096,8192,16384", help="sequence lengths")
    ap.add_argument("--heads", type=int, default=4, help="attention heads (default 4)")
    ap.add_argument("--head-dim", type=int, default=16, help="head size (default 16)")
    ap.add_argument("--repeats", type=int, default=2, help="timed repeats (default 2)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks (default 2)")
    ap.add_argument("--methods", default=",".join(METHODS), help="methods to time")
    ap.add_argument("--compile", default=None, metavar="BACKEND", help="also time compiled")
    args = ap.parse_args(argv)
    args.seqs = [int(x) for x in args.seqs.split(",")]
    args.methods = [m for m in args.methods.split(",") if m]
    print(f"load average {os.getloadavg()[0]:.2f}; {args.nproc} gloo ranks, 1 thread each")
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.SimpleQueue()
    mp.start_processes(
        _worker, args=(args.nproc, port, args, q), nprocs=args.nproc, start_method="spawn"
    )
    rows = q.get()
    print(
        f"\ncausal attention, batch 1, {args.heads} heads x {args.head_dim}, forward + "
        f"backward, head-tail layout over {args.nproc} ranks\n"
    )
    print(f"{'seq':>6} {'method':>12} {'time ms':>9} {'ratio':>6} {'cpu ms/rank':>12} "
          f"{'ratio':>6} {'sent MB/rank':>13} {'kv held MB':>11}")  # fmt: skip
    one = {s: (t, c) for s, m, t, c, *_ in rows if m == "one process"}
    eager = {(s, m): t for s, m, t, *_ in rows}
    for s, method, t, c, sent, held, chosen in rows:
        if method == "auto":
            print(f"{'':>6} {'auto':>12}  picks {chosen}")
            continue
        if method.endswith("+c"):  # compiled: the eager row's bytes; its ratio to eager
            e = eager[s, method[:-2]]
            print(
                f"{s:>6} {method:>12} {t * 1e3:>9.1f} {t / one[s][0]:>6.2f} {c * 1e3:>12.1f} "
                f"{c / one[s][1]:>6.2f}   compiled / eager {t / e:.2f}"
            )
            continue
        print(
            f"{s:>6} {method:>12} {t * 1e3:>9.1f} {t / one[s][0]:>6.2f} {c * 1e3:>12.1f} "
            f"{c / one[s][1]:>6.2f} {sent / 2**20:>13.2f} {held / 2**20:>11.2f}"
        )


if __name__ == "__main__":
    main()
