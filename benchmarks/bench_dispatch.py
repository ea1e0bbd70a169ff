"""Dispatch overhead of hyper_shard next to PyTorch DTensor, measured in one run.

Section 1, hot path (layout cache hit, no communication): for each op, the time of the
plain torch op on the local shard, of torch.distributed.tensor's DTensor and of
hyper_shard's DTensor on the same 1-D mesh of 2 (a fake process group, rank 0: no
collective runs because the placements need none). The *overhead* is DTensor time minus
plain time; the ratio is hyper_shard's overhead / torch DTensor's (< 1: hyper_shard adds
less). Variants are measured in interleaved rounds; each number is the best round's mean
per call, in microseconds.

Section 2, cold decision (layout cache miss) for ``mm`` on abstract meshes (4), (2,2),
(2,2,2) and (4,4,4): hyper_shard's decision (strategy search + plans) from a fixed sample
of input placements, with every cache cleared ("cold") and with the placement graphs of
the geometry already built ("warm graphs"); next to torch's sharding propagation
(``propagate_op_sharding_non_cached``) for the same placements, in milliseconds.

Section 1b, 1c and 3, the flight recorder and the consistency mode (issue 10): 1b, the hot
path with the consistency mode off and on, interleaved in this process (no collective runs,
so the two must be equal: the mode is read once per collective, never per op); 1c, the
guard's own cost per collective (a no-op backend call direct vs through
``hyper_shard.flight.collective``: frames, one record, timing); 3, on 2 spawned
gloo ranks, the time per call of a raw ``torch.distributed.all_gather_into_tensor`` of a
64x32 fp32 shard, of ``redistribute(S(0) -> R)`` of the 64x64 DTensor with the mode off
(the recorder and the context frames included) and with it on (plus one fingerprint
all-gather of 1 KiB per collective), interleaved rounds, the slowest rank's best round.

    python benchmarks/bench_dispatch.py [--quick] [--backend torch|mindspore] [--skip-comm]

Targets (issue 3): forward overhead <= torch DTensor's on every op, <= 0.5x on
view/reshape; linear forward+backward overhead <= 0.2x; 3-D cold decision < 2 ms.
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import time
import warnings
from collections.abc import Callable
from typing import Any

warnings.filterwarnings("ignore")


def _rounds(fns: dict[str, Callable[[], Any]], n: int, rounds: int) -> dict[str, float]:
    """Best-round mean time per call (µs) of each function, measured in interleaved rounds."""
    for f in fns.values():
        for _ in range(max(50, n // 10)):
            f()
    best = {k: float("inf") for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.perf_counter()
            for _ in range(n):
                f()
            best[k] = min(best[k], (time.perf_counter() - t0) / n * 1e6)
    return best


def hot_path(quick: bool) -> list[tuple[str, float]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh as t_mesh
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS
    from torch.distributed.tensor import distribute_tensor as t_dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard

    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=2)
    torch.set_num_threads(1)
    mesh = hs.init_device_mesh("cpu", (2,))
    tmesh = t_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    hx, hw = hs.distribute_tensor(x, mesh, [Shard(0)]), hs.distribute_tensor(w, mesh, [Replicate()])
    tx, tw = t_dist(x, tmesh, [TS(0)]), t_dist(w, tmesh, [TR()])
    lx, lw = hx.to_local().clone(), w.clone()
    n, rounds = (300, 3) if quick else (2000, 7)
    cases: list[tuple[str, Callable, Callable, Callable]] = [
        ("add", lambda: lx + lx, lambda: hx + hx, lambda: tx + tx),
        ("mul scalar", lambda: lx * 2.0, lambda: hx * 2.0, lambda: tx * 2.0),
        ("mm", lambda: torch.mm(lx, lw), lambda: torch.mm(hx, hw), lambda: torch.mm(tx, tw)),
        ("sum(dim=1)", lambda: lx.sum(1), lambda: hx.sum(1), lambda: tx.sum(1)),
        ("view", lambda: lx.view(32, 8, 8), lambda: hx.view(64, 8, 8), lambda: tx.view(64, 8, 8)),
        (
            "reshape",
            lambda: lx.reshape(32, 8, 8),
            lambda: hx.reshape(64, 8, 8),
            lambda: tx.reshape(64, 8, 8),
        ),
        ("relu", lambda: torch.relu(lx), lambda: torch.relu(hx), lambda: torch.relu(tx)),
        (
            "softmax",
            lambda: torch.softmax(lx, -1),
            lambda: torch.softmax(hx, -1),
            lambda: torch.softmax(tx, -1),
        ),
    ]
    # ops from the training coverage (issue 4): embedding, attention, losses, norms, joins
    ids = torch.randint(0, 64, (16, 8), generator=g)
    emb_w = torch.randn(64, 32, generator=g)
    q = torch.randn(2, 4, 16, 8, generator=g)
    tgt = torch.randint(0, 64, (64,), generator=g)
    ln_w = torch.randn(64, generator=g)
    h_ids, t_ids = hs.distribute_tensor(ids, mesh, [Shard(0)]), t_dist(ids, tmesh, [TS(0)])
    h_emb, t_emb = hs.distribute_tensor(emb_w, mesh, [Replicate()]), t_dist(emb_w, tmesh, [TR()])
    h_q, t_q = hs.distribute_tensor(q, mesh, [Shard(1)]), t_dist(q, tmesh, [TS(1)])
    h_tgt, t_tgt = hs.distribute_tensor(tgt, mesh, [Shard(0)]), t_dist(tgt, tmesh, [TS(0)])
    h_lnw, t_lnw = hs.distribute_tensor(ln_w, mesh, [Replicate()]), t_dist(ln_w, tmesh, [TR()])
    l_ids, l_q, l_tgt = h_ids.to_local(), h_q.to_local(), h_tgt.to_local()
    F = torch.nn.functional
    sdpa = F.scaled_dot_product_attention
    cases += [
        ("embedding", lambda: F.embedding(l_ids, emb_w), lambda: F.embedding(h_ids, h_emb),
         lambda: F.embedding(t_ids, t_emb)),
        ("sdpa causal", lambda: sdpa(l_q, l_q, l_q, is_causal=True),
         lambda: sdpa(h_q, h_q, h_q, is_causal=True), lambda: sdpa(t_q, t_q, t_q, is_causal=True)),
        ("cross_entropy", lambda: F.cross_entropy(lx, l_tgt), lambda: F.cross_entropy(hx, h_tgt),
         lambda: F.cross_entropy(tx, t_tgt)),
        ("layer_norm", lambda: F.layer_norm(lx, (64,), ln_w), lambda: F.layer_norm(hx, (64,), h_lnw),
         lambda: F.layer_norm(tx, (64,), t_lnw)),
        ("silu", lambda: F.silu(lx), lambda: F.silu(hx), lambda: F.silu(tx)),
        ("cat dim 1", lambda: torch.cat([lx, lx], 1), lambda: torch.cat([hx, hx], 1),
         lambda: torch.cat([tx, tx], 1)),
        ("getitem [:, :8]", lambda: lx[:, :8], lambda: hx[:, :8], lambda: tx[:, :8]),
        ("transpose", lambda: lx.t(), lambda: hx.t(), lambda: tx.t()),
    ]  # fmt: skip
    results: list[tuple[str, float]] = []
    print(f"{'op (64x64 fp32)':18s} {'plain':>8s} {'torch DT':>9s} {'hyper_shard':>12s} "
          f"{'torch +':>8s} {'hs +':>8s} {'ratio':>6s}")  # fmt: skip
    for name, fp, fh, ft in cases:
        try:
            ft()
        except Exception as e:  # torch DTensor has no strategy for it
            r = _rounds({"plain": fp, "hs": fh}, n, rounds)
            print(f"{name:18s} {r['plain']:8.2f} {'n/a':>9s} {r['hs']:12.2f} {'':8s} "
                  f"{r['hs'] - r['plain']:8.2f}    n/a  (torch DTensor: {type(e).__name__})")  # fmt: skip
            continue
        r = _rounds({"plain": fp, "hs": fh, "torch": ft}, n, rounds)
        _row(name, r, results)
    # linear forward + backward (weight Replicate, input batch-sharded)
    w_plain = w.clone().requires_grad_()
    hW = hs.distribute_tensor(w, mesh, [Replicate()]).requires_grad_()
    tW = t_dist(w, tmesh, [TR()]).requires_grad_()

    def plain_fb() -> None:
        F.linear(lx, w_plain).sum().backward()

    def hs_fb() -> None:
        F.linear(hx, hW).to_local().sum().backward()

    def torch_fb() -> None:
        F.linear(tx, tW).to_local().sum().backward()

    r = _rounds({"plain": plain_fb, "hs": hs_fb, "torch": torch_fb}, max(100, n // 4), rounds)
    _row("linear fwd+bwd", r, results)
    return results


def _row(name: str, r: dict[str, float], results: list[tuple[str, float]]) -> None:
    oh, ot = r["hs"] - r["plain"], r["torch"] - r["plain"]
    ratio = oh / ot if ot > 0 else float("nan")
    results.append((name, ratio))
    print(
        f"{name:18s} {r['plain']:8.2f} {r['torch']:9.2f} {r['hs']:12.2f} {ot:8.2f} {oh:8.2f} {ratio:6.2f}"
    )


def mode_hot_path(quick: bool) -> list[tuple[str, float, float]]:
    """Hot-path time per call with the consistency mode off and on (interleaved)."""
    import torch

    import hyper_shard as hs
    from hyper_shard import Replicate, Shard

    mesh = hs.init_device_mesh("cpu", (2,))
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 64, generator=g), torch.randn(64, 64, generator=g)
    hx, hw = hs.distribute_tensor(x, mesh, [Shard(0)]), hs.distribute_tensor(w, mesh, [Replicate()])
    n, rounds = (300, 3) if quick else (2000, 7)
    out = []
    print(f"{'op (64x64 fp32)':18s} {'mode off':>9s} {'mode on':>9s}  (µs per call, no collective)")
    for name, f in [("add", lambda: hx + hx), ("mm", lambda: torch.mm(hx, hw))]:
        r = _mode_rounds(f, n, rounds)
        out.append((name, r[False], r[True]))
        print(f"{name:18s} {r[False]:9.2f} {r[True]:9.2f}")
    return out


def guard_cost(quick: bool) -> tuple[float, float]:
    """The flight guard's own cost per collective (consistency mode off): a no-op backend
    call made directly and through ``hyper_shard.flight.collective`` (context frames read,
    one ring-buffer record, timing), interleaved; µs per call."""
    from hyper_shard.flight import collective

    class _Group:
        ranks, timeout = (0, 1), None

    class _Plat:
        name, comm_errors = "noop", (RuntimeError,)

    p, g = _Plat(), _Group()

    def noop() -> None:
        return None

    n, rounds = (20000, 3) if quick else (200000, 7)
    r = _rounds(
        {
            "direct": noop,
            "guarded": lambda: collective(p, "all_gather", g, (4, 4), "float32", noop),
        },
        n,
        rounds,
    )
    print(f"  no-op backend call, direct                {r['direct']:8.3f} µs")
    print(f"  through the guard + flight recorder       {r['guarded']:8.3f} µs")
    print(f"  guard + recorder cost per collective      {r['guarded'] - r['direct']:8.3f} µs")
    return r["direct"], r["guarded"]


def _mode_rounds(
    f: Callable[[], Any], n: int, rounds: int, sync: Callable[[], Any] | None = None
) -> dict[bool, float]:
    """Best-round mean time per call (µs) of the same ``f`` with the consistency mode off
    and on, alternating every round (``sync()`` before each timed batch)."""
    from hyper_shard.flight import MODE

    for _ in range(max(20, n // 10)):
        f()
    best = {False: float("inf"), True: float("inf")}
    try:
        for _ in range(rounds):
            for on in (False, True):
                MODE.on = on
                if sync is not None:
                    sync()
                t0 = time.perf_counter()
                for _ in range(n):
                    f()
                best[on] = min(best[on], (time.perf_counter() - t0) / n * 1e6)
    finally:
        MODE.on = False
    return best


def _comm_rank(rank: int, world: int, port: int, quick: bool, q: Any) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )  # fmt: skip
    import hyper_shard as hs
    from hyper_shard import Replicate, Shard

    mesh = hs.init_device_mesh("cpu", (world,))
    x = hs.distribute_tensor(torch.randn(64, 64, generator=torch.Generator().manual_seed(0)),
                             mesh, [Shard(0)])  # fmt: skip
    local = x.to_local().contiguous()
    buf = torch.empty(world * local.numel())
    n, rounds = (50, 3) if quick else (300, 7)

    def raw() -> None:
        dist.all_gather_into_tensor(buf, local.view(-1))

    def hs_call() -> None:
        x.redistribute(mesh, [Replicate()])

    r_raw = _mode_rounds(raw, n, rounds, dist.barrier)  # the mode cannot change a raw call
    r_hs = _mode_rounds(hs_call, n, rounds, dist.barrier)
    best = {"raw": min(r_raw.values()), "off": r_hs[False], "on": r_hs[True]}
    q.put((rank, best))
    dist.barrier()
    dist.destroy_process_group()


def mode_collective(quick: bool) -> dict[str, float]:
    """Per-collective cost of the recorder and of the consistency mode on 2 gloo ranks."""
    import multiprocessing as mp
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_comm_rank, args=(r, 2, port, quick, q)) for r in range(2)]
    for p in procs:
        p.start()
    per_rank = [q.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    worst = {k: max(b[k] for _, b in per_rank) for k in per_rank[0][1]}
    print(f"{'redistribute S(0)->R, 64x64 fp32, 2 gloo ranks':48s} {'µs per call':>12s}")
    print(f"  {'raw torch all_gather_into_tensor':46s} {worst['raw']:12.1f}")
    print(f"  {'hyper_shard, consistency mode off':46s} {worst['off']:12.1f}")
    print(f"  {'hyper_shard, consistency mode on':46s} {worst['on']:12.1f}")
    print(f"  mode on costs {worst['on'] - worst['off']:.1f} µs per collective "
          f"({worst['on'] / worst['off']:.2f}x): one extra 1 KiB all-gather")  # fmt: skip
    return worst


def cold_decision(quick: bool) -> list[tuple[str, float, float, float]]:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh as TMesh
    from torch.distributed.tensor import DTensor as TDT
    from torch.distributed.tensor import Partial as TP
    from torch.distributed.tensor import Replicate as TR
    from torch.distributed.tensor import Shard as TS
    from torch.distributed.tensor._dtensor_spec import DTensorSpec as TSpec
    from torch.distributed.tensor._dtensor_spec import TensorMeta as TMeta
    from torch.distributed.tensor._op_schema import OpSchema
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from hyper_shard import DeviceMesh, Partial, Replicate, Shard
    from hyper_shard.dispatch.dispatcher import clear_cache
    from hyper_shard.dispatch.op import Decision, OpCall
    from hyper_shard.redistribute.graph import clear_graphs
    from hyper_shard.redistribute.planner import clear_plan_cache
    from hyper_shard.registry import get_registry
    from hyper_shard.spec import DTensorSpec, TensorMeta, contiguous_stride

    if dist.is_initialized() and dist.get_world_size() < 64:
        dist.destroy_process_group()
    if not dist.is_initialized():
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=64)
    op = get_registry().entries["mm"].op
    prop = TDT._op_dispatcher.sharding_propagator
    shapes = [(256, 128), (128, 192)]
    out = []
    print(f"{'mesh':10s} {'hs cold':>9s} {'hs warm':>9s} {'torch':>9s} {'ratio':>6s}  (ms, median)")
    for mshape in [(4,), (2, 2), (2, 2, 2), (4, 4, 4)]:
        mesh = DeviceMesh.abstract(mshape)
        n = 1
        for s in mshape:
            n *= s
        tmesh = TMesh("cpu", torch.arange(n).reshape(mshape), _init_backend=False)
        opts = [Replicate(), Shard(0), Shard(1), Partial()]
        topts = [TR(), TS(0), TS(1), TP()]
        combos = list(itertools.product(range(4), repeat=len(mshape)))
        pairs = list(itertools.product(combos, combos))
        pairs = random.Random(0).sample(pairs, min(len(pairs), 12 if quick else 40))
        cold, warm, tt = [], [], []
        for ca, cb in pairs:
            specs = [
                DTensorSpec(
                    mesh,
                    [opts[i] for i in c],
                    TensorMeta(s, contiguous_stride(s), torch.float32, 4),
                )
                for c, s in zip((ca, cb), shapes)
            ]
            call = OpCall("mm", "torch.mm", specs, ["input", "mat2"], {}, {}, False, False, (), {})
            for kind in ("cold", "warm"):
                clear_cache()
                if kind == "cold":
                    clear_plan_cache()
                    clear_graphs()
                for sp in specs:
                    sp._plans = None
                t0 = time.perf_counter()
                Decision(call, op.infer_layout(call))
                (cold if kind == "cold" else warm).append((time.perf_counter() - t0) * 1e3)
            tspecs = [
                TSpec(
                    tmesh,
                    tuple(topts[i] for i in c),
                    tensor_meta=TMeta(torch.Size(s), contiguous_stride(s), torch.float32),
                )
                for c, s in zip((ca, cb), shapes)
            ]
            schema = OpSchema(torch.ops.aten.mm.default, tuple(tspecs), {})
            t0 = time.perf_counter()
            try:
                prop.propagate_op_sharding_non_cached(schema)
                tt.append((time.perf_counter() - t0) * 1e3)
            except Exception:  # torch refuses some inputs (e.g. Partial on both)
                pass
        c, w = statistics.median(cold), statistics.median(warm)
        t = statistics.median(tt) if tt else float("nan")
        out.append((str(mshape), c, w, t))
        print(f"{str(mshape):10s} {c:9.3f} {w:9.3f} {t:9.3f} {c / t:6.2f}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer iterations (~20 s)")
    ap.add_argument("--backend", choices=["torch", "mindspore"], default="torch")
    ap.add_argument("--skip-comm", action="store_true", help="skip section 3 (2 gloo ranks)")
    args = ap.parse_args()
    if args.backend == "mindspore":
        from bench_dispatch_mindspore import run  # type: ignore[import-not-found]

        run(quick=args.quick)
        return
    print("== 1. hot path: time per call (µs); overhead = DTensor - plain; ratio = hs / torch")
    hot = hot_path(args.quick)
    print("\n== 1b. hot path with the consistency mode off and on (issue 10)")
    modes = mode_hot_path(args.quick)
    print("\n== 1c. the guard and flight recorder per collective, mode off (issue 10)")
    direct, guarded = guard_cost(args.quick)
    print("\n== 2. cold decision for mm (cache miss)")
    cold = cold_decision(args.quick)
    comm = None
    if not args.skip_comm:
        print("\n== 3. per collective: the flight recorder and the consistency mode (issue 10)")
        comm = mode_collective(args.quick)
    ratios = [r for _, r in hot if r == r]
    print("\n== summary")
    print(f"  hot-path overhead ratio, geometric mean: {statistics.geometric_mean(ratios):.2f} "
          f"(max {max(ratios):.2f}; target <= 1, view/reshape <= 0.5, linear fwd+bwd <= 0.2)")  # fmt: skip
    for m, c, _w, t in cold:
        print(f"  cold mm decision {m}: {c:.2f} ms (torch {t:.2f} ms)")
    for name, off, on in modes:
        print(f"  hot path {name}: {off:.2f} µs mode off, {on:.2f} µs mode on (no collective)")
    print(f"  guard + recorder: {guarded - direct:.2f} µs per collective (mode off)")
    if comm is not None:
        print(f"  redistribute S->R on 2 gloo ranks: {comm['off']:.0f} µs mode off "
              f"(raw all-gather {comm['raw']:.0f} µs), {comm['on']:.0f} µs mode on")  # fmt: skip


if __name__ == "__main__":
    main()
