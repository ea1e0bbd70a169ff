"""Differentiating DTensor code on MindSpore: ``value_and_grad`` / ``grad`` (as
``mindspore.value_and_grad`` / ``mindspore.grad``) and the optimizer-ready gradients.

MindSpore's autograd is functional: ``ms.value_and_grad(fn)`` seeds ``ones`` for ``fn``'s
output on every rank. For a Replicate DTensor loss that counts the loss once per rank.
These wrappers return ``loss.to_local()`` to MindSpore instead, whose backward reads the
seed as one Replicate gradient and keeps it on coordinate 0 only (as
``DTensor.backward()`` does on torch), so every gradient follows hyper_shard's contract:

* the gradient with respect to a DTensor input or parameter is a DTensor on its mesh whose
  ``full_tensor()`` equals the single-device gradient; its placements are
  :func:`~hyper_shard.placement.grad_placement` of the input's (Shard -> Shard, Replicate
  -> Partial(sum), Partial(sum) -> Replicate);
* the value returned is the loss DTensor.

:func:`optimizer_grads` turns those gradients into the plain local tensors a MindSpore
optimizer (``nn.SGD``, ``nn.Adam``...) expects: each one redistributed to its parameter's
placements (a Partial gradient of a Replicate parameter is all-reduced: the data-parallel
reduction).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import mindspore as ms
from mindspore import Tensor

from ...dtensor import DTensor
from ...placement import grad_placement

__all__ = ["value_and_grad", "grad", "optimizer_grads", "grad_dtensor"]


def _seed(out: Any) -> Any:
    """What MindSpore differentiates: the local tensor of a DTensor output (read as
    Replicate in backward, so a Replicate loss is counted once)."""
    if isinstance(out, DTensor):
        return out.to_local()
    return out


def grad_dtensor(g: Tensor, like: Any) -> Any:
    """Wrap a local gradient MindSpore returned for ``like`` (a DTensor input/parameter)
    as a DTensor with ``like``'s gradient placements (a ``fully_shard`` parameter's own
    ``_hs_grad_spec``: its gradient is already reduced over the data-parallel dims); other
    gradients pass through."""
    if not isinstance(like, DTensor) or not isinstance(g, Tensor):
        return g
    gspec = getattr(like, "__dict__", {}).get("_hs_grad_spec")
    if gspec is None:  # fully_shard's parameters declare theirs (reduced on the dp dims)
        spec = like._spec
        gspec = spec.with_placements([grad_placement(p) for p in spec.placements])
    return gspec.mesh.platform.wrap(g, gspec)


def _positions(grad_position: Any, n: int) -> list[int]:
    if grad_position is None:
        return []
    if isinstance(grad_position, int):
        return [grad_position]
    return list(grad_position)


def value_and_grad(
    fn: Callable,
    grad_position: int | Sequence[int] | None = 0,
    weights: Any = None,
    has_aux: bool = False,
) -> Callable:
    """As ``mindspore.value_and_grad`` for functions of DTensors.

    Args:
        fn: returns a DTensor (or plain tensor) loss, or ``(loss, aux...)`` with
            ``has_aux``.
        grad_position / weights / has_aux: as ``mindspore.value_and_grad``.

    Returns:
        A function returning ``(value, grads)`` shaped as ``mindspore.value_and_grad``'s
        (grads with respect to positions, to weights, or ``(positions, weights)``), each
        gradient of a DTensor a DTensor in the gradient contract's placements.
    """
    spec_box: list[Any] = [None]

    def inner(*args: Any) -> Any:
        out = fn(*args)
        if has_aux:
            spec_box[0] = getattr(out[0], "_spec", None)
            return (_seed(out[0]), *out[1:])
        spec_box[0] = getattr(out, "_spec", None)
        return _seed(out)

    vg = ms.value_and_grad(inner, grad_position, weights, has_aux)
    wlist = list(weights) if weights is not None and not isinstance(weights, Tensor) else None
    if weights is not None and wlist is None:
        wlist = [weights]

    def run(*args: Any) -> tuple[Any, Any]:
        value, grads = vg(*args)
        spec = spec_box[0]

        def rewrap(v: Any) -> Any:
            if spec is None or not isinstance(v, Tensor):
                return v
            return spec.mesh.platform.wrap(v, spec)

        value = (rewrap(value[0]), *value[1:]) if has_aux else rewrap(value)
        pos = _positions(grad_position, len(args))
        wrap_pos = _wrap_seq(grads if weights is None else grads[0], [args[i] for i in pos])
        if weights is None:
            return value, wrap_pos
        wrap_w = _wrap_seq(grads if grad_position is None else grads[1], wlist or [])
        if grad_position is None:
            return value, wrap_w
        return value, (wrap_pos, wrap_w)

    return run


def _wrap_seq(gs: Any, likes: list[Any]) -> Any:
    if isinstance(gs, Tensor):
        return grad_dtensor(gs, likes[0]) if likes else gs
    return tuple(grad_dtensor(g, w) for g, w in zip(gs, likes))


def grad(
    fn: Callable,
    grad_position: int | Sequence[int] | None = 0,
    weights: Any = None,
    has_aux: bool = False,
) -> Callable:
    """As ``mindspore.grad`` for functions of DTensors (see :func:`value_and_grad`)."""
    vg = value_and_grad(fn, grad_position, weights, has_aux)

    def run(*args: Any) -> Any:
        value, grads = vg(*args)
        return (grads, value[1:]) if has_aux else grads

    return run


def optimizer_grads(grads: Sequence[Any], params: Sequence[Any]) -> tuple[Tensor, ...]:
    """Plain local gradients for a MindSpore optimizer: each DTensor gradient redistributed
    to its parameter's placements (Partial -> Replicate is an all-reduce), then
    ``to_local()``. Plain gradients pass through. A collective.

    Raises:
        ValueError: ``grads`` and ``params`` differ in length.
    """
    if len(grads) != len(params):
        raise ValueError(
            f"optimizer_grads: {len(grads)} gradients for {len(params)} parameters; pass the "
            f"optimizer's parameters in the order the gradients were taken"
        )
    out = []
    for g, p in zip(grads, params):
        if isinstance(g, DTensor) and isinstance(p, DTensor):
            if g.placements != p.placements:
                g = g.redistribute(p.device_mesh, p.placements)
            out.append(g.to_local())
        else:
            out.append(g)
    return tuple(out)
