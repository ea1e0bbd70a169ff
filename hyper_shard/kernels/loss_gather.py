"""``cross_entropy``/``nll_loss`` on class-sharded logits OUTSIDE ``loss_parallel()``: the

if TYPE_CHECKING:
    from ..platform.base import Runtime
class dim is gathered and the loss computed on whole rows, as PyTorch DTensor computes it
there (one all-gather of the logits; a class-sharded weight or probability target is
gathered alike). The first such call of each op warns once that ``loss_parallel()``
computes the same loss without the gather.

The decision (and so the output placements) is the class-parallel one of
:class:`~hyper_shard.kernels.loss.ClassParallelLoss`, made once for both
contexts: a ``Replicate`` loss (cross_entropy, class-index targets, no weight) comes out
identical on every rank; a ``Partial(sum)`` one is the whole loss on class coordinate 0 and
zero elsewhere. Backward follows the gather's (a reduce-scatter of the logits' gradient).
"""

from __future__ import annotations

import copy
import warnings
from typing import TYPE_CHECKING, Any

from ..placement import Replicate, Shard
from ..redistribute.executor import redistribute_local

if TYPE_CHECKING:
    from ..platform.base import Runtime

__all__ = ["gathered_loss"]

_HINTED: set[str] = set()


def _whole(plat: Runtime, t: Any, spec: Any, dim: int) -> Any:
    """``t`` (laid out by ``spec``) with tensor dim ``dim`` gathered (other dims kept)."""
    if spec is None or t is None:
        return t
    dst = spec.with_placements(
        [Replicate() if type(p) is Shard and p.dim == dim else p for p in spec.placements]
    )
    return redistribute_local(plat, t, spec, dst) if dst.placements != spec.placements else t


def gathered_loss(kernel: Any, args: tuple, kwargs: dict) -> Any:
    """The loss of ``kernel``'s call with the class dim gathered (see the module docstring).

    ``kernel.gather_specs`` maps ``input``/``target``/``weight`` to the spec of that argument
    in the decided layout (the rule fills it); ``kernel.class_coord0`` tells whether this
    rank is at coordinate 0 of every class-sharding mesh dim."""
    if kernel.kind not in _HINTED:
        _HINTED.add(kernel.kind)
        warnings.warn(
            f"hyper_shard: {kernel.kind} on logits sharded on their class dim outside "
            f"loss_parallel() gathers the classes first (one all-gather of the logits); "
            f"compute it inside `with hyper_shard.parallel.loss_parallel():` to get the same "
            f"loss without the gather",
            stacklevel=4,
        )
    b, specs, plat, cd = kernel.binder, kernel.gather_specs, kernel.plat, kernel.class_dim
    roles = [("input", cd), ("weight", 0)]
    if kernel.prob_count is not None:  # class probabilities: the target has the class dim
        roles.append(("target", cd))
    for role, dim in roles:
        v = b.get(args, kwargs, role)
        if role in specs and v is not None:
            args, kwargs = b.replace(args, kwargs, role, _whole(plat, v, specs[role], dim))
    whole = copy.copy(kernel)
    whole.class_offset, whole.class_groups = 0, ()
    out = whole.compute(args, kwargs)
    if kernel.replicated_output(b.get(args, kwargs, "weight") is not None):
        return out
    return out if kernel.class_coord0 else out * 0
