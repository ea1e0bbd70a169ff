"""Local kernels of the random rule (see ``hyper_shard/rules/random.py``): each runs the
called function on a tensor of the GLOBAL shape (same dtype and device as the local
shard) inside :class:`hyper_shard.random.OffsetRNGTracker`, which keeps this rank's box
of the draw. The generator therefore advances exactly as the single-device call would.

* :class:`GlobalDraw` — ``rand_like``, ``randn_like``, ``randint_like``,
  ``bernoulli(input)`` (probabilities gathered first): the function on the global tensor,
  this rank's box returned; in-place fills (``Tensor.uniform_``, ``normal_``,
  ``nn.init.*``) copy the box into the local shard.
* :class:`ShardedDropout` — ``dropout``/``dropout1d/2d/3d`` (torch), ``ops.dropout``
  (MindSpore): the same function on a global tensor of ones gives ``mask / (1 - p)``
  exactly as the framework's kernel computes it, so ``input * box`` is bit-identical to the
  single-device result.

Written against the Platform protocol.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..dispatch.op import Binder
from ..random import get_rng_tracker

if TYPE_CHECKING:
    from ..mesh import DeviceMesh
    from ..platform.base import LocalOps, Runtime

__all__ = ["GlobalDraw", "ShardedDropout"]


class GlobalDraw:
    """A random op whose output (or in-place result) is this rank's box of the global draw.

    Args:
        func: the function called (``torch.rand_like``, ``Tensor.uniform_``...).
        binder: the call's binder; role: the canonical name of the tensor the draw takes
            its shape from (``input``, ``tensor``...).
        plat: the Platform.
        global_shape: the global shape of the draw.
        box: ``(offset, local shape)`` of this rank's shard of the output.
        inplace: fill the local shard in place and return it.
        no_grad: run the in-place copy outside autograd (``nn.init`` functions).
        from_values: the tensor is already the global tensor (a gathered probability
            tensor of ``bernoulli``): call the function on it directly.
        mesh: the DTensor's mesh (the tracker draws once for ranks that are threads).
    """

    __slots__ = (
        "func",
        "binder",
        "role",
        "plat",
        "global_shape",
        "box",
        "inplace",
        "no_grad",
        "from_values",
        "mesh",
    )

    def __init__(
        self,
        func: Any,
        binder: Binder,
        role: str,
        plat: Runtime,
        global_shape: Sequence[int],
        box: tuple[Sequence[int], Sequence[int]],
        *,
        inplace: bool,
        no_grad: bool = False,
        from_values: bool = False,
        mesh: DeviceMesh | None = None,
    ) -> None:
        self.func, self.binder, self.role, self.plat = func, binder, role, plat
        self.global_shape = tuple(global_shape)
        self.box = (tuple(box[0]), tuple(box[1]))
        self.inplace, self.no_grad, self.from_values = inplace, no_grad, from_values
        self.mesh = mesh

    def __repr__(self) -> str:
        name = getattr(self.func, "__name__", "draw")
        return (
            f"GlobalDraw({name} on {list(self.global_shape)}, keep offset={list(self.box[0])} "
            f"shape={list(self.box[1])}{', in place' if self.inplace else ''})"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        x = self.binder.get(args, kwargs, self.role)
        rg = False
        if not self.inplace and "requires_grad" in kwargs:
            kwargs = dict(kwargs)
            rg = bool(kwargs.pop("requires_grad"))
        plat = self.plat
        full = x if self.from_values else plat.full(self.global_shape, 0, x)
        a2, k2 = self.binder.replace(args, kwargs, self.role, full)

        def draw() -> Any:
            out = self.func(*a2, **k2)
            return full if self.inplace else out

        box = get_rng_tracker().draw_shard(plat, draw, *self.box, self.mesh)
        if self.inplace:
            return plat.assign(x, box, no_grad=self.no_grad)
        return plat.set_requires_grad(box) if rg else box


class ShardedDropout:
    """``dropout``-style op (``input * mask / (1 - p)``) on a shard: the mask is this
    rank's box of the single-device draw.

    Args:
        func: the function called; binder: the call's binder.
        plat: the Platform.
        global_shape: the input's global shape; box: this rank's ``(offset, local shape)``.
        inplace_call: the function itself is in-place (``torch.dropout_``).
        mesh: the DTensor's mesh (the tracker draws once for ranks that are threads).
    """

    __slots__ = ("func", "binder", "plat", "global_shape", "box", "inplace_call", "mesh")

    def __init__(
        self,
        func: Any,
        binder: Binder,
        plat: LocalOps,
        global_shape: Sequence[int],
        box: tuple[Sequence[int], Sequence[int]],
        inplace_call: bool,
        mesh: DeviceMesh | None = None,
    ) -> None:
        self.func, self.binder, self.plat = func, binder, plat
        self.global_shape = tuple(global_shape)
        self.box = (tuple(box[0]), tuple(box[1]))
        self.inplace_call = inplace_call
        self.mesh = mesh

    def __repr__(self) -> str:
        return (
            f"ShardedDropout(mask drawn on {list(self.global_shape)}, keep "
            f"offset={list(self.box[0])} shape={list(self.box[1])})"
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        b = self.binder
        x = b.get(args, kwargs, "input")
        p = b.get(args, kwargs, "p", 0.5)
        training = b.get(args, kwargs, "training", b.get(args, kwargs, "train", True))
        inplace = self.inplace_call or bool(b.get(args, kwargs, "inplace", False))
        if not training or (isinstance(p, (int, float)) and p == 0):
            return x  # the framework draws nothing and returns the input
        ones = self.plat.full(self.global_shape, 1, x)
        a2, k2 = b.replace(args, kwargs, "input", ones)
        if "inplace" in b.pos:  # F.dropout(..., inplace=True): draw on the ones out of place
            a2, k2 = b.replace(a2, k2, "inplace", False)
        mask = get_rng_tracker().draw_shard(
            self.plat, lambda: self.func(*a2, **k2), *self.box, self.mesh
        )
        return self.plat.inplace_mul(x, mask) if inplace else x * mask
