"""State shared by the torch platform and its compiled path (kept apart to avoid an import
cycle): the tracing switch and the box a DTensor is while a compiled region is traced."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from ...dtensor import DTensor
from ...spec import DTensorSpec

#: > 0 while the dispatcher runs inside a nonstrict trace (collectives become functional)
_TRACING = [0]


def is_tracing() -> bool:
    """Whether hyper_shard is recording a compiled region's local program right now."""
    return _TRACING[0] > 0


@contextlib.contextmanager
def tracing() -> Iterator[None]:
    _TRACING[0] += 1
    try:
        yield
    finally:
        _TRACING[0] -= 1


class TracedDTensor(DTensor):
    """A DTensor while a compiled region is traced: a box holding the local (fake or
    functional) tensor and the spec. Not a ``torch.Tensor``: a fake tensor cannot be
    re-typed as the eager subclass; torch functions still reach :meth:`__torch_function__`
    (the protocol applies to any object), which dispatches through the same rules."""

    __slots__ = ("_local", "_spec")

    def __init__(self, local: Any, spec: DTensorSpec) -> None:
        self._local = local
        self._spec = spec

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from .compiled import TRACE_DISPATCHER

        return TRACE_DISPATCHER.dispatch(func, args, kwargs or {})

    # the metadata rules and kernels read from a DTensor
    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._spec.shape)

    def size(self, dim: int | None = None) -> Any:
        return torch.Size(self._spec.shape) if dim is None else self._spec.shape[dim]

    def dim(self) -> int:
        return len(self._spec.shape)

    @property
    def ndim(self) -> int:
        return len(self._spec.shape)

    def numel(self) -> int:
        return math.prod(self._spec.shape)

    @property
    def dtype(self) -> Any:
        return self._local.dtype

    @property
    def device(self) -> Any:
        return self._local.device

    @property
    def requires_grad(self) -> bool:
        return bool(self._local.requires_grad)

    @property
    def _version(self) -> int:
        """No version counter (the platform's ``version`` reads None): the dispatcher's memo
        of an input's last redistribution (``_moved``) is for eager steps, a trace records
        each use."""
        raise RuntimeError("a traced DTensor has no version counter")

    def __repr__(self) -> str:
        return f"TracedDTensor({list(self._spec.shape)}, {self._spec.placements})"
