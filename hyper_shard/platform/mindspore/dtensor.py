"""The MindSpore DTensor: a ``mindspore.Tensor`` subclass hooked with ``__fallback__``.

To MindSpore, a DTensor *is* its local shard: an alias made by ``Tensor._make_subclass``
(same storage, autograd kept), so every kernel and the autograd tape see local data. The
subclass adds a :class:`~hyper_shard.spec.DTensorSpec` and MindSpore hands every Primitive
called with a DTensor argument to ``__fallback__``, which routes it to the shared
dispatcher (registry, rules, layout cache, planner); the local Primitive runs under
``NoFallbackGuard``.

What the subclass answers itself:

* ``shape``, ``size`` (numel, a property in MindSpore 2.10), ``numel()``, ``len()``: the
  GLOBAL tensor (``ndim`` is the same locally and globally);
* ``str``/``repr``: the local shard and the layout (no communication);
* ``asnumpy()``, ``numpy()``, ``__array__``, ``item()``, ``tolist()``, ``bool``/``int``/
  ``float``: the FULL tensor (a collective: every rank must call them);
* reflected operators (``plain + dt``, ``2 / dt``, ``plain @ dt``...): MindSpore only looks
  ``__fallback__`` up on the left operand of a Tensor method, so these run the op with the
  DTensor as an argument instead;
* indexing ``dt[idx]`` / ``dt[idx] = v``: MindSpore's C++ indexing bypasses ``__fallback__``
  and would silently return a plain local slice, so both go through the dispatcher under the
  pseudo-Primitive names ``__getitem__`` / ``__setitem__`` (an op-spec entry binds them);
* ``mindspore.Parameter(dt)`` keeps the spec (``__new__`` is what Parameter calls).
"""

from __future__ import annotations

import math
from typing import Any

from mindspore import Parameter, Tensor, mint

from ...dtensor import DTensor, _format
from ...spec import DTensorSpec
from .dispatch import getitem_call, ms_dispatch, set_dtensor_type, setitem_call, tensor_method
from .hooks import NoFallbackGuard

__all__ = ["MindSporeDTensor", "wrap", "make_leaf"]

_local_shape = Tensor.shape.fget


class MindSporeDTensor(DTensor, Tensor):  # type: ignore[misc]
    """hyper_shard's DTensor on MindSpore (see :class:`hyper_shard.DTensor`).

    ``shape`` is the global shape; ``to_local()`` the local shard (a plain
    ``mindspore.Tensor`` sharing storage).
    """

    _spec: DTensorSpec = None  # type: ignore[assignment]

    def __new__(cls, data: Any, *args: Any, **kwargs: Any) -> MindSporeDTensor:
        # mindspore.Parameter(dt) calls type(dt).__new__(ParameterMindSporeDTensor, dt)
        out = Tensor._make_subclass(cls, data)
        out._spec = getattr(data, "_spec", None)
        return out

    def __fallback__(self, func: Any, args: tuple, kwargs: Any = None) -> Any:
        return ms_dispatch(func, args, kwargs or {})

    # ------------------------------------------------------------------ metadata
    @property
    def shape(self) -> tuple[int, ...]:  # type: ignore[override]
        spec = self._spec
        return tuple(spec.shape) if spec is not None else tuple(_local_shape(self))

    @property
    def size(self) -> int:  # type: ignore[override]
        return math.prod(self.shape)

    def numel(self) -> int:
        return math.prod(self.shape)

    def nelement(self) -> int:
        return math.prod(self.shape)

    def __len__(self) -> int:
        shape = self.shape
        if not shape:
            raise TypeError("len() of a 0-d DTensor")
        return shape[0]

    def __str__(self) -> str:
        return _format(self)

    def __repr__(self) -> str:
        return _format(self)

    def __format__(self, spec: str) -> str:
        return _format(self) if spec == "" else format(self.full_tensor(), spec)

    # ------------------------------------------------------------------ full-tensor views
    def asnumpy(self) -> Any:
        """The full tensor as a numpy array (a collective: every rank must call it)."""
        return self.full_tensor().asnumpy()

    def numpy(self) -> Any:
        return self.full_tensor().asnumpy()

    def __array__(self, dtype: Any = None) -> Any:
        a = self.full_tensor().asnumpy()
        return a if dtype is None else a.astype(dtype, copy=False)

    def item(self) -> Any:
        return self.full_tensor().item()

    def tolist(self) -> Any:
        return self.full_tensor().tolist()

    def __bool__(self) -> bool:
        return bool(self.full_tensor())

    def __int__(self) -> int:
        return int(self.full_tensor())

    def __float__(self) -> float:
        return float(self.full_tensor())

    def __index__(self) -> int:
        return self.full_tensor().__index__()

    # ------------------------------------------------------------------ hot methods
    # dispatched from Python (Tensor.<name> entries): no C++ fallback detour per call
    __add__ = tensor_method("__add__")
    __sub__ = tensor_method("__sub__")
    __mul__ = tensor_method("__mul__")
    __truediv__ = tensor_method("__truediv__")
    __matmul__ = tensor_method("__matmul__")
    __neg__ = tensor_method("__neg__")
    reshape = tensor_method("reshape")
    unsqueeze = tensor_method("unsqueeze")

    # ------------------------------------------------------------------ reflected operators
    def __radd__(self, other: Any) -> Any:
        return mint.add(other, self)

    def __rsub__(self, other: Any) -> Any:
        return mint.sub(other, self)

    def __rmul__(self, other: Any) -> Any:
        return mint.mul(other, self)

    def __rtruediv__(self, other: Any) -> Any:
        return mint.div(other, self)

    def __rmatmul__(self, other: Any) -> Any:
        return mint.matmul(other, self)

    def __rpow__(self, other: Any) -> Any:
        return mint.pow(other, self)

    # ------------------------------------------------------------------ indexing
    def __getitem__(self, index: Any) -> Any:
        return ms_dispatch(getitem_call, (self, index), {})

    def __setitem__(self, index: Any, value: Any) -> None:
        ms_dispatch(setitem_call, (self, index, value), {})

    # ------------------------------------------------------------------ copies
    def __deepcopy__(self, memo: dict) -> Any:
        if id(self) in memo:
            return memo[id(self)]
        from mindspore import ops

        with NoFallbackGuard():
            local = ops.deepcopy(Tensor._make_subclass(Tensor, self))
        out = wrap(local, self._spec)
        if isinstance(self, Parameter):  # Parameter.__deepcopy__ would drop the subclass
            out = Parameter(out, name=self.name, requires_grad=self.requires_grad)
        memo[id(self)] = out
        return out


set_dtensor_type(MindSporeDTensor)


def wrap(local: Tensor, spec: DTensorSpec) -> MindSporeDTensor:
    """Wrap a plain local tensor as a DTensor alias (same storage, autograd history kept)."""
    out = Tensor._make_subclass(MindSporeDTensor, local)
    out._spec = spec
    return out


def make_leaf(local: Tensor, spec: DTensorSpec, requires_grad: bool) -> MindSporeDTensor:
    """A DTensor over a fresh copy of ``local``'s data, with no autograd history.

    The copy is owned (never a view of a larger tensor such as ``distribute_tensor``'s
    chunk): MindSpore's optimizers refuse, or on CPU silently skip, in-place updates of
    views. ``requires_grad`` is not recorded: MindSpore's functional autograd decides what
    is differentiated.
    """
    from mindspore import ops

    return wrap(ops.deepcopy(local), spec)
