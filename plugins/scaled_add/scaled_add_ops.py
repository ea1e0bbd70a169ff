"""An example external hyper_shard op package: a fused "scaled add".

``scaled_add(input, other, alpha=1.0, bias=0.0)`` computes ``input + alpha * other + bias``
and ``axpby(input, other, alpha=1.0, beta=1.0)`` computes ``alpha * input + beta * other``,
both with torch broadcasting. On plain tensors they are plain torch; on hyper_shard
DTensors ``__torch_function__`` routes them to hyper_shard's dispatcher, which finds their
sharding rule in this directory's YAML files:

* ``ops.yaml`` binds ``scaled_add_ops.scaled_add`` to :class:`ScaledAddDistributedOp`
  (``class: scaled_add_ops:ScaledAddDistributedOp``);
* ``seed_ops.yaml`` binds ``scaled_add_ops.axpby`` to :class:`AxpbyDistributedOp` in the
  hyper-parallel seed format (``distributed_op_class`` + ``distributed_op_file``).

Load it with::

    export HYPER_PARALLEL_OPS_YAML_DIR=/path/to/plugins/scaled_add
    export HYPER_PARALLEL_OPS_PYTHON_PATH=/path/to/plugins/scaled_add

The rule takes the short path (:meth:`ScaledAddDistributedOp.single_dim_strategies` and
:meth:`~ScaledAddDistributedOp.output_shapes`; hyper_shard expands the strategies over
the mesh and picks the cheapest input redistribution) and adds one custom step,
:meth:`~ScaledAddDistributedOp.expand_impl`: with a ``Partial(sum)`` output every rank
holds one addend of the result, so a python-scalar term (``bias``, or a scalar
``input``/``other``) must be added on one rank only; the others get it zeroed.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.overrides import handle_torch_function, has_torch_function_variadic

from hyper_shard.dispatch.op import DistributedOp, Layout, OpCall
from hyper_shard.dispatch.search import SingleDimStrategy
from hyper_shard.errors import ShardingError
from hyper_shard.placement import Partial, Placement, Replicate, Shard
from hyper_shard.registry.models import RuleParams

__all__ = [
    "scaled_add",
    "axpby",
    "ScaledAddParams",
    "ScaledAddDistributedOp",
    "AxpbyDistributedOp",
]


# ---------------------------------------------------------------------- the functions
def scaled_add(input: Any, other: Any, alpha: float = 1.0, bias: float = 0.0) -> torch.Tensor:
    """``input + alpha * other + bias`` (torch broadcasting; ``other`` may be a scalar).

    DTensor arguments are routed to hyper_shard through ``__torch_function__``; the
    arguments are passed on exactly as given, so the sharding rule sees the same call.

    Raises:
        RuntimeError: shapes that do not broadcast (from torch).
    """
    if has_torch_function_variadic(input, other):
        return handle_torch_function(
            scaled_add, (input, other), input, other, alpha=alpha, bias=bias
        )
    return torch.add(input, other, alpha=alpha) + bias


def axpby(input: Any, other: Any, alpha: float = 1.0, beta: float = 1.0) -> torch.Tensor:
    """``alpha * input + beta * other`` (torch broadcasting).

    Raises:
        RuntimeError: shapes that do not broadcast (from torch).
    """
    if has_torch_function_variadic(input, other):
        return handle_torch_function(axpby, (input, other), input, other, alpha=alpha, beta=beta)
    return torch.add(alpha * input, other, alpha=beta)


# ---------------------------------------------------------------------- the rules
def _broadcast(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    n = max((len(s) for s in shapes), default=0)
    out = [1] * n
    for s in shapes:
        for i, d in enumerate(s):
            j = n - len(s) + i
            if d != 1:
                if out[j] not in (1, d):
                    raise ShardingError(f"shapes {list(shapes)} do not broadcast")
                out[j] = d
    return tuple(out)


class ScaledAddParams(RuleParams):
    """What the YAML entry may set besides ``class``/``torch`` (validated by pydantic)."""

    #: arguments whose python-scalar values are additive terms of the result
    scalar_terms: list[str] = ["input", "other", "bias"]
    #: Partial reductions an all-Partial input may keep (the op is linear in its tensors,
    #: so only sum and mean commute with it)
    partial_ops: list[Literal["sum", "avg"]] = ["sum", "avg"]


class ScaledAddDistributedOp(DistributedOp):
    """The sharding rule of :func:`scaled_add`: an affine elementwise op.

    Per mesh dim (``single_dim_strategies``), with the output first and then one placement
    per DTensor input:

    * ``[Shard(d), <each input sharded on its dim aligned with d, or Replicate if it
      broadcasts there>]`` for every output dim ``d``;
    * ``[Partial(op), Partial(op), ...]`` for op in ``partial_ops``: the op is linear in
      its tensor arguments, so the sums (or means) of the inputs give the sum (or mean) of
      the output — no communication.

    All-Replicate is implied. An input in another state (e.g. ``Shard(1)`` against a
    ``Shard(0)`` partner, or ``Partial(max)``) is redistributed to the cheapest match.
    """

    Params = ScaledAddParams
    signature = ("input", "other", "alpha", "bias")

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        """The broadcast shape of the DTensor inputs (python scalars broadcast away)."""
        return [_broadcast(*(tuple(s.shape) for s in call.specs))]

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        """``(output placements, input placements)`` pairs for one mesh dim."""
        out_shape = self.output_shapes(call)[0]
        assert out_shape is not None
        n = len(out_shape)
        strategies: list[SingleDimStrategy] = []
        for d in range(n):
            ins: list[Placement] = []
            for s in call.specs:
                k = d - (n - s.ndim)  # the input's dim aligned with output dim d
                if k < 0 or (s.shape[k] == 1 and out_shape[d] != 1):
                    ins.append(Replicate())  # broadcast along d: every rank needs all of it
                else:
                    ins.append(Shard(k))
            strategies.append(((Shard(d),), tuple(ins)))
        for op in self.params.partial_ops:
            strategies.append(((Partial(op),), (Partial(op),) * len(call.specs)))
        return strategies

    def expand_impl(self, call: OpCall, layout: Layout) -> Layout:
        """Zero the python-scalar terms on ranks off coordinate 0 of a ``Partial(sum)`` dim.

        The decision is cached per process and per call signature (scalar values are not
        part of the key), so this depends only on the layout and this rank's coordinate,
        never on the scalar's value.
        """
        out = layout.outputs[0]
        coord = call.mesh.get_coordinate()
        if out is None or coord is None:
            return layout
        psum = [m for m, p in enumerate(out) if p == Partial("sum")]
        if all(coord[m] == 0 for m in psum):
            return layout  # this rank adds the scalar terms (or nothing is Partial(sum))
        terms = set(self.params.scalar_terms)
        zeroed = {name: 0 * v for name, v in call.scalars.items() if name in terms}
        if zeroed:
            layout.overrides = {**(layout.overrides or {}), **zeroed}
        return layout


class AxpbyParams(ScaledAddParams):
    """:func:`axpby` has no constant term; a scalar ``input``/``other`` still is one."""

    scalar_terms: list[str] = ["input", "other"]


class AxpbyDistributedOp(ScaledAddDistributedOp):
    """The sharding rule of :func:`axpby` (loaded through the seed format)."""

    Params = AxpbyParams
    signature = ("input", "other", "alpha", "beta")
