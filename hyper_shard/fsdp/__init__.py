"""Fully sharded data parallelism on hyper_shard DTensors (the API of PyTorch FSDP2).

``fully_shard(module, mesh=...)`` shards a module's parameters over the data-parallel
ranks as ``Shard(0)`` DTensor parameters; each unit all-gathers its parameters in one
collective before forward and backward and reduce-scatters its gradients in one
collective after backward. A 2-D ``("replicate", "shard")`` mesh gives HSDP; parameters
made tensor-parallel by ``hyper_shard.parallel.parallelize_module`` on ``mesh["tp"]``
become 2-D DTensors on the ``("dp", "tp")`` mesh. See ``docs/fsdp.md``.

One engine serves every framework: the layout (``_layout``), the collectives
(``_collectives``, issued through the root's communication context ``_comm``), one
parameter (``_param``), one unit's state machine (``_group``), gradient reduction
(``_reduce``) and on-tape form (``_tape``), the root's coordination (``_state``) and the steps of ``fully_shard``
(``_init``) are framework-neutral. A framework joins through one adapter in its platform
package (``hyper_shard/platform/<framework>/fsdp.py``, see ``_adapter``): torch's drives
the unit with module and autograd hooks; MindSpore's autograd is functional, so there a
unit's all-gather is one differentiable node whose backward is the engine's
reduce-scatter.
"""

from __future__ import annotations

from ._module import FSDPModule, UnshardHandle
from ._policy import CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy
from .api import DataParallelMeshDims, fully_shard, register_fsdp_forward_method, share_comm_ctx

__all__ = [
    "fully_shard",
    "FSDPModule",
    "UnshardHandle",
    "MixedPrecisionPolicy",
    "OffloadPolicy",
    "CPUOffloadPolicy",
    "register_fsdp_forward_method",
    "share_comm_ctx",
    "DataParallelMeshDims",
]
