"""Indexing: ``Tensor.__getitem__``, ``Tensor.__setitem__``, index_select, gather, scatter,
scatter_add and the strided slice ``StridedSlice(input, begin, end, strides, begin_mask,
end_mask, ellipsis_mask, new_axis_mask, shrink_axis_mask)`` (``rule: index``, ``kind:``
picks the op).

Semantics are torch's on the GLOBAL tensor (ints, slices with steps, None, Ellipsis, python
bools, integer index DTensors and lists; as in torch, ints are applied first and the
advanced indices' result dims go where the advanced indices are, or first when they are not
adjacent). How a layout is decided:

* dims an index *touches* (an int, a slice that is not the whole dim, an index tensor) are
  gathered to Replicate in the indexed tensor; the other dims keep their shards;
* an integer index DTensor may stay sharded: the result dims it produces carry its shards
  (``weight[ids]`` with ``ids`` sharded on batch gives a batch-sharded result), while the
  dims it indexes are Replicate in the indexed tensor;
* ``Partial(op)`` of the indexed tensor passes through (selection commutes with any
  elementwise reduction over ranks); index tensors are never Partial;
* ``__setitem__`` writes in place: the target never moves. A sharded dim indexed by an int
  or a slice is handled per rank (the index is shifted to the local shard and the value
  narrowed to the part this rank holds); a Partial target gets the value once (Partial
  value, or a scalar written on coordinate 0 for ``sum``); a boolean mask DTensor is
  aligned with the target's shards and written locally (``x[mask] = v``); writing through
  an index tensor into a sharded dim raises (redistribute the target first);
* a boolean-mask READ (``x[mask]``) has a result shape that depends on the mask's values,
  which a cached sharding decision cannot hold: it runs whole on the gathered inputs, a
  Replicate result (``torch.where(mask, x, 0)`` keeps the shards, at the same shape).

Index tensors must be DTensors (the dispatcher refuses plain tensors with dimensions mixed
with DTensors); python ints, slices, lists and 0-d tensors are fine.

index_select and gather gather the indexed dim of ``input``; the index may stay sharded
(the output follows it). scatter/scatter_add keep shards on dims where input, index and
src have the same size; ``scatter_add`` keeps ``Partial(sum)``.

``strided_slice`` (MindSpore's ``ops.strided_slice``/``ops.StridedSlice``, as documented) is
read as the index it stands for (position ``i`` of ``begin``/``end``/``strides`` is an int
or a slice, as the mask bits say) and decided as ``__getitem__``; a negative stride gathers
its dim. The local call is the op itself; a sharded dim the slice keeps whole gets the
rank-local ``begin`` 0 and ``end`` its local size. Forms MindSpore 2.10's kernel computes
differently from its documentation (``ellipsis_mask``, ``new_axis_mask``, a negative stride
with a begin/end mask bit or a begin outside the dim, ``shrink_axis_mask`` with
``begin_mask`` on one position: wrong or uninitialised values on CPU) raise a
``ShardingError`` pointing to ``x[...]``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import field_validator

from ..dispatch.op import Layout, OpCall
from ..dispatch.views import ViewOf
from ..errors import ShardingError
from ..placement import Partial, Placement, Shard
from ..registry.models import RuleParams
from ..spec import compute_local_shape_and_offset
from . import register_rule
from ._index_model import IndexForm, local_slice, parse_index
from ._kinds import KindTable
from ._util import R, normalize_dim
from .planned import OpPlan, PlannedOp, ValueDependentShape, as_int, keep_strategies, partials_of
from .tensor_create import scalar_off_coordinate0 as _scalar_off_coordinate0

__all__ = ["IndexOp", "IndexParams", "IndexForm", "parse_index", "strided_slice_index"]


_MASKS = ("begin_mask", "end_mask", "ellipsis_mask", "new_axis_mask", "shrink_axis_mask")
_UNSUPPORTED_STRIDED = (
    "{call}: {what}: MindSpore 2.10's StridedSlice kernel does not follow its documented "
    "semantics for this form (checked on CPU: wrong or uninitialised values), so a sharded "
    "result could not match it; index the DTensor with x[...] instead (the __getitem__ entry)"
)

_KINDS = KindTable("index")


class _Same:
    """Output ``i`` of a basic-index view is ``base[index]`` (one output)."""

    __slots__ = ("index",)

    def __init__(self, index: Any) -> None:
        self.index = index

    def __call__(self, i: int) -> Any:
        return self.index


class _CheckedGetitem:
    """The local ``x[index]``, refusing an index whose list/tuple form differs from the one
    the cached decision was made for (the two forms share a cache key)."""

    __slots__ = ("form",)

    def __init__(self, form: type) -> None:
        self.form = form

    def __call__(self, x: Any, index: Any) -> Any:
        if type(index) is not self.form:
            raise ShardingError(
                f"Tensor.__getitem__: an index given as a {type(index).__name__} after the same "
                f"values as a {self.form.__name__}: pass one form consistently (a tuple of "
                f"ints indexes several dims, a list of ints is one index tensor)"
            )
        return x[index]


class _LocalSetitem:
    """The local ``x[index] = value`` for a target sharded on dims the index slices: the
    items on those dims are replaced by their local form, the value narrowed to match; a
    rank holding none of the written elements writes nothing."""

    __slots__ = ("tuple_form", "replace", "noop", "narrow", "scalar")

    def __init__(
        self,
        tuple_form: bool,
        replace: dict[int, Any],
        noop: bool,
        narrow: list[tuple[int, int, int]],
        scalar: Any,
    ) -> None:
        self.tuple_form, self.replace, self.noop = tuple_form, replace, noop
        self.narrow, self.scalar = narrow, scalar

    def __call__(self, x: Any, index: Any, value: Any) -> None:
        if self.noop:
            # this rank holds none of the written elements; a value that needs a gradient
            # still gets one (zeros): add an empty sum (exactly 0, never NaN) into x
            if getattr(value, "requires_grad", False):
                x.add_(value.reshape(-1)[:0].sum().to(x.dtype))
            return None
        items = list(index) if self.tuple_form else [index]
        for pos, v in self.replace.items():
            items[pos] = v
        if self.scalar is not None:
            value = self.scalar
        for d, start, length in self.narrow:
            value = value.narrow(d, start, length)
        x[tuple(items) if self.tuple_form or self.replace else items[0]] = value
        return None


# ---------------------------------------------------------------------- the rule
class IndexParams(RuleParams):
    """``kind``: which indexing op the entry is (see the module docstring)."""

    kind: str

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, v: str) -> str:
        return _KINDS.validate(v)


@register_rule("index")
class IndexOp(PlannedOp):
    """Indexing ops (see the module docstring); semantics as torch on global shapes.

    Raises:
        ShardingError: a boolean-mask read (data-dependent shape), a write through an index
            tensor into a sharded dim, or arguments torch would reject (naming the call).
        IndexError: an index out of range, too many indices.
        TypeError: an index of a type torch refuses.
    """

    Params = IndexParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        k = _KINDS[self.params.kind]
        self.use_signature(k.signature, k.static)

    def plan(self, call: OpCall) -> OpPlan:
        return _KINDS[self.params.kind].plan(self, call)

    def infer_layout(self, call: OpCall) -> Layout:
        if self.params.kind == "setitem":
            try:
                return self._setitem_layout(call)
            except ShardingError:
                raise
            except (IndexError, TypeError) as e:
                raise type(e)(f"{call.describe()}: {e}") from e
            except ValueError as e:
                raise ShardingError(f"{call.describe()}: {e}") from e
        return super().infer_layout(call)

    # -- __getitem__ --------------------------------------------------------------
    def _index(self, call: OpCall) -> Any:
        return call.get("indices")

    @_KINDS.kind("getitem", ("input", "indices"), ("indices",))
    def _plan_getitem(self, call: OpCall) -> OpPlan:
        x = call.specs[0]
        if call.arg_roles[0] != "input":
            raise ShardingError(
                f"{call.describe()}: indexing a plain tensor with DTensor indices; make the "
                f"indexed tensor a DTensor (distribute_tensor) or index with plain tensors"
            )
        index = self._index(call)
        form = parse_index(x.shape, index)
        if form.masks:  # the result's size is the mask's True count: run it whole
            raise ValueDependentShape
        plan = self._plan_form(call, form)
        if not form.adv:  # basic indexing (ints, slices, None, ...): a view, as in torch
            plan.view = ViewOf(_Same(index))
        if isinstance(index, (list, tuple)) and not any(
            it.kind in ("slice", "new", "ellipsis") or it.spec is not None for it in form.items
        ):
            checker = _CheckedGetitem(type(index))

            def local(layout: Layout) -> Layout:
                layout.impl = checker
                return layout

            plan.local = local
        return plan

    def _plan_form(self, call: OpCall, form: IndexForm) -> OpPlan:
        """``x[index]`` given its parsed form: untouched dims keep their shards, index
        DTensors their mapped ones, Partial values of ``x`` pass through."""
        x = call.specs[0]
        n_in = len(call.specs)
        maps: list[dict[int, int] | None] = [form.keep] + [None] * (n_in - 1)
        for i, m in form.adv_out.items():
            maps[i] = m
        strategies = keep_strategies(maps, 1, partials_of([x]), [True] + [False] * (n_in - 1))
        return OpPlan([tuple(int(s) for s in form.out_shape)], strategies)  # type: ignore[arg-type]

    # -- aten.slice.Tensor ------------------------------------------------------------
    @_KINDS.kind(
        "slice_dim", ("input", "dim", "start", "end", "step"), ("dim", "start", "end", "step")
    )
    def _plan_slice_dim(self, call: OpCall) -> OpPlan:
        """``aten.slice.Tensor(x, dim=0, start=None, end=None, step=1)`` is
        ``x[(:,) * dim + (start:end:step,)]``: decided as that ``__getitem__`` (the sliced
        dim gathered unless the slice keeps it whole; the local call slices that dim only)."""
        x = call.specs[0]
        if call.arg_roles[0] != "input":
            raise ShardingError(f"{call.describe()}: the sliced tensor must be the DTensor")
        st = call.static
        dim = normalize_dim(as_int(st.get("dim") or 0, "dim"), x.ndim)
        step = st.get("step")
        index = (slice(None),) * dim + (
            slice(st.get("start"), st.get("end"), 1 if step is None else as_int(step, "step")),
        )
        plan = self._plan_form(call, parse_index(x.shape, index))
        plan.view = ViewOf(_Same(index))
        return plan

    # -- strided slice ----------------------------------------------------------------
    @_KINDS.kind(
        "strided_slice",
        ("input", "begin", "end", "strides", *_MASKS),
        ("begin", "end", "strides", *_MASKS),
    )
    def _plan_strided_slice(self, call: OpCall) -> OpPlan:
        x = call.specs[0]
        if call.arg_roles != ["input"]:
            raise ShardingError(
                f"{call.describe()}: a strided slice takes one tensor and python begin/end/"
                f"strides; pass them as tuples of ints"
            )
        st = call.static
        begin: Any = st.get("begin")
        end: Any = st.get("end")
        strides: Any = st.get("strides")
        bm, em, ell, new, shrink = (st.get(m) or 0 for m in _MASKS)
        index = strided_slice_index(begin, end, strides, bm, em, ell, new, shrink)

        def unsupported(what: str) -> ShardingError:
            return ShardingError(_UNSUPPORTED_STRIDED.format(call=call.describe(), what=what))

        if ell or new:
            raise unsupported("ellipsis_mask/new_axis_mask")
        if len(index) > x.ndim:
            raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
        # a reversed (negative-step) slice plans as a positive one of its length, touched
        plan_index: list[Any] = []
        reversed_dims = []
        for d, it in enumerate(index):
            bit = 1 << d
            if isinstance(it, slice) and it.step < 0:
                n = x.shape[d]
                if bm & bit or em & bit or not -n <= it.start < n:
                    raise unsupported(
                        f"a negative stride with a begin/end mask bit or a begin outside the "
                        f"dim (position {d})"
                    )
                plan_index.append(slice(0, len(range(*it.indices(n)))))
                reversed_dims.append(d)
            else:
                if shrink & bit and bm & bit:
                    raise unsupported(f"shrink_axis_mask and begin_mask on one position ({d})")
                plan_index.append(it)
        form = parse_index(x.shape, tuple(plan_index))
        for d in reversed_dims:
            if d in form.keep:  # a whole reversed dim is still touched
                form.slices[d] = (form.items[d], form.keep.pop(d))
        plan = self._plan_form(call, form)
        whole = {d for d in range(len(index)) if d in form.keep}
        if not whole:
            return plan
        mesh = call.mesh

        def local(layout: Layout) -> Layout:
            # a sharded dim kept whole is sliced over its local extent: begin 0, end the
            # local size (rank-local arguments; a masked begin/end ignores them)
            tgt = tuple(layout.inputs[0] or x.placements)
            sharded = sorted({p.dim for p in tgt if type(p) is Shard} & whole)
            coord = mesh.get_coordinate()
            if not sharded or coord is None:
                return layout
            ls, _ = compute_local_shape_and_offset(x.shape, mesh.shape, tgt, coord)
            b, e = list(begin), list(end)
            for d in sharded:
                b[d], e[d] = 0, ls[d]
            layout.overrides = {"begin": tuple(b), "end": tuple(e)}
            return layout

        plan.local = local
        return plan

    # -- __setitem__ --------------------------------------------------------------
    @_KINDS.kind("setitem", ("input", "indices", "value"), ("indices",))
    def _setitem_layout(self, call: OpCall) -> Layout:
        x = call.specs[0]
        if call.arg_roles[0] != "input":
            raise ShardingError(
                f"{call.describe()}: writing into a plain tensor with DTensor indices or values; "
                f"make the target a DTensor, or use plain tensors (to_local()/full_tensor())"
            )
        index = self._index(call)
        form = parse_index(x.shape, index)
        leading = _leading_index_tensors(form, x)
        if leading is not None:  # x[idx] = v into a sharded indexed dim: index_put's rule
            from .index_put import index_put_layout

            return index_put_layout(call, leading, "value", setitem=True)
        n_idx = sum(1 for it in form.items if it.spec is not None)
        has_value = len(call.specs) > 1 + n_idx
        vspec = call.specs[-1] if has_value else None
        mesh = call.mesh
        coord = mesh.get_coordinate()
        targets: list[tuple[Placement, ...] | None] = [None] * len(call.specs)
        idx_t: dict[int, list[Placement]] = {
            it.spec: [] for it in form.items if it.spec is not None
        }
        val_t: list[Placement] = []
        out_nd = len(form.out_shape)
        mask_dims = {d: (it, j) for it in form.masks for j, d in enumerate(it.dims)}
        for p in x.placements:
            vp: Placement = R
            if type(p) is Shard:
                d = p.dim
                if d in form.keep:
                    vp = _value_shard(vspec, form, form.keep[d], out_nd)
                elif d in mask_dims:
                    it, j = mask_dims[d]
                    assert it.spec is not None
                    idx_t[it.spec].append(Shard(j))
                    for k in idx_t:
                        if k != it.spec:
                            idx_t[k].append(R)
                    val_t.append(R)
                    continue
                elif d in form.ints and form.ints[d].value is None:
                    raise ShardingError(
                        f"{call.describe()}: a tensor used as an int index into dim {d}, which "
                        f"the target shards ({p}); index it with a python int"
                    )
                elif d not in form.ints and d not in form.slices:
                    raise ShardingError(
                        f"{call.describe()}: writing through an index tensor into dim {d}, which "
                        f"the target shards ({p}) in place; redistribute the target so that dim "
                        f"is Replicate first (x = x.redistribute(mesh, ...)), or use index_put "
                        f"on a replicated copy"
                    )
            elif type(p) is Partial:
                vp = p
            for k in idx_t:
                idx_t[k].append(R)
            val_t.append(vp)
        for k, pls in idx_t.items():
            targets[k] = tuple(pls)
        if vspec is not None:
            _check_value_shape(vspec.shape, form.out_shape)
            targets[-1] = tuple(val_t)
        layout = Layout(targets, [], [])
        if coord is None:
            return layout
        # rank-local rewrite of ints/slices on sharded dims; scalars once on Partial(sum)
        local, off = x.local_shape_and_offset()
        replace: dict[int, Any] = {}
        narrow: list[tuple[int, int, int]] = []
        noop = False
        sharded = {p.dim for p in x.placements if type(p) is Shard}
        for d, it in form.ints.items():
            if d in sharded:
                i = it.value % x.shape[d]
                if off[d] <= i < off[d] + local[d]:
                    replace[it.pos] = i - off[d]
                else:
                    noop = True
        for d, (it, o) in form.slices.items():
            if d in sharded:
                sl, k0, cnt = local_slice(it.value, x.shape[d], off[d], local[d])
                if sl is None:
                    noop = True
                    continue
                replace[it.pos] = sl
                if vspec is not None:
                    vd = o - (out_nd - vspec.ndim)
                    if vd >= 0 and vspec.shape[vd] != 1:
                        narrow.append((vd, k0, cnt))
        scalar = None
        if "value" in call.scalars:
            scalar = _scalar_off_coordinate0(call, x.placements, call.scalars["value"])
        if replace or noop or scalar is not None:
            layout.impl = _LocalSetitem(form.tuple_form, replace, noop, narrow, scalar)
        return layout

    # -- index_select / gather / scatter ------------------------------------------
    def _dim(self, call: OpCall, ndim: int) -> int:
        return normalize_dim(as_int(call.static.get("dim"), "dim"), ndim, "dim")

    def _index_spec(self, call: OpCall, role: str = "index") -> Any:
        for s, r in zip(call.specs, call.arg_roles):
            if r == role:
                return s
        return None

    @_KINDS.kind("index_select", ("input", "dim", "index"), ("dim",))
    def _plan_index_select(self, call: OpCall) -> OpPlan:
        x = call.specs[0]
        dim = self._dim(call, x.ndim)
        idx = self._index_spec(call)
        if idx is not None and idx.ndim > 1:
            raise IndexError("index_select(): Index is supposed to be a vector")
        count = 1 if idx is None else math.prod(idx.shape)
        shape = list(x.shape)
        if x.ndim:
            shape[dim] = count
        maps: list[dict[int, int] | None] = [{d: d for d in range(x.ndim) if d != dim}]
        if idx is not None:
            maps.append({0: dim} if idx.ndim == 1 and x.ndim else None)
        strategies = keep_strategies(maps, 1, partials_of([x]), [True] + [False] * (len(maps) - 1))
        return OpPlan([tuple(shape)], strategies)

    @_KINDS.kind("gather", ("input", "dim", "index", "sparse_grad"), ("dim",))
    def _plan_gather(self, call: OpCall) -> OpPlan:
        x = call.specs[0]
        idx = self._index_spec(call)
        dim = self._dim(call, x.ndim)
        if idx is None:
            raise ShardingError(f"{call.describe()}: gather needs its index as a DTensor")
        if idx.ndim != x.ndim:
            if math.prod(idx.shape) == 0:  # torch accepts an empty index of any rank
                return OpPlan([idx.shape], [])
            raise ValueError("Index tensor must have the same number of dimensions as input tensor")
        same = {k for k in range(x.ndim) if k != dim and x.shape[k] == idx.shape[k]}
        maps = [{k: k for k in same}, {k: k for k in range(idx.ndim) if k == dim or k in same}]
        strategies = keep_strategies(maps, 1, partials_of([x]), [True, False])
        return OpPlan([idx.shape], strategies)

    @_KINDS.kind("scatter_add", ("input", "dim", "index", "src"), ("dim",))
    @_KINDS.kind("scatter", ("input", "dim", "index", "src", "reduce"), ("dim", "reduce"))
    def _plan_scatter(self, call: OpCall) -> OpPlan:
        x = call.specs[0]
        dim = self._dim(call, x.ndim)
        idx = self._index_spec(call)
        src = self._index_spec(call, "src")
        if idx is None:
            raise ShardingError(f"{call.describe()}: scatter needs its index as a DTensor")
        others = [s for s in (idx, src) if s is not None]
        same = {
            k
            for k in range(x.ndim)
            if k != dim and all(s.ndim == x.ndim and s.shape[k] == x.shape[k] for s in others)
        }
        keep = {k: k for k in same}
        maps: list[dict[int, int] | None] = [keep] * len(call.specs)
        flags = [r in ("input", "src") for r in call.arg_roles]
        partials: list[Partial] = []
        if src is not None and call.static.get("reduce") is None:
            ops = ("sum", "avg") if self.params.kind == "scatter_add" else None
            partials = [p for p in partials_of([x]) if ops is None or p.reduce_op in ops]
        return OpPlan([x.shape], keep_strategies(maps, 1, partials, flags))


def strided_slice_index(
    begin: Sequence[int],
    end: Sequence[int],
    strides: Sequence[int],
    begin_mask: int = 0,
    end_mask: int = 0,
    ellipsis_mask: int = 0,
    new_axis_mask: int = 0,
    shrink_axis_mask: int = 0,
) -> tuple:
    """The python index ``x[index]`` a strided slice stands for: position ``i`` is an
    Ellipsis (``ellipsis_mask`` bit ``i``), a new axis (``new_axis_mask``), the int
    ``begin[i]`` (``shrink_axis_mask``) or ``slice(begin[i], end[i], strides[i])`` with the
    start (``begin_mask``) or stop (``end_mask``) left open; dims past the last position are
    whole.

    Raises:
        ValueError: begin/end/strides of different lengths, a zero stride.
        TypeError: an argument that is not a sequence of ints.
    """
    for name, v in (("begin", begin), ("end", end), ("strides", strides)):
        if not isinstance(v, (tuple, list)):
            raise TypeError(f"strided slice: {name} must be a tuple of ints, got {v!r}")
    n = len(begin)
    if len(end) != n or len(strides) != n:
        raise ValueError(
            f"strided slice: begin, end and strides must have the same length, got "
            f"{len(begin)}, {len(end)} and {len(strides)}"
        )
    items: list[Any] = []
    for i in range(n):
        bit = 1 << i
        if ellipsis_mask & bit:
            items.append(Ellipsis)
        elif new_axis_mask & bit:
            items.append(None)
        else:
            step = as_int(strides[i], "strides")
            if step == 0:
                raise ValueError("strided slice: strides must not be 0")
            if shrink_axis_mask & bit:
                items.append(as_int(begin[i], "begin"))
                continue
            items.append(
                slice(
                    None if begin_mask & bit else as_int(begin[i], "begin"),
                    None if end_mask & bit else as_int(end[i], "end"),
                    step,
                )
            )
    return tuple(items)


def _leading_index_tensors(
    form: IndexForm, x: Any
) -> list[tuple[int | None, tuple[int, ...], str]] | None:
    """For ``x[i0, i1, ..., :, ...] = v`` with integer index DTensors on the leading dims
    (nothing else but whole slices / Ellipsis after them) into a target sharded on one of
    those dims: the index tensors as :func:`~hyper_shard.rules.index_put.index_put_layout`
    takes them; else None (the form this rule writes itself)."""
    items = [it for it in form.items if it.kind != "ellipsis"]
    adv = [it for it in items if it.kind == "adv"]
    if not adv or any(it.spec is None for it in adv):
        return None
    k = len(adv)
    if [it.dims[0] for it in adv] != list(range(k)) or form.items[:k] != adv:
        return None
    if any(it.kind != "slice" or it.dims[0] not in form.keep for it in items[k:]):
        return None
    if not any(type(p) is Shard and p.dim < k for p in x.placements):
        return None
    return [(it.spec, tuple(it.shape), "int") for it in adv]


def _value_shard(vspec: Any, form: IndexForm, o: int, out_nd: int) -> Placement:
    """The value's placement where the target is sharded on an untouched dim landing on
    result dim ``o``: sharded alike where the value has that dim at full size."""
    if vspec is None:
        return R
    vd = o - (out_nd - vspec.ndim)
    size = form.out_shape[o]
    if vd >= 0 and size is not None and vspec.shape[vd] == size and size != 1:
        return Shard(vd)
    return R


def _check_value_shape(vshape: Sequence[int], out: Sequence[int | None]) -> None:
    lead = len(out) - len(vshape)
    for k, n in enumerate(vshape):
        o = k + lead
        if o < 0:
            if n != 1:
                raise ValueError(
                    f"shape mismatch: value tensor of shape {list(vshape)} cannot be broadcast "
                    f"to indexing result of shape {list(out)}"
                )
            continue
        want = out[o]
        if n != 1 and want is not None and n != want:
            raise ValueError(
                f"shape mismatch: value tensor of shape {list(vshape)} cannot be broadcast to "
                f"indexing result of shape {list(out)}"
            )
        if want is None and n != 1:
            raise ShardingError(
                f"a value of shape {list(vshape)} for a boolean-mask write: its leading dim would "
                f"have to match the mask's number of True elements, which is data-dependent; "
                f"write a scalar or a value broadcast over the masked elements"
            )
