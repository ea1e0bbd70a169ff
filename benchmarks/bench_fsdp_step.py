"""FSDP training step: hyper_shard ``fully_shard`` vs PyTorch FSDP2, in the same run.

The model, data and optimizer are those of ``examples/train_llama_tp.py`` (a tiny
``transformers`` ``LlamaForCausalLM``, AdamW): each decoder layer and then the root is one
FSDP unit. Two configurations, each in its own set of gloo ranks on 127.0.0.1
(``torch.set_num_threads(1)``):

* ``fsdp``: 2 ranks, FSDP over both — hyper_shard ``fully_shard`` vs
  ``torch.distributed.fsdp.fully_shard`` (FSDP2 runs on gloo/CPU in torch 2.13: all-gather
  and reduce-scatter are there).
* ``fsdp_tp``: 4 ranks, a ("dp", "tp") = (2, 2) mesh — ``hyper_shard.parallel`` tensor
  parallelism on ``mesh["tp"]`` then ``fully_shard`` on ``mesh["dp"]``, vs PyTorch's
  ``torch.distributed.tensor.parallel`` plus FSDP2 (same plan, same mesh).

Both libraries train identical copies, steps alternating (who goes first alternates too),
with a ``dist.barrier()`` before each step. Printed per configuration:

* step time (forward + loss, backward, optimizer step + zero_grad): the median over timed
  steps of the slower rank; **ratio = hyper_shard / torch (< 1: hyper_shard faster)**,
  target <= 1.0;
* collectives per step: the c10d collectives one profiled step issues on rank 0
  (``torch.profiler`` events ``c10d::*``: all-gather, reduce-scatter, all-reduce...; on
  gloo hyper_shard runs all-gather and reduce-scatter as one ``send`` and one ``recv_``
  per peer, [Note: collectives on gloo] in ``hyper_shard/platform/torch/p2p.py``);
* bytes held per rank after a step (sharded parameters, gradients, AdamW state: unique
  storages, the largest rank), target <= 1.05x, and the peak of one profiled step: what
  the library holds at its start plus the largest growth of the CPU allocator's total
  (``torch.profiler`` allocation events) during it, the largest rank;
* the largest relative difference between the two libraries' losses (they must agree).

    python benchmarks/bench_fsdp_step.py                 # both configurations (~1 min idle)
    python benchmarks/bench_fsdp_step.py --config fsdp   # one of them
    python benchmarks/bench_fsdp_step.py --steps 10      # quicker, noisier
    python benchmarks/bench_fsdp_step.py --compile       # compiled (inductor), see below

``--compile [BACKEND]`` compares three copies per configuration instead: hyper_shard
compiled and PyTorch compiled — each decoder layer ``module.compile()``d before FSDP wraps
it, as torchtitan does (the FSDP hooks run eagerly around each compiled block) — and
hyper_shard eager; loss and optimizer step eager. Targets: hyper_shard compiled <= 1.0x
PyTorch compiled and <= 0.7x hyper_shard eager; collectives per step and the time outside
local kernels and collectives printed (``benchmarks/_compiled_step.py``).

Times on a shared machine are noisy: the first line prints the load average.
"""

from __future__ import annotations

import argparse
import functools
import os
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

PHASES = ("forward", "backward", "optimizer")
CONFIGS = {"fsdp": (2, 1), "fsdp_tp": (2, 2)}  # (dp, tp)


def _hs_setup(args: argparse.Namespace) -> dict[str, Any]:
    import train_llama_tp as ex

    from hyper_shard import DTensor, Replicate
    from hyper_shard import parallel as hp

    model = ex.build_model(args)
    mesh = ex.parallelize(args, model, torch.device("cpu"))
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    tp_mesh = mesh["tp"] if args.tp > 1 else None

    def loss_fn(logits: Any, y: torch.Tensor) -> Any:
        if tp_mesh is None:
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())
        target = DTensor.from_local(y.flatten(), tp_mesh, [Replicate()])
        with hp.loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), target)

    def backward(loss: Any) -> None:
        with hp.loss_parallel():
            loss.backward()

    def value(loss: Any) -> float:
        t = loss.detach()
        return float((t.full_tensor() if isinstance(t, DTensor) else t).item())

    return {"model": model, "opt": opt, "loss": loss_fn, "backward": backward, "value": value}


def _torch_setup(args: argparse.Namespace) -> dict[str, Any]:
    import train_llama_tp as ex
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor import parallel as tp

    mesh = init_device_mesh("cpu", (args.dp, args.tp), mesh_dim_names=("dp", "tp"))
    model = ex.build_model(args)
    if args.tp > 1:
        tp.parallelize_module(model, mesh["tp"], ex.llama_tp_plan(False, tp, Replicate, Shard))
    for layer in model.model.layers:
        fully_shard(layer, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)

    def loss_fn(logits: Any, y: torch.Tensor) -> Any:
        with tp.loss_parallel():
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    def backward(loss: Any) -> None:
        with tp.loss_parallel():
            loss.backward()

    def value(loss: Any) -> float:
        t = loss.detach()
        return float((t.full_tensor() if isinstance(t, DTensor) else t).item())

    return {"model": model, "opt": opt, "loss": loss_fn, "backward": backward, "value": value}


def _step(lib: dict[str, Any], x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor) -> tuple:
    dist.barrier()
    t0 = time.perf_counter()
    logits = lib["model"](input_ids=x, position_ids=pos).logits
    loss = lib["loss"](logits, y)
    t1 = time.perf_counter()
    lib["backward"](loss)
    t2 = time.perf_counter()
    lib["opt"].step()
    t3 = time.perf_counter()
    lib["held"] = _held_bytes(lib)  # after the step: parameters, gradients, optimizer state
    t4 = time.perf_counter()
    lib["opt"].zero_grad(set_to_none=True)
    t5 = time.perf_counter()
    return (t1 - t0, t2 - t1, (t3 - t2) + (t5 - t4)), lib["value"](loss)


def _held_bytes(lib: dict[str, Any]) -> dict[str, int]:
    """Unique storage bytes of the parameters, their gradients and the optimizer state."""
    seen: set[int] = set()
    out = {"params": 0, "grads": 0, "optimizer": 0}

    def add(kind: str, t: Any) -> None:
        if not isinstance(t, torch.Tensor):
            return
        local = getattr(t, "_local_tensor", t)
        with torch._C.DisableTorchFunctionSubclass():
            st = local.untyped_storage()
            key, n = st.data_ptr(), st.nbytes()
        if n and key not in seen:
            seen.add(key)
            out[kind] += n

    params = [p for g in lib["opt"].param_groups for p in g["params"]]
    for p in params:
        add("params", p)
    for p in params:
        add("grads", p.grad)
    for state in lib["opt"].state.values():
        for v in state.values():
            add("optimizer", v)
    return out


def _profiled(lib: dict[str, Any], x: torch.Tensor, y: torch.Tensor, pos: torch.Tensor) -> dict:
    """One step under torch.profiler: the collectives issued, and the peak bytes: what the
    library holds when the step starts (parameters, optimizer state) plus the largest
    growth of the CPU allocator's total during the step (its allocation events)."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    resident = sum(_held_bytes(lib).values())
    dist.barrier()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        logits = lib["model"](input_ids=x, position_ids=pos).logits
        loss = lib["loss"](logits, y)
        lib["backward"](loss)
        lib["opt"].step()
        lib["opt"].zero_grad(set_to_none=True)
    colls: dict[str, int] = {}
    for e in prof.events():
        if e.name.startswith("c10d::") and "barrier" not in e.name:
            colls[e.name] = colls.get(e.name, 0) + 1
    allocs = []
    stack = list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        e = stack.pop()
        stack.extend(e.children)
        if e.typed[0] == _EventType.Allocation:
            a = e.typed[1]
            allocs.append((e.start_time_ns, a.total_allocated, a.alloc_size))
    allocs.sort()
    growth = 0
    if allocs:
        start = allocs[0][1] - allocs[0][2]
        growth = max(total for _, total, _ in allocs) - start
    return {"collectives": colls, "peak": resident + growth}


def _compiled(lib: dict[str, Any], backend: str) -> dict[str, Any]:
    for layer in lib["model"].model.layers:
        layer.compile(backend=backend)
    return lib


def _compile_worker(rank: int, args: argparse.Namespace, out: Any) -> None:
    """``--compile``: the three libraries of ``_compiled_step.LIBS``, steps alternating."""
    import _compiled_step as cs
    import train_llama_tp as ex

    libs = {
        "hs_compiled": _compiled(_hs_setup(args), args.compile),
        "torch_compiled": _compiled(_torch_setup(args), args.compile),
        "hs_eager": _hs_setup(args),
    }
    data = ex.load_data()
    pos = torch.arange(args.seq)[None]
    dp_rank = rank // args.tp
    times: dict[str, list[tuple[float, ...]]] = {k: [] for k in libs}
    first: dict[str, float] = {}
    worsts: dict[str, float] = {}
    worst = 0.0
    total = args.warmup + args.steps
    batches = list(ex.batches(data, total + 1, args.batch, args.seq, args.seed + 1))
    for i, (x, y) in enumerate(batches[: total + 1]):
        x, y = x.chunk(args.dp)[dp_rank], y.chunk(args.dp)[dp_rank]
        if i == total:
            prof = {
                name: cs.profiled(functools.partial(_step, lib, x, y, pos))
                for name, lib in libs.items()
            }
            break
        vals = {}
        order = list(libs)[i % 3 :] + list(libs)[: i % 3]  # who goes first rotates
        for name in order:
            t, vals[name] = _step(libs[name], x, y, pos)
            if i >= args.warmup:
                times[name].append(t)
            elif i == 0:
                first[name] = sum(t)  # compiling, for the compiled ones
        ref = vals["hs_eager"]
        for k, v in vals.items():  # each library's largest relative loss difference to eager
            worsts[k] = max(worsts.get(k, 0.0), abs(v - ref) / max(abs(ref), 1e-12))
        worst = max(worsts.values())
    gathered: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (times, prof, first, worsts))
    if rank == 0:
        out.put((gathered, worst))


def _worker(rank: int, world: int, port: int, args: argparse.Namespace, out: Any) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    import train_llama_tp as ex

    if args.compile:
        _compile_worker(rank, args, out)
        dist.destroy_process_group()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)

    libs = {"hyper_shard": _hs_setup(args), "torch": _torch_setup(args)}
    data = ex.load_data()
    pos = torch.arange(args.seq)[None]
    dp_rank = rank // args.tp
    times: dict[str, list[tuple[float, ...]]] = {k: [] for k in libs}
    worst = 0.0
    total = args.warmup + args.steps
    batches = list(ex.batches(data, total + 1, args.batch, args.seq, args.seed + 1))
    for i, (x, y) in enumerate(batches[:total]):
        x, y = x.chunk(args.dp)[dp_rank], y.chunk(args.dp)[dp_rank]
        vals = {}
        order = list(libs) if i % 2 == 0 else list(reversed(libs))
        for name in order:
            t, vals[name] = _step(libs[name], x, y, pos)
            if i >= args.warmup:
                times[name].append(t)
        a, b = vals["hyper_shard"], vals["torch"]
        worst = max(worst, abs(a - b) / max(abs(b), 1e-12))
    x, y = batches[total]
    x, y = x.chunk(args.dp)[dp_rank], y.chunk(args.dp)[dp_rank]
    prof = {name: _profiled(lib, x, y, pos) for name, lib in libs.items()}
    held = {name: lib["held"] for name, lib in libs.items()}
    gathered: list[Any] = [None] * world
    dist.all_gather_object(gathered, (times, held, prof))
    dist.destroy_process_group()
    if rank == 0:
        out.put((gathered, worst))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # PyTorch's TP styles can abort the interpreter's teardown (see bench_tp_step)


def _median_of_slowest(per_rank: list[list[tuple[float, ...]]], phases: tuple[int, ...]) -> float:
    """Median over steps of the slower rank's time summed over ``phases``."""
    return statistics.median(max(sum(t[i] for i in phases) for t in per) for per in zip(*per_rank))


def run_config(name: str, args: argparse.Namespace) -> dict[str, float]:
    args.dp, args.tp = CONFIGS[name]
    world = args.dp * args.tp
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.spawn(_worker, args=(world, port, args, out), nprocs=world)
    gathered, worst = out.get()
    title = "FSDP, 2 ranks" if args.tp == 1 else "FSDP x TP, (dp 2, tp 2) on 4 ranks"
    print(f"\n== {name}: {title} ==")
    if args.compile:
        import _compiled_step as cs

        res = cs.report(gathered, PHASES, worst)
        cs.check_losses(gathered)
        return res
    times = [g[0] for g in gathered]
    print(f"{'phase':<22} {'hyper_shard ms':>15} {'torch ms':>10} {'ratio':>7}")
    rows = [(p, (i,)) for i, p in enumerate(PHASES)] + [("step", (0, 1, 2))]
    res: dict[str, float] = {}
    for label, idx in rows:
        hs = _median_of_slowest([t["hyper_shard"] for t in times], idx) * 1e3
        th = _median_of_slowest([t["torch"] for t in times], idx) * 1e3
        print(f"{label:<22} {hs:>15.2f} {th:>10.2f} {hs / th:>6.2f}x")
        res["step_ratio"] = hs / th
    colls = {lib: gathered[0][2][lib]["collectives"] for lib in ("hyper_shard", "torch")}
    for lib in ("hyper_shard", "torch"):
        c = colls[lib]
        detail = ", ".join(f"{k.removeprefix('c10d::')} {v}" for k, v in sorted(c.items()))
        print(f"collectives per step, {lib:<11}: {sum(c.values()):>3} ({detail})")
        if any(k in c for k in ("c10d::send", "c10d::recv_")):
            print(
                f"  ({lib} on gloo runs all-gather and reduce-scatter as isend/irecv, one send "
                f"and one receive per peer: hyper_shard/platform/torch/p2p.py)"
            )
    kinds = ("params", "grads", "optimizer")
    held = {
        lib: max(sum(g[1][lib][k] for k in kinds) for g in gathered)
        for lib in ("hyper_shard", "torch")
    }
    peak = {lib: max(g[2][lib]["peak"] for g in gathered) for lib in ("hyper_shard", "torch")}
    for lib in ("hyper_shard", "torch"):
        parts = ", ".join(
            f"{k} {max(g[1][lib][k] for g in gathered) / 1024:.0f} KiB" for k in kinds
        )
        print(
            f"bytes held after a step, {lib:<11}: {held[lib] / 1024:>7.0f} KiB ({parts}); peak "
            f"{peak[lib] / 1024:.0f} KiB"
        )
    res["held_ratio"] = held["hyper_shard"] / held["torch"]
    res["peak_ratio"] = peak["hyper_shard"] / peak["torch"]
    res["collectives"] = float(sum(colls["hyper_shard"].values()))
    res["torch_collectives"] = float(sum(colls["torch"].values()))
    print(
        f"ratios hyper_shard / torch: step time {res['step_ratio']:.2f}x (target <= 1.0), bytes "
        f"held {res['held_ratio']:.3f}x (target <= 1.05), peak {res['peak_ratio']:.2f}x; largest "
        f"relative loss difference {worst:.1e}"
    )
    if worst > 1e-4:
        raise SystemExit("the two libraries' losses differ: the comparison is not like for like")
    return res


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--config", choices=[*CONFIGS, "all"], default="all")
    ap.add_argument("--steps", type=int, default=20, help="timed steps per library")
    ap.add_argument("--warmup", type=int, default=3, help="untimed first steps")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--ffn", type=int, default=384)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=7e-4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--compile",
        nargs="?",
        const="inductor",
        default=None,
        metavar="BACKEND",
        help="compare per-block compiled models (default backend inductor) and hyper_shard eager",
    )
    args = ap.parse_args()
    args.sp = False
    if args.compile:
        args.warmup = max(args.warmup, 3)  # the first steps compile
    print(
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; Llama "
        f"{args.layers}x{args.hidden} (ffn {args.ffn}), batch {args.batch}x{args.seq}; "
        f"{args.steps} timed steps per library after {args.warmup} warm-up steps"
    )
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for name in CONFIGS if args.config == "all" else [args.config]:
        run_config(name, args)


if __name__ == "__main__":
    main()
