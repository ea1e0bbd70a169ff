"""The sim platform: local tensors are torch tensors, every rank is a thread, and the
collectives meet through an :class:`~.exchange.Exchange` (all of them native).

It implements the methods of :class:`hyper_shard.platform.base.Platform` that DTensor
creation, ops, redistribution and autograd need; nothing of FSDP, compilation or
checkpoints."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hyper_shard.platform.base import Platform
from hyper_shard.spec import TensorMeta, contiguous_stride

from .exchange import Exchange, SimGroup

__all__ = ["SimPlatform", "PLATFORM", "WORLD", "KEY", "the_platform"]

#: the platform's key: YAML ``sim: [...]``, ``Platform.name``
KEY = "sim"


class _World(threading.local):
    """This thread's rank and the exchange of its world (set by :func:`.runner.run_ranks`)."""

    rank: int = 0
    exchange: Exchange | None = None


WORLD = _World()

_REDUCE = {
    "sum": lambda xs: xs.sum(0),
    "avg": lambda xs: xs.mean(0),
    "max": lambda xs: xs.amax(0),
    "min": lambda xs: xs.amin(0),
    "prod": lambda xs: xs.prod(0),
}


class _Custom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Callable, bwd: Callable) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        out = fwd(x)
        return x.view_as(x) if out is x else out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        return ctx.bwd(g), None, None


class _CustomN(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, fwd: Callable, bwd: Callable, *inputs: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        return fwd(*inputs)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        return (None, None, *ctx.bwd(g))


class SimPlatform(Platform):
    """Torch local math; collectives through the thread exchange.

    Args:
        native: the collectives it runs natively (default: all); the executor composes
            the others, as on a backend without them (gloo has no all-to-all).
    """

    name = KEY

    def __init__(self, native: frozenset[str] | None = None) -> None:
        if native is not None:
            self.native_collectives = frozenset(native)

    # ------------------------------------------------------------ process groups
    def ensure_initialized(self, device_type: str, timeout: Any = None) -> None:
        if WORLD.exchange is None:
            raise RuntimeError("the sim platform runs inside fake_platform.run_ranks")

    def get_rank(self) -> int:
        return WORLD.rank

    def world_id(self) -> int:
        """The world (one :func:`.runner.run_ranks` call) this rank thread runs in."""
        return id(WORLD.exchange)

    def ranks_are_threads(self) -> bool:
        return True

    def get_world_size(self) -> int:
        assert WORLD.exchange is not None
        return WORLD.exchange.world

    def new_group(self, ranks: Sequence[int], timeout: Any = None) -> SimGroup:
        assert WORLD.exchange is not None
        return SimGroup(ranks, WORLD.rank, WORLD.exchange)

    # ------------------------------------------------------------ local primitives
    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(t.shape)

    def narrow(self, t: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
        return t.narrow(dim, start, length)

    def cat(self, ts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
        return torch.cat(list(ts), dim)

    def pad_dim(self, t: torch.Tensor, dim: int, size: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[dim] = size - shape[dim]
        return torch.cat([t, t.new_zeros(shape)], dim)

    def embed(self, t: torch.Tensor, dim: int, start: int, extent: int) -> torch.Tensor:
        shape = list(t.shape)
        shape[dim] = extent
        out = t.new_zeros(shape)
        out.narrow(dim, start, t.shape[dim]).copy_(t)
        return out

    def zeros_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(t)

    def ones_like(self, t: torch.Tensor) -> torch.Tensor:
        return torch.ones_like(t)

    def scale(self, t: torch.Tensor, factor: float) -> torch.Tensor:
        return t * factor

    def eq_mask(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return (a == b).to(a.dtype)

    def mul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a * b

    def div(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a / b

    def clone(self, t: Any) -> torch.Tensor:
        return t.clone(memory_format=torch.contiguous_format)

    def detach(self, t: torch.Tensor) -> torch.Tensor:
        return t.detach()

    def contiguous(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous()

    def cast(self, t: Any, dtype: Any) -> torch.Tensor:
        return t.to(dtype)

    # ------------------------------------------------------------ local math (kernels)
    def is_dtype(self, obj: Any) -> bool:
        return isinstance(obj, torch.dtype)

    def dtype_of(self, t: torch.Tensor) -> Any:
        return t.dtype

    def sum(self, t: torch.Tensor, dim: Any = None, keepdim: bool = False) -> torch.Tensor:
        return t.sum() if dim is None else t.sum(dim, keepdim=keepdim)

    def amax(self, t: torch.Tensor, dim: Any, keepdim: bool = False) -> torch.Tensor:
        return t.amax(dim, keepdim=keepdim)

    def exp(self, t: torch.Tensor) -> torch.Tensor:
        return t.exp()

    def log(self, t: torch.Tensor) -> torch.Tensor:
        return t.log()

    def softmax(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.softmax(dim)

    def no_grad(self) -> Any:
        return torch.no_grad()

    def new_tensor(
        self, kind: str, shape: Sequence[int], fill_value: Any, dtype: Any, device: Any = None
    ) -> torch.Tensor:
        if kind == "full":
            return torch.full(tuple(shape), fill_value, dtype=dtype)
        fn: Any = getattr(torch, kind)  # zeros, ones, empty, rand, randn
        return fn(tuple(shape), dtype=dtype)

    # ------------------------------------------------------------ collectives
    def all_gather(self, t: torch.Tensor, group: SimGroup, n: int) -> list[torch.Tensor]:
        return [x.clone() for x in group.exchange.gather(group, t.detach().clone())]

    def all_reduce(self, t: torch.Tensor, op: str, group: SimGroup) -> torch.Tensor:
        return _REDUCE[op](torch.stack(group.exchange.gather(group, t.detach().clone())))

    def reduce_scatter(self, pieces: Sequence[Any], op: str, group: SimGroup) -> torch.Tensor:
        every = group.exchange.gather(group, [p.detach().clone() for p in pieces])
        return _REDUCE[op](torch.stack([ps[group.coordinate] for ps in every]))

    def all_to_all(self, pieces: Sequence[Any], group: SimGroup) -> list[torch.Tensor]:
        every = group.exchange.gather(group, [p.detach().clone() for p in pieces])
        return [ps[group.coordinate].clone() for ps in every]

    def send_recv(
        self, t: torch.Tensor, dst: int, like: torch.Tensor, src: int, group: SimGroup
    ) -> torch.Tensor:
        """Every member posts ``(its tensor, its destination)``; each takes what ``src``
        sent it (native only where ``native`` lists ``send_recv``)."""
        every = group.exchange.gather(group, (t.detach().clone(), dst))
        sent, to = every[src]
        assert to == group.coordinate, "sim send_recv: unpaired exchange"
        return sent.clone()

    def broadcast(self, t: torch.Tensor, src_group_rank: int, group: SimGroup) -> torch.Tensor:
        return group.exchange.gather(group, t.detach().clone())[src_group_rank].clone()

    def all_gather_object(self, obj: Any, group: SimGroup, n: int) -> list[Any]:
        return list(group.exchange.gather(group, obj))

    # ------------------------------------------------------------ autograd & wrapping
    def custom_autograd(self, fwd: Callable, bwd: Callable, x: Any) -> torch.Tensor:
        return _Custom.apply(x, fwd, bwd)

    def custom_autograd_n(self, fwd: Callable, bwd: Callable, inputs: Sequence[Any]) -> Any:
        return _CustomN.apply(fwd, bwd, *inputs)

    def requires_grad(self, t: Any) -> bool:
        return bool(t.requires_grad) and torch.is_grad_enabled()

    def version(self, t: Any) -> int | None:
        return None  # nothing memoised

    def shares_storage(self, a: Any, b: Any) -> bool:
        return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> TensorMeta:
        shp = tuple(t.shape) if shape is None else tuple(shape)
        return TensorMeta(shp, contiguous_stride(shp), t.dtype, t.element_size())

    def wrap(self, local: torch.Tensor, spec: Any) -> Any:
        from .tensor import SimDTensor

        return SimDTensor(local, spec)

    def make_leaf(self, local: torch.Tensor, spec: Any, requires_grad: bool) -> Any:
        from .tensor import SimDTensor

        return SimDTensor(local.detach().requires_grad_(requires_grad), spec)

    def local_of(self, dt: Any) -> torch.Tensor:
        return dt._local  # type: ignore[no-any-return]


#: the platform (one for every rank: its collectives take the rank from the group)
PLATFORM = SimPlatform()


def the_platform() -> SimPlatform:
    """The declaration's Platform factory (``get_platform("sim")``)."""
    return PLATFORM
