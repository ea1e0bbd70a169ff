"""Fully sharded data parallelism on hyper_shard DTensors (the API of PyTorch FSDP2).

``fully_shard(module, mesh=...)`` shards a module's parameters over the data-parallel
ranks as ``Shard(0)`` DTensor parameters; each unit all-gathers its parameters in one
collective before forward and backward and reduce-scatters its gradients in one
collective after backward. A 2-D ``("replicate", "shard")`` mesh gives HSDP; parameters
made tensor-parallel by ``hyper_shard.parallel.parallelize_module`` on ``mesh["tp"]``
become 2-D DTensors on the ``("dp", "tp")`` mesh. See ``docs/fsdp.md``.

The core (layout, collectives, the unit's state machine, root coordination) is
framework-neutral; ``_torch.py`` is the torch adapter (module and autograd hooks);
``_mindspore.py`` runs ``fully_shard`` on MindSpore Cells (a unit is one differentiable
all-gather whose backward is the reduce-scatter: MindSpore's autograd is functional).
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
