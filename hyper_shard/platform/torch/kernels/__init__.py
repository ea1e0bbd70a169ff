"""Local torch kernels that sharding rules install as a decision's ``Layout.impl``.

The rules (``hyper_shard/rules/attention.py``, ``loss.py``, ``random.py``) decide layouts
without importing torch; when a decision needs more than the plain local op (a causal mask
shifted to a query shard's offset, a vocab-parallel cross-entropy, a dropout mask cut from
the single-device draw), they build one of these kernels. A kernel is called like the torch
function it replaces, with the (redistributed) local arguments, under torch-function
handling disabled, so autograd records local ops only; collectives go through the platform
and are autograd-correct (:func:`all_reduce_sum`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

__all__ = ["all_reduce_sum", "all_reduce", "groups_of"]


def groups_of(mesh: Any, mesh_dims: Sequence[int]) -> tuple[Any, ...]:
    """The process groups of ``mesh_dims`` (empty on an abstract mesh)."""
    if mesh.is_abstract:
        return ()
    return tuple(mesh._group(m) for m in mesh_dims)


def all_reduce(plat: Any, t: torch.Tensor, op: str, groups: Sequence[Any]) -> torch.Tensor:
    """``t`` reduced with ``op`` over every group in turn (no autograd)."""
    for g in groups:
        t = plat.all_reduce(t, op, g)
    return t


def all_reduce_sum(plat: Any, t: torch.Tensor, groups: Sequence[Any]) -> torch.Tensor:
    """Sum of ``t`` over the groups, differentiable: each rank holds one addend, every rank
    uses the sum, so the gradient of each addend is the sum of every rank's gradient (an
    all-reduce in backward too)."""
    if not groups:
        return t
    if not plat.requires_grad(t):
        return all_reduce(plat, t, "sum", groups)
    return plat.custom_autograd(
        lambda x: all_reduce(plat, x, "sum", groups),
        lambda g: all_reduce(plat, g, "sum", groups),
        t,
    )
