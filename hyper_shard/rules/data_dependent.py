"""``rule: data_dependent``: ops whose output SHAPE depends on the input's values
(``nonzero``, ``argwhere``, ``masked_select``, ``unique``...).

A sharding decision is cached per input layout and global shape, before any value is
read, so no rule can shard these (PyTorch DTensor has no strategy for them and raises).
This rule gathers the inputs and runs the op whole on every rank: the result is a
Replicate DTensor of the shape the values give (``rules._util.ReplicatedResult``). It is
always right, and costs the gather: the entry's ``fix`` (a same-shape alternative, e.g.
``torch.where``) is what to use when a sharded input is large.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..registry.models import RuleParams
from . import register_rule
from ._util import replicated_result_layout

__all__ = ["DataDependentOp", "DataDependentParams"]


class DataDependentParams(RuleParams):
    """``what``: what the output's size depends on; ``fix``: what to do instead."""

    what: str = "the number of selected elements"
    fix: str = "run it on the full tensor: x.full_tensor()"


@register_rule("data_dependent")
class DataDependentOp(DistributedOp):
    """Gathers the inputs and runs the op whole (see the module docstring)."""

    Params = DataDependentParams

    def infer_layout(self, call: OpCall) -> Layout:
        return replicated_result_layout(call)
