"""Resampling (``rule: interpolate``): ``torch.nn.functional.interpolate(input, size=None,
scale_factor=None, mode='nearest', align_corners=None, recompute_scale_factor=None,
antialias=False)``, which ``nn.Upsample``, ``nn.UpsamplingNearest2d`` and
``nn.UpsamplingBilinear2d`` call; semantics as torch's.

Global shapes: input ``(N, C, *spatial)``; output ``(N, C, *out)`` with ``out`` the given
``size``, or ``floor(spatial * scale_factor)`` per dim (as torch). Every output value is a
weighted sum of input values of one ``(n, c)`` plane (every mode is linear in the input),
so per mesh dim: a sharded batch or channel dim stays sharded, ``Partial(sum|avg)`` stays
Partial, and a sharded spatial dim is gathered (its output rows need neighbouring input
rows). No communication for batch/channel-sharded inputs.
"""

from __future__ import annotations

import math
import operator
from typing import Any

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy
from ..errors import ShardingError
from ..placement import Partial, Shard
from . import register_rule
from ._util import LINEAR_OPS

__all__ = ["InterpolateOp", "interpolate_output_shape"]


def interpolate_output_shape(in_shape: tuple[int, ...], size: Any, scale: Any) -> tuple[int, ...]:
    """``(N, C, *out)`` of ``F.interpolate`` (torch's rule: ``size`` as given, else
    ``floor(input size * scale_factor)``).

    Raises:
        ValueError: neither or both of ``size``/``scale_factor``, or a wrong length.
    """
    n = len(in_shape) - 2
    if n < 1:
        raise ValueError(f"interpolate expects a 3-D or larger input, got {len(in_shape)}-D")
    if (size is None) == (scale is None):
        raise ValueError("only one of size or scale_factor should be defined")
    if size is not None:
        sizes = list(size) if isinstance(size, (list, tuple)) else [size] * n
        if len(sizes) != n:
            raise ValueError(
                f"Input and output must have the same number of spatial dimensions, but got "
                f"input with spatial dimensions of {list(in_shape[2:])} and output size of "
                f"{sizes}"
            )
        out = [operator.index(s) for s in sizes]
    else:
        scales = list(scale) if isinstance(scale, (list, tuple)) else [scale] * n
        if len(scales) != n:
            raise ValueError(
                f"Input and scale_factor must have the same number of spatial dimensions, but "
                f"got input with spatial dimensions of {list(in_shape[2:])} and scale_factor of "
                f"shape {scales}"
            )
        out = [math.floor(float(in_shape[i + 2]) * float(scales[i])) for i in range(n)]
    return (in_shape[0], in_shape[1], *out)


@register_rule("interpolate")
class InterpolateOp(DistributedOp):
    """``F.interpolate`` (see the module docstring).

    Raises:
        ShardingError: arguments torch would reject (naming the call).
    """

    signature = (
        "input", "size", "scale_factor", "mode", "align_corners", "recompute_scale_factor",
        "antialias",
    )  # fmt: skip
    static_args = ("size", "scale_factor", "mode", "align_corners")

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        x = call.specs[0]
        try:
            return [
                interpolate_output_shape(
                    x.shape, call.static.get("size"), call.static.get("scale_factor")
                )
            ]
        except (TypeError, ValueError) as e:
            raise ShardingError(f"{call.describe()}: {e}") from None

    def infer_layout(self, call: OpCall) -> Any:
        from .conv import _empty_shard_impl

        return _empty_shard_impl(call, super().infer_layout(call), has_bias=False)

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        if len(call.specs) != 1:
            raise ShardingError(f"{call.describe()}: only the input may be a DTensor")
        out: list[SingleDimStrategy] = [((Shard(d),), (Shard(d),)) for d in (0, 1)]
        out += [((Partial(op),), (Partial(op),)) for op in LINEAR_OPS]
        return out
