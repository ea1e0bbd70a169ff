"""The redistribution step table: every step kind's legality, price, collective and
transpose, as data. No collective runs here (the executor,
:mod:`hyper_shard.redistribute.executor`, runs the steps), so plans are made and tested in
one process with no platform.

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
(legal moves), the cost model (prices) and the executor (which collective, which
transpose) all read this one table, so a new step is one class here and one runner there.

Legality: a step on mesh dim ``m`` that touches tensor dim ``d`` (as source or target
shard) is legal only if no mesh dim to the right of ``m`` shards ``d`` (shards nest left
to right); the caller passes those dims as ``blocked``.

Costs (ring algorithms, ``n`` ranks on the mesh dim; ``alpha`` seconds per hop, ``beta``
seconds per byte on the wire, ``gamma`` seconds per byte copied locally; ``B`` the
largest local shard before the step, ``B'`` after):

=====================================  =========  ===========================  ==========
step / route                           hops       bytes on the wire (per rank) local copy
=====================================  =========  ===========================  ==========
all-gather                             n - 1      (n - 1) / n * B'
all-reduce                             2 (n - 1)  2 (n - 1) / n * B
reduce-scatter, native                 n - 1      (n - 1) / n * B
reduce-scatter = all-reduce + narrow   2 (n - 1)  2 (n - 1) / n * B             B'
reduce-scatter = all-gather + sum      n - 1      (n - 1) * B                   n B'
all-to-all, native                     n - 1      (n - 1) / n * B
all-to-all = n - 1 send/recv rounds    n - 1      (n - 1) / n * B               B'
all-to-all = all-gather + pick         n - 1      (n - 1) * B                   B'
local chunk/pad/partition              0          0                             B' (B)
=====================================  =========  ===========================  ==========

A collective the platform lacks natively (its cost model's ``native`` set) is priced as
the composition that replaces it — the first of the kind's routes the platform can run
(:meth:`StepKind.route`: all-reduce before all-gather, send/recv before all-gather) — and
the executor runs exactly that composition (:mod:`hyper_shard.platform.compose`). Every step
also costs ``step_penalty`` (fewer steps win ties).

Gradient contract (see DESIGN.md): local autograd computes, on every rank, the derivative
of the global objective with respect to that rank's local data, so the backward of each
step is its transpose (:meth:`StepKind.transpose`: all-gather <-> reduce-scatter, chunk
<-> pad, all-to-all <-> all-to-all back, all-reduce <-> all-reduce of the gradient), plus
the scalings the executor applies (avg: divide by n; max/min: route to the extremum).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from ..placement import Partial, Placement, Replicate, Shard

if TYPE_CHECKING:
    from .cost import CostModel

__all__ = [
    "OrderedState",
    "StepKind",
    "Transpose",
    "STEPS",
    "STEPS_FROM",
    "COLLECTIVES",
    "LOCAL_STEPS",
    "ROUTES",
    "EXCHANGES",
]

_R = Replicate()
_SUM = Partial("sum")


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


@dataclass(frozen=True)
class Transpose:
    """The step a kind's backward runs on the gradient: ``kind`` from ``src`` to ``dst`` on
    the same mesh dim, from the placements after the forward step (``after``) or before."""

    kind: str
    src: Placement
    dst: Placement
    after: bool


def _ring(cm: CostModel, m: int, hops: int, wire_bytes: float) -> float:
    """``hops`` latencies plus ``wire_bytes`` over the bandwidth, plus the step penalty."""
    return cm.step_penalty + hops * cm.alpha_at(m) + wire_bytes * cm.beta_at(m)


# ---------------------------------------------------------------------- the base class
class StepKind:
    """One kind of redistribution step (see the module docstring).

    Attributes:
        name: the kind's name (``"all_gather"``...), as plans and counters spell it.
        source: the placement type it moves from (Replicate, Shard or Partial).
        collective: whether it communicates.
        routes: the ways to run it, in order of preference: ``"native"`` (the collective
            of the same name), then the compositions (:mod:`hyper_shard.platform.compose`),
            each named by the native collective it uses; a local kind has the single route
            ``"local"``.
    """

    name: ClassVar[str]
    source: ClassVar[type]
    collective: ClassVar[bool] = True
    routes: ClassVar[tuple[str, ...]] = ("native",)

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

    def route_cost(
        self, route: str, cm: CostModel, m: int, n: int, bytes_in: int, bytes_out: int
    ) -> float:
        """Seconds for one step on mesh dim ``m`` of ``n`` ranks run by ``route`` under the
        alpha-beta model ``cm``; ``bytes_in``/``bytes_out``: the largest local shard
        before/after."""
        raise NotImplementedError

    def needs(self, route: str) -> str | None:
        """The native collective ``route`` runs (None for a local step)."""
        if not self.collective:
            return None
        return self.name if route == "native" else route

    def route(self, native: frozenset[str]) -> str:
        """The route the executor runs and the planner prices: the first of
        :attr:`routes` whose collective is in ``native`` (the platform's native set). The order is by
        measurement, not by the alpha-beta model, which cannot rank the compositions: on
        mccl (MindSpore CPU, 2 ranks) reduce-scatter by all-gather + sum took 1.5-4x the
        time of all-reduce + narrow (8 to 4096 rows of 256 floats) where the ring model
        prices it lower.

        Raises:
            ValueError: no route is available (a platform without all-gather).
        """
        for r in self.routes:
            need = self.needs(r)
            if need is None or need in native:
                return r
        raise ValueError(
            f"redistribution step {self.name}: the platform runs none of "
            f"{[self.needs(r) for r in self.routes]} natively (native: {sorted(native)}); "
            f"every platform must run all_gather and all_reduce"
        )

    def cost(self, cm: CostModel, m: int, n: int, bytes_in: int, bytes_out: int) -> float:
        """Seconds for one step by the route it runs by (see :meth:`route`)."""
        if n <= 1 and self.collective:
            return cm.step_penalty
        return self.route_cost(self.route(cm.native), cm, m, n, bytes_in, bytes_out)

    def transpose(self, src: Placement, dst: Placement) -> Transpose | None:
        """The step the backward of ``src -> dst`` runs on the gradient (None: the
        gradient passes unchanged)."""
        raise NotImplementedError

    def saves(self, src: Placement) -> bool:
        """Whether the backward needs this step's forward (input, output) pair."""
        return False

    def __repr__(self) -> str:
        return f"<step {self.name}>"


# ---------------------------------------------------------------------- local steps
class _Local(StepKind):
    collective = False
    routes = ("local",)


class Chunk(_Local):
    """R -> S(d): keep this rank's ``torch.chunk`` piece."""

    name = "chunk"
    source = Replicate

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [Shard(d) for d in range(ndim) if d not in blocked]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_out

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("pad", dst, _SUM, True)


class Partition(_Local):
    """R -> P(op): the value on coordinate 0 and the op's identity elsewhere (sum/prod);
    the value itself everywhere for avg/max/min."""

    name = "partition"
    source = Replicate

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [Partial(o) for o in ops]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_in

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        if dst.reduce_op in ("sum", "prod"):
            return Transpose("partition", src, _SUM, False)
        return None


class Pad(_Local):
    """S(d) -> P(sum): place the shard at its offset in zeros of the whole extent."""

    name = "pad"
    source = Shard

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [_SUM] if "sum" in ops and p.dim not in blocked else []

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return cm.step_penalty + cm.gamma * bytes_out

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("chunk", dst, src, False)


# ---------------------------------------------------------------------- collectives
class AllGather(StepKind):
    """S(d) -> R: all-gather the pieces along d (padded to the largest, trimmed)."""

    name = "all_gather"
    source = Shard

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [] if p.dim in blocked else [_R]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return _ring(cm, m, n - 1, (n - 1) / n * bytes_out)

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("reduce_scatter", _SUM, src, True)


class ReduceScatter(StepKind):
    """P(sum|avg) -> S(d): reduce and keep this rank's piece along d (native, or composed
    from an all-reduce + narrow, or from an all-gather + local sum)."""

    name = "reduce_scatter"
    source = Partial
    routes = ("native", "all_reduce", "all_gather")

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        if p.reduce_op not in ("sum", "avg"):
            return []
        return [Shard(d) for d in range(ndim) if d not in blocked]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        f = (n - 1) / n
        if route == "native":
            return _ring(cm, m, n - 1, f * bytes_in)
        if route == "all_reduce":
            return _ring(cm, m, 2 * (n - 1), 2 * f * bytes_in) + cm.gamma * bytes_out
        return _ring(cm, m, n - 1, (n - 1) * bytes_in) + cm.gamma * n * bytes_out

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("all_gather", dst, src, True)  # avg: the executor divides by n


class AllToAll(StepKind):
    """S(d) -> S(e): every rank sends piece j of dim e to rank j and receives its piece of
    dim d (native, or composed from send/recv rounds, or from an all-gather + a pick)."""

    name = "all_to_all"
    source = Shard
    routes = ("native", "send_recv", "all_gather")

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        d = p.dim
        if d in blocked:
            return []
        return [Shard(e) for e in range(ndim) if e != d and e not in blocked]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        if route == "native":
            return _ring(cm, m, n - 1, (n - 1) / n * bytes_in)
        if route == "send_recv":
            return _ring(cm, m, n - 1, (n - 1) / n * bytes_in) + cm.gamma * bytes_out
        return _ring(cm, m, n - 1, (n - 1) * bytes_in) + cm.gamma * bytes_out

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("all_to_all", dst, src, True)


class AllReduce(StepKind):
    """P(op) -> R: all-reduce with the partial's op. Backward: the all-reduced gradient
    (avg: divided by n; max/min: routed to the ranks holding the extremum, ties split)."""

    name = "all_reduce"
    source = Partial

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return [_R]

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        return _ring(cm, m, 2 * (n - 1), 2 * (n - 1) / n * bytes_in)

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return Transpose("all_reduce", _SUM, _R, False)  # avg/max/min: the executor scales

    def saves(self, src: Placement) -> bool:
        return type(src) is Partial and src.reduce_op in ("max", "min")


class AllToAllV(StepKind):
    """No placement step: the all-to-all of rows in pieces of any sizes (expert
    parallelism's token exchange, :func:`hyper_shard.platform.compose.all_to_all_v`),
    routed and priced like the steps. Routes: native; the even all-to-all with every piece
    padded to the largest of the exchange; ``n - 1`` send/recv rounds moving only the
    rows; an all-gather of the padded pieces + a pick. ``bytes_in``: the rows this rank
    sends; ``bytes_out``: ``n`` times the largest piece (the padded exchange)."""

    name = "all_to_all_v"
    source = Shard
    routes = ("native", "all_to_all", "send_recv", "all_gather")

    def targets(self, p, ndim, blocked, ops):  # type: ignore[no-untyped-def]
        return []

    def route_cost(self, route, cm, m, n, bytes_in, bytes_out):  # type: ignore[no-untyped-def]
        f = (n - 1) / n
        if route == "native":
            return _ring(cm, m, n - 1, f * bytes_in)
        if route == "all_to_all":
            return _ring(cm, m, n - 1, f * bytes_out) + cm.gamma * (bytes_in + bytes_out)
        if route == "send_recv":
            return _ring(cm, m, n - 1, f * bytes_in) + cm.gamma * bytes_in
        return _ring(cm, m, n - 1, (n - 1) * bytes_out) + cm.gamma * (bytes_in + bytes_out)

    def transpose(self, src, dst):  # type: ignore[no-untyped-def]
        return None  # its backward is the exchange with the sizes swapped


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
#: exchanges that are no placement step, routed and priced like one (not in the graph)
EXCHANGES: dict[str, StepKind] = _table(AllToAllV())
#: collective kind -> its routes (see :attr:`StepKind.routes`)
ROUTES: dict[str, tuple[str, ...]] = {k.name: k.routes for k in STEPS.values() if k.collective}
