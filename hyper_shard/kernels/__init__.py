"""Framework-neutral composite local kernels, written once against the Platform protocol.

The rules (``hyper_shard/rules/attention.py``, ``loss.py``, ``random.py``,
``reduction.py``) decide layouts; when a decision needs more than the plain local op (a
causal mask shifted to a query shard's offset, a vocab-parallel cross-entropy, a dropout
mask cut from the single-device draw, a mean over a sharded dim, ring or all-to-all
attention on a sharded sequence), they install one of these kernels as the decision's
``Layout.impl``. A kernel is called like the op it
replaces, with the (redistributed) local arguments, inside the platform's local-run
context (torch: torch-function handling disabled; MindSpore: ``NoFallbackGuard``), so the
framework's autograd records local ops only. It reads its arguments through the call's
:class:`~hyper_shard.dispatch.op.Binder` (canonical names, whatever the platform's
argument order), computes with the platform's local math (``plat.exp``, ``plat.gather``,
``plat.where``...; arithmetic, comparisons and ``&``/``~`` are the tensors' own Python
operators) and communicates through the platform's collectives, made differentiable by
``plat.custom_autograd`` (:func:`all_reduce_sum`). Where the op itself is the best local
kernel (``F.scaled_dot_product_attention`` with an explicit mask, ``cross_entropy`` with
``reduction='sum'``), the kernel calls the platform function it was given.

Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..platform.base import Comm, LocalOps, Runtime

__all__ = ["all_reduce_sum", "all_reduce", "groups_of", "numel", "input_as_dtype"]


def groups_of(mesh: Any, mesh_dims: Sequence[int]) -> tuple[Any, ...]:
    """The process groups of ``mesh_dims`` (empty on an abstract mesh)."""
    if mesh.is_abstract:
        return ()
    return tuple(mesh._group(m) for m in mesh_dims)


def numel(plat: LocalOps, t: Any) -> int:
    """The number of elements of a local tensor."""
    n = 1
    for s in plat.shape(t):
        n *= s
    return n


def all_reduce(plat: Comm, t: Any, op: str, groups: Sequence[Any]) -> Any:
    """``t`` reduced with ``op`` over every group in turn (no autograd)."""
    for g in groups:
        t = plat.all_reduce(t, op, g)
    return t


def all_reduce_sum(plat: Runtime, t: Any, groups: Sequence[Any]) -> Any:
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


def input_as_dtype(binder: Any, plat: LocalOps, args: tuple, kwargs: dict) -> Any:
    """The call's ``input`` cast to its ``dtype=`` argument (keyword, or the first dtype
    positional after the input), as torch's ``sum(x, dtype=)``/``log_softmax(x, d, dtype)``
    do before computing; the input unchanged when no dtype is given."""
    x = binder.get(args, kwargs, "input")
    dtype = kwargs.get("dtype")
    if dtype is None:
        dtype = next((a for a in args[1:] if plat.is_dtype(a)), None)
    return plat.cast(x, dtype) if dtype is not None else x
