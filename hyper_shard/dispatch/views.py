"""View semantics: in-place writes through a view of a DTensor land in its base.

A view op (``x[:2]``, ``narrow``, ``select``, ``split``/``chunk``/``unbind``, ``diagonal``,
``view``/``reshape``/``transpose``/``unsqueeze``... — the ops whose framework result is a
view of their input) runs the framework's own view op on the local shard. When its
decision moves nothing, the result's local data *is* a view of the base's local data:
in-place writes through it land in the base on every rank, exactly as in plain torch.

When the decision had to move the base's data (a slice of a sharded dim gathers it), the
result is a copy: a *copied view*. It gets a :class:`ViewCopySpec` (so every op on it
takes the dispatcher's slow path; the hot path pays nothing) and a link to its base. An
in-place op on a copied view — or on a view of one — is written back to the base after it
runs:

* views that are a basic index of the base (getitem with slices/ints, narrow, select,
  split/chunk/unbind pieces) are written with ``base[index] = view`` (the setitem rule:
  every rank writes the part of the slice it owns, nothing of the base is gathered);
* any other view (diagonal, a reshape or transpose that needed communication) replays the
  view op on the base's full value, writes the view's value through it and copies the
  result into the base (``base.copy_``), which gathers the base once.

Either way the base ends up as plain torch would leave it, autograd included (the write
back is made of differentiable ops). A copied view is a snapshot for reading: a write to
the base *after* the view was taken does not show in it (it does in plain torch, where the
view shares memory); take the view again after writing the base. Platforms without view
semantics (MindSpore) do not link views.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ..placement import Replicate
from ..spec import DTensorSpec, intern_spec_key

__all__ = ["ViewOf", "ViewCopySpec", "link_views", "write_back"]


@dataclass(frozen=True)
class ViewOf:
    """A rule's statement that its outputs are views of the call's first DTensor input.

    Attributes:
        index: ``index(i)`` -> the basic index (ints, slices) such that output ``i`` is
            ``base[index]``; None when the view is not a basic index (diagonal, reshape).
    """

    index: Callable[[int], Any] | None = None


class ViewCopySpec(DTensorSpec):
    """The spec of a copied view: the same layout as its :class:`DTensorSpec`, under another
    cache key (so decisions on it are never the hot path's)."""

    __slots__ = ()

    def __init__(self, spec: DTensorSpec) -> None:
        super().__init__(spec.mesh, spec.placements, spec.tensor_meta, spec.shard_order)
        self.key = (*self.key, "view-copy")  # type: ignore[assignment]
        self._hash = hash(self.key)
        self._id = intern_spec_key(self.key)
        self._cid = str(self._id)  # a compiled region names the layout by it

    def __reduce__(self) -> tuple:
        spec = DTensorSpec(self.mesh, self.placements, self.tensor_meta, self.shard_order)
        return (ViewCopySpec, (spec,))


class _Link:
    """Output ``index`` of a view op on ``base``; ``copy``: the decision moved the base's
    data (the output is a copy to write back), else it aliases the base's local data."""

    __slots__ = ("base", "copy", "view", "func", "args", "kwargs", "index")

    def __init__(
        self, base: Any, copy: bool, view: ViewOf, func: Any, args: tuple, kwargs: dict, index: int
    ) -> None:
        self.base, self.copy, self.view = base, copy, view
        self.func, self.args, self.kwargs, self.index = func, args, kwargs, index


def link_views(
    out: Any, dts: Sequence[Any], moved: bool, view: ViewOf, func: Any, args: tuple, kwargs: dict
) -> None:
    """Link the outputs of a view op to its base ``dts[0]`` when they are copies (``moved``)
    or views of a copied view; other views alias their base and need nothing."""
    base = dts[0]
    if not moved and type(base._spec) is not ViewCopySpec:
        return
    outs = out if isinstance(out, (tuple, list)) else (out,)
    i = 0
    for o in outs:
        if hasattr(o, "_spec"):
            o.__dict__["_hs_view"] = _Link(base, moved, view, func, args, kwargs, i)
            o._spec = ViewCopySpec(o._spec)
            i += 1


def write_back(target: Any, dispatcher: Any) -> None:
    """After an in-place op on ``target`` (a copied view, or a view of one): write the change
    into the base that owns the data (see the module docstring)."""
    node = target
    while True:
        link = node.__dict__.get("_hs_view")
        if link is None:
            return
        if link.copy:
            _write(link, node, dispatcher)
            return  # the base's own in-place write continues up its chain
        node = link.base  # an alias: its data is the base's, look further up


def _write(link: _Link, view: Any, dispatcher: Any) -> None:
    base = link.base
    idx = link.view.index
    if idx is not None:
        base[idx(link.index)] = view  # the setitem rule: each rank writes what it owns
        return
    plat = dispatcher.platform
    spec = base._spec
    full = plat.clone(base.full_tensor())  # the base's global value, a tensor of its own
    is_dt = dispatcher.is_dtensor

    def sub(a: Any) -> Any:
        if a is base:
            return full
        if is_dt(a):
            return a.full_tensor()
        if type(a) in (list, tuple):
            return type(a)(sub(x) for x in a)
        return a

    target = dispatcher.run_local(
        link.func, tuple(sub(a) for a in link.args), {k: sub(v) for k, v in link.kwargs.items()}
    )
    if isinstance(target, (tuple, list)):
        target = target[link.index]
    plat.copy_plain(target, view.full_tensor())  # through the framework's own view of full
    # all Replicate: the global shape is full's (no shape=: from_local wants it with stride=)
    rep = type(base).from_local(full, spec.mesh, [Replicate()] * spec.mesh.ndim)
    base.copy_(rep)
