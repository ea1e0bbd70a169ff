"""Tensor parallelism for existing models (as ``torch.distributed.tensor.parallel``).

``parallelize_module(model, mesh, plan)`` turns the selected submodules' parameters into
DTensor parameters and converts their inputs/outputs in forward hooks, by styles:
``ColwiseParallel``, ``RowwiseParallel``, ``SequenceParallel``, ``PrepareModuleInput``,
``PrepareModuleOutput``, ``PrepareModuleInputOutput``, and for mixture-of-experts layers
``ExpertParallel`` / ``ExpertTensorParallel``; ``distribute_module`` is the
lower-level building block, and ``loss_parallel()`` computes cross-entropy on
class-sharded logits without gathering them.
"""

from __future__ import annotations

from .api import parallelize_module
from .distribute import distribute_module
from .expert import ExpertParallel, ExpertTensorParallel
from .loss import loss_parallel
from .plan import PlanKeyError, PlanKeyWarning
from .style import (
    ColwiseParallel,
    LayoutLengthError,
    ParallelStyle,
    PrepareModuleInput,
    PrepareModuleInputOutput,
    PrepareModuleOutput,
    RowwiseParallel,
    SequenceParallel,
)

__all__ = [
    "parallelize_module",
    "distribute_module",
    "ParallelStyle",
    "ColwiseParallel",
    "RowwiseParallel",
    "SequenceParallel",
    "PrepareModuleInput",
    "PrepareModuleOutput",
    "PrepareModuleInputOutput",
    "ExpertParallel",
    "ExpertTensorParallel",
    "PlanKeyError",
    "PlanKeyWarning",
    "LayoutLengthError",
    "loss_parallel",
]
