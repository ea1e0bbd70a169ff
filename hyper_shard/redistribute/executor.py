"""The redistribution executor: runs a :class:`Plan` on a local tensor, and its backward.

The step table (:mod:`hyper_shard.redistribute.steps`, planning) says what each kind is:
its legality, price, the route its collective takes on this platform and its transpose.
This module runs them: one runner per kind (:data:`RUNNERS`) does the local work and calls
the collectives — native or composed once for every platform in
:mod:`hyper_shard.platform.compose` — through the platform passed in. A collective step
runs inside a :class:`~hyper_shard.flight.context.StepFrame` (what a CollectiveError, the
flight recorder and the consistency mode name) and every step is counted in the active
:func:`~hyper_shard.debug.comm_counter`.

Gradient contract: the backward of a step is its transpose (``StepKind.transpose``), run
by the same runners, plus the scalings below (avg: divide by ``n``; max/min: route the
gradient to the ranks holding the extremum, ties split). Uneven shards (``torch.chunk``
semantics) are padded to the largest chunk for a collective and trimmed after.
Framework-neutral: no framework import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ..flight.context import BackwardFrame, StepFrame, forward_context, stack
from ..placement import Partial, Placement, Replicate, Shard
from ..platform import compose
from ..spec import DTensorSpec, chunk_sizes, split_orders
from .planner import Plan, plan_redistribute
from .steps import STEPS, OrderedState

if TYPE_CHECKING:
    from ..platform.base import Comm, CommOps, Runtime

__all__ = [
    "execute_plan",
    "backward_plan",
    "redistribute_with_plan",
    "run_step",
    "step_route",
    "redistribute_local",
    "COUNTERS",
]

_R = Replicate()
_SUM = Partial("sum")

#: active step counters (see :func:`hyper_shard.debug.comm_counter`): ``(rank, counts)``,
#: each counting the steps of that rank only (ranks may be threads of one process; None:
#: every rank)
COUNTERS: list[tuple[int | None, dict[str, int]]] = []


# ---------------------------------------------------------------------- geometry helpers
def _extent(
    spec: DTensorSpec, state: Sequence[Placement], m: int, d: int, coord: Sequence[int]
) -> int:
    """Extent of tensor dim ``d`` that mesh dim ``m`` splits: after the shards of the mesh
    dims that split ``d`` before ``m`` (left of ``m``; with an :class:`OrderedState`, before
    ``m`` in ``d``'s split order), at this rank's coordinates."""
    e = spec.shape[d]
    ms = spec.mesh.shape
    order = getattr(state, "order", None)
    if order is not None:
        for k in order[d]:
            if k == m:
                break
            e = chunk_sizes(e, ms[k])[coord[k]]
        return e
    for k in range(m):
        p = state[k]
        if type(p) is Shard and p.dim == d:
            e = chunk_sizes(e, ms[k])[coord[k]]
    return e


def _sizes(spec: DTensorSpec, state: Sequence[Placement], m: int, d: int) -> list[int]:
    """The ``torch.chunk`` piece sizes mesh dim ``m`` splits tensor dim ``d`` into."""
    coord = spec.mesh.get_coordinate()
    assert coord is not None
    return chunk_sizes(_extent(spec, state, m, d, coord), spec.mesh.shape[m])


def _coord(spec: DTensorSpec, m: int) -> int:
    coord = spec.mesh.get_coordinate()
    assert coord is not None
    return coord[m]


def step_route(plat: Comm, kind: str) -> str:
    """The route a collective step runs by on ``plat``: the one the planner priced with the
    platform's native set (:meth:`~hyper_shard.redistribute.steps.StepKind.route`)."""
    return "native" if plat.has(kind) else STEPS[kind].route(plat.native_collectives)


# ---------------------------------------------------------------------- the runners
Runner = Callable[
    ["CommOps", Any, DTensorSpec, Sequence[Placement], int, Placement, Placement], Any
]


def _chunk(plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any) -> Any:
    d = dst.dim
    sizes = _sizes(spec, state, m, d)
    c = _coord(spec, m)
    return plat.narrow(t, d, sum(sizes[:c]), sizes[c])


def _partition(
    plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any
) -> Any:
    op = dst.reduce_op
    if op in ("sum", "prod") and _coord(spec, m) != 0:
        return plat.zeros_like(t) if op == "sum" else plat.ones_like(t)
    return t


def _pad(plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any) -> Any:
    d = src.dim
    sizes = _sizes(spec, state, m, d)
    return plat.embed(t, d, sum(sizes[: _coord(spec, m)]), sum(sizes))


def _all_gather(
    plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any
) -> Any:
    d = src.dim
    sizes = _sizes(spec, state, m, d)
    padded = t if plat.shape(t)[d] == sizes[0] else plat.pad_dim(t, d, sizes[0])
    parts = plat.all_gather(padded, spec.mesh._group(m), spec.mesh.shape[m])
    return plat.cat([plat.narrow(p, d, 0, s) for p, s in zip(parts, sizes)], d)


def _reduce_scatter(
    plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any
) -> Any:
    d = dst.dim
    route = step_route(plat, "reduce_scatter")
    return compose.reduce_scatter(
        plat, t, d, _sizes(spec, state, m, d), src.reduce_op, spec.mesh._group(m),
        _coord(spec, m), route,
    )  # fmt: skip


def _all_to_all(
    plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any
) -> Any:
    d, e = src.dim, dst.dim
    route = step_route(plat, "all_to_all")
    return compose.all_to_all(
        plat, t, d, e, _sizes(spec, state, m, d), _sizes(spec, state, m, e),
        spec.mesh._group(m), _coord(spec, m), route,
    )  # fmt: skip


def _all_reduce(
    plat: CommOps, t: Any, spec: DTensorSpec, state: Any, m: int, src: Any, dst: Any
) -> Any:
    return plat.all_reduce(t, src.reduce_op, spec.mesh._group(m))


#: kind name -> the function running one step of it (forward)
RUNNERS: dict[str, Runner] = {
    "chunk": _chunk,
    "partition": _partition,
    "pad": _pad,
    "all_gather": _all_gather,
    "reduce_scatter": _reduce_scatter,
    "all_to_all": _all_to_all,
    "all_reduce": _all_reduce,
}


def run_step(
    plat: CommOps,
    t: Any,
    spec: DTensorSpec,
    state: Sequence[Placement],
    m: int,
    kind: str,
    src: Placement,
    dst: Placement,
) -> Any:
    """Run one step of ``kind`` on mesh dim ``m`` from ``state`` (the placements before it),
    counting it in every active :func:`~hyper_shard.debug.comm_counter`. A collective step
    runs inside a :class:`~hyper_shard.flight.context.StepFrame`. A collective over a
    size-1 mesh dim is the identity on the local tensor: it runs nothing and counts
    nothing (PyTorch's ``test_one_chunk_mesh``)."""
    if spec.mesh.shape[m] == 1 and STEPS[kind].collective:
        return t
    if COUNTERS:
        me = spec.mesh.get_rank()
        for rank, counter in COUNTERS:
            if rank is None or rank == me:
                counter[kind] = counter.get(kind, 0) + 1
    run = RUNNERS[kind]
    if not STEPS[kind].collective:
        return run(plat, t, spec, state, m, src, dst)
    frames = stack()
    frames.append(StepFrame(kind, m, spec, state, dst))
    try:
        return run(plat, t, spec, state, m, src, dst)
    finally:
        frames.pop()


def _step_backward(
    plat: CommOps,
    g: Any,
    spec: DTensorSpec,
    before: Sequence[Placement],
    after: Sequence[Placement],
    m: int,
    kind: str,
    src: Placement,
    dst: Placement,
    saved: list[Any],
) -> Any:
    """The transpose of one step on the local gradient ``g`` of its output (see the module
    docstring); ``saved`` holds the (input, output) pairs of the steps that keep them."""
    tr = STEPS[kind].transpose(src, dst)
    if tr is None:
        return g
    out = run_step(plat, g, spec, after if tr.after else before, m, tr.kind, tr.src, tr.dst)
    if type(src) is not Partial or kind == "partition":
        return out
    op = src.reduce_op
    if op == "sum":
        return out
    if op == "avg":
        return plat.scale(out, 1.0 / spec.mesh.shape[m])
    if op in ("max", "min"):
        x, y = saved.pop()
        mask = plat.eq_mask(x, y)
        count = run_step(plat, mask, spec, before, m, "all_reduce", _SUM, _R)
        return plat.div(plat.mul(out, mask), count)
    raise NotImplementedError(
        f"gradient through all-reduce of Partial({op}) is not supported; redistribute the "
        f"value to Replicate() before differentiating through it"
    )


# ---------------------------------------------------------------------- plans
def execute_plan(
    plat: CommOps, local: Any, spec: DTensorSpec, plan: Plan, saved: list[Any] | None = None
) -> Any:
    """Run ``plan`` on ``local`` (the shard of ``spec`` on this rank), forward only.

    If ``saved`` is a list, the (input, output) of every step whose backward needs them (a
    max/min all-reduce) is appended to it for :func:`backward_plan`.
    """
    state: Any = _ordered_start(spec) if plan.ordered else list(spec.placements)
    for step in plan.steps:
        out = run_step(plat, local, spec, state, step.mesh_dim, step.kind, step.src, step.dst)
        if saved is not None and STEPS[step.kind].saves(step.src):
            saved.append((local, out))
        local = out
        if plan.ordered:
            state = state.moved(step.mesh_dim, step.src, step.dst)
        else:
            state[step.mesh_dim] = step.dst
    return local


def _ordered_start(spec: DTensorSpec) -> OrderedState:
    return OrderedState(spec.placements, split_orders(spec.placements, spec.ndim, spec.shard_order))


def backward_plan(
    plat: CommOps, grad: Any, spec: DTensorSpec, plan: Plan, saved: Sequence[Any] = ()
) -> Any:
    """The backward of :func:`execute_plan`: ``grad`` is the local derivative w.r.t. the
    output; returns the local derivative w.r.t. the input."""
    states: list[Any]
    if plan.ordered:
        states = [_ordered_start(spec)]
        for st in plan.steps:
            states.append(states[-1].moved(st.mesh_dim, st.src, st.dst))
    else:
        states = [list(spec.placements)]
        for st in plan.steps:
            s = list(states[-1])
            s[st.mesh_dim] = st.dst
            states.append(s)
    saved_left = list(saved)
    for i in range(len(plan.steps) - 1, -1, -1):
        st = plan.steps[i]
        grad = _step_backward(
            plat, grad, spec, states[i], states[i + 1], st.mesh_dim, st.kind, st.src, st.dst,
            saved_left,
        )  # fmt: skip
    return grad


def redistribute_with_plan(
    plat: Runtime, local: Any, spec: DTensorSpec, plan: Plan, backward_dtype: Any = None
) -> Any:
    """Run a precomputed plan on a local tensor, differentiably: the platform's custom
    autograd function runs :func:`execute_plan` forward and :func:`backward_plan` on the
    gradient. ``backward_dtype``: run the backward collectives on the gradient cast to this
    dtype (cast back afterwards), as PyTorch DTensor's ``redistribute(backward_dtype=)``."""
    if not plat.requires_grad(local):
        return execute_plan(plat, local, spec, plan)
    saved: list[Any] = []
    where = BackwardFrame(forward_context())  # what the backward's collectives ran for

    def back(g: Any) -> Any:
        frames = stack()
        frames.append(where)
        try:
            return backward_plan(plat, g, spec, plan, saved)
        finally:
            frames.pop()

    if backward_dtype is None:
        bwd = back
    else:

        def bwd(g: Any) -> Any:
            return plat.cast(back(plat.cast(g, backward_dtype)), plat.dtype_of(g))

    return plat.custom_autograd(lambda x: execute_plan(plat, x, spec, plan, saved), bwd, local)


def redistribute_local(plat: Runtime, local: Any, src: DTensorSpec, dst: DTensorSpec) -> Any:
    """Redistribute a local shard from ``src`` to ``dst``'s placements and split order
    (autograd-aware; ``local`` unchanged when they match)."""
    plan = plan_redistribute(src, dst.placements, shard_order=dst.shard_order)
    if not plan.steps:
        return local
    return redistribute_with_plan(plat, local, src, plan)
