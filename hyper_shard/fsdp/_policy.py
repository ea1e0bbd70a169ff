"""FSDP policies (as ``torch.distributed.fsdp``): mixed precision and offloading.

Dtypes are the framework's own dtype objects (``torch.bfloat16``...); this module does not
import a framework.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MixedPrecisionPolicy", "OffloadPolicy", "CPUOffloadPolicy"]


@dataclass(frozen=True)
class MixedPrecisionPolicy:
    """Module-level mixed precision (as FSDP2's ``MixedPrecisionPolicy``).

    Attributes:
        param_dtype: dtype of the unsharded parameters, hence of the all-gather and of the
            forward/backward compute (None: the parameters' own dtype). The optimizer keeps
            stepping the sharded parameters in their original dtype.
        reduce_dtype: dtype of the gradient reduce-scatter / all-reduce (None:
            ``param_dtype``). The reduced gradient is cast back to the parameter's dtype.
        output_dtype: floating-point forward outputs are cast to it (None: unchanged).
        cast_forward_inputs: cast floating-point forward inputs to ``param_dtype``.
    """

    param_dtype: Any = None
    reduce_dtype: Any = None
    output_dtype: Any = None
    cast_forward_inputs: bool = True


@dataclass
class OffloadPolicy:
    """No offloading (the default ``offload_policy``), as FSDP2's ``OffloadPolicy``."""


@dataclass
class CPUOffloadPolicy(OffloadPolicy):
    """Keep sharded parameters, gradients and optimizer state on the CPU (as FSDP2's
    ``CPUOffloadPolicy``): the shard is copied to the mesh's device for the all-gather and
    the reduced gradient copied back to the CPU, so the optimizer steps on the CPU.

    Attributes:
        pin_memory: pin the CPU shards (faster copies; ignored where no accelerator is
            present, since pinning needs one).
    """

    pin_memory: bool = True
