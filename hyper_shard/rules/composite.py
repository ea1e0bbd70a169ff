"""``rule: composite``: an op that is its parts.

A framework function written in the framework's own language from ops hyper_shard
already shards (``torch.nn.functional.gaussian_nll_loss``, ``Tensor.__rmatmul__``...)
needs no layout of its own: the dispatcher runs the function's body on the DTensors and
each inner op dispatches with its own rule (the platform's ``decompose``: on torch, a
copy of the Python function whose ``__torch_function__`` check is off). The result is
the one the parts give — sharded as they decide, gradients through their local autograd.

An unregistered Python-level function is decomposed too; an entry makes it deliberate:
the op is listed (``hyper-shard ops list``), tested by the conformance suite, and a
platform that cannot decompose it (a builtin) says so instead of decomposing silently.
Framework-neutral: nothing here imports a platform.
"""

from __future__ import annotations

from ..dispatch.op import DistributedOp, Layout, OpCall
from ..errors import ShardingError
from . import register_rule

__all__ = ["CompositeOp"]


@register_rule("composite")
class CompositeOp(DistributedOp):
    """Runs as its parts (see the module docstring); the dispatcher never asks it for a
    layout. ``infer_layout`` (reached only through ``Dispatcher.decide`` or ``hyper-shard
    explain``) raises, naming that there is no single decision.

    Raises:
        ShardingError: from :meth:`infer_layout`.
    """

    runs_as_parts = True

    def infer_layout(self, call: OpCall) -> Layout:
        raise ShardingError(
            f"{call.describe()}: entry {self.name!r} (rule: composite) runs as its parts, "
            f"each inner op with its own decision; there is no single layout to explain"
        )
