"""The base of rules that describe a call by an :class:`OpPlan`, and their shared helpers.

A planned rule returns, for one call signature, an :class:`OpPlan`: the global output
shapes, the single-dim strategies over the call's DTensor inputs and an optional rank-local
step (argument overrides or an implementation); :class:`PlannedOp` searches the cheapest
input placements that fit (:func:`~hyper_shard.dispatch.search.search_strategy`). The
tensor_op, index and embedding families are planned rules.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy, follow_inputs, search_strategy
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..redistribute.planner import cost_model_for
from ._util import R, as_int, normalize_dim, replicated_result_layout

__all__ = [
    "ValueDependentShape",
    "planned_with_context",
    "OpPlan",
    "PlannedOp",
    "keep_strategies",
    "partials_of",
    "as_int",
    "dims_arg",
    "no_empty_shards",
]


@dataclass
class OpPlan:
    """What a planned op does to one call signature.

    Attributes:
        shapes: global output shapes (one per output tensor).
        strategies: single-dim strategies ``(outputs, inputs)`` over ``call.specs``.
        local: optional ``local(layout) -> layout`` adding rank-local overrides or an
            implementation once the placements are decided.
        fixed: inputs that may not move (default: ``self`` of an in-place call).
        accept: optional N-D check (see :func:`~hyper_shard.dispatch.search.search_strategy`).
        view: a :class:`~hyper_shard.dispatch.views.ViewOf` when the outputs are views of
            the first input (as torch's op returns views).
        follow: the inputs stay where they are or become Replicate on each mesh dim (op
            dims that must be whole are gathered in place, as PyTorch DTensor:
            :func:`~hyper_shard.dispatch.search.follow_inputs`).
    """

    shapes: list[tuple[int, ...]]
    strategies: list[SingleDimStrategy] = field(default_factory=list)
    local: Callable[[Layout], Layout] | None = None
    fixed: tuple[int, ...] | None = None
    accept: Callable[[tuple, tuple], bool] | None = None
    view: Any = None
    follow: bool = False


class ValueDependentShape(Exception):
    """Raised by a plan for a call whose output shape depends on the values (a boolean
    mask index, a tensor of repeats or split indices, ``num_classes=-1``): the op then
    runs whole on gathered inputs (``rules._util.replicated_result_layout``), its result a
    Replicate DTensor of the shape the values give. Not an error a user sees."""


class PlannedOp(DistributedOp):
    """Base of rules that describe a call by an :class:`OpPlan` (see the module docstring).

    Subclasses implement :meth:`plan`; errors a global-shape check raises there
    (``IndexError``, ``TypeError``, ``ValueError``) are re-raised naming the call.
    """

    def plan(self, call: OpCall) -> OpPlan:
        raise NotImplementedError

    def checked_plan(self, call: OpCall) -> OpPlan:
        return planned_with_context(
            call,
            lambda: self.plan(call),
            " (sizes, dims and indices are GLOBAL, as for the full tensor)",
        )

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        return list(self.checked_plan(call).shapes)

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        return self.checked_plan(call).strategies

    def infer_layout(self, call: OpCall) -> Layout:
        try:
            plan = self.checked_plan(call)
        except ValueDependentShape:
            return replicated_result_layout(call)
        fixed = plan.fixed if plan.fixed is not None else ((0,) if call.inplace else ())
        try:
            res = search_strategy(
                call.specs,
                plan.strategies,
                len(plan.shapes),
                cost_model_for(call.mesh),
                fixed=fixed,
                accept=follow_inputs(call.specs, plan.accept) if plan.follow else plan.accept,
            )
        except ValueError as e:
            raise ShardingError(
                f"{call.describe()}: no sharding of the inputs fits {call.platform_name} while "
                f"keeping the in-place target's placements; redistribute it first (e.g. to "
                f"Replicate()), or use the out-of-place op"
            ) from e
        layout = Layout(
            list(res.inputs), list(res.outputs), list(plan.shapes), cost=res.cost, view=plan.view
        )
        return plan.local(layout) if plan.local is not None else layout


def partials_of(specs: Sequence[Any]) -> list[Partial]:
    """The distinct Partial placements the given specs carry, in order of appearance."""
    return list(dict.fromkeys(p for s in specs for p in s.placements if type(p) is Partial))


def keep_strategies(
    dim_maps: Sequence[dict[int, int] | None],
    n_out: int,
    partials: Sequence[Partial] = (),
    partial_inputs: Sequence[bool] | None = None,
) -> list[SingleDimStrategy]:
    """Strategies of an op whose inputs keep their shards on mapped dims.

    Args:
        dim_maps: per input, ``{input dim: output dim}`` for the dims that may stay sharded
            (None: that input must be Replicate whenever the output is sharded).
        n_out: number of outputs (all placed alike).
        partials: Partial placements that pass through.
        partial_inputs: per input, whether it is Partial in a Partial strategy (the others
            are Replicate); default every input.
    """
    outs: dict[int, list[Placement]] = {}
    n_in = len(dim_maps)
    for i, m in enumerate(dim_maps):
        for d, o in (m or {}).items():
            outs.setdefault(o, [R] * n_in)[i] = Shard(d)
    strategies: list[SingleDimStrategy] = [
        ((Shard(o),) * n_out, tuple(ins)) for o, ins in sorted(outs.items())
    ]
    flags = partial_inputs if partial_inputs is not None else [True] * n_in
    for p in partials:
        strategies.append(((p,) * n_out, tuple(p if f else R for f in flags)))
    return strategies


def no_empty_shards(specs: Sequence[Any]) -> Callable[[tuple, tuple], bool]:
    """An :attr:`OpPlan.accept` check refusing N-D input placements that leave some rank an
    empty shard of a non-empty dim (a size-1 dim split over 2 ranks; 5 over 4 by
    ``torch.chunk``): for kernels that reject empty batches (MKL's FFT, LAPACK's
    backward), such an input is gathered on that dim instead."""
    import itertools

    from ..spec import compute_local_shape_and_offset

    mesh_shape = tuple(specs[0].mesh.shape)
    coords = list(itertools.product(*(range(n) for n in mesh_shape)))

    def accept(ins: tuple, outs: tuple) -> bool:
        for spec, pl in zip(specs, ins):
            if not any(type(p) is Shard for p in pl):
                continue
            for c in coords:
                local, _ = compute_local_shape_and_offset(spec.shape, mesh_shape, pl, c)
                if any(n == 0 and g > 0 for n, g in zip(local, spec.shape)):
                    return False
        return True

    return accept


def dims_arg(v: Any, ndim: int, what: str) -> list[int]:
    """Distinct normalised dims from an int or a list of ints.

    Raises:
        TypeError / IndexError / ValueError: a non-int, out-of-range or repeated dim.
    """
    vals = v if isinstance(v, (list, tuple)) else [v]
    out = [normalize_dim(as_int(d, what), ndim, what) for d in vals]
    if len(set(out)) != len(out):
        raise ValueError(f"{what}: dim appears multiple times in the list of dims {list(vals)}")
    return out


def planned_with_context(call: OpCall, plan: Callable[[], Any], hint: str) -> Any:
    """``plan()``, its errors naming the call: an IndexError or TypeError keeps its type
    with ``call.describe()`` in front; a ValueError (a bad size, dim or index) becomes a
    ShardingError ending with ``hint``; a ShardingError passes as it is. Chained (``from``).
    """
    try:
        return plan()
    except ShardingError:
        raise
    except IndexError as e:
        raise IndexError(f"{call.describe()}: {e}") from e
    except TypeError as e:
        raise TypeError(f"{call.describe()}: {e}") from e
    except ValueError as e:
        raise ShardingError(f"{call.describe()}: {e}{hint}") from e
