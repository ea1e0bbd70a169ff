"""Products whose einsum equation depends on the operands' ranks or a dims argument:
``torch.inner``, ``torch.tensordot`` and ``torch.linalg.vecdot`` (``rule: inner``,
``tensordot``, ``vecdot``); the einsum rule then decides (:mod:`.einsum`): output labels
keep their shards, a sharded contracted label gives ``Partial(sum)``, exactly one
``Partial`` factor passes through.

* ``inner(a, b)``: the last dims are contracted, the output is ``a``'s other dims then
  ``b``'s; a 0-d operand multiplies (``inner(2, b) = 2 * b``);
* ``tensordot(a, b, dims)``: ``dims`` an int ``n`` (the last ``n`` of ``a`` with the first
  ``n`` of ``b``) or two lists of dims; a size-1 contracted dim broadcasts as in torch;
* ``linalg.vecdot(x, y, dim=-1)``: broadcast, then contract ``dim`` (real dtypes: torch
  conjugates ``x`` first, which is the identity there).

Semantics follow the torch functions of the same names. Framework-neutral.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ..registry.models import RuleParams
from . import register_rule
from ._util import normalize_dim
from .einsum import EinsumOp, Equation

__all__ = ["InnerOp", "TensordotOp", "VecdotOp"]


class _FormParams(RuleParams):
    bias: None = None
    bias_arg: str = "bias"
    equation: str = "from the operands"


def _labels(prefix: str, n: int) -> tuple[str, ...]:
    return tuple(f"{prefix}{i}" for i in range(n))


class _FormOp(EinsumOp):
    Params = _FormParams  # type: ignore[assignment]

    def _two(self, call: OpCall) -> tuple[Any, Any]:
        if len(call.specs) != 2:
            raise ShardingError(
                f"{call.describe()}: {self.name} takes two DTensor operands on one mesh"
            )
        return call.specs[0], call.specs[1]


@register_rule("inner")
class InnerOp(_FormOp):
    """``torch.inner(input, other)`` (see the module docstring)."""

    signature = ("input", "other")  # type: ignore[assignment]

    def equation(self, call: OpCall) -> Equation:
        a, b = self._two(call)
        la, lb = _labels("a", a.ndim), _labels("b", b.ndim)
        if a.ndim == 0 or b.ndim == 0:  # a scalar times the other operand
            return Equation((la, lb), la + lb)
        if a.shape[-1] != b.shape[-1]:
            raise ShardingError(
                f"{call.describe()}: inner() the last dimension must match on both input "
                f"tensors but got shapes {list(a.shape)} and {list(b.shape)}"
            )
        la, lb = la[:-1] + ("k",), lb[:-1] + ("k",)
        return Equation((la, lb), la[:-1] + lb[:-1])


@register_rule("tensordot")
class TensordotOp(_FormOp):
    """``torch.tensordot(a, b, dims=2)`` (see the module docstring)."""

    signature = ("a", "b", "dims", "out")  # type: ignore[assignment]
    static_args = ("dims",)

    def equation(self, call: OpCall) -> Equation:
        a, b = self._two(call)
        dims = call.static.get("dims", 2)
        dims = 2 if dims is None else dims
        if isinstance(dims, (list, tuple)):
            if len(dims) != 2:
                raise ShardingError(
                    f"{call.describe()}: tensordot expects dims to be an int or two lists of "
                    f"dims, got {dims!r}"
                )
            da, db = (list(d) if isinstance(d, (list, tuple)) else [d] for d in dims)
        elif isinstance(dims, int) and not isinstance(dims, bool):
            if dims < 0 or dims > min(a.ndim, b.ndim):
                raise ShardingError(
                    f"{call.describe()}: tensordot expects 0 <= dims <= min(ndim), got {dims}"
                )
            da, db = list(range(a.ndim - dims, a.ndim)), list(range(dims))
        else:
            raise ShardingError(
                f"{call.describe()}: tensordot on DTensors takes dims as an int or two lists of "
                f"ints, got {type(dims).__name__}"
            )
        if len(da) != len(db):
            raise ShardingError(
                f"{call.describe()}: both dimension lists should have the same length, got "
                f"{da} and {db}"
            )
        da = [normalize_dim(int(d), a.ndim) for d in da]
        db = [normalize_dim(int(d), b.ndim) for d in db]
        la, lb = list(_labels("a", a.ndim)), list(_labels("b", b.ndim))
        for i, (x, y) in enumerate(zip(da, db)):
            if a.shape[x] != b.shape[y] and 1 not in (a.shape[x], b.shape[y]):
                raise ShardingError(
                    f"{call.describe()}: contracted dimensions need to match, but first has "
                    f"size {a.shape[x]} in dim {x} and second has size {b.shape[y]} in dim {y}"
                )
            la[x] = lb[y] = f"k{i}"
        out = tuple(la[d] for d in range(a.ndim) if d not in da) + tuple(
            lb[d] for d in range(b.ndim) if d not in db
        )
        return Equation((tuple(la), tuple(lb)), out)


@register_rule("vecdot")
class VecdotOp(_FormOp):
    """``torch.linalg.vecdot(x, y, dim=-1)`` (see the module docstring)."""

    signature = ("x", "y", "dim")  # type: ignore[assignment]
    static_args = ("dim",)

    def equation(self, call: OpCall) -> Equation:
        a, b = self._two(call)
        n = max(a.ndim, b.ndim)
        dim = call.static.get("dim")
        d = normalize_dim(-1 if dim is None else int(dim), n, "dim")
        full = [f"l{i}" for i in range(n)]
        full[d] = "k"
        out = tuple(x for i, x in enumerate(full) if i != d)
        return Equation((tuple(full[n - a.ndim :]), tuple(full[n - b.ndim :])), out)
