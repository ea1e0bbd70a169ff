"""Whole ``Replicate`` gradients for the parameters a parallel style replicates.

hyper_shard's gradient contract gives a ``Replicate`` leaf a ``Partial(sum)`` gradient
(each rank's contribution), reduced by the optimizer step that reads it: the
data-parallel all-reduce, once per step. PyTorch's ``RowwiseParallel`` gives the bias it
leaves ``Replicate`` a ``Replicate`` gradient, whole on every rank after backward (its
``SequenceParallel`` norm weights get ``Partial(sum)`` ones, as hyper_shard's), and code
written for it reads it so: ``if rank == 0: p.grad.redistribute(placements=[Replicate()])``
or ``p.grad.full_tensor()`` is local there, but with a ``Partial`` gradient it is a
collective that rank 0 alone enters, and every rank waits for ever (PyTorch's
``test_parallelize_api`` row-wise ``Linear`` case).

So a style's ``Replicate`` parameter gets a gradient hook: each backward's contribution is
all-reduced over the mesh dims where it is ``Replicate`` as it arrives (every rank runs the
same backward, so the collectives line up), accumulation adds whole gradients, and
``.grad`` reports ``Replicate`` on those dims (``dtensor._grad_get``). Differentiable (the
all-reduce is its own backward), so ``create_graph`` works.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from ...kernels import all_reduce_sum, groups_of
from ...placement import Replicate

__all__ = ["WHOLE_GRAD", "whole_replicate_grad"]

#: the attribute (in the parameter's ``__dict__``) naming the mesh dims whose gradient is
#: whole: ``.grad`` reports ``Replicate`` there
WHOLE_GRAD = "_hs_whole_grad"


def whole_replicate_grad(param: Any) -> None:
    """Make the gradient of the DTensor leaf ``param`` whole (``Replicate``) on the mesh
    dims where ``param`` is ``Replicate`` (see the module docstring). Idempotent; nothing
    for a parameter that does not require grad, has no ``Replicate`` mesh dim, or lives on
    a mesh this rank is outside of."""
    spec = param._spec
    mesh = spec.mesh
    dims = tuple(m for m, p in enumerate(spec.placements) if type(p) is Replicate)
    if not dims or not param.requires_grad or mesh.get_coordinate() is None:
        return
    if param.__dict__.get(WHOLE_GRAD) == dims:
        return
    plat, groups = mesh.platform, groups_of(mesh, dims)

    def whole(g: torch.Tensor) -> torch.Tensor:
        return all_reduce_sum(plat, g, groups)

    with DisableTorchFunctionSubclass():
        torch.Tensor.register_hook(param, whole)
    param.__dict__[WHOLE_GRAD] = dims
