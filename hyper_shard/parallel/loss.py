"""``loss_parallel()``: cross-entropy on class-sharded logits without gathering them (as
``torch.distributed.tensor.parallel.loss_parallel``).

Inside the context, ``torch.nn.functional.cross_entropy`` and ``nll_loss`` on logits
sharded along the class dim (a ``ColwiseParallel`` output projection's ``Shard(-1)``
logits) run the vocab-parallel loss of :mod:`hyper_shard.rules.loss`: max and sum-exp
all-reduces, the target's logit taken on the rank that owns its class; ``ignore_index``,
``label_smoothing`` and a class ``weight`` are supported, forward and backward exact.
Outside it, such a call raises :class:`hyper_shard.ShardingError`. ``log_softmax`` along a
sharded dim never gathers (in or outside the context) and has the true gradient even when
used alone.

The switch is a ``ContextVar``: nestable, and local to the thread (or asyncio task) that
entered it. ``backward()`` may run inside or outside the context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ..kernels.loss import LOSS_PARALLEL, loss_parallel_enabled

__all__ = ["loss_parallel", "loss_parallel_enabled"]


@contextmanager
def loss_parallel() -> Iterator[None]:
    """Compute ``cross_entropy``/``nll_loss`` on class-sharded DTensor logits without
    gathering them, for the duration of the ``with`` block.

    Shapes: logits ``(N, C)`` / ``(N, C, d1...)`` global, sharded ``Shard(1)`` (or
    ``Shard(-1)`` of a 2-d tensor) and possibly a batch dim on another mesh dim; targets
    ``(N, d1...)`` Replicate on the class-sharding mesh dims. The loss is a
    ``Partial(sum)`` DTensor (``reduction='none'``: per-sample, ``Partial(sum)`` over the
    class mesh dims); its ``full_tensor()`` equals torch's loss on the full logits.

    Example::

        with loss_parallel():
            loss = F.cross_entropy(logits, labels)   # logits: DTensor, Shard(1)
            loss.backward()
    """
    token = LOSS_PARALLEL.set(LOSS_PARALLEL.get() + 1)
    try:
        yield
    finally:
        LOSS_PARALLEL.reset(token)
