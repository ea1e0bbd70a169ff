"""The sim "framework": its functions (``sim.add``, ``sim.linear``...), its tensor
methods (``SimTensor.__add__``, ``SimTensor.sum``...) and its DTensor type.

A plain sim tensor is a torch tensor. A :class:`SimOp` called with a :class:`SimDTensor`
argument goes to the sim dispatcher (:mod:`.dispatch`), which looks it up in the binding
table built from the registry's ``sim:`` names; called with plain tensors it runs its
local function. The names a YAML entry binds are the ones :data:`FUNCTIONS` and
:data:`METHODS` list (the resolver, :func:`.dispatch.resolve_sim_op`, reads them).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from hyper_shard.dtensor import DTensor, local_derivative
from hyper_shard.placement import Partial, Replicate, grad_placement

__all__ = ["SimOp", "SimDTensor", "FUNCTIONS", "METHODS"]


def _has_dtensor(args: tuple, kwargs: dict) -> bool:
    for a in (*args, *kwargs.values()):
        if type(a) is SimDTensor or (
            type(a) in (list, tuple) and any(type(x) is SimDTensor for x in a)
        ):
            return True
    return False


class SimOp:
    """One op of the sim framework: its name (as YAML binds it) and its local function."""

    __slots__ = ("name", "local")

    def __init__(self, name: str, local: Callable[..., Any]) -> None:
        self.name = name
        self.local = local

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _has_dtensor(args, kwargs):
            from .dispatch import DISPATCHER

            return DISPATCHER.dispatch(self, args, kwargs)
        return self.local(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<sim op {self.name}>"


def _sum(input: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """numpy's spelling: ``axis``, ``keepdims`` (the YAML gives the sim its signature)."""
    return input.sum() if axis is None else torch.sum(input, dim=axis, keepdim=keepdims)


_T = torch.Tensor
#: ``sim.<name>``: the framework's functions
FUNCTIONS: dict[str, SimOp] = {
    n: SimOp(f"sim.{n}", f)
    for n, f in {
        "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div,
        "neg": torch.neg, "exp": torch.exp, "tanh": torch.tanh, "relu": torch.relu,
        "matmul": torch.matmul, "mm": torch.mm, "linear": F.linear, "sum": _sum,
        "mean": torch.mean, "softmax": torch.softmax, "t": torch.t,
        "transpose": torch.transpose, "reshape": torch.reshape,
    }.items()
}  # fmt: skip
#: ``SimTensor.<name>``: the tensor methods
METHODS: dict[str, SimOp] = {
    n: SimOp(f"SimTensor.{n}", getattr(_T, n))
    for n in (
        "__add__", "__radd__", "__sub__", "__mul__", "__rmul__", "__truediv__", "__neg__",
        "__matmul__", "sum", "mean", "relu", "exp", "t", "transpose", "view", "reshape",
    )
}  # fmt: skip


def _method(name: str) -> Callable[..., Any]:
    op = METHODS[name]

    def method(self: SimDTensor, *args: Any, **kwargs: Any) -> Any:
        return op(self, *args, **kwargs)

    method.__name__ = name
    return method


class SimDTensor(DTensor):
    """The sim platform's DTensor: this rank's local torch tensor and the spec.

    ``shape`` is global; autograd runs on the local tensor (a leaf DTensor's local tensor
    is the autograd leaf); ``grad`` is a DTensor with the gradient placements of the
    contract (Shard -> Shard, Replicate -> Partial(sum), Partial -> Replicate).
    """

    def __init__(self, local: torch.Tensor, spec: Any) -> None:
        self._local = local
        self._spec = spec

    @property
    def shape(self) -> torch.Size:
        return torch.Size(self._spec.shape)

    def size(self, dim: int | None = None) -> Any:
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self._spec.shape)

    @property
    def dtype(self) -> torch.dtype:
        return self._local.dtype

    @property
    def requires_grad(self) -> bool:
        return self._local.requires_grad

    @property
    def grad(self) -> SimDTensor | None:
        g = self._local.grad
        if g is None:
            return None
        spec = self._spec
        return SimDTensor(g, spec.with_placements([grad_placement(p) for p in spec.placements]))

    def detach(self) -> SimDTensor:
        """The same value and spec, out of the autograd graph."""
        return SimDTensor(self._local.detach(), self._spec)

    def requires_grad_(self, requires_grad: bool = True) -> SimDTensor:
        """In place: this DTensor's local tensor (an autograd leaf) records gradients."""
        self._local.requires_grad_(requires_grad)
        return self

    def backward(self, gradient: SimDTensor | None = None) -> None:
        """Backward from this DTensor: a one-element one seeds the local derivative of 1
        (1 on the coordinate 0 of each Replicate mesh dim, 0 elsewhere), else
        ``gradient``'s, read by its placements."""
        spec = self._spec
        target = self
        if any(type(p) is Partial and p.reduce_op != "sum" for p in spec.placements):
            reps = [Replicate() if type(p) is Partial else p for p in spec.placements]
            target = self.redistribute(spec.mesh, reps)
        tspec, local = target._spec, target._local
        plat = tspec.mesh.platform
        if gradient is None:
            if math.prod(tspec.shape) != 1:
                raise RuntimeError("grad can be implicitly created only for scalar outputs")
            coord = tspec.mesh.get_coordinate()
            first = all(
                coord[m] == 0 for m, p in enumerate(tspec.placements) if type(p) is Replicate
            )
            seed = torch.ones_like(local) if first else torch.zeros_like(local)
        else:
            seed = local_derivative(plat, gradient._local, gradient._spec.placements, tspec)
        torch.autograd.backward(local, seed)

    def __repr__(self) -> str:
        return f"SimDTensor({list(self.shape)}, {list(self.placements)}, local={self._local})"

    __add__ = _method("__add__")
    __radd__ = _method("__radd__")
    __sub__ = _method("__sub__")
    __mul__ = _method("__mul__")
    __rmul__ = _method("__rmul__")
    __truediv__ = _method("__truediv__")
    __neg__ = _method("__neg__")
    __matmul__ = _method("__matmul__")
    sum = _method("sum")
    mean = _method("mean")
    relu = _method("relu")
    exp = _method("exp")
    t = _method("t")
    transpose = _method("transpose")
    view = _method("view")
    reshape = _method("reshape")
