"""View ops: view, reshape, flatten, unflatten, transpose, permute, movedim, squeeze,
unsqueeze, expand, contiguous, ``Tensor.T``/``Tensor.mT`` and the ``*_as`` forms.

Semantics (global shapes, ``-1``, errors) are those of the ``torch.Tensor`` methods of the
same names. One rule, ``rule: view``, serves them all; its ``kind`` parameter picks the op
(``view``, ``reshape``, ``view_as``, ``reshape_as``, ``flatten``, ``unflatten``,
``transpose``, ``swapaxes``, ``t``, ``T``, ``mT``, ``permute``, ``movedim``, ``squeeze``,
``unsqueeze``, ``expand``, ``expand_as``, ``contiguous``) and with it the canonical
signature and static args. Two kinds follow numpy where it differs from torch:
``transpose_axes`` (``Tensor.transpose(*axes)``: no axes reverses every dim) and
``squeeze_axis`` (an empty axis tuple squeezes every size-1 dim); ``flatten_batch`` is
MindSpore's legacy ``Flatten`` (dim 0 kept, the rest flattened).

How a layout is decided (the dim mapping itself is in :mod:`._view_dims`):

* every op is a :class:`~._view_dims.DimMap` from input dims to output dims (1:1, a
  flatten, a split, a removed/new size-1 dim, a broadcast dim);
* per mesh dim, ``Shard(d)`` survives as ``Shard(o)`` when ``d`` leads its group and the
  ``torch.chunk`` pieces line up (:func:`~._view_dims.shard_target`); the N-D combination
  is checked exactly, nested shards (``[Shard(0), Shard(0)]``) piece by piece, through the
  search's ``accept`` hook. Anything else is redistributed by the strategy search (usually
  an all-gather): never a silently wrong result;
* ``Partial(op)`` stays ``Partial(op)`` for every reduce op: these ops only move or repeat
  elements, which commutes with an elementwise reduction over ranks. A dtype view
  (``view(torch.int32)``) reinterprets bits, so a Partial input is reduced first. The
  search never *introduces* a Partial (a cheap local pad would otherwise win over a gather);
* expand: a broadcast (1 -> n) dim must be Replicate in the input and is Replicate in the
  output, as are expand's new leading dims; squeeze: a squeezed size-1 dim must be
  Replicate.

The local call receives LOCAL arguments: view/reshape/expand get the output shard's shape
at this rank, unflatten its local sizes, squeeze the explicit global size-1 dims (a
sharded dim can be size 1 locally), and view_as/reshape_as/expand_as run a replacement
that uses the local output shape. ``-1`` is resolved against the GLOBAL numel.

In-place view ops (``t_``, ``squeeze_``, ``unsqueeze_``, ``transpose_``...) change the shape
of their DTensor: on torch they reuse these rules (``platform/torch/inplace_views.py``) and
run in place when the view moves no data, else raise.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import field_validator

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy, search_strategy
from ..dispatch.views import ViewOf
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..redistribute.planner import cost_model_for
from ..registry.models import RuleParams
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._kinds import KindTable
from ._view_dims import (
    DimMap,
    check_perm,
    dtype_view_map,
    expand_map,
    expand_shape,
    flatten_shape,
    infer_shape,
    movedim_perm,
    permute_map,
    reshape_map,
    shard_target,
    squeeze_dims,
    squeeze_map,
    transpose_perm,
    unflatten_shape,
    unsqueeze_dim,
    unsqueeze_map,
    wrap_dim,
)
from .planned import planned_with_context

__all__ = ["ViewOp", "ViewParams", "ViewPlan", "layout_is_exact"]

#: every kind but contiguous returns a view of its input (as torch.Tensor's methods); a
#: copied view is written back by replaying the op on the base (dispatch/views.py)
_VIEW = ViewOf()


#: kind -> (canonical signature, static args), torch's argument names
_KINDS = KindTable("view")

#: local shape of the output at this rank -> (argument overrides, replacement implementation)
LocalArgs = Callable[[tuple[int, ...]], tuple[dict[str, Any] | None, Callable | None]]


class ViewParams(RuleParams):
    """``kind``: which view op the entry is (see the module docstring). ``copies``: the op
    returns a new tensor where its namesake returns a view (``permute_copy``,
    ``view_copy``...): in-place writes to the result never reach the input."""

    kind: str
    copies: bool = False

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        return _KINDS.validate(v)


@dataclass
class ViewPlan:
    """What a view op does to one input signature.

    Attributes:
        dmap: global input/output shapes and the dim groups.
        keep_partial: Partial inputs may stay Partial (False for a dtype view).
        local: how to turn this rank's local output shape into the local call's arguments
            (None: the local op needs nothing rank-specific).
    """

    dmap: DimMap
    keep_partial: bool = True
    local: LocalArgs | None = None


def layout_is_exact(dmap: DimMap, mesh_shape: Sequence[int], placements: Sequence[Any]) -> bool:
    """True if every Shard in the input ``placements`` survives the op exactly: for each
    sharded input dim, with the sizes of all the mesh dims sharding it (nested left to
    right), :func:`~._view_dims.shard_target` finds an output dim."""
    splits: dict[int, list[int]] = {}
    for m, p in enumerate(placements):
        if type(p) is Shard:
            splits.setdefault(p.dim, []).append(mesh_shape[m])
    return all(shard_target(dmap, d, s) is not None for d, s in splits.items())


def _is_int(v: Any) -> bool:
    try:
        operator.index(v)
    except TypeError:
        return False
    return True


def _seq(v: Any) -> tuple:
    return tuple(v) if isinstance(v, (list, tuple)) else (v,)


def _arg(static: dict[str, Any], name: str, default: Any) -> Any:
    v = static.get(name)
    return default if v is None else v


@register_rule("view")
class ViewOp(DistributedOp):
    """A view op (``kind``), semantics as the ``torch.Tensor`` method of that name.

    Shapes and dims in the arguments are GLOBAL (``x.view(-1, 6)`` on a ``(12, 8)``
    DTensor means a global ``(16, 6)`` result, ``-1`` resolved against the global numel);
    the local op is called with this rank's local output shape. The output's placements
    keep every shard the data layout allows exactly (see the module docstring); the others
    are gathered first.

    Raises:
        ShardingError: arguments torch would reject for the global shape (a shape that does
            not match the numel, bad expand sizes...), or an ``*_as`` call whose ``other`` is
            not a DTensor on the same mesh. The message names the op and the placements.
        IndexError: a dim out of range for the global rank.
        TypeError: a non-integer size or dim.
    """

    Params = ViewParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        k = _KINDS[self.params.kind]
        self.use_signature(k.signature, k.static)

    # ------------------------------------------------------------------ phase 2
    def plan(self, call: OpCall) -> ViewPlan:
        """The op's dim map and local arguments for this call (global shapes).

        Raises:
            ShardingError, IndexError, TypeError: see the class docstring.
        """
        kind = self.params.kind
        shape = call.specs[0].shape
        return planned_with_context(
            call,
            lambda: _KINDS[kind].plan(self, call, shape, call.static),
            f". Sizes and dims are GLOBAL (as torch.Tensor.{kind} on the full tensor of shape "
            f"{tuple(shape)}), not the local shard's",
        )

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        return self._strategies(call, self.plan(call))

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        return [self.plan(call).dmap.out_shape]

    def _strategies(self, call: OpCall, plan: ViewPlan) -> list[SingleDimStrategy]:
        spec = call.specs[0]
        sizes = sorted(set(call.mesh.shape))
        out: list[SingleDimStrategy] = []
        for d in range(spec.ndim):
            o = shard_target(plan.dmap, d)
            if o is not None and any(shard_target(plan.dmap, d, [n]) is not None for n in sizes):
                out.append(((Shard(o),), (Shard(d),)))
        if plan.keep_partial:
            for p in dict.fromkeys(p for p in spec.placements if type(p) is Partial):
                out.append(((p,), (p,)))
        return out

    def infer_layout(self, call: OpCall) -> Layout:
        """Search the cheapest placements of the first input whose shards survive exactly;
        any other DTensor argument (``view_as``'s ``other``) only gives a shape and is not
        moved."""
        plan = self.plan(call)
        spec = call.specs[0]
        mesh = call.mesh
        start = spec.placements

        def accept(ins: tuple, outs: tuple) -> bool:
            pl: tuple[Placement, ...] = ins[0]
            if any(type(p) is Partial and p != start[m] for m, p in enumerate(pl)):
                return False  # never introduce a Partial (a local pad beats a gather on cost)
            return layout_is_exact(plan.dmap, mesh.shape, pl)

        res = search_strategy(
            [spec], self._strategies(call, plan), 1, cost_model_for(mesh), accept=accept
        )
        out_shape = plan.dmap.out_shape
        layout = Layout(
            [res.inputs[0], *([None] * (len(call.specs) - 1))],
            [res.outputs[0]],
            [out_shape],
            cost=res.cost,
            view=None if self.params.kind == "contiguous" or self.params.copies else _VIEW,
        )
        coord = mesh.get_coordinate()
        if plan.local is not None and coord is not None:
            local, _ = compute_local_shape_and_offset(out_shape, mesh.shape, res.outputs[0], coord)
            layout.overrides, layout.impl = plan.local(tuple(local))
        return layout

    # ------------------------------------------------------------------ kinds
    @_KINDS.kind("view", ("input", "*size"), ("size", "dtype"))
    def _plan_view(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        raw, dtype = st.get("size"), st.get("dtype")
        if dtype is None and raw is not None and len(_seq(raw)) == 1 and not _is_int(_seq(raw)[0]):
            dtype = _seq(raw)[0]
        if dtype is not None:
            out_item = getattr(dtype, "itemsize", None)
            if not isinstance(out_item, int):
                raise TypeError(f"view: expected a shape or a dtype, got {dtype!r}")
            dmap = dtype_view_map(shape, call.specs[0].tensor_meta.itemsize, out_item)
            return ViewPlan(dmap, keep_partial=False)
        return self._reshape(shape, raw, "size")

    @_KINDS.kind("reshape", ("input", "*shape"), ("shape",))
    def _plan_reshape(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        return self._reshape(shape, st.get("shape"), "shape")

    @staticmethod
    def _reshape(shape: tuple, raw: Any, name: str) -> ViewPlan:
        if raw is None:
            raise TypeError(f"missing the {name!r} argument")
        out = infer_shape(_seq(raw), math.prod(shape))
        return ViewPlan(reshape_map(shape, out), local=lambda ls: ({name: ls}, None))

    def _other_shape(self, call: OpCall) -> tuple[int, ...]:
        if len(call.specs) < 2:
            raise ShardingError(
                f"{call.describe()}: 'other' must be a DTensor on the same mesh (it only gives "
                f"the target shape); pass the shape instead, e.g. x.view(other.shape)"
            )
        return call.specs[1].shape

    @_KINDS.kind("reshape_as", ("input", "other"), ())
    @_KINDS.kind("view_as", ("input", "other"), ())
    def _plan_view_as(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        out = self._other_shape(call)
        if math.prod(out) != math.prod(shape):
            raise ValueError(f"shape {list(out)} is invalid for input of size {math.prod(shape)}")
        method = "view" if self.params.kind == "view_as" else "reshape"

        def local(ls: tuple[int, ...]) -> tuple[None, Callable]:
            return None, lambda x, *a, **k: getattr(x, method)(ls)

        return ViewPlan(reshape_map(shape, out), local=local)

    @_KINDS.kind("flatten", ("input", "start_dim", "end_dim"), ("start_dim", "end_dim"))
    def _plan_flatten(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        out = flatten_shape(shape, _arg(st, "start_dim", 0), _arg(st, "end_dim", -1))
        return ViewPlan(reshape_map(shape, out))

    @_KINDS.kind("flatten_batch", ("input",), ())
    def _plan_flatten_batch(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        # MindSpore's legacy Flatten: keeps dim 0 and flattens the rest ((n,) -> (n, 1))
        if not shape:
            raise ValueError("Flatten: the input must have at least one dim (got a 0-d tensor)")
        return ViewPlan(reshape_map(shape, (shape[0], math.prod(shape[1:]))))

    @_KINDS.kind("unflatten", ("input", "dim", "sizes"), ("dim", "sizes"))
    def _plan_unflatten(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("dim") is None or st.get("sizes") is None:
            raise TypeError("unflatten needs 'dim' and 'sizes'")
        d = wrap_dim(st["dim"], len(shape))
        out = unflatten_shape(shape, d, _seq(st["sizes"]))
        k = len(out) - len(shape) + 1
        return ViewPlan(reshape_map(shape, out), local=lambda ls: ({"sizes": ls[d : d + k]}, None))

    @_KINDS.kind("transpose", ("input", "dim0", "dim1"), ("dim0", "dim1"))
    def _plan_transpose(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("dim0") is None or st.get("dim1") is None:
            raise TypeError("transpose needs 'dim0' and 'dim1'")
        return ViewPlan(permute_map(shape, transpose_perm(len(shape), st["dim0"], st["dim1"])))

    @_KINDS.kind("swapaxes", ("input", "axis0", "axis1"), ("axis0", "axis1"))
    def _plan_swapaxes(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("axis0") is None or st.get("axis1") is None:
            raise TypeError("swapaxes needs 'axis0' and 'axis1'")
        return ViewPlan(permute_map(shape, transpose_perm(len(shape), st["axis0"], st["axis1"])))

    @_KINDS.kind("t", ("input",), ())
    def _plan_t(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if len(shape) > 2:
            raise ValueError(
                f"t() expects a tensor with <= 2 dimensions, but self is {len(shape)}D"
            )
        return ViewPlan(permute_map(shape, tuple(reversed(range(len(shape))))))

    @_KINDS.kind("T", ("input",), ())
    def _plan_T(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        return ViewPlan(permute_map(shape, tuple(reversed(range(len(shape))))))

    @_KINDS.kind("mT", ("input",), ())
    def _plan_mT(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        n = len(shape)
        if n < 2:
            raise ValueError(
                f"tensor.mT is only supported on matrices or batches of matrices. Got {n}-D tensor"
            )
        return ViewPlan(permute_map(shape, transpose_perm(n, -2, -1)))

    @_KINDS.kind("permute", ("input", "*dims"), ("dims",))
    def _plan_permute(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("dims") is None:
            raise TypeError("permute needs 'dims'")
        return ViewPlan(permute_map(shape, check_perm(_seq(st["dims"]), len(shape))))

    @_KINDS.kind("transpose_axes", ("input", "*dims"), ("dims",))
    def _plan_transpose_axes(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        # numpy's (and MindSpore's 1.x) Tensor.transpose(*axes): no axes, or None,
        # reverses every dim; otherwise as permute
        dims = st.get("dims")
        if dims is None or (isinstance(dims, (list, tuple)) and dims in ((), [], (None,))):
            return ViewPlan(permute_map(shape, tuple(reversed(range(len(shape))))))
        return ViewPlan(permute_map(shape, check_perm(_seq(dims), len(shape))))

    @_KINDS.kind("movedim", ("input", "source", "destination"), ("source", "destination"))
    def _plan_movedim(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("source") is None or st.get("destination") is None:
            raise TypeError("movedim needs 'source' and 'destination'")
        return ViewPlan(
            permute_map(shape, movedim_perm(len(shape), st["source"], st["destination"]))
        )

    @_KINDS.kind("squeeze", ("input", "dim"), ("dim",))
    def _plan_squeeze(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        dims = squeeze_dims(shape, st.get("dim"))
        return ViewPlan(squeeze_map(shape, dims), local=lambda ls: ({"dim": dims}, None))

    @_KINDS.kind("squeeze_axis", ("input", "dim|axis"), ("dim",))
    def _plan_squeeze_axis(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        # numpy's squeeze (MindSpore's Squeeze): an empty axis tuple, like None, squeezes
        # every size-1 dim. The local call is a reshape to the local output shape (the local
        # op given the global size-1 dims, or none of them, would also drop a sharded dim
        # that is size 1 locally)
        dim = st.get("dim")
        if isinstance(dim, (list, tuple)) and len(dim) == 0:
            dim = None
        dims = squeeze_dims(shape, dim)
        plat = call.platform

        def local(ls: tuple[int, ...]) -> tuple[None, Callable]:
            return None, lambda x, *a, **k: plat.reshape(x, ls)

        return ViewPlan(squeeze_map(shape, dims), local=local)

    @_KINDS.kind("unsqueeze", ("input", "dim"), ("dim",))
    def _plan_unsqueeze(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("dim") is None:
            raise TypeError("unsqueeze needs 'dim'")
        return ViewPlan(unsqueeze_map(shape, unsqueeze_dim(len(shape), st["dim"])))

    @_KINDS.kind("expand", ("input", "*size"), ("size",))
    def _plan_expand(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        if st.get("size") is None:
            raise TypeError("expand needs 'size'")
        out = expand_shape(shape, _seq(st["size"]))
        return ViewPlan(expand_map(shape, out), local=lambda ls: ({"size": ls}, None))

    @_KINDS.kind("expand_as", ("input", "other"), ())
    def _plan_expand_as(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        out = expand_shape(shape, self._other_shape(call))

        def local(ls: tuple[int, ...]) -> tuple[None, Callable]:
            return None, lambda x, *a, **k: x.expand(ls)

        return ViewPlan(expand_map(shape, out), local=local)

    @_KINDS.kind("contiguous", ("input", "memory_format"), ())
    def _plan_contiguous(self, call: OpCall, shape: tuple, st: dict) -> ViewPlan:
        return ViewPlan(permute_map(shape, range(len(shape))))
