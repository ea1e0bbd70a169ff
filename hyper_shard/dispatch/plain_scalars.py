"""Plain one-element tensors next to DTensors, taken as ``Replicate`` (as PyTorch DTensor).

PyTorch DTensor accepts a plain tensor of one element mixed with DTensors (``x *
torch.tensor([2.0])``, a ``(1, 1)`` scale) by reading it as a replicated DTensor; it warns
for the one-dimensional form. hyper_shard does the same: such a tensor becomes an alias
``Replicate`` DTensor on the mesh of the call's first DTensor before the layout is
decided, so the rule sees its shape (a ``(1, 1, 1)`` tensor can add dims by broadcasting).
A 0-d plain tensor keeps its older reading, a scalar argument, which is the same for every
rule. Larger plain tensors still raise unless inside ``implicit_replication()``.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .plain import replicate_where

if TYPE_CHECKING:
    from ..platform.base import Platform

__all__ = ["replicate_one_element"]

_WARNING = (
    "Found a non-scalar tensor with numel=1 and ndim!=0, we are implicitly creating a "
    "replicated DTensor for it. However, please consider changing it to a scalar tensor or "
    "explicitly create a DTensor under distributed environment."
)


def replicate_one_element(
    plat: Platform, is_dt: Callable[[Any], bool], args: tuple, kwargs: dict
) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with every plain tensor of one element and rank >= 1 (top level or
    in a list/tuple; never ``out=``) replaced by a ``Replicate`` DTensor alias on the mesh of
    the first DTensor argument. Unchanged when there is no such tensor or no DTensor."""
    plain = plat.is_tensor

    def wanted(a: Any, nested: bool) -> bool:
        if not plain(a):
            return False
        shape = plat.shape(a)
        return bool(shape) and math.prod(shape) == 1

    def warn_1d(a: Any) -> None:
        if len(plat.shape(a)) == 1:
            warnings.warn(_WARNING, stacklevel=6)

    return replicate_where(plat, is_dt, args, kwargs, wanted, warn_1d)
