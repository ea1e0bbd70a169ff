"""``rule: data_dependent``: ops whose output SHAPE depends on the input's values
(``nonzero``, ``argwhere``, ``masked_select``, ``unique``...).

A sharding decision is cached per input layout and global shape, before any value is
read, so no rule can decide these; PyTorch DTensor cannot either. Binding them to this
rule makes the call raise a :class:`~hyper_shard.errors.ShardingError` that names the op,
its placements and the fix (the entry's ``fix``: a same-shape alternative, or the op on
``full_tensor()``), instead of the generic "no sharding rule" error.

Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from ..registry.models import RuleParams
from . import register_rule

__all__ = ["DataDependentOp", "DataDependentParams"]


class DataDependentParams(RuleParams):
    """``what``: what the output's size depends on; ``fix``: what to do instead."""

    what: str = "the number of selected elements"
    fix: str = "run it on the full tensor: x.full_tensor()"


@register_rule("data_dependent")
class DataDependentOp(DistributedOp):
    """Refuses every call (see the module docstring).

    Raises:
        ShardingError: always, naming the call and the entry's fix.
    """

    Params = DataDependentParams

    def infer_layout(self, call: OpCall) -> Layout:
        raise ShardingError(
            f"{call.describe()}: the output shape depends on the values ({self.params.what}), "
            f"which a sharding decision cannot know; {self.params.fix}"
        )
