"""Redistribution benchmark: hyper_shard vs PyTorch DTensor (torch.distributed.tensor).

Both libraries run in the same process, on the same inputs, in one run; every number is
printed next to PyTorch's and their ratio. **ratio = hyper_shard / torch: < 1 means
hyper_shard is faster, > 1 means it is slower.**

Section 1 - plan time (one process, no communication). For meshes (4,), (2,2), (2,2,2)
and (2,2,2,2), tensors (64,), (64,48), (16,12,8) fp32, and a fixed set of
(source -> target) placement pairs per mesh:

* hs cold: ``clear_plan_cache()`` (plans and placement graphs) and the source spec's own
  plan memo cleared, then ``plan_redistribute(spec, dst)`` on an abstract
  mesh (``DeviceMesh.abstract``). hs cached: the same call again (a cache hit).
* torch cold: ``_gen_transform_infos.cache_clear()`` and
  ``clear_redistribute_planner_cache()``, then ``_gen_transform_infos(src, dst)``: the
  planner ``DTensor.redistribute`` uses (by default the *greedy* planner). torch cached:
  the same call again (its ``functools.cache`` hit).
* tgraph cold: the same with ``use_graph_based_transform=True``, torch's min-cost
  (Dijkstra) planner: the like-for-like algorithm, since hyper_shard's planner is a
  shortest-path search too.
* steps h/t/g: the number of steps of the hyper_shard / torch greedy / torch graph plans.

torch's meshes are built in this process over a fake process group
(``torch.testing._internal.distributed.fake_pg``, world of 16, rank 0) with
``DeviceMesh(..., _init_backend=False)``: no communication is needed to plan. Cold
numbers are medians of single calls; cached numbers are the best of 5 batches of calls
(the batch least disturbed by other load on the machine).

Section 2 - redistribute time on real gloo ranks (127.0.0.1, ``torch.set_num_threads(1)``):
2 ranks on mesh (2,) (every ordered pair among R, S(0), S(1), P) and 4 ranks on mesh
(2,2) (a dozen pairs), fp32 tensors of (256,256) and (1024,1024). hyper_shard inputs
come from ``hyper_shard.init_device_mesh`` + ``DTensor.from_local``, torch's from
``torch.distributed.device_mesh.init_device_mesh`` + torch ``DTensor.from_local``, with
the same local data. Each timed call is ``x.redistribute(mesh, dst)``, after warm-up,
with a ``dist.barrier()`` before every measurement, hyper_shard and torch alternating;
a row reports the median over iterations of the slowest rank (max over ranks of the
per-rank medians). "grad" rows time ``from_local`` + ``redistribute`` + ``to_local`` +
``backward``; the backward collectives differ by design: with hyper_shard, a Replicate
output gradient counts once, so the backward of S->R / P->R runs a reduce-scatter /
all-reduce where torch runs none (R->S: an all-reduce where torch all-gathers).
torch cannot redistribute *to* ``Partial`` (internal use only): "n/a".
Before timing, every pair is checked once, on the first size and on an uneven (7,5):
both results' ``full_tensor()`` against the global tensor, and both libraries' input
gradients against each other; mismatches are printed. The 4-rank job runs 4 processes on
the cores available, so its times include oversubscription noise.

The summary gives the geometric mean of the ratios of each column.

    python benchmarks/bench_redistribute.py            # about 2 minutes on 2 cores
    python benchmarks/bench_redistribute.py --quick    # < 1 minute: no (2,2,2,2) mesh,
                                                       # fewer pairs, sizes, iterations
    add --skip-plan or --skip-real to run one section only

Times on a shared machine are noisy: the start line prints the load average; rerun when
it is high. Single rows, above all on the oversubscribed 4-rank mesh, can swing by 2x;
read the geometric means.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import math
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import hyper_shard as hs
from hyper_shard.redistribute.planner import clear_plan_cache, plan_redistribute
from hyper_shard.spec import contiguous_stride

# ---------------------------------------------------------------------- configuration
PLAN_MESHES: tuple[tuple[int, ...], ...] = ((4,), (2, 2), (2, 2, 2), (2, 2, 2, 2))
PLAN_SHAPES: tuple[tuple[int, ...], ...] = ((64,), (64, 48), (16, 12, 8))

# (source -> target) per mesh rank; pairs naming a tensor dim the tensor lacks are skipped
PLAN_PAIRS: dict[int, tuple[str, ...]] = {
    1: ("S0->R", "P->S0", "S0->S1", "R->S0", "P->R", "S1->S0", "S0->P"),
    2: (
        "S0,R->R,R",
        "P,R->S0,R",
        "S0,R->S1,R",
        "S0,S1->S1,R",
        "P,S0->R,R",
        "S0,S0->R,S0",
        "R,R->S0,S1",
        "S0,S1->S1,S0",
        "P,P->R,S0",
    ),
    3: (
        "S0,R,R->R,R,R",
        "P,R,R->S0,R,R",
        "R,S0,R->R,S1,R",
        "S0,S1,R->S1,R,R",
        "P,S0,R->R,R,R",
        "S0,S0,R->R,S0,R",
        "S0,S1,S2->R,R,R",
        "P,S0,S1->S1,S0,R",
        "P,P,P->S0,S1,R",
    ),
    4: (
        "S0,R,R,R->R,R,R,R",
        "P,R,R,R->S0,R,R,R",
        "S0,S1,R,R->S1,R,R,R",
        "P,S0,R,R->R,R,R,R",
        "S0,S0,R,R->R,S0,R,R",
        "S0,S1,S2,R->S2,S1,S0,R",
        "P,P,S0,S1->R,R,R,R",
    ),
}

REAL_1D_PLACEMENTS = ("R", "S0", "S1", "P")
REAL_2D_PAIRS: tuple[str, ...] = (
    "S0,R->R,R",
    "R,S1->R,R",
    "P,R->S0,R",
    "P,P->R,R",
    "S0,R->S1,R",
    "S0,S1->S1,R",
    "S0,S1->R,R",
    "S0,S1->S1,S0",
    "P,S0->R,R",
    "S0,S0->R,S0",
    "S0,S0->R,R",
    "R,R->S0,S1",
)
GRAD_1D_PAIRS: tuple[str, ...] = ("S0->R", "R->S0", "S0->S1", "P->R")
GRAD_2D_PAIRS: tuple[str, ...] = ("S0,S1->S1,R", "P,S0->R,R", "S0,S0->R,S0")
CHECK_SHAPE = (7, 5)
_KINDS = {
    "all_gather": "AG",
    "all_reduce": "AR",
    "reduce_scatter": "RS",
    "all_to_all": "A2A",
}  # uneven on 2 ranks: exercises the torch.chunk padding paths


def parse_pair(pair: str) -> tuple[list[str], list[str]]:
    """``"S0,R->R,R"`` -> (["S0", "R"], ["R", "R"])."""
    a, b = pair.split("->")
    return a.split(","), b.split(",")


def pair_fits(pair: str, ndim: int) -> bool:
    """True if every Shard of ``pair`` names a dim of an ``ndim``-D tensor."""
    src, dst = parse_pair(pair)
    return all(int(t[1:]) < ndim for t in src + dst if t.startswith("S"))


def hs_placements(tokens: Sequence[str]) -> list[hs.Placement]:
    """hyper_shard placements from tokens R / S<d> / P."""
    out: list[hs.Placement] = []
    for t in tokens:
        out.append(
            hs.Replicate() if t == "R" else hs.Partial() if t == "P" else hs.Shard(int(t[1:]))
        )
    return out


def torch_placements(tokens: Sequence[str]) -> list[Any]:
    """torch.distributed.tensor placements from tokens R / S<d> / P."""
    from torch.distributed.tensor import Partial, Replicate, Shard

    out: list[Any] = []
    for t in tokens:
        out.append(Replicate() if t == "R" else Partial() if t == "P" else Shard(int(t[1:])))
    return out


def fmt_shape(shape: Sequence[int]) -> str:
    return "(" + ",".join(str(s) for s in shape) + ")"


def fmt_num(v: float | None, digits: int = 1) -> str:
    return "n/a" if v is None else f"{v:.{digits}f}"


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def geomean(xs: Sequence[float | None]) -> tuple[float | None, int]:
    vals = [x for x in xs if x is not None and x > 0]
    if not vals:
        return None, 0
    return math.exp(sum(math.log(x) for x in vals) / len(vals)), len(vals)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int) -> None:
    """Print ``rows`` aligned; the first ``left`` columns left-aligned, others right."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)
    ]

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
        )

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))
    sys.stdout.flush()


# ---------------------------------------------------------------------- section 1: plans
def time_cold(fn: Callable[[], Any], clear: Callable[[], None], reps: int, budget: float) -> float:
    """Median in microseconds of single ``fn()`` calls, each after ``clear()`` (untimed);
    at least 3 calls, at most ``reps``, stopping early once ``budget`` seconds are spent."""
    samples: list[int] = []
    start = time.perf_counter()
    gc.disable()
    try:
        while len(samples) < reps:
            clear()
            t0 = time.perf_counter_ns()
            fn()
            samples.append(time.perf_counter_ns() - t0)
            if len(samples) >= 3 and time.perf_counter() - start > budget:
                break
    finally:
        gc.enable()
    return statistics.median(samples) / 1e3


def time_cached(fn: Callable[[], Any], calls: int, batches: int = 5) -> float:
    """Best over ``batches`` of the mean time in microseconds of ``calls`` ``fn()`` calls."""
    fn()
    per: list[float] = []
    gc.disable()
    try:
        for _ in range(batches):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                fn()
            per.append((time.perf_counter_ns() - t0) / calls / 1e3)
    finally:
        gc.enable()
    return min(per)


class TorchPlanner:
    """torch's redistribution planner on meshes built over a fake process group."""

    def __init__(self, world: int) -> None:
        self.error: str | None = None
        self.meshes: dict[tuple[int, ...], Any] = {}
        try:
            from torch.testing._internal.distributed.fake_pg import FakeStore

            if not dist.is_initialized():
                dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
            from torch.distributed.tensor import _redistribute as tr

            self.tr = tr
        except Exception as e:  # pragma: no cover - depends on the torch version
            self.error = f"{type(e).__name__}: {e}"

    def mesh(self, shape: tuple[int, ...]) -> Any:
        from torch.distributed.device_mesh import DeviceMesh

        if shape not in self.meshes:
            ranks = torch.arange(math.prod(shape)).reshape(shape)
            self.meshes[shape] = DeviceMesh("cpu", ranks, _init_backend=False)
        return self.meshes[shape]

    def specs(self, mesh_shape: tuple[int, ...], shape: tuple[int, ...], pair: str) -> Any:
        from torch.distributed.tensor._dtensor_spec import DTensorSpec, TensorMeta

        mesh = self.mesh(mesh_shape)
        meta = TensorMeta(torch.Size(shape), contiguous_stride(shape), torch.float32)
        src, dst = parse_pair(pair)
        return (
            DTensorSpec(mesh, tuple(torch_placements(src)), tensor_meta=meta),
            DTensorSpec(mesh, tuple(torch_placements(dst)), tensor_meta=meta),
        )

    def clear(self) -> None:
        self.tr._gen_transform_infos.cache_clear()
        self.tr.clear_redistribute_planner_cache()

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def bench_plans(args: argparse.Namespace) -> dict[str, list[float | None]]:
    """Section 1; returns the ratios of each column."""
    meshes = PLAN_MESHES[:3] if args.quick else PLAN_MESHES
    shapes = PLAN_SHAPES[1:] if args.quick else PLAN_SHAPES
    npairs = 5 if args.quick else 99
    reps = 15 if args.quick else 40
    calls = 300 if args.quick else 2000
    budget = 0.08 if args.quick else 0.4
    tp = TorchPlanner(max(math.prod(m) for m in meshes))
    if tp.error:
        print(f"torch planner unavailable ({tp.error}); printing hyper_shard's numbers only")
    print(
        "\n== 1. plan time (µs; one process; cold = caches cleared before each call; "
        "cached = cache hit; ratio = hyper_shard / torch, < 1: hyper_shard faster)"
    )
    headers = [
        "mesh", "shape", "pair", "steps h/t/g",
        "hs cold", "torch cold", "ratio", "tgraph cold", "ratio",
        "hs cached", "torch cached", "ratio",
    ]  # fmt: skip
    rows: list[list[str]] = []
    out: dict[str, list[float | None]] = {"cold": [], "cold_graph": [], "cached": []}
    for mesh_shape in meshes:
        hmesh = hs.DeviceMesh.abstract(mesh_shape)
        for shape in shapes:
            meta = hs.TensorMeta(shape, contiguous_stride(shape), torch.float32, 4)
            pairs = [p for p in PLAN_PAIRS[len(mesh_shape)] if pair_fits(p, len(shape))][:npairs]
            for pair in pairs:
                src, dst = parse_pair(pair)
                spec = hs.DTensorSpec(hmesh, hs_placements(src), meta)
                hdst = hs_placements(dst)

                def hs_plan(spec: hs.DTensorSpec = spec, hdst: list = hdst) -> Any:
                    return plan_redistribute(spec, hdst)

                hs_steps = len(hs_plan())

                def hs_clear(spec: hs.DTensorSpec = spec) -> None:
                    clear_plan_cache()  # the global plan cache and the placement graphs
                    spec._plans = None  # and the plans memoised on the source spec

                hs_cold = time_cold(hs_plan, hs_clear, reps, budget)
                hs_cached = time_cached(hs_plan, calls)
                t_cold = t_graph = t_cached = None
                t_steps: str = "-"
                g_steps: str = "-"
                if tp.error is None:
                    tsrc, tdst = tp.specs(mesh_shape, shape, pair)
                    gen = tp.tr._gen_transform_infos

                    def t_plan(tsrc: Any = tsrc, tdst: Any = tdst, gen: Any = gen) -> Any:
                        return gen(tsrc, tdst, None)

                    def g_plan(tsrc: Any = tsrc, tdst: Any = tdst, gen: Any = gen) -> Any:
                        return gen(tsrc, tdst, True)

                    try:
                        tp.clear()
                        t_steps = str(len(t_plan()))
                        t_cold = time_cold(t_plan, tp.clear, reps, budget)
                        t_cached = time_cached(t_plan, calls)
                    except Exception as e:
                        t_steps = f"err:{type(e).__name__}"
                    try:
                        tp.clear()
                        g_steps = str(len(g_plan()))
                        t_graph = time_cold(g_plan, tp.clear, reps, budget)
                    except Exception as e:
                        g_steps = f"err:{type(e).__name__}"
                r_cold, r_graph, r_cached = (
                    ratio(hs_cold, t_cold),
                    ratio(hs_cold, t_graph),
                    ratio(hs_cached, t_cached),
                )
                out["cold"].append(r_cold)
                out["cold_graph"].append(r_graph)
                out["cached"].append(r_cached)
                rows.append(
                    [
                        fmt_shape(mesh_shape),
                        fmt_shape(shape),
                        pair,
                        f"{hs_steps}/{t_steps}/{g_steps}",
                        fmt_num(hs_cold),
                        fmt_num(t_cold),
                        fmt_num(r_cold, 2),
                        fmt_num(t_graph),
                        fmt_num(r_graph, 3),
                        fmt_num(hs_cached, 2),
                        fmt_num(t_cached, 2),
                        fmt_num(r_cached, 2),
                    ]
                )
    print_table(headers, rows, left=3)
    tp.close()
    return out


# ---------------------------------------------------------------------- section 2: real
def local_part(
    full: torch.Tensor, tokens: Sequence[str], mesh_shape: Sequence[int], coord: Sequence[int]
) -> torch.Tensor:
    """This rank's local data for ``tokens`` (torch.chunk semantics, nested left to right;
    Partial(sum): the value divided by the mesh dim size, exact for powers of two)."""
    t = full
    for m, tok in enumerate(tokens):
        n = mesh_shape[m]
        if tok == "P":
            t = t / n
        elif tok.startswith("S"):
            d = int(tok[1:])
            chunks = torch.chunk(t, n, dim=d)
            c = coord[m]
            t = chunks[c] if c < len(chunks) else t.narrow(d, t.size(d), 0)
    return t.contiguous()


def _barrier_time(fn: Callable[[], Any]) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _hs_move(x: Any, dst: Any) -> Any:
    """``x.redistribute(mesh, dst)``; a Partial target the source does not have is internal
    in the public API (as torch's), so it runs through the same executor path directly."""
    from hyper_shard.dtensor import redistribute_local

    spec = x._spec
    if not any(type(p) is hs.Partial and p != q for p, q in zip(dst, spec.placements)):
        return x.redistribute(spec.mesh, dst)
    plat = spec.mesh.platform
    tgt = spec.with_placements(dst)
    return plat.wrap(redistribute_local(plat, plat.local_of(x), spec, tgt), tgt)


class Case:
    """One (pair, shape) on this rank: the inputs of both libraries and their callables."""

    def __init__(
        self, pair: str, shape: tuple[int, ...], hmesh: Any, tmesh: Any, grad: bool = False
    ) -> None:
        from torch.distributed.tensor import DTensor as TDTensor

        self.pair, self.shape, self.hmesh, self.tmesh = pair, shape, hmesh, tmesh
        src, dst = parse_pair(pair)
        self.src, self.dst = src, dst
        self.hdst, self.tdst = hs_placements(dst), torch_placements(dst)
        self.hsrc, self.tsrc = hs_placements(src), torch_placements(src)
        g = torch.Generator().manual_seed(1234)
        self.full = torch.randn(shape, generator=g)
        coord = hmesh.get_coordinate()
        self.local = local_part(self.full, src, hmesh.shape, coord)
        self.stride = contiguous_stride(shape)
        self.tshape = torch.Size(shape)
        self.grad = grad
        if grad:
            self.hleaf = self.local.clone().requires_grad_()
            self.tleaf = self.local.clone().requires_grad_()
            self.gy: dict[str, torch.Tensor] = {}
        else:
            self.hx = hs.DTensor.from_local(
                self.local, hmesh, self.hsrc, shape=shape, stride=self.stride
            )
            self.tx = TDTensor.from_local(
                self.local, tmesh, self.tsrc, run_check=False, shape=self.tshape, stride=self.stride
            )
        self.torch_ok = "P" not in [d for s, d in zip(src, dst) if s != d]

    # -- forward only
    def hs_plan(self) -> str:
        """hyper_shard's plan for this pair, e.g. ``RS+AR+AG``."""
        spec = hs.DTensorSpec(
            hs.DeviceMesh.abstract(self.hmesh.shape),
            self.hsrc,
            hs.TensorMeta(self.shape, self.stride, torch.float32, 4),
        )
        steps = plan_redistribute(spec, self.hdst).steps
        return "+".join(_KINDS.get(st.kind, st.kind) for st in steps)

    def hs_fwd(self) -> Any:
        return _hs_move(self.hx, self.hdst)

    def torch_fwd(self) -> Any:
        return self.tx.redistribute(self.tmesh, self.tdst)

    # -- forward + backward
    def _bwd(self, key: str, y_local: torch.Tensor) -> None:
        gy = self.gy.get(key)
        if gy is None:
            gy = self.gy[key] = torch.ones_like(y_local)
        y_local.backward(gy)

    def hs_grad(self) -> None:
        self.hleaf.grad = None
        x = hs.DTensor.from_local(
            self.hleaf, self.hmesh, self.hsrc, shape=self.shape, stride=self.stride
        )
        y = _hs_move(x, self.hdst).to_local()
        self._bwd("hs", y)

    def torch_grad(self) -> None:
        from torch.distributed.tensor import DTensor as TDTensor

        self.tleaf.grad = None
        x = TDTensor.from_local(
            self.tleaf, self.tmesh, self.tsrc, run_check=False, shape=self.tshape,
            stride=self.stride,
        )  # fmt: skip
        y = x.redistribute(self.tmesh, self.tdst).to_local()
        self._bwd("torch", y)

    def fns(self) -> tuple[Callable[[], Any], Callable[[], Any]]:
        return (self.hs_grad, self.torch_grad) if self.grad else (self.hs_fwd, self.torch_fwd)


def check_case(pair: str, shape: tuple[int, ...], hmesh: Any, tmesh: Any) -> list[str]:
    """Redistribute once with both libraries and compare ``full_tensor()`` with the global
    tensor; also compare the input gradients of both. Returns the problems found."""
    problems: list[str] = []
    try:
        c = Case(pair, shape, hmesh, tmesh)
        got = c.hs_fwd().full_tensor()
        if not torch.allclose(torch.as_tensor(got).as_subclass(torch.Tensor), c.full, atol=1e-5):
            problems.append(f"hyper_shard {pair} shape {shape}: wrong full_tensor()")
    except Exception as e:
        problems.append(f"hyper_shard {pair} shape {shape}: {type(e).__name__}: {e}")
    if "P" not in parse_pair(pair)[1]:
        try:
            c = Case(pair, shape, hmesh, tmesh)
            got_t = c.torch_fwd().full_tensor()
            if not torch.allclose(got_t, c.full, atol=1e-5):
                problems.append(f"torch {pair} shape {shape}: wrong full_tensor()")
        except Exception as e:
            problems.append(f"torch {pair} shape {shape}: {type(e).__name__}: {e}")
        try:  # input gradients of both libraries must agree
            c = Case(pair, shape, hmesh, tmesh, grad=True)
            gh = _leaf_grad(c.hs_grad, c.hleaf)
            gt = _leaf_grad(c.torch_grad, c.tleaf)
            if not torch.allclose(gh, gt, atol=1e-5):
                problems.append(
                    f"grad {pair} shape {shape}: hyper_shard input grad {gh.flatten()[:4]}... "
                    f"!= torch {gt.flatten()[:4]}..."
                )
        except Exception as e:
            problems.append(f"grad {pair} shape {shape}: {type(e).__name__}: {e}")
    return problems


def _leaf_grad(fn: Callable[[], None], leaf: torch.Tensor) -> torch.Tensor:
    """Run ``fn`` (forward + backward from a fresh ``leaf.grad``) and return the gradient."""
    fn()
    g = leaf.grad
    return torch.zeros_like(leaf) if g is None else g.detach().as_subclass(torch.Tensor)


def run_cases(cases: list[Case], warmup: int, iters: int) -> list[tuple[float, float | None]]:
    """Median seconds (slowest rank) of hyper_shard and torch for every case."""
    res: list[tuple[float, float | None]] = []
    for c in cases:
        hfn, tfn = c.fns()
        for _ in range(warmup):
            hfn()
            if c.torch_ok:
                tfn()
        hts: list[float] = []
        tts: list[float] = []
        for _ in range(iters):
            hts.append(_barrier_time(hfn))
            if c.torch_ok:
                tts.append(_barrier_time(tfn))
        med = torch.tensor(
            [statistics.median(hts), statistics.median(tts) if tts else -1.0], dtype=torch.float64
        )
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        res.append((float(med[0]), float(med[1]) if c.torch_ok else None))
    return res


def real_worker(rank: int, world: int, port: int, cfg: dict[str, Any], out_path: str) -> None:
    """One gloo rank of section 2; rank 0 prints and writes the ratios to ``out_path``."""
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)  # torch's advice on flattening meshes / gloo all-to-all
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        _real_bench(rank, cfg, out_path)
    except Exception:
        traceback.print_exc()
        raise
    finally:
        dist.destroy_process_group()


def _real_bench(rank: int, cfg: dict[str, Any], out_path: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh as t_init_device_mesh

    mesh_shape = tuple(cfg["mesh"])
    hmesh = hs.init_device_mesh("cpu", mesh_shape)
    tmesh = t_init_device_mesh("cpu", mesh_shape)
    pairs: list[str] = cfg["pairs"]
    shapes = [tuple(s) for s in cfg["shapes"]]

    problems: list[str] = []
    for pair in pairs:
        for shape in (CHECK_SHAPE, shapes[0]):
            problems += check_case(pair, shape, hmesh, tmesh)

    cases = [Case(p, s, hmesh, tmesh) for s in shapes for p in pairs]
    cases += [Case(p, shapes[0], hmesh, tmesh, grad=True) for p in cfg["grad_pairs"]]
    t0 = time.perf_counter()
    res = run_cases(cases, cfg["warmup"], cfg["iters"])
    elapsed = time.perf_counter() - t0
    if rank != 0:
        return
    world = dist.get_world_size()
    print(
        f"\n== 2. redistribute time, mesh {fmt_shape(mesh_shape)} on {world} gloo ranks "
        f"(ms, median of {cfg['iters']} after {cfg['warmup']} warm-up, slowest rank; "
        f"ratio = hyper_shard / torch)"
    )
    rows = []
    ratios: dict[str, list[float | None]] = {"fwd": [], "grad": []}
    for c, (h, t) in zip(cases, res):
        r = ratio(h, t)
        ratios["grad" if c.grad else "fwd"].append(r)
        rows.append(
            [
                c.pair + (" (grad)" if c.grad else ""),
                fmt_shape(c.shape),
                c.hs_plan(),
                fmt_num(h * 1e3, 3),
                fmt_num(None if t is None else t * 1e3, 3),
                fmt_num(r, 2),
            ]
        )
    print_table(["pair", "shape", "hs plan", "hs ms", "torch ms", "ratio"], rows, left=3)
    print(
        f"(timed in {elapsed:.1f}s; plan steps AG all-gather, AR all-reduce, RS reduce-scatter, "
        f"A2A all-to-all, local: chunk/pad/partition. On gloo, hyper_shard's all-to-all is "
        f"all_to_all_single; torch falls back to all-gather + chunk)"
    )
    if problems:
        print(f"correctness problems on mesh {fmt_shape(mesh_shape)}:")
        for p in problems:
            print("  " + p)
    else:
        print(
            f"correctness: every pair gives the global tensor for both libraries and equal input "
            f"gradients (shapes {fmt_shape(CHECK_SHAPE)} and {fmt_shape(shapes[0])})"
        )
    sys.stdout.flush()
    with open(out_path, "w") as f:
        json.dump({"ratios": ratios, "problems": problems}, f)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def bench_real(args: argparse.Namespace) -> dict[str, list[float | None]]:
    """Section 2: spawn 2 then 4 gloo ranks; returns the ratios of each kind of row."""
    shapes = [(256, 256)] if args.quick else [(256, 256), (1024, 1024)]
    iters, warmup = (5, 2) if args.quick else (40, 3)
    pairs_1d = [f"{a}->{b}" for a in REAL_1D_PLACEMENTS for b in REAL_1D_PLACEMENTS if a != b]
    jobs: list[dict[str, Any]] = [
        {"mesh": [2], "pairs": pairs_1d, "grad_pairs": list(GRAD_1D_PAIRS)},
        {
            "mesh": [2, 2],
            "pairs": list(REAL_2D_PAIRS[:6] if args.quick else REAL_2D_PAIRS),
            "grad_pairs": list(GRAD_2D_PAIRS[:1] if args.quick else GRAD_2D_PAIRS),
        },
    ]
    out: dict[str, list[float | None]] = {"fwd": [], "grad": []}
    for job in jobs:
        job.update(shapes=shapes, iters=iters, warmup=warmup)
        world = math.prod(job["mesh"])
        fd, path = tempfile.mkstemp(suffix=".json", prefix="bench_redistribute_")
        os.close(fd)
        try:
            mp.spawn(real_worker, args=(world, free_port(), job, path), nprocs=world)
            with open(path) as f:
                data = json.load(f)
            for k in out:
                out[k] += data["ratios"][k]
        except Exception as e:
            print(f"section 2 on mesh {job['mesh']} failed: {type(e).__name__}: {e}")
        finally:
            os.unlink(path)
    return out


# ---------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--quick", action="store_true", help="fewer iterations/pairs (< 60 s)")
    ap.add_argument("--skip-plan", action="store_true", help="skip section 1")
    ap.add_argument("--skip-real", action="store_true", help="skip section 2")
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print(
        f"hyper_shard {hs.__version__} vs torch {torch.__version__} "
        f"({'quick' if args.quick else 'default'} run; ratio < 1: hyper_shard faster; "
        f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start)"
    )
    plan = {} if args.skip_plan else bench_plans(args)
    real = {} if args.skip_real else bench_real(args)
    print("\n== summary: geometric mean of ratios hyper_shard / torch (< 1: hyper_shard faster)")
    labels = {
        "cold": "plan, cold vs torch default (greedy) planner",
        "cold_graph": "plan, cold vs torch graph (min-cost) planner",
        "cached": "plan, cached",
        "fwd": "redistribute on gloo ranks",
        "grad": "redistribute forward+backward on gloo ranks",
    }
    for key, vals in {**plan, **real}.items():
        g, n = geomean(vals)
        print(f"  {labels[key]:<46} {fmt_num(g, 3):>7}  ({n} rows)")
    print(f"total time {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    main()
