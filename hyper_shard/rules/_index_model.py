"""The index model behind ``rule: index``: how torch reads ``tensor[index]`` on a GLOBAL
shape (ints, slices, None, Ellipsis, python bools, integer/boolean index tensors and lists),
which input dims an index touches and where every dim of the result comes from.

Pure python: index DTensors are recognised by their ``_spec``, plain 0-d tensors by their
``shape``/``dtype``; nothing imports a framework. Checked against torch's own results in
``tests/unit/test_tensor_op_rules.py``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ..errors import ShardingError
from ._util import broadcast_shapes
from .planned import as_int

__all__ = ["IndexForm", "parse_index", "local_slice"]

_INT_DTYPES = ("int64", "int32", "int16", "int8", "uint8", "long", "int")


def _dtype_kind(dtype: Any) -> str:
    name = str(dtype).rsplit(".", 1)[-1].lower()  # torch.int64, MindSpore's Int32
    if name in ("bool", "uint8"):  # torch reads a uint8 index as a (deprecated) mask
        return "bool"
    if name in _INT_DTYPES or name.startswith(("int", "uint")):
        return "int"
    return "other"


# ---------------------------------------------------------------------- the index model
@dataclass
class _Item:
    """One index item. ``kind``: int, slice, new (None/True/False), adv (integer tensor or
    list), mask (boolean tensor), ellipsis. ``spec`` is the position in ``call.specs`` of a
    DTensor item."""

    kind: str
    pos: int
    value: Any = None
    spec: int | None = None
    shape: tuple[int, ...] = ()
    dims: tuple[int, ...] = ()  # input dims it consumes


@dataclass
class IndexForm:
    """A parsed index on a tensor of a given global shape.

    Attributes:
        items: the items, in order (Ellipsis expanded into nothing: see ``view``).
        tuple_form: the index was a tuple (or a list torch reads as one).
        out_shape: the result's global shape (None for a mask's data-dependent size).
        keep: untouched input dim -> result dim.
        slices: input dim indexed by a partial slice -> (item, result dim).
        ints: input dim indexed by an int -> item.
        adv_out: for every index DTensor (by spec position) ``{index dim: result dim}`` of
            its dims that may stay sharded.
        masks: boolean mask DTensor items.
    """

    items: list[_Item]
    tuple_form: bool
    out_shape: tuple[int | None, ...]
    keep: dict[int, int] = field(default_factory=dict)
    slices: dict[int, tuple[_Item, int]] = field(default_factory=dict)
    ints: dict[int, _Item] = field(default_factory=dict)
    adv_out: dict[int, dict[int, int]] = field(default_factory=dict)
    masks: list[_Item] = field(default_factory=list)
    adv: list[_Item] = field(default_factory=list)


def _list_shape(v: Any) -> tuple[tuple[int, ...], str]:
    """Shape and leaf kind (int/bool) of a nested list index."""
    if isinstance(v, (list, tuple)):
        if not v:
            return (0,), "int"
        subs = [_list_shape(x) for x in v]
        if any(s != subs[0][0] for s, _ in subs):
            raise ValueError(f"index list {v!r} is ragged")
        kinds = {k for _, k in subs}
        return (len(v), *subs[0][0]), ("bool" if kinds == {"bool"} else "int")
    if isinstance(v, bool):
        return (), "bool"
    as_int(v, "index list element")
    return (), "int"


def _is_sequence_index(v: Any) -> bool:
    return isinstance(v, (list, tuple))


def _treat_as_tuple(index: Any) -> bool:
    """torch's rule: a tuple, or a short list holding a slice, None, Ellipsis, a sequence or
    a tensor, is a tuple of items."""
    if isinstance(index, tuple):
        return True
    if not isinstance(index, list) or len(index) >= 32:
        return False
    return any(
        isinstance(x, (slice, list, tuple)) or x is None or x is Ellipsis or hasattr(x, "shape")
        for x in index
    )


def parse_index(shape: Sequence[int], index: Any, first_spec: int = 1) -> IndexForm:
    """The :class:`IndexForm` of ``tensor[index]`` for a tensor of global ``shape``.

    DTensor items (objects with a ``_spec``) are numbered from ``first_spec`` in order of
    appearance, as the dispatcher lists them in ``call.specs``.

    Raises:
        IndexError: too many indices, more than one Ellipsis, an int out of range.
        TypeError: an index of a type torch refuses.
        ValueError: a mask or list whose shape does not match the indexed dims.
    """
    tuple_form = _treat_as_tuple(index)
    raw = list(index) if tuple_form else [index]
    ndim = len(shape)
    items: list[_Item] = []
    n_spec = first_spec
    for pos, v in enumerate(raw):
        spec = getattr(v, "_spec", None)
        if v is None:
            items.append(_Item("new", pos, 1))
        elif v is Ellipsis:
            items.append(_Item("ellipsis", pos))
        elif isinstance(v, bool):
            items.append(_Item("new", pos, 1 if v else 0))
        elif isinstance(v, slice):
            items.append(_Item("slice", pos, v))
        elif spec is not None:
            kind = _dtype_kind(spec.dtype)
            if kind == "other":
                raise TypeError(
                    f"tensors used as indices must be long, int or bool tensors, got {spec.dtype}"
                )
            if spec.ndim == 0:
                if kind == "bool":
                    raise ShardingError(
                        "a 0-d boolean DTensor index makes the result's shape depend on its "
                        "value; index with a python bool instead"
                    )
                items.append(_Item("int", pos, None, spec=n_spec))
            elif kind == "bool":
                items.append(_Item("mask", pos, None, spec=n_spec, shape=spec.shape))
            else:
                items.append(_Item("adv", pos, None, spec=n_spec, shape=spec.shape))
            n_spec += 1
        elif hasattr(v, "shape") and hasattr(v, "dtype"):  # a plain 0-d tensor (a scalar)
            if tuple(v.shape) != ():
                raise TypeError("a plain tensor index must be 0-d; wrap it as a DTensor")
            if _dtype_kind(v.dtype) == "bool":
                raise ShardingError(
                    "a 0-d boolean tensor index makes the result's shape depend on its value; "
                    "index with a python bool instead"
                )
            items.append(_Item("int", pos, None))
        elif _is_sequence_index(v):
            lshape, lkind = _list_shape(v)
            if lkind == "bool":
                if len(lshape) != 1:
                    raise TypeError(
                        "a nested boolean list index is not supported; use a mask DTensor"
                    )
                count = sum(1 for x in v if x)
                items.append(_Item("adv", pos, v, shape=(count,)))
                items[-1].dims = (-1,)  # marks a boolean list over one dim
            else:
                items.append(_Item("adv", pos, v, shape=lshape))
        else:
            items.append(_Item("int", pos, as_int(v, "index")))
    consumed = sum(
        len(it.shape) if it.kind == "mask" else 1
        for it in items
        if it.kind in ("int", "slice", "adv", "mask")
    )
    if sum(it.kind == "ellipsis" for it in items) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if consumed > ndim:
        raise IndexError(f"too many indices for tensor of dimension {ndim}")
    # walk the items over the input dims; "view" = the dims after basic indexing
    view: list[tuple[str, Any]] = []
    form = IndexForm(items, tuple_form, ())
    d = 0

    def full_dim(k: int) -> None:
        view.append(("dim", k))

    for it in items:
        if it.kind == "new":
            view.append(("new", it.value))
        elif it.kind == "ellipsis":
            for _ in range(ndim - consumed):
                full_dim(d)
                d += 1
        elif it.kind == "int":
            it.dims = (d,)
            if it.value is not None:
                n = shape[d]
                if not -n <= it.value < n:
                    raise IndexError(
                        f"index {it.value} is out of bounds for dimension {d} with size {n}"
                    )
            form.ints[d] = it
            d += 1
        elif it.kind == "slice":
            it.dims = (d,)
            view.append(("slice", it))
            d += 1
        elif it.kind == "adv":
            if it.dims == (-1,) and len(it.value) != shape[d]:
                raise IndexError(
                    f"the shape of the mask [{len(it.value)}] at index 0 does not match the "
                    f"shape of the indexed tensor [{shape[d]}]"
                )
            it.dims = (d,)
            view.append(("adv", it))
            d += 1
        else:  # mask
            k = len(it.shape)
            if tuple(shape[d : d + k]) != it.shape:
                raise IndexError(
                    f"the shape of the mask {list(it.shape)} does not match the shape of the "
                    f"indexed tensor {list(shape[d : d + k])} at dims {d}..{d + k - 1}"
                )
            it.dims = tuple(range(d, d + k))
            view.append(("adv", it))
            d += k
    while d < ndim:
        full_dim(d)
        d += 1
    # advanced indices: one broadcast block, in place if adjacent, else first
    adv_at = [i for i, (k, _) in enumerate(view) if k == "adv"]
    adv_items = [it for k, it in view if k == "adv"]
    form.adv = [it for it in adv_items if it.kind == "adv"]
    form.masks = [it for it in adv_items if it.kind == "mask"]
    block: tuple[int | None, ...] = ()
    if adv_items:
        if form.masks:
            if len(adv_items) > 1:
                raise ShardingError(
                    "a boolean mask DTensor combined with other index tensors is not supported; "
                    "index in two steps"
                )
            block = (None,)
        else:
            block = broadcast_shapes(*(it.shape for it in adv_items))
    adjacent = not adv_at or adv_at == list(range(adv_at[0], adv_at[-1] + 1))
    out: list[int | None] = []
    entries = [e for e in view if e[0] != "adv"]
    insert_at = adv_at[0] if adjacent and adv_at else 0
    rest_before = [e for i, e in enumerate(view) if e[0] != "adv" and i < insert_at]
    rest_after = [e for i, e in enumerate(view) if e[0] != "adv" and i >= insert_at]
    if not adjacent:
        rest_before, rest_after = [], entries
    for e in rest_before:
        _emit(e, shape, out, form)
    b0 = len(out)
    out.extend(block)
    for e in rest_after:
        _emit(e, shape, out, form)
    for it in form.adv:
        if it.spec is None:
            continue
        r = len(it.shape)
        form.adv_out[it.spec] = {
            j: b0 + len(block) - r + j for j in range(r) if it.shape[j] == block[len(block) - r + j]
        }
    form.out_shape = tuple(out)
    return form


def _emit(entry: tuple[str, Any], shape: Sequence[int], out: list, form: IndexForm) -> None:
    kind, v = entry
    if kind == "new":
        out.append(v)
    elif kind == "dim":
        form.keep[v] = len(out)
        out.append(shape[v])
    else:  # slice
        it: _Item = v
        d = it.dims[0]
        n = shape[d]
        sl: slice = it.value
        if sl.step is not None and as_int(sl.step, "slice step") <= 0:
            raise ValueError("step must be greater than zero")
        start, stop, step = sl.indices(n)
        length = len(range(start, stop, step))
        if length == n:  # the whole dim: untouched
            form.keep[d] = len(out)
        else:
            form.slices[d] = (it, len(out))
        out.append(length)


def local_slice(sl: slice, n: int, lo: int, size: int) -> tuple[slice | None, int, int]:
    """The part of ``sl`` (over a dim of ``n`` elements) inside this rank's ``[lo, lo+size)``:
    (local slice or None if empty, index of its first element in the slice's result, count)."""
    start, stop, step = sl.indices(n)
    total = len(range(start, stop, step))
    k_lo = max(0, -(-(lo - start) // step))
    k_hi = min(total, max(0, -(-(lo + size - start) // step)))
    cnt = max(0, k_hi - k_lo)
    if cnt == 0:
        return None, 0, 0
    first = start + k_lo * step - lo
    return slice(first, first + (cnt - 1) * step + 1, step), k_lo, cnt
