"""``rule: gathered``: ops run whole on every rank.

For ops where every output element depends on (nearly) every input element — a tensor
inverse or solve, an LU factorisation, a multi-dimensional histogram, a gradient by
finite differences along every dim — or whose arguments mix layouts no strategy covers,
the inputs are gathered (``Replicate``; a ``Partial`` value reduced first), the op runs
on the whole tensors on every rank, and every tensor of the result is a ``Replicate``
DTensor of the shape it has (``rules._util.ReplicatedResult``). Always right; it costs
the gather (a sharded input's memory on every rank). Gradients flow through the gather's
autograd: the gradient of a sharded input is sharded as the input.

Only for out-of-place ops: an in-place call would write into the gathered copy and lose
the write, so it raises a ShardingError.

Semantics as the framework function each entry binds (global shapes: the result's global
shape is its local one). Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from . import register_rule
from ._util import replicated_result_layout

__all__ = ["GatheredOp"]


@register_rule("gathered")
class GatheredOp(DistributedOp):
    """Gathers every DTensor input and runs the op whole (see the module docstring).

    Raises:
        ShardingError: an in-place call (its target would be a gathered copy).
    """

    def infer_layout(self, call: OpCall) -> Layout:
        if call.inplace:
            raise ShardingError(
                f"{call.describe()}: {self.name} runs on gathered copies, so an in-place form "
                f"cannot write its target; use the out-of-place op"
            )
        return replicated_result_layout(call)
