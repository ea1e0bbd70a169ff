"""Ranks as threads: hyper_shard under PyTorch's threaded process group
(``torch.testing._internal.distributed.multi_threaded_pg``, what its
``MultiThreadedTestCase`` and the DTensor tests built on ``DTensorOpTestBase`` run: one
thread per rank in one process, ``init_process_group("threaded", ...)``), 4 ranks.

Every rank thread runs the same program as a process would; every result is compared with
plain torch on the whole tensors in one process (forward values, every gradient, dropout
masks and the generator's state, a tensor-parallel MLP's losses and weights over optimizer
steps). Every join has a timeout: a deadlock (ranks waiting in collectives the others never
join, as decisions shared between the threads used to cause) fails the test in seconds,
naming the ranks still running, instead of hanging it.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.testing._internal.distributed.multi_threaded_pg import (
    ProcessLocalGroup,
    _install_threaded_pg,
    _uninstall_threaded_pg,
)

import hyper_shard as hs
from hyper_shard import DeviceMesh, Partial, Replicate, Shard, distribute_tensor
from hyper_shard import random as hs_random
from hyper_shard.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

WORLD = 4
TIMEOUT = 120.0  # seconds for a whole scenario; a deadlock fails it, never hangs the run
S0, S1, R, P = Shard(0), Shard(1), Replicate(), Partial()

_ONE_AT_A_TIME = threading.Lock()  # one threaded world per process at a time


def run_threads(fn: Callable[[int], Any], world: int = WORLD, timeout: float = TIMEOUT) -> list:
    """``fn(rank)`` on ``world`` ranks, each a thread of this process in PyTorch's threaded
    process group (installed for the call, then removed); the results by rank.

    Raises:
        TimeoutError: some rank did not finish within ``timeout`` seconds (the ranks still
            waiting in a collective are released and the message names the ones left).
        The first exception a rank raised (the others' collectives are released).
    """
    with _ONE_AT_A_TIME:
        torch._C._distributed_c10d._set_thread_isolation_mode(True)
        _install_threaded_pg()
        store = dist.HashStore()
        results: list[Any] = [None] * world
        errors: list[tuple[int, BaseException]] = []

        def work(rank: int) -> None:
            try:
                dist.init_process_group("threaded", rank=rank, world_size=world, store=store)
                results[rank] = fn(rank)
            except BaseException as e:  # noqa: BLE001 - reported by the caller below
                errors.append((rank, e))
                ProcessLocalGroup.exception_handle(e)  # release the others' collectives
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()

        threads = [
            threading.Thread(target=work, args=(r,), name=f"rank-{r}", daemon=True)
            for r in range(world)
        ]
        try:
            for t in threads:
                t.start()
            deadline = time.monotonic() + timeout
            for t in threads:
                t.join(max(0.0, deadline - time.monotonic()))
            stuck = [r for r, t in enumerate(threads) if t.is_alive()]
            if stuck:
                ProcessLocalGroup.exception_handle(TimeoutError())
                for t in threads:
                    t.join(5.0)
        finally:
            ProcessLocalGroup.reset()
            _uninstall_threaded_pg()
            torch._C._distributed_c10d._set_thread_isolation_mode(False)
    if stuck:
        raise TimeoutError(
            f"ranks {stuck} of {world} still running after {timeout} s: a deadlock (errors: "
            f"{[(r, repr(e)) for r, e in errors]})"
        )
    real = [(r, e) for r, e in errors if not isinstance(e, SystemExit)]
    if real:
        raise real[0][1]
    if errors:
        raise RuntimeError(f"ranks ended by the test's termination: {errors}")
    return results


def _inputs(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    """Plain tensors made once, in the main thread (every rank takes the same values)."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def _close(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")


def _mesh(shape: tuple[int, ...]) -> DeviceMesh:
    names = ("dp", "tp")[: len(shape)] if len(shape) > 1 else None
    return hs.init_device_mesh("cpu", shape, mesh_dim_names=names)


# ---------------------------------------------------------------------- DTensor ops
#: the activations PyTorch's test_pointwise_ops checks (gelu, relu, sigmoid on Shard(0),
#: Shard(1) and Replicate), and more
ACTIVATIONS: list[tuple[str, Callable]] = [
    ("gelu", F.gelu),
    ("relu", F.relu),
    ("sigmoid", torch.sigmoid),
    ("tanh", torch.tanh),
    ("silu", F.silu),
    ("softplus", F.softplus),
]


def _check_ops(mesh: DeviceMesh, xs: list[torch.Tensor]) -> int:
    """Activations (forward and gradient), matmul, reductions and views of DTensors on
    ``mesh`` against plain torch; shapes include uneven ones (a rank with an empty shard
    decides differently from the others: its decisions must stay its own)."""
    n = 0
    pls = [p for p in itertools.product((S0, S1, R), repeat=mesh.ndim)]
    a, b, c, u = xs  # (8, 5), (5, 12), (3, 12), (5, 3): the last is uneven on 4 ranks
    for (name, op), pl, x in itertools.product(ACTIVATIONS, pls, (a, c, u)):
        leaf = x.clone().requires_grad_(True)
        ref = op(leaf)
        ref.sum().backward()
        d = distribute_tensor(x, mesh, list(pl)).requires_grad_(True)
        out = op(d)
        _close(out.full_tensor(), ref.detach(), f"{name} {pl} {tuple(x.shape)}")
        out.sum().backward()
        _close(d.grad.full_tensor(), leaf.grad, f"grad of {name} {pl}")
        n += 1
    for pa, pb in itertools.product(pls, repeat=2):  # matmul, every pair of layouts
        da, db = distribute_tensor(a, mesh, list(pa)), distribute_tensor(b, mesh, list(pb))
        _close(torch.mm(da, db).full_tensor(), a @ b, f"mm {pa} x {pb}")
        n += 1
    for pl in pls:  # reductions and views of each layout, uneven included
        for x in (a, u):
            d = distribute_tensor(x, mesh, list(pl))
            for what, f in (
                ("sum", lambda t: t.sum()),
                ("sum(0)", lambda t: t.sum(0)),
                ("mean(1)", lambda t: t.mean(1)),
                ("amax(0)", lambda t: t.amax(0)),
                ("softmax(1)", lambda t: torch.softmax(t, 1)),
                ("view", lambda t: t.reshape(-1)),
                ("transpose", lambda t: t.t().contiguous()),
                ("slice", lambda t: t[1:4, :2]),
                ("unsqueeze", lambda t: t.unsqueeze(0).flatten(1)),
                ("narrow", lambda t: t.narrow(1, 1, 2)),
            ):
                _close(f(d).full_tensor(), f(x), f"{what} of {pl} {tuple(x.shape)}")
                n += 1
    return n


def _check_redistribute(mesh: DeviceMesh, x: torch.Tensor) -> int:
    """Every redistribution between Shard(0)/Shard(1)/Replicate/Partial on ``mesh``,
    forward (the global value, this rank's shard) and backward (the gradient)."""
    n = 0
    states = list(itertools.product((S0, S1, R, P), repeat=mesh.ndim))
    targets = [s for s in states if P not in s]
    for src, dst in itertools.product(states, targets):
        if P in src:  # a Partial source: each rank holds its share of the sum
            k = 1
            for m, p in enumerate(src):
                k *= mesh.shape[m] if p == P else 1
            box = distribute_tensor(x, mesh, [R if p == P else p for p in src]).to_local()
            d = hs.DTensor.from_local(box / k, mesh, list(src)).requires_grad_(True)
        else:
            d = distribute_tensor(x, mesh, list(src)).requires_grad_(True)
        out = d.redistribute(mesh, list(dst))
        _close(out.full_tensor(), x, f"{src} -> {dst}")
        want = distribute_tensor(x, mesh, list(dst)).to_local()
        _close(out.to_local(), want, f"{src} -> {dst}: this rank's shard")
        out.sum().backward()
        _close(d.grad.full_tensor(), torch.ones_like(x), f"grad of {src} -> {dst}")
        n += 1
    return n


def test_dtensor_ops_on_thread_ranks():
    xs = _inputs((8, 5), (5, 12), (3, 12), (5, 3))

    def rank(r: int) -> int:
        return _check_ops(_mesh((WORLD,)), xs) + _check_ops(_mesh((2, 2)), xs)

    counts = run_threads(rank)
    assert len(set(counts)) == 1 and counts[0] > 300


def test_every_redistribution_on_thread_ranks():
    (x,) = _inputs((6, 7))  # uneven on both dims

    def rank(r: int) -> int:
        return _check_redistribute(_mesh((WORLD,)), x) + _check_redistribute(_mesh((2, 2)), x)

    counts = run_threads(rank)
    assert counts == [12 + 16 * 9] * WORLD  # 4 x 3 on the 1-D mesh, 16 x 9 on the 2-D one


# ---------------------------------------------------------------------- dropout
#: (mesh shape, placements, p, input shape): dropout calls in program order
DROPOUTS = [
    ((WORLD,), (S0,), 0.4, (8, 5)),
    ((WORLD,), (S1,), 0.5, (3, 14)),
    ((WORLD,), (R,), 0.3, (6, 4)),
    ((2, 2), (S0, S1), 0.5, (6, 6)),
    ((2, 2), (R, S0), 0.2, (5, 3)),  # uneven
]


def test_dropout_forward_and_backward_on_thread_ranks():
    """The ranks share the process's generator: each dropout is drawn once for all of them
    (hyper_shard.random), so masks, outputs, gradients and the generator's state after the
    run equal one device's from the same seed."""
    xs = _inputs(*[s for *_, s in DROPOUTS], seed=1)
    ws = _inputs(*[s for *_, s in DROPOUTS], seed=2)
    torch.manual_seed(1234)  # once, before the rank threads draw

    def rank(r: int) -> list:
        meshes = {s: _mesh(s) for s in {m for m, *_ in DROPOUTS}}
        out = []
        for (ms, pl, p, _), x, w in zip(DROPOUTS, xs, ws):
            mesh = meshes[ms]
            d = distribute_tensor(x, mesh, list(pl)).requires_grad_(True)
            y = F.dropout(d, p=p, training=True)
            loss = (y * distribute_tensor(w, mesh, list(pl))).sum()
            loss.backward()
            out.append((y.full_tensor(), d.grad.full_tensor(), loss.full_tensor()))
        hs_random.manual_seed(99, meshes[(WORLD,)])  # once for every rank
        d = distribute_tensor(xs[0], meshes[(WORLD,)], [S0])
        out.append(F.dropout(d, p=0.5).full_tensor())
        return out

    got = run_threads(rank)
    state_after = torch.get_rng_state()
    torch.manual_seed(1234)
    want = []
    for (*_, p, _), x, w in zip(DROPOUTS, xs, ws):
        leaf = x.clone().requires_grad_(True)
        y = F.dropout(leaf, p=p, training=True)
        loss = (y * w).sum()
        loss.backward()
        want.append((y.detach(), leaf.grad, loss.detach()))
    torch.manual_seed(99)
    want.append(F.dropout(xs[0], p=0.5))
    assert torch.equal(state_after, torch.get_rng_state()), "the generator is not in step"
    for r in range(WORLD):
        for i, (g, w) in enumerate(zip(got[r][:-1], want[:-1])):
            for what, a, b in zip(("output", "grad", "loss"), g, w):
                _close(a, b, f"rank {r}, dropout {DROPOUTS[i]}: {what}")
        _close(got[r][-1], want[-1], f"rank {r}: dropout after manual_seed(99, mesh)")


def test_dropout_backward_aten_on_thread_ranks():
    """PyTorch's test_pointwise_ops ``test_dropout_backward``:
    ``aten.native_dropout_backward`` with keyword arguments on Shard(0)."""
    g, m = _inputs((8, 5), (8, 5), seed=3)
    mask = m < 0.8

    def rank(r: int) -> torch.Tensor:
        mesh = _mesh((WORLD,))
        dg, dm = distribute_tensor(g, mesh, [S0]), distribute_tensor(mask, mesh, [S0])
        out = torch.ops.aten.native_dropout_backward(grad_output=dg, mask=dm, scale=0.3)
        return out.full_tensor()

    want = torch.ops.aten.native_dropout_backward(grad_output=g, mask=mask, scale=0.3)
    for r, got in enumerate(run_threads(rank)):
        _close(got, want, f"rank {r}")


# ---------------------------------------------------------------------- TP MLP
class MLP(torch.nn.Module):
    """A gated MLP: ``gate`` and ``up`` read the same input (one wrap of it, reused: its
    backward reduces once per rank, so every rank must reuse alike)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = torch.nn.Linear(8, 16)
        self.up = torch.nn.Linear(8, 16)
        self.down = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.gelu(self.gate(x)) * self.up(x))


def test_tensor_parallel_mlp_on_thread_ranks():
    """parallelize_module (column then row parallel), forward, backward and optimizer steps
    on 4 thread ranks: every rank's losses, gradients and weights equal one process's."""
    torch.manual_seed(5)
    model = MLP()
    batches = _inputs((4, 8), (4, 8), (4, 8), seed=6)
    steps = len(batches)

    def rank(r: int) -> list:
        mesh = _mesh((WORLD,))
        m = parallelize_module(
            copy.deepcopy(model),
            mesh,
            {"gate": ColwiseParallel(), "up": ColwiseParallel(), "down": RowwiseParallel()},
        )
        opt = torch.optim.AdamW(m.parameters(), lr=0.05)
        out = []
        for b in batches:
            x = b.clone().requires_grad_(True)  # its gradient too (the reused wrap's)
            opt.zero_grad()
            loss = m(x).square().mean()
            loss.backward()
            grads = {n: p.grad.full_tensor() for n, p in m.named_parameters()}
            grads["input"] = x.grad
            opt.step()
            out.append((loss.detach().clone(), grads))
        out.append({n: p.full_tensor() for n, p in m.named_parameters()})
        return out

    got = run_threads(rank)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=0.05)
    want = []
    for b in batches:
        x = b.clone().requires_grad_(True)
        opt.zero_grad()
        loss = ref(x).square().mean()
        loss.backward()
        grads = {n: p.grad.clone() for n, p in ref.named_parameters()}
        grads["input"] = x.grad
        want.append((loss.detach(), grads))
        opt.step()
    weights = dict(ref.named_parameters())
    for r in range(WORLD):
        for s in range(steps):
            _close(got[r][s][0], want[s][0], f"rank {r}, step {s}: loss")
            for n, g in want[s][1].items():
                _close(got[r][s][1][n], g, f"rank {r}, step {s}: grad of {n}")
        for n, w in weights.items():
            _close(got[r][steps][n], w.detach(), f"rank {r}: {n} after {steps} steps")


# ---------------------------------------------------------------------- two meshes
def test_two_independent_meshes_used_from_two_pairs_of_threads():
    """Mesh A over ranks [0, 1] and mesh B over [2, 3]: the threads of A and those of B run
    different programs (shapes, ops, numbers of steps) at the same time in one process, each
    equal to plain torch."""
    xa, wa, xb, wb = _inputs((6, 4), (4, 10), (9, 3), (3, 5), seed=7)

    def work_a(mesh: DeviceMesh) -> int:
        n = 0
        for i in range(12):
            d = distribute_tensor(xa * (i + 1), mesh, [S0])
            w = distribute_tensor(wa, mesh, [S1])
            y = torch.relu(d @ w).redistribute(mesh, [S0]).sum(1)
            _close(y.full_tensor(), torch.relu((xa * (i + 1)) @ wa).sum(1), f"A step {i}")
            n += 1
        return n

    def work_b(mesh: DeviceMesh) -> int:
        n = 0
        for i in range(7):
            d = distribute_tensor(xb + i, mesh, [S1]).requires_grad_(True)
            w = distribute_tensor(wb, mesh, [R])
            y = torch.tanh(d.redistribute(mesh, [R]) @ w)
            y.sum().backward()
            leaf = (xb + i).requires_grad_(True)
            torch.tanh(leaf @ wb).sum().backward()
            _close(y.full_tensor(), torch.tanh((xb + i) @ wb), f"B step {i}")
            _close(d.grad.full_tensor(), leaf.grad, f"B step {i}: grad")
            n += 1
        return n

    def rank(r: int) -> tuple[str, int]:
        a = DeviceMesh("cpu", [0, 1], mesh_dim_names=("a",))  # every rank builds both
        b = DeviceMesh("cpu", [2, 3], mesh_dim_names=("b",))
        return ("A", work_a(a)) if r in (0, 1) else ("B", work_b(b))

    assert run_threads(rank) == [("A", 12), ("A", 12), ("B", 7), ("B", 7)]


def test_a_deadlock_fails_in_time_and_names_the_ranks():
    """The harness itself: a rank that skips a collective the others wait in is reported as
    a timeout naming the ranks left, in seconds (what the scenarios above rule out)."""

    def rank(r: int) -> None:
        mesh = _mesh((WORLD,))
        if r != 3:  # rank 3 never joins the all-gather
            distribute_tensor(torch.ones(4, 4), mesh, [S0]).full_tensor()

    t0 = time.monotonic()
    with pytest.raises(TimeoutError, match=r"ranks \[0, 1, 2\]"):
        run_threads(rank, timeout=3.0)
    assert time.monotonic() - t0 < 30
