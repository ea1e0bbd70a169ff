"""Reductions over dims: sum, mean, amax/amin, max/min, argmax/argmin, prod, std/var,
all/any, vector norms, logsumexp.

YAML parameters (see ``op_specs/reduction.yaml``):

* ``reduce_op``: what the op computes, which decides how a *reduced* dim may stay sharded
  and which Partial inputs may stay Partial:

  ===========================  ===========================  ===========================
  reduce_op                    reduced dim sharded          Partial input kept
  ===========================  ===========================  ===========================
  ``sum``                      output ``Partial(sum)``      ``Partial(sum|avg)`` (linear)
  ``mean``                     ``Partial(sum)`` of local    ``Partial(sum|avg)`` (linear)
                               sum / GLOBAL count
  ``amax`` / ``amin``          ``Partial(max)``/``(min)``   ``Partial(max)``/``(min)``
  ``max`` / ``min``            as amax/amin for ``max(x)``; ``max(x, dim)`` returns
                               ``(values, indices)``: the reduced dim must be Replicate;
                               ``max(x, other)`` is the elementwise maximum (pointwise)
  ``argmax``, ``argmin``,      Replicate (gathered)         none (reduced first)
  ``prod``, ``std``, ``var``,
  ``all``, ``any``, ``norm``,
  ``logsumexp``, ``none``
  ===========================  ===========================  ===========================

  Arg-reductions are never partial: indices must be global. A vector norm is not linear
  over a sharded dim (``|a| + |b| != |(a, b)|``), nor is it over a ``Partial(sum)`` value:
  ``vector_norm``/``norm`` have their own rule (:mod:`.vector_norm`), which reduces a
  sharded dim shard-wise. A reduced dim with no Partial form is gathered where it is
  sharded (``follow_inputs``: as PyTorch DTensor, never moved to a kept dim).
* ``dims_arg`` (default ``dim``): the argument naming the reduced dims (an int, a
  sequence, or None for every dim; ``null`` in YAML: the op always reduces every dim).
* ``keepdim_arg`` (default ``keepdim``): the argument keeping reduced dims as size 1.
* ``empty_dims`` (default ``all``): what an empty dims sequence means (``torch.sum(x, ())``
  reduces every dim, ``torch.all(x, ())`` none; MindSpore's ``ReduceAll``/``ReduceAny`` and
  the other legacy ``Reduce*`` every dim).
* ``gather_unless`` (a mapping, default empty): arguments that, away from the given value,
  make the reduced dims gathered and Partial inputs reduced first (``{initial: null}`` for
  MindSpore's ``Tensor.sum(axis, initial=...)``, whose ``initial`` a Partial(sum) output
  would count once per shard).

Non-reduced dims keep their shards (the shard's tensor dim shifts left past the removed
dims when ``keepdim`` is False). Exactness on uneven and empty shards:

* ``mean`` over a sharded dim runs ``local sum / global count`` (PyTorch DTensor divides by
  the local count, which is wrong for uneven shards and NaN for empty ones);
* ``amax``/``amin`` (and ``max(x)``/``min(x)``) pad an empty local shard with the
  reduction's identity (``-inf``/``+inf``, the integer dtype's min/max), since the local
  kernel refuses an empty reduction; on floating inputs their gradient splits evenly
  between all the elements equal to the extremum, on whichever ranks (as torch;
  :mod:`hyper_shard.kernels.extremum`).

These local implementations compute with the platform's local math (``plat.sum``,
``plat.amax``): the same on every framework.

Semantics follow ``torch.sum``, ``torch.mean``, ``torch.amax``, ``torch.max``... (global
shapes in, global shapes out; a DTensor's result equals the single-device one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from ..dispatch.op import Binder, DistributedOp, Layout, OpCall
from ..dispatch.search import SingleDimStrategy, follow_inputs, search_strategy
from ..errors import ShardingError
from ..kernels import groups_of, input_as_dtype
from ..kernels.extremum import ExactExtremum
from ..placement import Partial, Shard
from ..redistribute.planner import cost_model_for
from ..registry.models import RuleParams
from . import register_rule
from .pointwise import PointwiseOp

__all__ = [
    "ReductionOp",
    "ReductionParams",
    "ReduceForm",
    "reduced_dims",
    "reduced_shape",
    "kept_dim_map",
    "identity_value",
]

ReduceKind = Literal[
    "sum",
    "mean",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "prod",
    "std",
    "var",
    "all",
    "any",
    "norm",
    "logsumexp",
    "nansum",
    "count_nonzero",
    "none",
]

#: reduce_op -> (partial op of a sharded reduced dim, Partial input ops kept as is)
_PARTIAL_RULES: dict[str, tuple[str, tuple[str, ...]]] = {
    "sum": ("sum", ("sum", "avg")),
    "mean": ("sum", ("sum", "avg")),
    "amax": ("max", ("max",)),
    "amin": ("min", ("min",)),
    "max": ("max", ("max",)),
    "min": ("min", ("min",)),
    # a sharded reduced dim gives Partial(sum); a Partial input is reduced first (NaNs and
    # zeros of the parts are not those of the sum)
    "nansum": ("sum", ()),
    "count_nonzero": ("sum", ()),
}


class ReductionParams(RuleParams):
    reduce_op: ReduceKind = "none"
    dims_arg: str | None = "dim"
    keepdim_arg: str | None = "keepdim"
    empty_dims: Literal["all", "none"] = "all"
    #: for max/min: the argument holding the second tensor of the elementwise form
    other_arg: str = "other"
    #: tensors the op returns, all of the reduced shape (var_mean: 2; max(x, dim): always 2)
    outputs: int = Field(default=1, ge=1)
    #: arguments that, given another value than this one, make every reduced dim gathered
    #: and every Partial input reduced first (``initial: null``: MindSpore's
    #: ``Tensor.sum(axis, initial=1)`` would add ``initial`` once per shard); static
    gather_unless: dict[str, Any] = Field(default_factory=dict)


# ---------------------------------------------------------------------- pure shape logic
def _is_dims_value(v: Any) -> bool:
    if v is None or isinstance(v, int):
        return True
    return isinstance(v, (list, tuple)) and all(
        isinstance(x, int) and not isinstance(x, bool) for x in v
    )


def reduced_dims(
    value: Any, ndim: int, empty_dims: str = "all", *, what: str = "reduction"
) -> tuple[int, ...]:
    """The reduced dims, sorted and in ``[0, ndim)``, as torch reads a ``dim`` argument.

    ``None`` (and a bool, which torch's legacy ``std(x, unbiased)`` form puts in the dim
    position) means every dim; an empty sequence means every dim (``empty_dims="all"``, as
    ``torch.sum``) or none (``"none"``, as ``torch.all``). A 0-d tensor accepts dim 0/-1 and
    has no dim to reduce.

    Raises:
        IndexError: a dim out of range (message names ``what``).
        ShardingError: a dim listed twice (as torch's "appears multiple times").
        TypeError: a value that is not an int, a sequence of ints or None.
    """
    if value is None or isinstance(value, bool):
        return tuple(range(ndim))
    if isinstance(value, int):
        dims: Sequence[int] = (value,)
    elif isinstance(value, (list, tuple)):
        if len(value) == 0:
            return tuple(range(ndim)) if empty_dims == "all" else ()
        dims = value
    else:
        raise TypeError(f"{what}: dim must be an int, a sequence of ints or None, got {value!r}")
    n = max(ndim, 1)
    out: list[int] = []
    for d in dims:
        if isinstance(d, bool) or not isinstance(d, int):
            raise TypeError(f"{what}: dim must be an int, got {d!r}")
        if not -n <= d < n:
            raise IndexError(
                f"{what}: dim {d} is out of range for a tensor of rank {ndim} "
                f"(expected a dim in [{-n}, {n - 1}])"
            )
        k = d % n
        if k in out:
            raise ShardingError(
                f"{what}: dim {k} appears multiple times in the list of dims {tuple(dims)}; "
                f"list each dim once"
            )
        out.append(k)
    if ndim == 0:
        return ()
    return tuple(sorted(out))


def reduced_shape(shape: Sequence[int], dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    """Global output shape of a reduction of ``shape`` over ``dims``."""
    red = set(dims)
    if keepdim:
        return tuple(1 if d in red else n for d, n in enumerate(shape))
    return tuple(n for d, n in enumerate(shape) if d not in red)


def kept_dim_map(ndim: int, dims: Sequence[int], keepdim: bool) -> dict[int, int]:
    """Input dim -> output dim for every dim that is not reduced."""
    red = set(dims)
    out: dict[int, int] = {}
    k = 0
    for d in range(ndim):
        if d in red:
            if keepdim:
                k += 1
            continue
        out[d] = k
        k += 1
    return out


def _is_floating(dtype: Any) -> bool:
    name = str(dtype).rsplit(".", 1)[-1].lower()
    return any(k in name for k in ("float", "half", "double"))


def identity_value(reduce: str, dtype: Any, itemsize: int) -> Any:
    """The identity of ``max``/``min`` for a dtype given by name (``torch.float32``,
    ``int64``...): ``-inf``/``+inf`` for floating dtypes, the integer range's bounds
    otherwise (``False``/``True`` for bool)."""
    name = str(dtype).rsplit(".", 1)[-1].lower()
    if "bool" in name:
        return reduce == "min"
    if "float" in name or "half" in name or "bfloat" in name or "double" in name:
        return -math.inf if reduce == "max" else math.inf
    bits = 8 * itemsize
    if name.startswith("uint"):
        return 0 if reduce == "max" else 2**bits - 1
    return -(2 ** (bits - 1)) if reduce == "max" else 2 ** (bits - 1) - 1


@dataclass(frozen=True)
class ReduceForm:
    """How one call reduces: ``dims`` (sorted), ``keepdim``, ``indices`` (returns
    ``(values, indices)``), ``elementwise`` (``max(x, other)``)."""

    dims: tuple[int, ...]
    keepdim: bool
    indices: bool = False
    elementwise: bool = False


# ---------------------------------------------------------------------- local kernels
class _MeanAsSum:
    """``mean`` = local ``sum`` / GLOBAL element count (exact for uneven/empty shards).
    A ``dtype`` argument (keyword, or a positional dtype after the input) casts the input
    first, as ``torch.mean(..., dtype=)`` and MindSpore's ``MeanExt`` do."""

    __slots__ = ("binder", "dims", "keepdim", "count", "plat")

    def __init__(
        self, binder: Binder, dims: tuple[int, ...], keepdim: bool, count: int, plat: Any
    ) -> None:
        self.binder, self.dims, self.keepdim, self.count = binder, dims, keepdim, count
        self.plat = plat

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = input_as_dtype(self.binder, self.plat, args, kwargs)
        return self.plat.sum(x, self.dims, self.keepdim) / self.count


class _ExtremumPadded:
    """``amax``/``amin`` of a local shard that is empty along a reduced dim: the shard is
    first padded to size 1 there with the reduction's identity."""

    __slots__ = ("binder", "dims", "keepdim", "mode", "pad_dims", "fill", "mesh", "dtype")

    def __init__(
        self,
        binder: Binder,
        dims: tuple[int, ...],
        keepdim: bool,
        mode: str,
        pad_dims: tuple[int, ...],
        fill: Any,
        mesh: Any,
        dtype: Any,
    ) -> None:
        self.binder, self.dims, self.keepdim, self.mode = binder, dims, keepdim, mode
        self.pad_dims, self.fill, self.mesh, self.dtype = pad_dims, fill, mesh, dtype

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = self.binder.get(args, kwargs, "input")
        plat = self.mesh.platform
        for d in self.pad_dims:
            shape = list(plat.shape(x))
            shape[d] = 1
            pad = plat.new_tensor("full", shape, self.fill, self.dtype, self.mesh.device_type)
            x = plat.cat([x, pad], d)
        fn = plat.amax if self.mode == "max" else plat.amin
        return fn(x, self.dims, self.keepdim)


# ---------------------------------------------------------------------- the rule
@register_rule("reduction")
class ReductionOp(DistributedOp):
    """A reduction over dims of one DTensor input (see the module docstring).

    Global input shape ``s``; global output shape ``s`` without the reduced dims (or with
    them as 1 when ``keepdim``); local output shapes follow the output placements.

    Raises:
        IndexError: a reduced dim out of range.
        ShardingError: a dim listed twice; a call with more than one DTensor input (except
            ``max(x, other)``/``min(x, other)``).
    """

    keeps_shard_order = True  # local data only: shard orders pass (dispatch/order.py)

    Params = ReductionParams
    signature = ("input", "dim", "keepdim")

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        p = self.params
        if p.static_args is None:
            names = (p.dims_arg, p.keepdim_arg, *p.gather_unless)
            self.static_names = tuple(n for n in names if n)
        self._pointwise: PointwiseOp | None = None

    # -- call analysis ---------------------------------------------------------------
    def _arg(self, call: OpCall, name: str | None) -> Any:
        if not name:
            return None
        if name in call.static:
            return call.static[name]
        return call.get(name)

    def form(self, call: OpCall) -> ReduceForm:
        """The call's reduced dims and output kind.

        Raises:
            IndexError / TypeError: a bad dim (as torch).
            ShardingError: a dim listed twice, or a second DTensor input.
        """
        p = self.params
        dims_value = self._arg(call, p.dims_arg)
        if isinstance(dims_value, bool) and p.reduce_op not in ("std", "var"):
            raise TypeError(
                f"{call.describe()}: {call.platform_name}: dim must be an int, a sequence of ints "
                f"or None, got {dims_value!r}"
            )
        if p.reduce_op in ("max", "min") and (
            len(call.specs) > 1 or p.other_arg in call.kwargs or not _is_dims_value(dims_value)
        ):
            return ReduceForm((), False, elementwise=True)
        if len(call.specs) != 1 or call.arg_roles[0] != "input":
            raise ShardingError(
                f"{call.describe()}: {self.name} reduces one DTensor 'input'; other DTensor "
                f"arguments are not supported (pass python values, or reduce the DTensor first)"
            )
        keepdim = bool(self._arg(call, p.keepdim_arg))
        ndim = call.specs[0].ndim
        indices = p.reduce_op in ("max", "min") and dims_value is not None
        if indices and not isinstance(dims_value, int):
            raise TypeError(
                f"{call.describe()}: {call.platform_name}(input, dim) takes a single int dim, got "
                f"{dims_value!r}"
            )
        try:
            dims = reduced_dims(dims_value, ndim, p.empty_dims, what=call.platform_name)
        except (IndexError, TypeError, ShardingError) as e:
            raise type(e)(f"{call.describe()}: {e}") from e
        return ReduceForm(dims, keepdim, indices=indices)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        f = self.form(call)
        if f.elementwise:
            return self._pw().output_shapes(call)
        shape = reduced_shape(call.specs[0].shape, f.dims, f.keepdim)
        return [shape] * self._n_out(f)

    def _n_out(self, f: ReduceForm) -> int:
        return 2 if f.indices else self.params.outputs

    def _pw(self) -> PointwiseOp:
        if self._pointwise is None:
            self._pointwise = PointwiseOp(self.name, {})
        return self._pointwise

    def _partial_rule(self, call: OpCall, f: ReduceForm) -> tuple[str | None, tuple[str, ...]]:
        op = self.params.reduce_op
        rule = _PARTIAL_RULES.get(op)
        if rule is None or f.indices:
            return None, ()
        for name, default in self.params.gather_unless.items():
            if self._arg(call, name) != default:
                return None, ()  # e.g. an `initial` value: reduce the whole dim locally
        out: str | None = rule[0]
        keep = rule[1]
        dtype = str(call.specs[0].dtype)
        if out in ("max", "min") and "bool" in dtype:
            return None, ()  # no Partial(max/min) of bool values
        if op == "mean" and not self._mean_exact(call):
            out = None  # the global-count kernel divides floats only
        return out, keep

    @staticmethod
    def _mean_exact(call: OpCall) -> bool:
        dtype = call.kwargs.get("dtype") or call.specs[0].dtype
        name = str(dtype).rsplit(".", 1)[-1].lower()
        return any(k in name for k in ("float", "half", "double", "complex"))

    # -- phase 2 -----------------------------------------------------------------
    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        f = self.form(call)
        if f.elementwise:
            return self._pw().single_dim_strategies(call)
        spec = call.specs[0]
        n_out = self._n_out(f)
        kept = kept_dim_map(spec.ndim, f.dims, f.keepdim)
        reduced = set(f.dims)
        out_op, keep_ops = self._partial_rule(call, f)
        strategies: list[SingleDimStrategy] = []
        for d in range(spec.ndim):
            if d in kept:
                strategies.append(((Shard(kept[d]),) * n_out, (Shard(d),)))
            elif d in reduced and out_op is not None:
                strategies.append(((Partial(out_op),) * n_out, (Shard(d),)))
        for op in keep_ops:
            strategies.append(((Partial(op),) * n_out, (Partial(op),)))
        return strategies

    def infer_layout(self, call: OpCall) -> Layout:
        f = self.form(call)
        if f.elementwise:
            return self._pw().infer_layout(call)
        strategies = self.single_dim_strategies(call)
        n_out = self._n_out(f)
        # a reduced dim without a Partial form is gathered where it is sharded, as PyTorch
        # DTensor (not moved to a kept dim by an all-to-all)
        res = search_strategy(
            call.specs,
            strategies,
            n_out,
            cost_model_for(call.mesh),
            accept=follow_inputs(call.specs),
        )
        layout = Layout(
            list(res.inputs), list(res.outputs), self.output_shapes(call), cost=res.cost
        )
        return self.expand_impl(call, layout, f)

    def expand_impl(self, call: OpCall, layout: Layout, f: ReduceForm | None = None) -> Layout:
        """Install the exact local kernels (see the module docstring) where a reduced dim is
        sharded in the decided input placements."""
        if f is None:
            f = self.form(call)
        op = self.params.reduce_op
        target = layout.inputs[0]
        if target is None or f.indices or op not in ("mean", "amax", "amin", "max", "min"):
            return layout
        reduced = set(f.dims)
        sharded = [m for m, p in enumerate(target) if type(p) is Shard and p.dim in reduced]
        if not sharded:
            return layout
        spec = call.specs[0]
        if op == "mean":
            count = math.prod(spec.shape[d] for d in f.dims)
            layout.impl = _MeanAsSum(
                call.binder or self.binder, f.dims, f.keepdim, count, call.platform
            )
            return layout
        # amax / amin / max(x) / min(x): pad an empty local shard with the identity; a
        # floating input gets torch's gradient for ties across ranks (kernels/extremum.py)
        local = spec.with_placements(target).local_shape()
        empty = tuple(d for d in f.dims if local[d] == 0)
        mode = "max" if op in ("amax", "max") else "min"
        meta = spec.tensor_meta
        if _is_floating(meta.dtype):
            layout.impl = ExactExtremum(
                call.binder or self.binder,
                f.dims,
                f.keepdim,
                mode,
                empty,
                identity_value(mode, meta.dtype, meta.itemsize),
                call.mesh,
                meta.dtype,
                groups_of(call.mesh, sharded),
            )
        elif empty:
            layout.impl = _ExtremumPadded(
                call.binder or self.binder,
                f.dims,
                f.keepdim,
                mode,
                empty,
                identity_value(mode, meta.dtype, meta.itemsize),
                call.mesh,
                meta.dtype,
            )
        return layout
