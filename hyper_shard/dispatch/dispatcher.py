"""Routes every op called on a DTensor (placeholder until the registry lands)."""

from __future__ import annotations

from typing import Any

from ..errors import OpNotRegisteredError

__all__ = ["dispatch"]


def _describe(args: Any, kwargs: dict) -> str:
    from ..dtensor import DTensor

    parts = []
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, DTensor):
            parts.append(f"DTensor{list(a._spec.shape)}[{', '.join(str(p) for p in a.placements)}]")
    return ", ".join(parts) or "no DTensor"


def dispatch(func: Any, args: Any, kwargs: dict) -> Any:
    from ..platform.torch.names import torch_op_name

    name = torch_op_name(func)
    raise OpNotRegisteredError(
        f"op {name!r} has no sharding rule registered (inputs: {_describe(args, kwargs)}). "
        f"Add a YAML entry for it (see docs/), or call to_local()/full_tensor() and run the "
        f"op on plain tensors"
    )
