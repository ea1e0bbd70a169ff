"""Readable, registry-style names of torch functions (``torch.add``, ``Tensor.add_``,
``torch.nn.functional.linear``, ``Tensor.shape.__get__``)."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["torch_op_name", "resolve_torch_op"]

_NAMESPACES: list[tuple[str, Any]] = [
    ("torch", torch),
    ("Tensor", torch.Tensor),
    ("torch.nn.functional", torch.nn.functional),
    ("torch.linalg", torch.linalg),
    ("torch.special", torch.special),
    ("torch.fft", torch.fft),
]
_BY_FUNC: dict[Any, str] | None = None


def _build() -> dict[Any, str]:
    out: dict[Any, str] = {}
    for prefix, ns in reversed(_NAMESPACES):  # earlier namespaces win
        for n in dir(ns):
            try:
                f = getattr(ns, n)
            except Exception:  # some attributes raise on access
                continue
            if callable(f) and not isinstance(f, type):
                try:
                    out[f] = f"{prefix}.{n}"
                except TypeError:  # unhashable
                    continue
    return out


def torch_op_name(func: Any) -> str:
    """The public name of a torch function as our YAML spells it."""
    global _BY_FUNC
    if _BY_FUNC is None:
        _BY_FUNC = _build()
    try:
        name = _BY_FUNC.get(func)
    except TypeError:
        name = None
    if name is not None:
        return name
    if getattr(func, "__name__", None) in ("__get__", "__set__", "__delete__"):
        desc = getattr(func, "__self__", None)
        return f"Tensor.{getattr(desc, '__name__', '?')}.{func.__name__}"
    mod = getattr(func, "__module__", None) or ""
    return f"{mod + '.' if mod else ''}{getattr(func, '__qualname__', repr(func))}"


def resolve_torch_op(name: str) -> Any:
    """The torch function object named ``name`` (``torch.add``, ``Tensor.add_``,
    ``torch.nn.functional.linear``, ``Tensor.shape.__get__``...).

    Raises:
        LookupError: no such function.
    """
    parts = name.split(".")
    if parts[0] == "Tensor":
        obj: Any = torch.Tensor
        parts = parts[1:]
    elif parts[0] == "torch":
        obj = torch
        parts = parts[1:]
    else:
        raise LookupError(f"{name!r}: torch op names start with 'torch.' or 'Tensor.'")
    for p in parts:
        try:
            obj = getattr(obj, p)
        except AttributeError:
            raise LookupError(f"{name!r}: torch has no attribute {p!r} there") from None
    return obj
