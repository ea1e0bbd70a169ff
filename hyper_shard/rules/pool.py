"""Pooling (``rule: pool``): ``max_pool1d/2d/3d`` (values, and indices with
``return_indices``), ``avg_pool1d/2d/3d`` and the ``adaptive_`` forms, semantics and
argument names as ``torch.nn.functional``'s.

Global shapes: input ``(N, C, *spatial)`` or unbatched ``(C, *spatial)``; the output keeps
the leading dims and has the pooled spatial sizes (``(L + 2p - d(k - 1) - 1) / s + 1``,
rounded down or, with ``ceil_mode``, up unless the last window starts in the right
padding; ``output_size`` for the adaptive forms, ``None`` keeping a size). Per mesh dim:

* the batch and channel dims keep their shards (every window lies in one plane); the
  indices of ``return_indices`` count within a plane, so they are the same on every shard;
* average pools are linear in the input: ``Partial(sum|avg)`` passes through;
* a sharded **spatial** dim stays sharded where the windows tile it (``kernel_size ==
  stride``, ``padding`` 0, ``dilation`` 1: the common 2x2 / stride-2 pool) and every shard
  is a whole number of windows whose counts are the output's ``torch.chunk`` layout; any
  other spatial shard (overlapping windows would need the neighbours' border rows, a halo
  exchange hyper_shard does not implement; an adaptive window may span the whole dim) is
  redistributed first, at the cheapest modelled cost, as convolutions do;
* a channel shard that would be empty on some rank (more ranks than channels) is gathered
  instead: torch's pooling kernels refuse an empty plane.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

import operator
from typing import Any, Literal

from ..dispatch.op import OpCall
from ..errors import ShardingError
from ..registry.models import RuleParams
from . import register_rule
from ._util import window_shards_align
from .planned import OpPlan, PlannedOp, keep_strategies, partials_of
from .tensor_along import nonempty_shards

__all__ = ["PoolOp", "PoolParams", "pool_output_size"]

_SIGNATURES = {
    "max": (
        ("input", "kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
        ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices"),
    ),
    "avg": (
        ("input", "kernel_size", "stride", "padding", "ceil_mode", "count_include_pad",
         "divisor_override"),
        ("kernel_size", "stride", "padding", "ceil_mode"),
    ),
    "adaptive_max": (("input", "output_size", "return_indices"), ("output_size", "return_indices")),
    "adaptive_avg": (("input", "output_size"), ("output_size",)),
}  # fmt: skip


class PoolParams(RuleParams):
    """``dims``: spatial dims; ``kind``: the pool; ``indices``: whether the op returns
    (values, indices): ``arg`` (as ``return_indices`` says), ``always``, ``never``."""

    dims: Literal[1, 2, 3]
    kind: Literal["max", "avg", "adaptive_max", "adaptive_avg"]
    indices: Literal["arg", "always", "never"] = "never"


def _tuple(v: Any, n: int, what: str, default: Any = None) -> tuple[Any, ...]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        if default is None:
            raise TypeError(f"{what} is required")
        v = default
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            return (v[0],) * n
        if len(v) != n:
            raise ValueError(f"{what} must have {n} elements, got {list(v)}")
        return tuple(v)
    return (v,) * n


def pool_output_size(size: int, k: int, s: int, p: int, d: int, ceil_mode: bool) -> int:
    """One spatial output size of a max/avg pool, as torch computes it.

    Raises:
        ValueError: a non-positive output size or a padding over half the kernel.
    """
    if p > (d * (k - 1) + 1) // 2:
        raise ValueError(f"pad should be at most half of effective kernel size, got pad={p}")
    span = size + 2 * p - d * (k - 1) - 1
    out = (-(-span // s) if ceil_mode else span // s) + 1
    if ceil_mode and (out - 1) * s >= size + p:
        out -= 1
    if out <= 0:
        raise ValueError(f"the pooled output size would be {out} (input size {size}, kernel {k})")
    return out


@register_rule("pool")
class PoolOp(PlannedOp):
    """Max / average / adaptive pooling (see the module docstring).

    Raises:
        ShardingError: shapes torch would reject (the message names the call).
    """

    Params = PoolParams

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        sig, static = _SIGNATURES[self.params.kind]
        self.use_signature(sig, static)

    def _spatial(self, call: OpCall) -> tuple[Any, int]:
        if call.arg_roles != ["input"]:
            raise ShardingError(f"{call.describe()}: {self.name} takes one DTensor input")
        x = call.specs[0]
        n = self.params.dims
        if x.ndim not in (n + 1, n + 2):
            raise ValueError(f"expected a {n + 1}-D or {n + 2}-D input, got {x.ndim}-D")
        return x, x.ndim - n

    def _out_spatial(self, call: OpCall, x: Any, lead: int) -> tuple[int, ...]:
        st, n, kind = call.static, self.params.dims, self.params.kind
        sizes = tuple(x.shape[lead:])
        if kind.startswith("adaptive"):
            osz = _tuple(st.get("output_size"), n, "output_size")
            return tuple(sizes[i] if o is None else operator.index(o) for i, o in enumerate(osz))
        k = tuple(operator.index(v) for v in _tuple(st.get("kernel_size"), n, "kernel_size"))
        s = tuple(operator.index(v) for v in _tuple(st.get("stride"), n, "stride", k))
        p = tuple(operator.index(v) for v in _tuple(st.get("padding"), n, "padding", 0))
        d = (1,) * n
        if kind == "max":
            d = tuple(operator.index(v) for v in _tuple(st.get("dilation"), n, "dilation", 1))
        ceil = bool(st.get("ceil_mode"))
        return tuple(pool_output_size(sizes[i], k[i], s[i], p[i], d[i], ceil) for i in range(n))

    def _n_out(self, call: OpCall) -> int:
        mode = self.params.indices
        if mode == "arg":
            return 2 if call.static.get("return_indices") else 1
        return 2 if mode == "always" else 1

    def plan(self, call: OpCall) -> OpPlan:
        x, lead = self._spatial(call)
        shape = (*x.shape[:lead], *self._out_spatial(call, x, lead))
        n_out = self._n_out(call)
        steps = self._tiling_steps(call, lead)
        keep = {d: d for d in (*range(lead), *steps)}
        linear = self.params.kind in ("avg", "adaptive_avg")
        parts = partials_of([x]) if linear else []
        planes = _nonempty_planes(call, lead)
        mesh_shape = call.mesh.shape

        def accept(ins: tuple, outs: tuple) -> bool:
            pl = ins[0]
            return planes(ins, outs) and (
                pl is None or window_shards_align(x.shape, pl, mesh_shape, steps, lead)
            )

        return OpPlan([shape] * n_out, keep_strategies([keep], n_out, parts), accept=accept)

    def _tiling_steps(self, call: OpCall, lead: int) -> dict[int, int]:
        """Spatial dim -> window length where the windows tile the dim (kernel == stride,
        padding 0, dilation 1; not adaptive, no indices returned)."""
        if self.params.kind.startswith("adaptive") or self._n_out(call) == 2:
            return {}  # max_pool's indices count within the whole plane: not local ones
        st, n = call.static, self.params.dims
        k = tuple(operator.index(v) for v in _tuple(st.get("kernel_size"), n, "kernel_size"))
        s = tuple(operator.index(v) for v in _tuple(st.get("stride"), n, "stride", k))
        p = tuple(operator.index(v) for v in _tuple(st.get("padding"), n, "padding", 0))
        d = (1,) * n
        if self.params.kind == "max":
            d = tuple(operator.index(v) for v in _tuple(st.get("dilation"), n, "dilation", 1))
        return {lead + i: s[i] for i in range(n) if k[i] == s[i] and p[i] == 0 and d[i] == 1}


def _nonempty_planes(call: OpCall, lead: int) -> Any:
    """Refuse a channel shard that is empty on some rank (an empty batch is fine)."""
    return nonempty_shards(call, lambda d: lead == 1 or d > 0)
