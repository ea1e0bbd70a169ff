"""The torch platform: torch.distributed collectives, local primitives and autograd."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C import DisableTorchFunctionSubclass

from ...redistribute.cost import COLLECTIVES
from ...spec import TensorMeta, contiguous_stride
from ..base import GroupRanks, Platform

__all__ = ["TorchPlatform", "TorchGroup"]

_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl", "xpu": "xccl"}
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class TorchGroup(GroupRanks):
    """A torch process group plus the map from mesh coordinate to group rank."""

    __slots__ = ("pg",)

    def __init__(self, pg: Any, ranks: Sequence[int]) -> None:
        super().__init__(ranks)
        self.pg = pg

    def __repr__(self) -> str:
        return f"TorchGroup(ranks={list(self.ranks)})"


class _Custom(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, fwd: Callable, bwd: Callable) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        out = fwd(x)
        if out is x:
            out = x.view_as(x)
        return out

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        with DisableTorchFunctionSubclass():
            return ctx.bwd(g), None, None


class _Alias(torch.autograd.Function):
    """An alias of the input whose backward is a given function. The output is a detached
    alias (same storage and version counter), not a view made inside a custom Function,
    so autograd lets it be modified in place (the in-place op is recorded on it)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, bwd: Callable) -> torch.Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        return x.detach()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> tuple[Any, None]:  # type: ignore[override]
        with DisableTorchFunctionSubclass():
            return ctx.bwd(g), None


class TorchPlatform(Platform):
    """hyper_shard on PyTorch: gloo on CPU, NCCL on GPU, HCCL on Ascend (torch_npu)."""

    name = "torch"
    view_semantics = True

    def __init__(self) -> None:
        compose = os.environ.get("HYPER_SHARD_COMPOSE", "")
        self.native_collectives = frozenset(
            c for c in COLLECTIVES if c not in {x.strip() for x in compose.split(",")}
        )

    # ------------------------------------------------------------ process groups
    def ensure_initialized(self, device_type: str) -> None:
        if dist.is_initialized():
            return
        backend = _BACKENDS.get(device_type.lower(), "gloo")
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend)
        else:  # a lone process (notebook, single-device debugging): a world of one
            dist.init_process_group(backend=backend, store=dist.HashStore(), rank=0, world_size=1)

    def get_rank(self) -> int:
        return dist.get_rank()

    def get_world_size(self) -> int:
        return dist.get_world_size()

    def new_group(self, ranks: Sequence[int]) -> TorchGroup:
        ranks = list(ranks)
        if sorted(ranks) == list(range(dist.get_world_size())):
            pg = dist.group.WORLD
        else:
            pg = dist.new_group(ranks)
        return TorchGroup(pg, ranks)

    # ------------------------------------------------------------ local primitives
    def shape(self, t: Any) -> tuple[int, ...]:
        with DisableTorchFunctionSubclass():
            return tuple(t.shape)

    def narrow(self, t: torch.Tensor, dim: int, start: int, length: int) -> torch.Tensor:
        return t.narrow(dim, start, length)

    def cat(self, ts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
        return ts[0] if len(ts) == 1 else torch.cat(list(ts), dim)

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

    def version(self, t: Any) -> int | None:
        with DisableTorchFunctionSubclass():
            try:
                return int(t._version)
            except RuntimeError:  # inference tensors (torch.inference_mode) have none
                return None

    def copy_into(self, dst: Any, src: Any) -> None:
        with DisableTorchFunctionSubclass():
            dst.copy_(src)

    def cost_model(self, mesh: Any) -> Any:
        """Alpha-beta parameters by backend: gloo on CPU has ~100 µs per collective hop and
        ~1 GB/s; NCCL/HCCL ~10 µs and tens of GB/s."""
        from ...redistribute.cost import CostModel

        backend = _BACKENDS.get(str(mesh.device_type).lower(), "gloo")
        if backend == "gloo":
            cm = CostModel(alpha=1e-4, beta=1e-9)
        else:
            cm = CostModel(alpha=1e-5, beta=2e-11)
        return cm.with_native(self.native_collectives)

    def detach(self, t: torch.Tensor) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.detach()

    def contiguous(self, t: torch.Tensor) -> torch.Tensor:
        return t.contiguous()

    def new_tensor(
        self, kind: str, shape: Sequence[int], fill_value: Any, dtype: Any, device: Any = None
    ) -> torch.Tensor:
        shape = tuple(shape)
        if isinstance(device, str) and device != "cpu" and ":" not in device:
            mod = getattr(torch, device, None)
            device = torch.device(device, mod.current_device()) if mod is not None else device
        if kind == "full":
            return torch.full(shape, fill_value, dtype=dtype, device=device)
        fn: Any = {
            "zeros": torch.zeros,
            "ones": torch.ones,
            "empty": torch.empty,
            "rand": torch.rand,
            "randn": torch.randn,
        }[kind]
        return fn(shape, dtype=dtype, device=device)

    # ------------------------------------------------------------ collectives
    # gloo has no int16 kernels: such tensors travel as int32 (sums wrap the same way)
    def all_gather(self, t: torch.Tensor, group: TorchGroup, n: int) -> list[torch.Tensor]:
        if t.dtype is torch.int16:
            return [x.to(torch.int16) for x in self.all_gather(t.int(), group, n)]
        shape = tuple(t.shape)
        if t.numel() == 0:
            return [t] * n
        buf = torch.empty((n, *shape), dtype=t.dtype, device=t.device)
        _all_gather(buf.view(-1), t.contiguous().view(-1), group=group.pg)
        return group.to_coord_order(list(buf.unbind(0)))

    def all_reduce(self, t: torch.Tensor, op: str, group: TorchGroup) -> torch.Tensor:
        if t.dtype is torch.int16:
            return self.all_reduce(t.int(), op, group).to(torch.int16)
        out = t.contiguous().clone()
        if out.numel() == 0:
            return out
        dist.all_reduce(out, op=_OPS["sum" if op == "avg" else op], group=group.pg)
        if op == "avg":
            out = out / len(group.ranks) if out.is_floating_point() else out // len(group.ranks)
        return out

    def reduce_scatter(
        self, pieces: Sequence[torch.Tensor], op: str, group: TorchGroup
    ) -> torch.Tensor:
        if pieces and pieces[0].dtype is torch.int16:
            return self.reduce_scatter([p.int() for p in pieces], op, group).to(torch.int16)
        inp = torch.stack(group.to_group_order(pieces))
        out = torch.empty_like(pieces[0], memory_format=torch.contiguous_format)
        if out.numel() == 0:
            return out
        _reduce_scatter(
            out.view(-1), inp.view(-1), op=_OPS["sum" if op == "avg" else op], group=group.pg
        )
        if op == "avg":
            out = out / len(group.ranks)
        return out

    def all_to_all(self, pieces: Sequence[torch.Tensor], group: TorchGroup) -> list[torch.Tensor]:
        if pieces and pieces[0].dtype is torch.int16:
            return [x.to(torch.int16) for x in self.all_to_all([p.int() for p in pieces], group)]
        inp = torch.stack(group.to_group_order(pieces))
        if inp.numel() == 0:
            return list(pieces)
        out = torch.empty_like(inp)
        dist.all_to_all_single(out.view(-1), inp.view(-1), group=group.pg)
        return group.to_coord_order(list(out.unbind(0)))

    def broadcast(self, t: torch.Tensor, src_group_rank: int, group: TorchGroup) -> torch.Tensor:
        if t.dtype is torch.int16:
            return self.broadcast(t.int(), src_group_rank, group).to(torch.int16)
        out = t.contiguous().clone()
        dist.broadcast(out, src=group.ranks[src_group_rank], group=group.pg)
        return out

    def all_gather_object(self, obj: Any, group: TorchGroup, n: int) -> list[Any]:
        out: list[Any] = [None] * n
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dist.all_gather_object(out, obj, group=group.pg)
        return group.to_coord_order(out)

    # ------------------------------------------------------------ flat buffers (FSDP)
    def empty_flat(self, numel: int, dtype: Any, like: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return torch.empty(int(numel), dtype=dtype, device=like.device)

    def reshape(self, t: torch.Tensor, shape: Sequence[int]) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.reshape(tuple(shape))

    def copy_flat(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        with DisableTorchFunctionSubclass(), torch.no_grad():
            (dst if dst.dim() == 1 else dst.view(-1)).copy_(src.reshape(-1))

    def pack_chunks(self, tensors: Sequence[torch.Tensor], n: int, out: torch.Tensor) -> None:
        with DisableTorchFunctionSubclass(), torch.no_grad():
            ts = [t if t.dtype == out.dtype else t.to(out.dtype) for t in tensors]
            if all(t.dim() > 0 for t in ts) and not out.is_meta:
                torch._chunk_cat(ts, 0, n, out=out.view(n, -1))
            else:
                Platform.pack_chunks(self, ts, n, out)

    def unpack_chunks(self, flat: torch.Tensor, n: int, outs: Sequence[torch.Tensor]) -> None:
        with DisableTorchFunctionSubclass(), torch.no_grad():
            sizes = [o.numel() // n for o in outs]
            torch.split_with_sizes_copy(
                flat.view(n, -1), sizes, dim=1, out=[o.view(n, -1) for o in outs]
            )

    def free_storage(self, t: torch.Tensor) -> None:
        with DisableTorchFunctionSubclass():
            st = t.untyped_storage()
            if st.size() != 0:
                st.resize_(0)

    def alloc_storage(self, t: torch.Tensor) -> None:
        with DisableTorchFunctionSubclass():
            st = t.untyped_storage()
            need = int((t.storage_offset() + t.numel()) * t.element_size())
            if st.size() != need:
                st.resize_(need)

    def all_gather_into(
        self, out: torch.Tensor, inp: torch.Tensor, group: TorchGroup, async_op: bool = False
    ) -> Any:
        if group.identity:
            return _all_gather(out, inp, group=group.pg, async_op=async_op)
        # the backend orders chunks by group rank: gather, then put them in mesh order
        tmp = torch.empty_like(out)
        _all_gather(tmp, inp.clone(), group=group.pg)
        k = inp.numel()
        for c, g in enumerate(group.order):
            out.narrow(0, c * k, k).copy_(tmp.narrow(0, g * k, k))
        return None

    def reduce_scatter_into(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        op: str,
        group: TorchGroup,
        async_op: bool = False,
    ) -> Any:
        if "reduce_scatter" not in self.native_collectives:
            return Platform.reduce_scatter_into(self, out, inp, op, group)
        n = len(group.ranks)
        if not group.identity:  # chunks go to group ranks: reorder the input
            k = out.numel()
            src = inp
            inp = torch.empty_like(src)
            for c, g in enumerate(group.order):
                inp.narrow(0, g * k, k).copy_(src.narrow(0, c * k, k))
        if op == "avg":  # divide first (exact for powers of two; no backend needs AVG)
            inp.div_(n)
        elif op != "sum":
            raise ValueError(f"reduce_scatter_into: reduce op {op!r} (use 'sum' or 'avg')")
        return _reduce_scatter(out, inp, op=dist.ReduceOp.SUM, group=group.pg, async_op=async_op)

    def all_reduce_into(
        self, t: torch.Tensor, op: str, group: TorchGroup, async_op: bool = False
    ) -> Any:
        if op == "avg":
            t.div_(len(group.ranks))
            op = "sum"
        return dist.all_reduce(t, op=_OPS[op], group=group.pg, async_op=async_op)

    # ------------------------------------------------------------ autograd & wrapping
    def custom_autograd(self, fwd: Callable, bwd: Callable, x: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return _Custom.apply(x, fwd, bwd)

    def alias_autograd(self, bwd: Callable, x: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return _Alias.apply(x, bwd)

    def shares_storage(self, a: Any, b: Any) -> bool:
        with DisableTorchFunctionSubclass():
            return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())

    def copy_plain(self, dst: Any, src: Any) -> None:
        with DisableTorchFunctionSubclass():
            dst.copy_(src)

    def clone(self, t: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.clone()

    def native_group(self, group: Any) -> Any:
        return group.pg

    def cast(self, t: Any, dtype: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.to(dtype)

    def requires_grad(self, t: Any) -> bool:
        with DisableTorchFunctionSubclass():
            return bool(t.requires_grad) and torch.is_grad_enabled()

    def wrap(self, local: torch.Tensor, spec: Any) -> Any:
        from .dtensor import wrap

        return wrap(local, spec)

    def make_leaf(self, local: torch.Tensor, spec: Any, requires_grad: bool) -> Any:
        from .dtensor import make_leaf

        return make_leaf(local, spec, requires_grad)

    def local_of(self, dt: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return dt.as_subclass(torch.Tensor)

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> TensorMeta:
        with DisableTorchFunctionSubclass():
            shp = tuple(t.shape) if shape is None else tuple(shape)
            return TensorMeta(shp, contiguous_stride(shp), t.dtype, t.element_size())

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)
