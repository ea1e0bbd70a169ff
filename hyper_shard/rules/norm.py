"""Normalisation layers over trailing dims: layer_norm, rms_norm.

``normalized_shape`` (``shape_arg``) names the ``k`` trailing dims whose statistics are
computed: on the input those dims must be Replicate, and so must the affine parameters
(``weight``, ``bias``: shape ``normalized_shape``). The leading dims keep their shards; the
output has the input's global shape and placements. A Partial input (or parameter) is
reduced first: normalisation is not linear.

Gradients follow the contract of :func:`hyper_shard.placement.grad_placement`: each rank's
local autograd gives the weight/bias gradient of its leading shard, so the gradient of a
Replicate parameter is ``Partial(sum)`` (its ``full_tensor()`` equals the single-device
gradient).

Semantics follow ``torch.nn.functional.layer_norm`` and ``torch.nn.functional.rms_norm``.
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Placement, Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import R

__all__ = ["NativeLayerNormOp", "NormOp", "NormParams", "normalized_ndim"]


class NormParams(RuleParams):
    shape_arg: str = "normalized_shape"
    #: arguments holding affine parameters of shape ``normalized_shape``
    param_args: list[str] = ["weight", "bias"]


def normalized_ndim(normalized_shape: Any) -> tuple[int, ...]:
    """``normalized_shape`` as a tuple of ints (an int means a 1-tuple).

    Raises:
        TypeError: not an int or a sequence of ints.
    """
    if isinstance(normalized_shape, int) and not isinstance(normalized_shape, bool):
        return (normalized_shape,)
    try:
        out = tuple(int(n) for n in normalized_shape)
    except TypeError:
        raise TypeError(
            f"normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}"
        ) from None
    return out


@register_rule("norm")
class NormOp(DistributedOp):
    """Layer/RMS normalisation over the trailing ``normalized_shape`` dims (see the module
    docstring). Global input shape ``(*lead, *normalized_shape)``; the output has the same
    global shape and the input's leading shards.

    Raises:
        ShardingError: the input is not a DTensor, ``normalized_shape`` does not match the
            input's trailing dims or a parameter's shape, or an unexpected DTensor argument.
    """

    Params = NormParams
    signature = ("input", "normalized_shape", "weight", "bias", "eps")

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            self.static_names = (self.params.shape_arg,)

    def _check(self, call: OpCall) -> tuple[int, int]:
        """(index of the input among the DTensors, number of normalised dims)."""
        roles = call.arg_roles
        if "input" not in roles:
            raise ShardingError(
                f"{call.describe()}: {self.name} needs its input as a DTensor; distribute the "
                f"input too (its parameters are DTensors)"
            )
        name = self.params.shape_arg
        value = call.static[name] if name in call.static else call.get(name)
        shape = normalized_ndim(value)
        k = len(shape)
        i = roles.index("input")
        ishape = call.specs[i].shape
        if k > len(ishape) or tuple(ishape[len(ishape) - k :]) != shape:
            raise ShardingError(
                f"{call.describe()}: normalized_shape={list(shape)} expects an input of shape "
                f"[*, {', '.join(map(str, shape))}], got {list(ishape)}; pass the input's "
                f"trailing dims as normalized_shape"
            )
        for r, s in zip(roles, call.specs):
            if r == "input":
                continue
            if r not in self.params.param_args:
                raise ShardingError(
                    f"{call.describe()}: unexpected DTensor argument {r!r} for {self.name}; "
                    f"only input and {', '.join(self.params.param_args)} may be DTensors"
                )
            if tuple(s.shape) != shape:
                raise ShardingError(
                    f"{call.describe()}: {r} of shape {list(s.shape)} does not match "
                    f"normalized_shape={list(shape)}; give {r} the normalized shape"
                )
        return i, k

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        i, k = self._check(call)
        n = len(call.specs)
        lead = call.specs[i].ndim - k
        out: list[SingleDimStrategy] = []
        for d in range(lead):
            ins: list[Placement] = [R] * n
            ins[i] = Shard(d)
            out.append(((Shard(d),), tuple(ins)))
        return out

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        i, _ = self._check(call)
        return [call.specs[i].shape]


@register_rule("native_layer_norm")
class NativeLayerNormOp(NormOp):
    """``torch.native_layer_norm(input, normalized_shape, weight, bias, eps)``: three outputs,
    ``out`` (the input's shape), ``mean`` and ``rstd`` (the input's shape with the ``k``
    normalised dims of size 1); all keep the input's leading shards (the statistics are
    computed there, never gathered). Semantics as ``torch.native_layer_norm``.

    Raises:
        ShardingError: as :class:`NormOp`.
    """

    n_outputs = 3

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        return [(outs * 3, ins) for outs, ins in super().single_dim_strategies(call)]

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        i, k = self._check(call)
        shape = tuple(call.specs[i].shape)
        stat = shape[: len(shape) - k] + (1,) * k
        return [shape, stat, stat]


@register_rule("layer_norm_axis")
class AxisLayerNormOp(NormOp):
    """MindSpore's ``LayerNorm`` Primitive (``ops.LayerNorm(begin_norm_axis,
    begin_params_axis, epsilon)(x, gamma, beta)``, what ``nn.LayerNorm`` runs): the dims from
    ``begin_norm_axis`` on are normalised, ``gamma``/``beta`` have the shape of the dims
    from ``begin_params_axis`` on. Three outputs: ``y`` (``x``'s shape), ``mean`` and
    ``rstd`` (``x``'s shape with the normalised dims of size 1); all keep the input's shards
    of the leading dims (the statistics are computed there, never gathered).

    Raises:
        ShardingError: ``begin_params_axis`` before ``begin_norm_axis`` (parameters over a
            leading dim would mix shards with statistics), or shapes that do not match.
    """

    signature = ("input", "gamma", "beta", "begin_norm_axis", "begin_params_axis", "epsilon")  # type: ignore[assignment]
    static_args = ("begin_norm_axis", "begin_params_axis")
    n_outputs = 3

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        self.static_names = ("begin_norm_axis", "begin_params_axis")

    def _axes(self, call: OpCall) -> tuple[int, int, int]:
        roles = call.arg_roles
        if "input" not in roles:
            raise ShardingError(f"{call.describe()}: {self.name} needs its input as a DTensor")
        i = roles.index("input")
        nd = call.specs[i].ndim
        bn, bp = (int(call.static.get(k) or 0) for k in ("begin_norm_axis", "begin_params_axis"))
        bn, bp = bn % nd if nd else 0, bp % nd if nd else 0
        if bp < bn:
            raise ShardingError(
                f"{call.describe()}: begin_params_axis={bp} before begin_norm_axis={bn}; use "
                f"begin_params_axis >= begin_norm_axis"
            )
        want = tuple(call.specs[i].shape[bp:])
        for r, s in zip(roles, call.specs):
            if r in ("gamma", "beta") and tuple(s.shape) != want:
                raise ShardingError(
                    f"{call.describe()}: {r} of shape {list(s.shape)} must have shape {list(want)}"
                )
            if r not in ("input", "gamma", "beta"):
                raise ShardingError(f"{call.describe()}: unexpected DTensor argument {r!r}")
        return i, bn, nd

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        i, bn, _ = self._axes(call)
        n = len(call.specs)
        out: list[SingleDimStrategy] = []
        for d in range(bn):
            ins: list[Placement] = [R] * n
            ins[i] = Shard(d)
            out.append(((Shard(d),) * 3, tuple(ins)))
        return out

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        i, bn, nd = self._axes(call)
        shape = tuple(call.specs[i].shape)
        stat = shape[:bn] + (1,) * (nd - bn)
        return [shape, stat, stat]


@register_rule("rms_norm_gamma")
class GammaRmsNormOp(NormOp):
    """MindSpore's ``RmsNorm`` Primitive (``ops.rms_norm(x, gamma, epsilon)``): the trailing
    ``gamma.ndim`` dims of ``x`` are normalised. Two outputs: ``y`` (``x``'s shape) and
    ``rstd`` (``x``'s shape with the normalised dims of size 1); both keep the input's
    shards of the leading dims.

    Raises:
        ShardingError: ``gamma`` is not a DTensor, or its shape is not ``x``'s trailing dims.
    """

    signature = ("input", "gamma", "epsilon")  # type: ignore[assignment]
    n_outputs = 2

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        self.static_names = ()

    def _k(self, call: OpCall) -> tuple[int, int]:
        roles = call.arg_roles
        if "input" not in roles or "gamma" not in roles:
            raise ShardingError(
                f"{call.describe()}: {self.name} needs input and gamma as DTensors (distribute "
                f"gamma as Replicate())"
            )
        i, g = roles.index("input"), roles.index("gamma")
        x, gs = call.specs[i].shape, call.specs[g].shape
        k = len(gs)
        if k > len(x) or tuple(x[len(x) - k :]) != tuple(gs):
            raise ShardingError(
                f"{call.describe()}: gamma of shape {list(gs)} must be the input's trailing "
                f"dims (input {list(x)})"
            )
        return i, k

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        i, k = self._k(call)
        n = len(call.specs)
        out: list[SingleDimStrategy] = []
        for d in range(call.specs[i].ndim - k):
            ins: list[Placement] = [R] * n
            ins[i] = Shard(d)
            out.append(((Shard(d), Shard(d)), tuple(ins)))
        return out

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        i, k = self._k(call)
        shape = tuple(call.specs[i].shape)
        return [shape, shape[: len(shape) - k] + (1,) * k]
