"""Opt-in behaviours that PyTorch DTensor keeps under ``torch.distributed.tensor.experimental``.

:func:`implicit_replication` lets plain tensors take part in ops on DTensors, as PyTorch
DTensor's context of the same name does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from .dispatch.switches import implicit_replication_block

__all__ = ["implicit_replication"]


@contextmanager
def implicit_replication() -> Iterator[None]:
    """Treat plain tensors mixed with DTensors as ``Replicate`` DTensors, as PyTorch
    DTensor's ``torch.distributed.tensor.experimental.implicit_replication``.

    Inside the context, an op on DTensors that also receives a plain tensor of rank >= 1
    (a mask, an index tensor, a bias, labels...) wraps that tensor as a ``Replicate``
    DTensor on the mesh of the op's first DTensor argument (an alias: no copy, autograd
    kept), then dispatches as usual. Outside it, such a call raises
    :class:`~hyper_shard.errors.ShardingError` naming the op and the argument (a 0-d tensor
    argument is accepted as a scalar; a 0-d tensor inside a tensor list, as in
    ``torch.stack([dt_norm, plain_norm])``, is a tensor and needs this context).

    The plain tensor must hold the same values on every rank (it is the global tensor);
    nothing checks that. A gradient flowing back to it is each rank's local contribution
    (as with PyTorch DTensor), so give it ``requires_grad=False`` or reduce it yourself.
    Works on both backends (PyTorch and MindSpore). The switch is a ``ContextVar``:
    nestable, local to the thread (or asyncio task) that entered it, restored on exit,
    also when the body raises.
    """
    with implicit_replication_block(True):
        yield
