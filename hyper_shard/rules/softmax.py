"""Softmax-like ops: softmax, log_softmax (a normalisation along one dim).

The normalised dim (``dim_arg``, default ``dim``) needs every element of its slice on one
rank, so it must be Replicate; every other dim keeps its shard (the output has the input's
shape, and the same placements). A Partial input is reduced first (softmax is not linear).
``dim=None`` (``torch.nn.functional.softmax``'s legacy form) picks torch's implicit dim:
0 for 0-, 1- and 3-d inputs, else 1. A one-element sequence ``(d,)`` means ``d`` (MindSpore's
legacy ``Softmax`` Primitive passes its axis so); a longer one raises ``TypeError``.

Semantics follow ``torch.softmax`` / ``torch.nn.functional.softmax`` (global shapes: the
output's global and local shapes are the input's).
"""

from __future__ import annotations

from typing import Any

from ..dispatch.op import DistributedOp, OpCall
from ..dispatch.search import SingleDimStrategy, follow_inputs
from ..errors import ShardingError
from ..placement import Shard
from ..registry.models import RuleParams
from . import register_rule
from ._util import normalize_dim

__all__ = ["SoftmaxOp", "SoftmaxParams", "softmax_dim"]


class SoftmaxParams(RuleParams):
    dim_arg: str = "dim"


def softmax_dim(dim: Any, ndim: int) -> int:
    """The normalised dim in ``[0, ndim)`` (``None``: torch's implicit choice, as
    ``torch.nn.functional._get_softmax_dim``; a one-element sequence: its element, as
    MindSpore's legacy ``Softmax(axis)`` passes it).

    Raises:
        IndexError: ``dim`` out of range.
        TypeError: ``dim`` is not an int or None.
    """
    if dim is None:
        return 0 if ndim in (0, 1, 3) else 1
    if isinstance(dim, (list, tuple)):  # MindSpore's legacy Softmax(axis) passes (axis,)
        if len(dim) != 1:
            raise TypeError(
                f"dim must be an int or a one-element sequence, got {dim!r}: softmax over "
                f"several dims is not supported; reshape them into one dim first"
            )
        (dim,) = dim
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"dim must be an int or None, got {dim!r}")
    return normalize_dim(dim, ndim)


@register_rule("softmax")
class SoftmaxOp(DistributedOp):
    """Normalisation along one dim (see the module docstring). The output's global shape,
    placements and local shapes are the input's (after the dim is gathered).

    Raises:
        IndexError: the dim is out of range for the input's rank.
        ShardingError: more than one DTensor argument.
    """

    Params = SoftmaxParams
    signature = ("input", "dim")

    def __init__(self, name: str, params: Any = None) -> None:
        super().__init__(name, params)
        if self.params.static_args is None:
            self.static_names = (self.params.dim_arg,)

    def _dim(self, call: OpCall) -> int:
        if len(call.specs) != 1 or call.arg_roles[0] != "input":
            raise ShardingError(
                f"{call.describe()}: {self.name} takes one DTensor 'input'; other DTensor "
                f"arguments are not supported (pass them as python values or plain dtypes)"
            )
        name = self.params.dim_arg
        dim = call.static[name] if name in call.static else call.get(name)
        try:
            return softmax_dim(dim, call.specs[0].ndim)
        except (IndexError, TypeError) as e:
            raise type(e)(f"{call.describe()}: {call.platform_name}: {e}") from e

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        dim = self._dim(call)
        return [((Shard(d),), (Shard(d),)) for d in range(call.specs[0].ndim) if d != dim]

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        # the normalised dim is gathered where it is sharded, as PyTorch DTensor (not moved
        # to another dim by an all-to-all)
        return follow_inputs(call.specs)(inputs, outputs)


@register_rule("softmax_backward")
class SoftmaxBackwardOp(DistributedOp):
    """``torch.ops.aten._softmax_backward_data(grad_output, output, dim, input_dtype)`` (and
    ``_log_softmax_backward_data``): the gradient of a softmax along ``dim`` from the
    gradient of its output and the output itself (same global shape). ``dim`` is gathered on
    both, every other dim keeps its shard, sharded alike on both; Partial is reduced first.
    Semantics as the aten ops.

    Raises:
        ShardingError: grad_output and output not both DTensors of one shape.
        IndexError: ``dim`` out of range.
    """

    signature = ("grad_output", "output", "dim", "input_dtype")
    static_args = ("dim",)

    def _dim(self, call: OpCall) -> int:
        if len(call.specs) != 2 or call.specs[0].shape != call.specs[1].shape:
            raise ShardingError(
                f"{call.describe()}: {self.name} takes grad_output and output as DTensors of "
                f"one shape; distribute both"
            )
        return normalize_dim(int(call.static["dim"]), call.specs[0].ndim)

    def single_dim_strategies(self, call: OpCall) -> list[SingleDimStrategy]:
        dim = self._dim(call)
        return [((Shard(d),), (Shard(d), Shard(d))) for d in range(call.specs[0].ndim) if d != dim]

    def accept(self, call: OpCall, inputs: tuple, outputs: tuple) -> bool:
        # the dim is gathered where it is sharded, as the forward (and PyTorch DTensor)
        return follow_inputs(call.specs)(inputs, outputs)

    def output_shapes(self, call: OpCall) -> list[tuple[int, ...] | None]:
        self._dim(call)
        return [call.specs[0].shape]
