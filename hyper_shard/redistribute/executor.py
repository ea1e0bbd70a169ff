"""The redistribution executor: runs a :class:`Plan` on a local tensor, and its backward.

Framework-neutral: every tensor operation goes through the mesh's platform. Uneven
shards (``torch.chunk`` semantics) are handled by padding to the largest chunk for the
collective and trimming after. Collectives the platform lacks natively are composed
(reduce-scatter = all-reduce + chunk; all-to-all = all-gather + pick).

Gradient contract (see DESIGN.md): local autograd computes, on every rank, the
derivative of the global objective with respect to that rank's local data. The backward
of each step is therefore its transpose:

==========================  ==========================================================
forward step                backward on the gradient
==========================  ==========================================================
chunk  R -> S(d)            pad into zeros (S(d) -> P(sum))
pad    S(d) -> P(sum)       chunk (R -> S(d))
all_gather S(d) -> R        reduce-scatter sum (P(sum) -> S(d))
reduce_scatter P -> S(d)    all-gather (divided by n for avg)
all_to_all S(d) -> S(e)     all-to-all S(e) -> S(d)
all_reduce P(op) -> R       all-reduce sum (avg: divided by n; max/min: routed to the
                            ranks holding the extremum, ties split evenly)
partition R -> P(op)        sum/prod: keep coordinate 0 only; avg/max/min: identity
==========================  ==========================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..placement import Partial, Placement, Shard
from ..spec import DTensorSpec, chunk_sizes
from .planner import Plan, Step

__all__ = ["execute_plan", "backward_plan", "run_step", "COUNTERS"]

#: active step counters (see :func:`hyper_shard.debug.comm_counter`)
COUNTERS: list[dict[str, int]] = []


def _extent(
    spec: DTensorSpec, state: Sequence[Placement], m: int, d: int, coord: Sequence[int]
) -> int:
    """Extent of tensor dim ``d`` that mesh dim ``m`` splits: after the shards of mesh dims
    left of ``m`` on ``d`` (this rank's coordinates)."""
    e = spec.shape[d]
    ms = spec.mesh.shape
    for k in range(m):
        p = state[k]
        if type(p) is Shard and p.dim == d:
            e = chunk_sizes(e, ms[k])[coord[k]]
    return e


def _split(plat: Any, t: Any, d: int, sizes: Sequence[int]) -> list[Any]:
    out, start = [], 0
    for s in sizes:
        out.append(plat.narrow(t, d, start, s))
        start += s
    return out


def _pad_to(plat: Any, t: Any, d: int, size: int) -> Any:
    return t if plat.shape(t)[d] == size else plat.pad_dim(t, d, size)


def _all_gather_dim(plat: Any, t: Any, d: int, sizes: Sequence[int], group: Any, n: int) -> Any:
    parts = plat.all_gather(_pad_to(plat, t, d, sizes[0]), group, n)
    return plat.cat([plat.narrow(p, d, 0, s) for p, s in zip(parts, sizes)], d)


def _reduce_scatter_dim(
    plat: Any, t: Any, d: int, sizes: Sequence[int], c: int, op: str, group: Any, n: int
) -> Any:
    if "reduce_scatter" in plat.native_collectives and op in ("sum", "avg"):
        pieces = [_pad_to(plat, p, d, sizes[0]) for p in _split(plat, t, d, sizes)]
        out = plat.reduce_scatter(pieces, op, group)
        return plat.narrow(out, d, 0, sizes[c])
    full = plat.all_reduce(t, op, group)
    return plat.narrow(full, d, sum(sizes[:c]), sizes[c])


def _all_to_all_dims(
    plat: Any,
    t: Any,
    d: int,
    e: int,
    sizes_d: Sequence[int],
    sizes_e: Sequence[int],
    c: int,
    group: Any,
    n: int,
) -> Any:
    """Local ``t`` holds chunk ``c`` of dim d and the whole extent of dim e; return the
    whole extent of d and chunk ``c`` of e."""
    if "all_to_all" in plat.native_collectives:
        pieces = [
            _pad_to(plat, _pad_to(plat, p, e, sizes_e[0]), d, sizes_d[0])
            for p in _split(plat, t, e, sizes_e)
        ]
        recv = plat.all_to_all(pieces, group)
    else:
        everyone = plat.all_gather(_pad_to(plat, t, d, sizes_d[0]), group, n)
        start = sum(sizes_e[:c])
        recv = [plat.narrow(x, e, start, sizes_e[c]) for x in everyone]
    return plat.cat(
        [plat.narrow(plat.narrow(r, e, 0, sizes_e[c]), d, 0, s) for r, s in zip(recv, sizes_d)], d
    )


def run_step(
    plat: Any,
    t: Any,
    spec: DTensorSpec,
    state: Sequence[Placement],
    m: int,
    kind: str,
    src: Placement,
    dst: Placement,
) -> Any:
    """Run one step on mesh dim ``m`` from ``state`` (the placements before the step).

    ``kind`` may also be a backward-only kind: ``"avg_all_gather"`` (all-gather then /n).
    """
    mesh = spec.mesh
    coord = mesh.get_coordinate()
    assert coord is not None
    n = mesh.shape[m]
    c = coord[m]
    if COUNTERS:
        for counter in COUNTERS:
            counter[kind] = counter.get(kind, 0) + 1
    if kind == "chunk":
        d = dst.dim  # type: ignore[attr-defined]
        sizes = chunk_sizes(_extent(spec, state, m, d, coord), n)
        return plat.narrow(t, d, sum(sizes[:c]), sizes[c])
    if kind == "pad":
        d = src.dim  # type: ignore[attr-defined]
        ext = _extent(spec, state, m, d, coord)
        sizes = chunk_sizes(ext, n)
        return plat.embed(t, d, sum(sizes[:c]), ext)
    if kind == "partition":
        op = dst.reduce_op  # type: ignore[attr-defined]
        if op in ("sum", "prod") and c != 0:
            return plat.zeros_like(t) if op == "sum" else plat.ones_like(t)
        return t
    group = mesh._group(m)
    if kind == "all_gather":
        d = src.dim  # type: ignore[attr-defined]
        sizes = chunk_sizes(_extent(spec, state, m, d, coord), n)
        return _all_gather_dim(plat, t, d, sizes, group, n)
    if kind == "all_reduce":
        return plat.all_reduce(t, src.reduce_op, group)  # type: ignore[attr-defined]
    if kind == "reduce_scatter":
        d = dst.dim  # type: ignore[attr-defined]
        sizes = chunk_sizes(_extent(spec, state, m, d, coord), n)
        return _reduce_scatter_dim(plat, t, d, sizes, c, src.reduce_op, group, n)  # type: ignore[attr-defined]
    if kind == "all_to_all":
        d, e = src.dim, dst.dim  # type: ignore[attr-defined]
        sizes_d = chunk_sizes(_extent(spec, state, m, d, coord), n)
        sizes_e = chunk_sizes(_extent(spec, state, m, e, coord), n)
        return _all_to_all_dims(plat, t, d, e, sizes_d, sizes_e, c, group, n)
    raise ValueError(f"unknown redistribution step {kind!r}")


def execute_plan(
    plat: Any, local: Any, spec: DTensorSpec, plan: Plan, saved: list[Any] | None = None
) -> Any:
    """Run ``plan`` on ``local`` (the shard of ``spec`` on this rank), forward only.

    If ``saved`` is a list, the (input, output) of every max/min all-reduce is appended
    to it for the backward.
    """
    state = list(spec.placements)
    for step in plan.steps:
        out = run_step(plat, local, spec, state, step.mesh_dim, step.kind, step.src, step.dst)
        if saved is not None and step.kind == "all_reduce" and step.src.reduce_op in ("max", "min"):  # type: ignore[attr-defined]
            saved.append((local, out))
        local = out
        state[step.mesh_dim] = step.dst
    return local


def backward_plan(
    plat: Any, grad: Any, spec: DTensorSpec, plan: Plan, saved: Sequence[Any] = ()
) -> Any:
    """The backward of :func:`execute_plan`: ``grad`` is the local derivative w.r.t. the
    output; returns the local derivative w.r.t. the input."""
    states = [list(spec.placements)]
    for st in plan.steps:
        s = list(states[-1])
        s[st.mesh_dim] = st.dst
        states.append(s)
    saved_iter = list(saved)
    for i in range(len(plan.steps) - 1, -1, -1):
        grad = _backward_step(plat, grad, spec, plan.steps[i], states[i], states[i + 1], saved_iter)
    return grad


_SUM = Partial("sum")


def _backward_step(
    plat: Any,
    g: Any,
    spec: DTensorSpec,
    st: Step,
    before: Sequence[Placement],
    after: Sequence[Placement],
    saved: list[Any],
) -> Any:
    m, kind = st.mesh_dim, st.kind
    n = spec.mesh.shape[m]
    if kind == "chunk":
        return run_step(plat, g, spec, after, m, "pad", st.dst, _SUM)
    if kind == "pad":
        return run_step(plat, g, spec, before, m, "chunk", st.dst, st.src)
    if kind == "all_gather":
        return run_step(plat, g, spec, after, m, "reduce_scatter", _SUM, st.src)
    if kind == "reduce_scatter":
        out = run_step(plat, g, spec, after, m, "all_gather", st.dst, st.src)
        return plat.scale(out, 1.0 / n) if st.src.reduce_op == "avg" else out  # type: ignore[attr-defined]
    if kind == "all_to_all":
        return run_step(plat, g, spec, after, m, "all_to_all", st.dst, st.src)
    if kind == "partition":
        op = st.dst.reduce_op  # type: ignore[attr-defined]
        if op in ("sum", "prod"):
            return run_step(plat, g, spec, before, m, "partition", st.src, _SUM)
        return g
    if kind == "all_reduce":
        op = st.src.reduce_op  # type: ignore[attr-defined]
        group = spec.mesh._group(m)
        total = plat.all_reduce(g, "sum", group)
        if op == "sum":
            return total
        if op == "avg":
            return plat.scale(total, 1.0 / n)
        if op in ("max", "min"):
            x, y = saved.pop()
            mask = plat.eq_mask(x, y)
            count = plat.all_reduce(mask, "sum", group)
            return plat.div(plat.mul(total, mask), count)
        raise NotImplementedError(
            f"gradient through all-reduce of Partial({op}) is not supported; redistribute the "
            f"value to Replicate() before differentiating through it"
        )
    raise ValueError(f"unknown redistribution step {kind!r}")
