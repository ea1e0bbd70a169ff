"""In-place view ops on a torch DTensor: ``squeeze_``, ``unsqueeze_``, ``t_``, ``transpose_``,
``swapdims_``, ``swapaxes_`` (pytorch/pytorch#174136, #159532).

Such an op changes the shape of its DTensor and must keep its storage (``x.t_()`` returns
``x`` itself). That is possible exactly when the out-of-place view needs no data movement:
the view's rule (``op_specs/view.yaml``) decides the output placements, the local tensor
is changed by the same in-place op (its local arguments), and the DTensor's spec becomes
the view's spec. When the view would move data (``squeeze_`` of a size-1 dim that is
sharded, whose empty shards must first be gathered), the op raises a ShardingError that
names the op, the placements and the fix (the out-of-place op, or redistribute first),
before anything changes: PyTorch DTensor instead left the DTensor inconsistent (a spec of
shape ``[4]`` over a local ``[1, 4]``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from ...errors import ShardingError
from ...spec import DTensorSpec
from .dtensor import PROTOCOL_HANDLERS

__all__: list[str] = []

T: Any = torch.Tensor


def _squeeze_local_args(self: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``squeeze_``'s local arguments: the GLOBAL size-1 dims, explicitly (a sharded dim can
    be size 1, or 0, locally without being squeezed)."""
    shape = self._spec.shape
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None:
        dims = tuple(d for d, s in enumerate(shape) if s == 1)
    else:
        n = max(len(shape), 1)
        seq = dim if isinstance(dim, (tuple, list)) else (dim,)
        dims = tuple(d for d in (int(x) % n for x in seq) if shape and shape[d] == 1)
    return (self, dims), {}


def _same_args(self: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    return args, kwargs


def _handler(inplace: Any, view: Any, local_args: Any) -> Any:
    name = inplace.__name__
    view_name = view.__name__

    def handle(args: Any, kwargs: dict) -> Any:
        from .dispatch import DISPATCHER

        self = args[0]
        spec: DTensorSpec = self._spec
        decision = DISPATCHER.decide(view, args, kwargs)
        if decision.needs_redist:
            pl = ", ".join(str(p) for p in spec.placements)
            raise ShardingError(
                f"Tensor.{name} on DTensor{list(spec.shape)}[{pl}]: the view needs this "
                f"DTensor's data moved first (its placements cannot describe the result "
                f"locally), and an in-place op keeps its storage. Use the out-of-place "
                f"`x = x.{view_name}(...)`, or redistribute first (e.g. "
                f"`x = x.redistribute(mesh, [Replicate()] * mesh.ndim)`)"
            )
        out = DISPATCHER.dispatch(view, args, kwargs)  # the view's spec, no data moved
        new = DTensorSpec(
            out._spec.mesh, out._spec.placements, out._spec.tensor_meta, out._spec.shard_order
        )
        largs, lkwargs = local_args(self, args, kwargs)
        with DisableTorchFunctionSubclass():
            inplace(*largs, **lkwargs)
            got = tuple(self.shape)
        if new.mesh.get_coordinate() is not None and got != tuple(new.local_shape()):
            raise AssertionError(  # the view rule and the local op disagree: a bug
                f"Tensor.{name}: local shape {got} != {tuple(new.local_shape())} of {new}"
            )
        self._spec = new
        return self

    return handle


for _inplace, _view, _local in (
    (T.squeeze_, T.squeeze, _squeeze_local_args),
    (T.unsqueeze_, T.unsqueeze, _same_args),
    (T.t_, T.t, _same_args),
    (T.transpose_, T.transpose, _same_args),
    (T.swapdims_, T.swapdims, _same_args),
    (T.swapaxes_, T.swapaxes, _same_args),
):
    PROTOCOL_HANDLERS[_inplace] = _handler(_inplace, _view, _local)
    # the aten overloads (``torch.ops.aten.squeeze_.dim(x, 0)``, as PyTorch's test_view_ops
    # calls them) take the same arguments, self first
    _packet = getattr(torch.ops.aten, _inplace.__name__)
    for _overload in _packet.overloads():
        PROTOCOL_HANDLERS[getattr(_packet, _overload)] = PROTOCOL_HANDLERS[_inplace]
