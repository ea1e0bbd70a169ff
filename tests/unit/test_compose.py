"""The collectives composed once for every platform (hyper_shard/platform/compose.py) and
the routes the planner prices (redistribute/steps.py), on ranks simulated by threads in
one process: every route of reduce-scatter and all-to-all gives what the native
collective gives (the plain torch reduction/transposition of the ranks' data), uneven
pieces included; the route the executor runs is the one the planner priced; plans run by
composition equal the native ones."""

from __future__ import annotations

import subprocess
import sys
import threading
from typing import Any

import pytest
import torch

from hyper_shard.mesh import DeviceMesh
from hyper_shard.placement import Partial, Shard
from hyper_shard.platform import compose
from hyper_shard.platform.base import GroupRanks, Platform
from hyper_shard.platform.torch import TorchPlatform
from hyper_shard.redistribute.cost import DEFAULT_COST_MODEL
from hyper_shard.redistribute.executor import execute_plan, step_route
from hyper_shard.redistribute.planner import plan_redistribute
from hyper_shard.redistribute.steps import STEPS
from hyper_shard.spec import DTensorSpec, TensorMeta, chunk_sizes, contiguous_stride


class _Exchange:
    """Collectives between threads: each group's members deposit, meet, read."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.slots: dict[tuple, dict] = {}
        self.barriers: dict[tuple, threading.Barrier] = {}

    def gather(self, group: Any, value: Any) -> list[Any]:
        key = group.ranks
        with self.lock:
            bar = self.barriers.setdefault(key, threading.Barrier(len(key)))
            slot = self.slots.setdefault(key, {})
        slot[group.me] = value
        bar.wait()
        out = [slot[r] for r in key]  # mesh-coordinate order
        bar.wait()
        return out


class _Group(GroupRanks):
    __slots__ = ("me",)

    def __init__(self, ranks: tuple[int, ...], me: int) -> None:
        super().__init__(ranks)
        self.me = me


class _Sim(TorchPlatform):
    """Torch local primitives; every native collective through the exchange, limited to
    ``native``; counts the native collectives it ran."""

    def __init__(self, ex: _Exchange, native: frozenset[str], me: int) -> None:
        super().__init__()
        self.ex, self.native_collectives, self.ran, self.me = ex, native, [], me

    def get_rank(self) -> int:
        return self.me

    def _run(self, name: str) -> None:
        assert name in self.native_collectives, f"{name} is not native here"
        self.ran.append(name)

    def all_gather(self, t, group, n):  # noqa: ANN001, ANN201
        self._run("all_gather")
        return [x.clone() for x in self.ex.gather(group, t.clone())]

    def all_reduce(self, t, op, group):  # noqa: ANN001, ANN201
        self._run("all_reduce")
        xs = torch.stack(self.ex.gather(group, t.clone()))
        return {"sum": xs.sum(0), "avg": xs.mean(0), "max": xs.amax(0), "min": xs.amin(0)}[op]

    def reduce_scatter(self, pieces, op, group):  # noqa: ANN001, ANN201
        self._run("reduce_scatter")
        allp = self.ex.gather(group, [p.clone() for p in pieces])
        xs = torch.stack([ps[group.ranks.index(group.me)] for ps in allp])
        return xs.sum(0) if op == "sum" else xs.mean(0)

    def all_to_all(self, pieces, group):  # noqa: ANN001, ANN201
        self._run("all_to_all")
        allp = self.ex.gather(group, [p.clone() for p in pieces])
        return [ps[group.ranks.index(group.me)].clone() for ps in allp]

    def send_recv(self, t, dst, like, src, group):  # noqa: ANN001, ANN201
        self._run("send_recv")
        c = group.ranks.index(group.me)
        msgs = self.ex.gather(group, (dst, t.clone()))  # every rank's (destination, data)
        got = msgs[src]
        assert got[0] == c and got[1].shape == like.shape, "mismatched send_recv pairing"
        return got[1]


def _ranks(n: int, native: frozenset[str], fn: Any) -> list[Any]:
    """``fn(coord, group, plat)`` on ``n`` threads; results by coordinate."""
    ex = _Exchange()
    out: list[Any] = [None] * n
    errors: list[BaseException] = []

    def work(c: int) -> None:
        try:
            out[c] = fn(c, _Group(tuple(range(n)), c), _Sim(ex, native, c))
        except BaseException as e:  # noqa: BLE001
            errors.append(e)
            for b in ex.barriers.values():
                b.abort()

    threads = [threading.Thread(target=work, args=(c,)) for c in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    if errors:
        raise errors[0]
    return out


BASE = frozenset({"all_gather", "all_reduce"})


@pytest.mark.parametrize("n, extent", [(2, 7), (3, 7), (4, 9), (4, 3)])
@pytest.mark.parametrize("route", ["native", "all_reduce", "all_gather"])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_reduce_scatter_routes(n: int, extent: int, route: str, op: str) -> None:
    g = torch.Generator().manual_seed(n * 100 + extent)
    data = torch.randn(n, 3, extent, generator=g)  # rank r's whole input: data[r]
    sizes = chunk_sizes(extent, n)
    total = data.sum(0) if op == "sum" else data.mean(0)
    native = BASE | ({"reduce_scatter"} if route == "native" else set())

    def fn(c: int, group: Any, plat: _Sim) -> Any:
        out = compose.reduce_scatter(plat, data[c], 1, sizes, op, group, c, route)
        return out, plat.ran

    for c, (out, ran) in enumerate(_ranks(n, native, fn)):
        start = sum(sizes[:c])
        torch.testing.assert_close(out, total.narrow(1, start, sizes[c]))
        assert ran == ["reduce_scatter" if route == "native" else route]


@pytest.mark.parametrize("n, ext_d, ext_e", [(2, 5, 7), (3, 4, 8), (4, 9, 6)])
@pytest.mark.parametrize("route", ["native", "send_recv", "all_gather"])
def test_all_to_all_routes(n: int, ext_d: int, ext_e: int, route: str) -> None:
    """Dim 0 sharded (uneven) -> dim 1 sharded (uneven)."""
    full = torch.randn(ext_d, ext_e, 2, generator=torch.Generator().manual_seed(n))
    sd, se = chunk_sizes(ext_d, n), chunk_sizes(ext_e, n)
    native = BASE | ({"all_to_all"} if route == "native" else {route})

    def fn(c: int, group: Any, plat: _Sim) -> Any:
        mine = full.narrow(0, sum(sd[:c]), sd[c])
        return compose.all_to_all(plat, mine, 0, 1, sd, se, group, c, route), plat.ran

    for c, (out, ran) in enumerate(_ranks(n, native, fn)):
        torch.testing.assert_close(out, full.narrow(1, sum(se[:c]), se[c]))
        want = {"native": ["all_to_all"], "all_gather": ["all_gather"]}.get(route)
        assert ran == (want or ["send_recv"] * (n - 1))


def test_the_executor_runs_the_route_the_planner_priced() -> None:
    """A step is priced as the route it runs: native where present, else the first
    composition the native set allows (all-reduce before all-gather for reduce-scatter,
    send/recv before all-gather for all-to-all)."""
    want = {
        "reduce_scatter": {BASE: "all_reduce", BASE | {"send_recv"}: "all_reduce"},
        "all_to_all": {BASE: "all_gather", BASE | {"send_recv"}: "send_recv"},
    }
    for kind, by_native in want.items():
        step = STEPS[kind]
        for native, route in by_native.items():
            cm = DEFAULT_COST_MODEL.with_native(native)
            assert step.route(native) == route
            assert compose.route_for(_Sim(_Exchange(), native, 0), kind) == route
            assert step_route(_Sim(_Exchange(), native, 0), kind) == route
            for n, b_in in [(2, 64), (4, 64), (4, 1 << 24), (8, 1 << 26)]:
                b_out = b_in // n
                price = step.cost(cm, 0, n, b_in, b_out)
                assert price == step.route_cost(route, cm, 0, n, b_in, b_out)
                assert step.route_cost("native", cm, 0, n, b_in, b_out) < price
        assert step.route(DEFAULT_COST_MODEL.native) == "native"
    # all-to-all by send/recv moves 1/n of the bytes the all-gather composition moves
    a2a = STEPS["all_to_all"]
    cm = DEFAULT_COST_MODEL
    assert a2a.route_cost("send_recv", cm, 0, 8, 1 << 20, 1 << 20) < a2a.route_cost(
        "all_gather", cm, 0, 8, 1 << 20, 1 << 20
    )


def _mesh(n: int, c: int) -> DeviceMesh:
    groups = [_Group(tuple(range(n)), c)]
    return DeviceMesh("cpu", list(range(n)), _rank=c, _groups=groups, _abstract=True)


@pytest.mark.parametrize("native", [BASE, BASE | {"send_recv"}, BASE | STEPS.keys()])
def test_plans_run_by_composition_equal_the_values(native: frozenset[str]) -> None:
    """P -> S(1) and S(0) -> S(1) on 4 simulated ranks: each rank ends with its shard of
    the global value, whatever the platform runs natively, by the routes the plan was
    priced with."""
    n, shape = 4, (9, 6)
    terms = torch.randn(n, *shape, generator=torch.Generator().manual_seed(7))
    total = terms.sum(0)
    meta = TensorMeta(shape, contiguous_stride(shape), torch.float32, 4)
    cm = DEFAULT_COST_MODEL.with_native(native)

    def fn(c: int, group: Any, plat: _Sim) -> Any:
        mesh = _mesh(n, c)
        outs = []
        for src, local in (
            ([Partial()], terms[c]),
            ([Shard(0)], total.narrow(0, sum(chunk_sizes(9, n)[:c]), chunk_sizes(9, n)[c])),
        ):
            spec = DTensorSpec(mesh, src, meta)
            plan = plan_redistribute(spec, [Shard(1)], cm)
            plat.ran.clear()
            outs.append(execute_plan(plat, local, spec, plan))
            ran = set(plat.ran)
            for st in plan.steps:  # the collectives the priced routes use, and no other
                step = STEPS[st.kind]
                if step.collective:
                    assert step.needs(step.route(cm.native)) in ran, (st, ran)
        return outs

    sizes = chunk_sizes(6, n)
    for c, outs in enumerate(_ranks(n, native, fn)):
        for out in outs:
            torch.testing.assert_close(out, total.narrow(1, sum(sizes[:c]), sizes[c]))


def test_planning_needs_no_platform() -> None:
    """Plans are made in a fresh process on an abstract mesh with no framework imported."""
    code = (
        "import sys\n"
        "from hyper_shard.mesh import DeviceMesh\n"
        "from hyper_shard.placement import Partial, Replicate, Shard\n"
        "from hyper_shard.redistribute.planner import plan_redistribute\n"
        "from hyper_shard.spec import DTensorSpec, TensorMeta\n"
        "m = DeviceMesh.abstract((2, 2))\n"
        "s = DTensorSpec(m, [Shard(0), Partial()], TensorMeta((8, 6), (6, 1), 'f32', 4))\n"
        "p = plan_redistribute(s, [Replicate(), Shard(1)])\n"
        "assert [x.kind for x in p.steps] == ['reduce_scatter', 'all_gather'], p\n"
        "bad = [k for k in sys.modules if k.split('.')[0] in ('torch', 'mindspore')]\n"
        "bad += [k for k in sys.modules if k.startswith('hyper_shard.platform.')\n"
        "        and k.split('.')[2] not in ('base', 'bindings', 'compose', 'local_ops', 'select')]\n"
        "assert not bad, bad\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("native", [BASE, BASE | {"reduce_scatter"}])
@pytest.mark.parametrize("op", ["sum", "avg"])
def test_fsdp_flat_collectives(native: frozenset[str], op: str) -> None:
    """The FlatBuffers defaults (what FSDP calls where a platform has no native flat
    collective): reduce-scatter of a flat buffer into this rank's chunk, all-gather of
    flat chunks in mesh order."""
    n, k = 3, 5
    data = torch.randn(n, n * k, generator=torch.Generator().manual_seed(1))
    total = data.sum(0) if op == "sum" else data.mean(0)

    def fn(c: int, group: Any, plat: _Sim) -> Any:
        out = torch.empty(k)
        Platform.reduce_scatter_into(plat, out, data[c].clone(), op, group)
        gathered = torch.empty(n * k)
        Platform.all_gather_into(plat, gathered, out, group)
        return out, gathered

    for c, (out, gathered) in enumerate(_ranks(n, native, fn)):
        torch.testing.assert_close(out, total.narrow(0, c * k, k))
        torch.testing.assert_close(gathered, total)
