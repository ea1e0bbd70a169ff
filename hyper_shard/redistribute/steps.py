"""The redistribution steps, one class each: legality, cost, forward and backward.

A step changes the placement of one mesh dim ``m`` of one tensor:

=============  ===============  ==============================================
from -> to     kind             what runs
=============  ===============  ==============================================
R -> S(d)      chunk            local: keep this rank's chunk
R -> P(op)     partition        local: the value on coordinate 0, identity elsewhere
S(d) -> R      all_gather       all-gather along d
S(d) -> S(e)   all_to_all       all-to-all from d to e
S(d) -> P      pad              local: place the shard in zeros (sum only)
P(op) -> R     all_reduce       all-reduce with op
P(op) -> S(d)  reduce_scatter   reduce-scatter along d (sum and avg only)
=============  ===============  ==============================================

:data:`STEPS` maps a kind's name to its :class:`StepKind`; the placement-state graph
(legal moves), the cost model (alpha-beta prices) and the executor (forward and backward)
all read this one table, so a new step is one class here.

Legality: a step on mesh dim ``m`` that touches tensor dim ``d`` (as source or target
shard) is legal only if no mesh dim to the right of ``m`` shards ``d`` (shards nest left
to right); the caller passes those dims as ``blocked``.

Costs (ring algorithms, ``n`` ranks on the mesh dim; ``alpha`` seconds per hop, ``beta``
seconds per byte on the wire, ``gamma`` seconds per byte copied locally):

=================  ==============================  ================================
step               hops                            bytes on the wire (per rank)
=================  ==============================  ================================
all-gather         n - 1                           (n - 1) / n * output bytes
reduce-scatter     n - 1                           (n - 1) / n * input bytes
all-reduce         2 (n - 1)                       2 (n - 1) / n * bytes
all-to-all         n - 1                           (n - 1) / n * input bytes
local chunk/pad    0                               gamma * output bytes (a copy)
=================  ==============================  ================================

A collective the platform lacks natively is priced as the composition that replaces it
(reduce-scatter = all-reduce + chunk; all-to-all = all-gather of the whole local shard + a
local pick) and run as such. Every step also costs ``step_penalty`` (fewer steps win ties).

Gradient contract (see DESIGN.md): local autograd computes, on every rank, the derivative
of the global objective with respect to that rank's local data, so the backward of each
step is its transpose (all-gather <-> reduce-scatter, chunk <-> pad, all-to-all <->
all-to-all back, all-reduce <-> all-reduce of the gradient).

Framework-neutral: every tensor operation goes through the platform passed in (duck-typed,
:class:`hyper_shard.platform.base.Platform`); uneven shards (``torch.chunk`` semantics) are
padded to the largest chunk for a collective and trimmed after. No framework import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from ..flight.context import StepFrame, stack
from ..placement import Partial, Placement, Replicate, Shard
from ..spec import DTensorSpec, chunk_sizes

__all__ = [
    "OrderedState",
    "StepKind",
    "STEPS",
    "STEPS_FROM",
    "COLLECTIVES",
    "LOCAL_STEPS",
    "run_step",
    "COUNTERS",
]

_R = Replicate()
_SUM = Partial("sum")

#: active step counters (see :func:`hyper_shard.debug.comm_counter`)
COUNTERS: list[dict[str, int]] = []


# ---------------------------------------------------------------------- shared helpers
class OrderedState(list):
    """The placements of a plan in progress plus every tensor dim's split order
    (``order[d]``: the mesh dims sharding ``d``, in the order they split it), for plans
    whose specs carry a ``shard_order``. A plain list of placements means left to right."""

    def __init__(self, placements: Sequence[Placement], order: Sequence[Sequence[int]]) -> None:
        super().__init__(placements)
        self.order = [list(o) for o in order]

    def moved(self, m: int, src: Placement, dst: Placement) -> OrderedState:
        """The state after a step on mesh dim ``m`` from ``src`` to ``dst``."""
        out = OrderedState(self, self.order)
        if type(src) is Shard:
            out.order[src.dim].remove(m)
        if type(dst) is Shard:
            out.order[dst.dim].append(m)
        out[m] = dst
        return out


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


def _split(plat: Any, t: Any, d: int, sizes: Sequence[int]) -> list[Any]:
    out, start = [], 0
    for s in sizes:
        out.append(plat.narrow(t, d, start, s))
        start += s
    return out


def _pad_to(plat: Any, t: Any, d: int, size: int) -> Any:
    return t if plat.shape(t)[d] == size else plat.pad_dim(t, d, size)


# ---------------------------------------------------------------------- the base class
class StepKind:
    """One kind of redistribution step (see the module docstring).

    Attributes:
        name: the kind's name (``"all_gather"``...), as plans and counters spell it.
        source: the placement type it moves from (Replicate, Shard or Partial).
        collective: whether it communicates.
    """

    name: ClassVar[str]
    source: ClassVar[type]
    collective: ClassVar[bool] = True

    def targets(
        self, p: Placement, ndim: int, blocked: frozenset[int] | set[int], ops: Sequence[str]
    ) -> list[Placement]:
        """The placements this kind may move ``p`` to on one mesh dim.

        Args:
            p: the current placement (of type :attr:`source`).
            ndim: the tensor's rank.
            blocked: tensor dims sharded by mesh dims to the right (may not be touched).
            ops: the partial ops the search may visit.
        """
        raise NotImplementedError

    def cost(self, cm: Any, m: int, n: int, bytes_in: int, bytes_out: int) -> float:
        """Seconds for one step on mesh dim ``m`` of ``n`` ranks under the alpha-beta model
        ``cm`` (:class:`~hyper_shard.redistribute.cost.CostModel`); ``bytes_in``/``bytes_out``:
        the largest local shard before/after."""
        raise NotImplementedError

    def forward(
        self,
        plat: Any,
        t: Any,
        spec: DTensorSpec,
        state: Sequence[Placement],
        m: int,
        src: Placement,
        dst: Placement,
    ) -> Any:
        """Run the step on local ``t``; ``state`` holds the placements before it."""
        raise NotImplementedError

    def backward(
        self,
        plat: Any,
        g: Any,
        spec: DTensorSpec,
        before: Sequence[Placement],
        after: Sequence[Placement],
        m: int,
        src: Placement,
        dst: Placement,
        saved: list[Any],
    ) -> Any:
        """The transpose of :meth:`forward` on the local gradient ``g`` of its output;
        ``saved`` holds what :meth:`saves` asked the forward to keep (popped last first)."""
        raise NotImplementedError

    def saves(self, src: Placement) -> bool:
        """Whether the backward needs this step's forward (input, output) pair."""
        return False

    def __repr__(self) -> str:
        return f"<step {self.name}>"


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
    """Run one step of ``kind`` on mesh dim ``m`` from ``state`` (the placements before it),
    counting it in every active :func:`~hyper_shard.debug.comm_counter`. A collective step
    runs inside a :class:`~hyper_shard.flight.context.StepFrame` (what a CollectiveError,
    the flight recorder and the consistency mode name)."""
    if COUNTERS:
        for counter in COUNTERS:
            counter[kind] = counter.get(kind, 0) + 1
    step = STEPS[kind]
    if not step.collective:
        return step.forward(plat, t, spec, state, m, src, dst)
    frames = stack()
    frames.append(StepFrame(kind, m, spec, state, dst))
    try:
        return step.forward(plat, t, spec, state, m, src, dst)
    finally:
        frames.pop()


# ---------------------------------------------------------------------- local steps
class Chunk(StepKind):
    """R -> S(d): keep this rank's ``torch.chunk`` piece."""

    name = "chunk"
    source = Replicate
    collective = False

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [Shard(d) for d in range(ndim) if d not in blocked]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_out

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        d = dst.dim
        sizes = _sizes(spec, state, m, d)
        c = _coord(spec, m)
        return plat.narrow(t, d, sum(sizes[:c]), sizes[c])

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        return run_step(plat, g, spec, after, m, "pad", dst, _SUM)


class Partition(StepKind):
    """R -> P(op): the value on coordinate 0 and the op's identity elsewhere (sum/prod);
    the value itself everywhere for avg/max/min."""

    name = "partition"
    source = Replicate
    collective = False

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [Partial(o) for o in ops]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_in

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        op = dst.reduce_op
        if op in ("sum", "prod") and _coord(spec, m) != 0:
            return plat.zeros_like(t) if op == "sum" else plat.ones_like(t)
        return t

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        if dst.reduce_op in ("sum", "prod"):
            return run_step(plat, g, spec, before, m, "partition", src, _SUM)
        return g


class Pad(StepKind):
    """S(d) -> P(sum): place the shard at its offset in zeros of the whole extent."""

    name = "pad"
    source = Shard
    collective = False

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [_SUM] if "sum" in ops and p.dim not in blocked else []

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_out

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        d = src.dim
        sizes = _sizes(spec, state, m, d)
        c = _coord(spec, m)
        return plat.embed(t, d, sum(sizes[:c]), sum(sizes))

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        return run_step(plat, g, spec, before, m, "chunk", dst, src)


# ---------------------------------------------------------------------- collectives
def _ring(cm: Any, m: int, n: int, hops: int, wire_bytes: float) -> float:
    """``hops`` latencies plus ``wire_bytes`` over the bandwidth, plus the step penalty."""
    return cm.step_penalty + hops * cm.alpha_at(m) + wire_bytes * cm.beta_at(m)


class AllGather(StepKind):
    """S(d) -> R: all-gather the pieces along d (padded to the largest, trimmed)."""

    name = "all_gather"
    source = Shard

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [] if p.dim in blocked else [_R]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        if n <= 1:
            return cm.step_penalty
        return _ring(cm, m, n, n - 1, (n - 1) / n * bytes_out)

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        d = src.dim
        sizes = _sizes(spec, state, m, d)
        group, n = spec.mesh._group(m), spec.mesh.shape[m]
        parts = plat.all_gather(_pad_to(plat, t, d, sizes[0]), group, n)
        return plat.cat([plat.narrow(p, d, 0, s) for p, s in zip(parts, sizes)], d)

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        return run_step(plat, g, spec, after, m, "reduce_scatter", _SUM, src)


class ReduceScatter(StepKind):
    """P(sum|avg) -> S(d): reduce and keep this rank's piece along d (composed as
    all-reduce + chunk where the platform has no reduce-scatter)."""

    name = "reduce_scatter"
    source = Partial

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        if p.reduce_op not in ("sum", "avg"):
            return []
        return [Shard(d) for d in range(ndim) if d not in blocked]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        if n <= 1:
            return cm.step_penalty
        f = (n - 1) / n
        if "reduce_scatter" in cm.native:
            return _ring(cm, m, n, n - 1, f * bytes_in)
        return _ring(cm, m, n, 2 * (n - 1), 2 * f * bytes_in) + cm.gamma * bytes_out

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        d, op = dst.dim, src.reduce_op
        sizes = _sizes(spec, state, m, d)
        c = _coord(spec, m)
        group = spec.mesh._group(m)
        if "reduce_scatter" in plat.native_collectives and op in ("sum", "avg"):
            pieces = [_pad_to(plat, p, d, sizes[0]) for p in _split(plat, t, d, sizes)]
            out = plat.reduce_scatter(pieces, op, group)
            return plat.narrow(out, d, 0, sizes[c])
        full = plat.all_reduce(t, op, group)
        return plat.narrow(full, d, sum(sizes[:c]), sizes[c])

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        out = run_step(plat, g, spec, after, m, "all_gather", dst, src)
        return plat.scale(out, 1.0 / spec.mesh.shape[m]) if src.reduce_op == "avg" else out


class AllToAll(StepKind):
    """S(d) -> S(e): every rank sends piece j of dim e to rank j and receives its piece of
    dim d (composed as an all-gather of the local shard + a local pick where the platform
    has no all-to-all)."""

    name = "all_to_all"
    source = Shard

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        d = p.dim
        if d in blocked:
            return []
        return [Shard(e) for e in range(ndim) if e != d and e not in blocked]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        if n <= 1:
            return cm.step_penalty
        if "all_to_all" in cm.native:
            return _ring(cm, m, n, n - 1, (n - 1) / n * bytes_in)
        return _ring(cm, m, n, n - 1, (n - 1) * bytes_in) + cm.gamma * bytes_out

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        # local t holds chunk c of dim d and the whole extent of dim e; the result holds the
        # whole extent of d and chunk c of e
        d, e = src.dim, dst.dim
        sizes_d = _sizes(spec, state, m, d)
        sizes_e = _sizes(spec, state, m, e)
        c = _coord(spec, m)
        group, n = spec.mesh._group(m), spec.mesh.shape[m]
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
            [plat.narrow(plat.narrow(r, e, 0, sizes_e[c]), d, 0, s) for r, s in zip(recv, sizes_d)],
            d,
        )

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        return run_step(plat, g, spec, after, m, "all_to_all", dst, src)


class AllReduce(StepKind):
    """P(op) -> R: all-reduce with the partial's op. Backward: the all-reduced gradient
    (avg: divided by n; max/min: routed to the ranks holding the extremum, ties split)."""

    name = "all_reduce"
    source = Partial

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [_R]

    def cost(self, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        if n <= 1:
            return cm.step_penalty
        return _ring(cm, m, n, 2 * (n - 1), 2 * (n - 1) / n * bytes_in)

    def forward(self, plat, t, spec, state, m, src, dst):  # type: ignore[no-untyped-def]
        return plat.all_reduce(t, src.reduce_op, spec.mesh._group(m))

    def backward(self, plat, g, spec, before, after, m, src, dst, saved):  # type: ignore[no-untyped-def]
        op = src.reduce_op
        total = run_step(plat, g, spec, before, m, "all_reduce", _SUM, _R)
        if op == "sum":
            return total
        if op == "avg":
            return plat.scale(total, 1.0 / spec.mesh.shape[m])
        if op in ("max", "min"):
            x, y = saved.pop()
            mask = plat.eq_mask(x, y)
            count = run_step(plat, mask, spec, before, m, "all_reduce", _SUM, _R)
            return plat.div(plat.mul(total, mask), count)
        raise NotImplementedError(
            f"gradient through all-reduce of Partial({op}) is not supported; redistribute the "
            f"value to Replicate() before differentiating through it"
        )

    def saves(self, src: Placement) -> bool:
        return type(src) is Partial and src.reduce_op in ("max", "min")


# ---------------------------------------------------------------------- the table
def _table(*kinds: StepKind) -> dict[str, StepKind]:
    return {k.name: k for k in kinds}


#: kind name -> StepKind: the one table the graph, the cost model and the executor read
STEPS: dict[str, StepKind] = _table(
    Chunk(), Partition(), Pad(), AllGather(), AllToAll(), ReduceScatter(), AllReduce()
)
#: placement type -> the kinds that move away from it, in a fixed order
STEPS_FROM: dict[type, tuple[StepKind, ...]] = {
    t: tuple(k for k in STEPS.values() if k.source is t) for t in (Replicate, Shard, Partial)
}
#: the communicating kinds (a platform may run some natively and compose the others)
COLLECTIVES = frozenset(k.name for k in STEPS.values() if k.collective)
#: the local kinds
LOCAL_STEPS = frozenset(k.name for k in STEPS.values() if not k.collective)
