"""The MindSpore platform (PyNative): ``mint.distributed`` collectives, local primitives,
custom-gradient functions and the MindSpore DTensor.

Devices and their collectives:

======== ========= =========================================================================
device   backend   native collectives (the others are composed by the executor)
======== ========= =========================================================================
CPU      mccl      ``all_gather`` (to a list), ``all_reduce``, ``send_recv`` (isend/irecv);
                   reduce-scatter and all-to-all are composed (MindSpore 2.10 has no
                   ``DistCommReduceScatter``/``DistCommAllToAllV`` CPU kernels; see
                   :mod:`hyper_shard.platform.compose`)
Ascend   HCCL      all four, and ``send_recv``
GPU      NCCL      all four, and ``send_recv``
======== ========= =========================================================================

Every collective passes its group explicitly (on CPU the default ``"hccl_world_group"``
does not exist; the world group is ``"mccl_world_group"``) and works on a fresh, owned
buffer (an in-place all-reduce or broadcast into a *view* silently does nothing on CPU).

A process joins the world through ``msrun`` (``mindspore.communication.init()``), through
:func:`hyper_shard.platform.mindspore.launch.init_process` (spawned ranks on one machine:
TCPStore + the mccl store init), or, with neither, as a world of one (no communication).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import mindspore as ms
import mindspore.mint.distributed as dist
from mindspore import Parameter, Tensor, mint, ops
from mindspore.communication import GlobalComm

from ...flight import collective, guarded
from ...parallel._adapter import register_adapter
from ...redistribute.cost import COLLECTIVES
from ...spec import TensorMeta, contiguous_stride
from ..base import GroupRanks, Platform
from . import hooks
from .hooks import NoFallbackGuard
from .hooks import pynative_executor as _executor
from .timeouts import check_group_timeout, collective_timeout, set_collective_timeout

__all__ = ["MindSporePlatform", "MSGroup", "CPU_COLLECTIVES", "ms_local"]

#: collectives MindSpore 2.10 runs natively on CPU (mccl): all-gather, all-reduce and the
#: point-to-point isend/irecv (no batch_isend_irecv kernel: two handles, waited on)
CPU_COLLECTIVES = frozenset({"all_gather", "all_reduce", "send_recv"})
_BACKENDS = {"CPU": "mccl", "Ascend": "hccl", "GPU": "nccl"}
_DEVICES = {"cpu": "CPU", "ascend": "Ascend", "npu": "Ascend", "gpu": "GPU", "cuda": "GPU"}
_local_shape = Tensor.shape.fget  # the C++ (local) shape, whatever a subclass reports
# dtypes mccl (MindSpore 2.10, CPU) cannot move: sent as another dtype, or reduced locally
_GATHER_WIRE = {ms.bool_: ms.int32, ms.int16: ms.int32}
_REDUCE_WIRE = {ms.bool_: ms.int32, ms.uint8: ms.int32}
_REDUCE_BY_GATHER = frozenset({ms.float64})


def ms_local(t: Any) -> Tensor:
    """A plain ``mindspore.Tensor`` alias of ``t`` (a DTensor's local data; same storage,
    autograd kept). Plain tensors are returned unchanged."""
    if type(t) is Tensor or not isinstance(t, Tensor):
        return t
    if isinstance(t, Parameter):
        with NoFallbackGuard():
            return mint.reshape(t, _local_shape(t))
    return Tensor._make_subclass(Tensor, t)


def _device_of(device_type: str | None) -> str:
    if device_type is None:
        return str(ms.get_context("device_target"))
    return _DEVICES.get(device_type.lower(), device_type)


class MSGroup(GroupRanks):
    """A MindSpore communication group (its name) plus the map from mesh coordinate to
    group rank (MindSpore orders a group's ranks ascending), and the collective timeout
    (process-wide on MindSpore; None if unknown).

    ``name`` is None in a world of one (no communication).
    """

    __slots__ = ("name", "timeout")

    def __init__(
        self, name: str | None, ranks: Sequence[int], timeout: timedelta | None = None
    ) -> None:
        super().__init__(ranks)
        self.name = name
        self.timeout = timeout

    def __repr__(self) -> str:
        return f"MSGroup({self.name!r}, ranks={list(self.ranks)})"


class _Custom(ms._Function):
    """``fwd(x)`` as one autograd node whose backward is ``bwd(grad)``."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, fwd: Callable, bwd: Callable) -> Tensor:  # type: ignore[override]
        ctx.bwd = bwd
        out = fwd(x)
        if out is x:  # MindSpore skips the custom backward of an input returned as is
            out = x.view(_local_shape(x))
        return out

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, None, None]:  # type: ignore[override]
        out = ctx.bwd(g)
        # a strided gradient (a narrow of a non-leading dim) is mis-read by some view ops'
        # backward (SplitTensorView): hand MindSpore a contiguous one
        return (out.contiguous() if isinstance(out, Tensor) else out), None, None


class _CustomN(ms._Function):
    """``fwd(*inputs)`` as one autograd node over several inputs; backward ``bwd(grad)``
    (``fwd``/``bwd`` passed last: MindSpore binds the tensor inputs first)."""

    @staticmethod
    def forward(ctx: Any, *args: Any) -> Tensor:  # type: ignore[override]
        *inputs, fwd, bwd = args
        ctx.bwd = bwd
        ctx.n = len(inputs)
        return fwd(*inputs)  # type: ignore[no-any-return]

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Any, ...]:  # type: ignore[override]
        grads = [x.contiguous() if isinstance(x, Tensor) else x for x in ctx.bwd(g)]
        return (*grads, None, None)


class MindSporePlatform(Platform):
    """hyper_shard on MindSpore (PyNative): mccl on CPU, HCCL on Ascend, NCCL on GPU.

    ``HYPER_SHARD_COMPOSE`` (comma-separated collective names) forces the executor to
    compose those collectives even where the device has them.
    """

    name = "mindspore"
    #: what mint.distributed raises for a failed collective ("AllReduce failed.": a peer
    #: that did not answer within MS_CPU_COMM_OP_TIMEOUT, or died)
    comm_errors: tuple[type[BaseException], ...] = (RuntimeError,)

    def __init__(self) -> None:
        self._initialized = False
        self._world: tuple[int, int] | None = None  # (rank, size) of a world of one
        self.device = _device_of(None)
        self.native_collectives = self._native(self.device)

    @staticmethod
    def _native(device: str) -> frozenset[str]:
        base = CPU_COLLECTIVES if device == "CPU" else COLLECTIVES | {"send_recv"}
        compose = {x.strip() for x in os.environ.get("HYPER_SHARD_COMPOSE", "").split(",")}
        return frozenset(c for c in base if c not in compose)

    def cost_model(self, mesh: Any) -> Any:
        """Alpha-beta parameters by device: mccl on CPU costs ~0.3-2 ms per collective and
        ~1 GB/s; HCCL/NCCL ~10 µs per hop and tens of GB/s. Composed collectives are priced
        as their composition (see :mod:`hyper_shard.redistribute.cost`)."""
        from ...redistribute.cost import CostModel

        if _device_of(mesh.device_type) == "CPU":
            cm = CostModel(alpha=3e-4, beta=1e-9)
        else:
            cm = CostModel(alpha=1e-5, beta=2e-11)
        return cm.with_native(self.native_collectives)

    # ------------------------------------------------------------ process groups
    def ensure_initialized(
        self, device_type: str, timeout: timedelta | float | None = None
    ) -> None:
        """Join the world: already initialised (``init_process`` or ``init()``), ``msrun``'s
        environment (``MS_ROLE``: ``mindspore.communication.init()``, after
        :func:`set_collective_timeout` with ``timeout``), or else a world of one.

        Raises:
            ValueError: ``device_type`` is not a MindSpore device (CPU/Ascend/GPU), or a
                timeout that is not positive.
        """
        device = _device_of(device_type)
        if device not in _BACKENDS:
            raise ValueError(
                f"MindSpore device_type {device_type!r} is unknown; use 'CPU', 'Ascend' or 'GPU'"
            )
        if self._initialized:
            return
        if str(ms.get_context("device_target")) != device:
            ms.set_device(device)
        self.device = device
        self.native_collectives = self._native(device)
        if _comm_initialized():
            self._world = None
        elif os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED"):
            from mindspore.communication import init

            set_collective_timeout(device, timeout)
            init()  # msrun's scheduler process runs the script too: init() serves the cluster
            _patch_world_defaults()
            self._world = None
        else:  # a lone process (notebook, benchmark, single-device debugging)
            self._world = (0, 1)
        self._initialized = True
        from .dispatch import bind

        bind()  # bound Python-level functions dispatch from the first DTensor call

    def get_rank(self) -> int:
        if self._world is not None:
            return self._world[0]
        from mindspore.communication import get_rank

        return int(get_rank())

    def get_world_size(self) -> int:
        if self._world is not None:
            return self._world[1]
        from mindspore.communication import get_group_size

        return int(get_group_size())

    def new_group(self, ranks: Sequence[int], timeout: timedelta | float | None = None) -> MSGroup:
        """A group over ``ranks`` (every rank of the world calls this for every group, in
        the same order: MindSpore's hashed group names make that safe).

        MindSpore has no per-group timeout (``new_group(timeout=)`` is reserved): its
        collective timeout is process-wide and fixed when communication starts (see
        :func:`set_collective_timeout`). An explicit ``timeout`` that differs warns.

        Raises:
            RuntimeError: MindSpore could not create the group.
        """
        ranks = list(ranks)
        have = collective_timeout(self.device)
        check_group_timeout(timeout, have if self._world is None else None)
        if self._world is not None:
            return MSGroup(None, ranks)
        if sorted(ranks) == list(range(self.get_world_size())):
            return MSGroup(GlobalComm.WORLD_COMM_GROUP, ranks, have)
        backend = "mccl" if self.device == "CPU" else None
        name = dist.new_group(ranks=sorted(ranks), backend=backend)
        if not name:
            raise RuntimeError(
                f"mindspore.mint.distributed.new_group(ranks={sorted(ranks)}) failed (see the "
                f"MindSpore log); every rank of the world must build the same DeviceMesh"
            )
        return MSGroup(name, ranks, have)

    # ------------------------------------------------------------ local primitives
    def shape(self, t: Any) -> tuple[int, ...]:
        return tuple(_local_shape(t))

    def narrow(self, t: Tensor, dim: int, start: int, length: int) -> Tensor:
        return mint.narrow(t, dim, start, length)

    def cat(self, ts: Sequence[Tensor], dim: int) -> Tensor:
        return ts[0] if len(ts) == 1 else mint.cat(list(ts), dim)

    def _zeros(self, shape: Sequence[int], dtype: Any) -> Tensor:
        return mint.zeros(tuple(shape), dtype=dtype)

    def pad_dim(self, t: Tensor, dim: int, size: int) -> Tensor:
        shape = list(_local_shape(t))
        shape[dim] = size - shape[dim]
        return mint.cat([t, self._zeros(shape, t.dtype)], dim)

    def embed(self, t: Tensor, dim: int, start: int, extent: int) -> Tensor:
        shape = list(_local_shape(t))
        n = shape[dim]
        parts = []
        if start > 0:
            shape[dim] = start
            parts.append(self._zeros(shape, t.dtype))
        parts.append(t)
        if extent - start - n > 0:
            shape[dim] = extent - start - n
            parts.append(self._zeros(shape, t.dtype))
        return parts[0] if len(parts) == 1 else mint.cat(parts, dim)

    def zeros_like(self, t: Tensor) -> Tensor:
        return self._zeros(_local_shape(t), t.dtype)

    def ones_like(self, t: Tensor) -> Tensor:
        return mint.ones(tuple(_local_shape(t)), dtype=t.dtype)

    def scale(self, t: Tensor, factor: float) -> Tensor:
        return t * factor

    def eq_mask(self, a: Tensor, b: Tensor) -> Tensor:
        return mint.eq(a, b).astype(a.dtype)

    def mul(self, a: Tensor, b: Tensor) -> Tensor:
        return mint.mul(a, b)

    def div(self, a: Tensor, b: Tensor) -> Tensor:
        return mint.div(a, b)

    def detach(self, t: Tensor) -> Tensor:
        return ops.stop_gradient(ms_local(t))

    def contiguous(self, t: Tensor) -> Tensor:
        return t.contiguous()

    def new_tensor(
        self, kind: str, shape: Sequence[int], fill_value: Any, dtype: Any, device: Any = None
    ) -> Tensor:
        shape = tuple(int(s) for s in shape)
        dtype = ms.float32 if dtype is None else dtype
        if kind == "full":  # mint.full: no FillScalar kernel on CPU
            return ops.full(shape, fill_value, dtype=dtype)
        if kind in ("zeros", "empty") or (kind in ("rand", "randn") and 0 in shape):
            return mint.zeros(shape, dtype=dtype)  # an empty draw must not advance the RNG
        if kind == "ones":
            return mint.ones(shape, dtype=dtype)
        if kind == "rand":  # mint.rand/randn: no InplaceUniform/InplaceNormal kernel on CPU
            return ops.rand(shape, dtype=dtype)
        if kind == "randn":
            return ops.randn(shape, dtype=dtype)
        raise ValueError(f"new_tensor: unknown kind {kind!r}")

    # ------------------------------------------------------------ local math (kernels)
    # MindSpore 2.10 CPU kernels: mint where it has one, else ops (no CPU kernel for
    # mint.stack, mint.repeat_interleave, mint.arange, mint.clone, mint.full; mint.select's
    # backward fails on CPU)
    def exp(self, t: Tensor) -> Tensor:
        return mint.exp(t)

    def log(self, t: Tensor) -> Tensor:
        return mint.log(t)

    def amax(self, t: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
        return mint.amax(t, dim, keepdim)

    def amin(self, t: Tensor, dim: Any, keepdim: bool = False) -> Tensor:
        return mint.amin(t, dim, keepdim)

    def sum(self, t: Tensor, dim: Any = None, keepdim: bool = False) -> Tensor:
        return mint.sum(t) if dim is None else mint.sum(t, dim, keepdim)

    def where(self, cond: Tensor, a: Any, b: Any) -> Tensor:
        return mint.where(cond, a, b)

    def gather(self, t: Tensor, dim: int, index: Tensor) -> Tensor:
        return mint.gather(t, dim, index)

    def take_rows(self, t: Tensor, index: Tensor) -> Tensor:
        return ops.gather(t, index, 0)

    def stack(self, ts: Sequence[Tensor], dim: int) -> Tensor:
        return ops.stack(list(ts), dim)

    def select(self, t: Tensor, dim: int, index: int) -> Tensor:
        return mint.squeeze(mint.narrow(t, dim, index, 1), dim)

    def unsqueeze(self, t: Tensor, dim: int) -> Tensor:
        return mint.unsqueeze(t, dim)

    def squeeze(self, t: Tensor, dim: int) -> Tensor:
        return mint.squeeze(t, dim)

    def reshape(self, t: Tensor, shape: Sequence[int]) -> Tensor:
        return mint.reshape(t, tuple(shape))

    def transpose(self, t: Tensor, dim0: int, dim1: int) -> Tensor:
        return mint.transpose(t, dim0, dim1)

    def movedim(self, t: Tensor, source: int, destination: int) -> Tensor:
        perm = [d for d in range(t.ndim) if d != source]
        perm.insert(destination, source)
        return mint.permute(t, tuple(perm))

    def matmul(self, a: Tensor, b: Tensor) -> Tensor:
        return mint.matmul(a, b)

    def softmax(self, t: Tensor, dim: int) -> Tensor:
        return mint.softmax(t, dim)

    def isfinite(self, t: Tensor) -> Tensor:
        return mint.isfinite(t)

    def argsort(self, t: Tensor) -> Tensor:
        """A stable argsort of an integer tensor: ``ops.sort`` of the unique keys
        ``value * len + position`` (no stable sort kernel on CPU)."""
        n = int(_local_shape(t)[0])
        keys = t.astype(ms.int64) * max(n, 1) + self.arange(0, n, t)
        return ops.sort(keys)[1].astype(ms.int64)

    def tolist(self, t: Tensor) -> list[Any]:
        return ms_local(t).asnumpy().tolist()  # type: ignore[no-any-return]

    def repeat_interleave(self, t: Tensor, repeats: int, dim: int) -> Tensor:
        return ops.repeat_interleave(t, repeats, dim)

    def full(self, shape: Sequence[int], value: Any, like: Tensor, dtype: Any = None) -> Tensor:
        return ops.full(tuple(int(s) for s in shape), value, dtype=dtype or like.dtype)

    def arange(self, start: int, end: int, like: Tensor) -> Tensor:
        import numpy as np

        return Tensor(np.arange(start, end, dtype=np.int64))

    def clone(self, t: Tensor) -> Tensor:
        return ops.deepcopy(t)

    def dropout(self, t: Tensor, p: float) -> Tensor:
        return ops.dropout(t, p, True)

    def no_grad(self) -> Any:
        return ms._no_grad()

    def is_dtype(self, obj: Any) -> bool:
        return isinstance(obj, ms.dtype.Type)

    def dtype_of(self, t: Tensor) -> Any:
        return t.dtype

    def cast(self, t: Any, dtype: Any) -> Tensor:
        return ops.cast(ms_local(t), dtype)

    def assign(self, dst: Tensor, src: Tensor, no_grad: bool = False) -> Tensor:
        # in-place copies into aliases are unreliable on CPU: rebind the data (the
        # dispatcher writes a rebound alias back into its DTensor)
        Tensor.assign_value(dst, ops.deepcopy(src))
        return dst

    def inplace_mul(self, dst: Tensor, other: Any) -> Tensor:
        Tensor.assign_value(dst, mint.mul(dst, other))
        return dst

    def put_rows_(self, dst: Tensor, index: Tensor, rows: Tensor) -> Tensor:
        # CPU: index-based in-place kernels are missing (InplaceIndexPut/IndexCopy) or
        # leave an alias's storage unchanged; a whole copy_ (InplaceCopy) writes it
        with ms._no_grad():
            new = ops.tensor_scatter_update(dst, mint.reshape(index, (-1, 1)), rows)
            dst.copy_(new)
        return dst

    # ------------------------------------------------------------ collectives
    @staticmethod
    def _owned(t: Tensor) -> Tensor:
        """A fresh contiguous buffer with ``t``'s values (MindSpore's in-place collectives
        silently skip views on CPU)."""
        return ops.deepcopy(ms_local(t))

    def all_gather(self, t: Tensor, group: MSGroup, n: int) -> list[Tensor]:
        if n == 1:
            return [t]
        shape = tuple(_local_shape(t))
        if 0 in shape:
            return [t] * n
        dtype = t.dtype
        wire = _GATHER_WIRE.get(dtype) if self.device == "CPU" else None
        src = ms_local(t).contiguous()
        if wire is not None:  # mccl cannot gather this dtype: send it as `wire`
            src = src.astype(wire)
        parts = [self._zeros(shape, src.dtype) for _ in range(n)]
        collective(
            self, "all_gather", group, shape, src.dtype, dist.all_gather, parts, src, group=group.name,
        )  # fmt: skip
        if wire is not None:
            parts = [p.astype(dtype) for p in parts]
        return group.to_coord_order(parts)

    def all_reduce(self, t: Tensor, op: str, group: MSGroup) -> Tensor:
        if len(group.ranks) == 1:
            return t
        n = len(group.ranks)
        dtype = t.dtype
        cpu = self.device == "CPU"
        if cpu and dtype in _REDUCE_BY_GATHER:  # no mccl reduction kernel: reduce locally
            out = self._reduce_gathered(t, op, group, n)
        else:
            wire = _REDUCE_WIRE.get(dtype) if cpu else None
            out = self._owned(t) if wire is None else ms_local(t).astype(wire)
            if 0 in _local_shape(out):
                return out
            rop = "sum" if op == "avg" else op
            collective(
                self, "all_reduce", group, _local_shape(out), out.dtype,
                dist.all_reduce, out, op=rop, group=group.name,
            )  # fmt: skip
            if wire is not None:
                out = out.astype(dtype) if dtype != ms.bool_ else out != 0
        if op == "avg":
            out = out / n if out.is_floating_point() else ops.floor_div(out, n)
        return out

    def _reduce_gathered(self, t: Tensor, op: str, group: MSGroup, n: int) -> Tensor:
        parts = self.all_gather(t, group, n)
        out = parts[0]
        for p in parts[1:]:
            if op in ("sum", "avg"):
                out = out + p
            elif op == "prod":
                out = out * p
            elif op == "max":
                out = mint.maximum(out, p)
            else:
                out = mint.minimum(out, p)
        return out

    def reduce_scatter(self, pieces: Sequence[Tensor], op: str, group: MSGroup) -> Tensor:
        """Native on Ascend/GPU only (``dist.reduce_scatter_tensor``).

        Raises:
            NotImplementedError: on CPU (mccl has no reduce-scatter kernel; the executor
                composes it from all-reduce unless this platform claims it natively).
        """
        if "reduce_scatter" not in self.native_collectives:
            raise NotImplementedError(
                f"reduce_scatter: MindSpore on {self.device} has no native reduce-scatter "
                f"(no DistCommReduceScatter kernel); hyper_shard composes it from all_reduce + "
                f"narrow or all_gather + sum (hyper_shard.platform.compose). Do not list "
                f"'reduce_scatter' in native_collectives on this device"
            )
        if len(group.ranks) == 1:
            return pieces[0]
        shape = tuple(_local_shape(pieces[0]))
        flat = [ms_local(p).contiguous().reshape(-1) for p in group.to_group_order(pieces)]
        inp = mint.cat(flat, 0)
        out = self._zeros((flat[0].shape[0],), pieces[0].dtype)
        rop = "sum" if op == "avg" else op
        collective(
            self, "reduce_scatter", group, _local_shape(inp), inp.dtype,
            dist.reduce_scatter_tensor, out, inp, op=rop, group=group.name,
        )  # fmt: skip
        out = out.reshape(shape)
        return out / len(group.ranks) if op == "avg" else out

    def all_to_all(self, pieces: Sequence[Tensor], group: MSGroup) -> list[Tensor]:
        """Native on Ascend/GPU only (``dist.all_to_all``).

        Raises:
            NotImplementedError: on CPU (mccl has no all-to-all kernel).
        """
        if "all_to_all" not in self.native_collectives:
            raise NotImplementedError(
                f"all_to_all: MindSpore on {self.device} has no native all-to-all (no "
                f"DistCommAllToAllV kernel); hyper_shard composes it from send_recv rounds or "
                f"all_gather (hyper_shard.platform.compose)"
            )
        if len(group.ranks) == 1:
            return list(pieces)
        send = [ms_local(p).contiguous() for p in group.to_group_order(pieces)]
        recv = [self._zeros(_local_shape(p), p.dtype) for p in send]
        collective(
            self, "all_to_all", group, _local_shape(send[0]), send[0].dtype,
            dist.all_to_all, recv, send, group=group.name,
        )  # fmt: skip
        return group.to_coord_order(recv)

    def send_recv(self, t: Tensor, dst: int, like: Tensor, src: int, group: MSGroup) -> Tensor:
        """One paired exchange: ``isend`` of ``t`` to coordinate ``dst`` and ``irecv`` of a
        tensor like ``like`` from coordinate ``src`` into a fresh buffer, both waited on."""
        if len(group.ranks) == 1:
            return t
        dtype = t.dtype
        wire = _GATHER_WIRE.get(dtype) if self.device == "CPU" else None
        send = self._owned(t) if wire is None else ms_local(t).astype(wire)
        recv = self._zeros(_local_shape(like), send.dtype)
        if 0 in _local_shape(send) and 0 in _local_shape(recv):
            return recv if wire is None else recv.astype(dtype)
        collective(
            self, "send_recv", group, _local_shape(send), send.dtype,
            _exchange, send, group.ranks[dst], recv, group.ranks[src], group.name,
        )  # fmt: skip
        return recv if wire is None else recv.astype(dtype)

    def broadcast(self, t: Tensor, src_group_rank: int, group: MSGroup) -> Tensor:
        if len(group.ranks) == 1:
            return t
        dtype = t.dtype
        wire = _GATHER_WIRE.get(dtype) if self.device == "CPU" else None
        out = self._owned(t) if wire is None else ms_local(t).astype(wire)
        src = group.ranks[src_group_rank]
        collective(
            self, "broadcast", group, _local_shape(out), out.dtype,
            dist.broadcast, out, src=src, group=group.name,
        )  # fmt: skip
        return out if wire is None else out.astype(dtype)

    def all_gather_object(self, obj: Any, group: MSGroup, n: int) -> list[Any]:
        if n == 1:
            return [obj]
        out: list[Any] = [None] * n
        collective(
            self, "all_gather_object", group, None, None,
            dist.all_gather_object, out, obj, group=group.name,
        )  # fmt: skip
        return group.to_coord_order(out)

    def all_gather_bytes(self, data: bytes, group: MSGroup, n: int) -> list[bytes]:
        """Every rank's ``data`` (same length everywhere), in mesh-coordinate order: one
        all-gather of an int32 buffer, unrecorded (the consistency exchange)."""
        import numpy as np

        src = Tensor(np.frombuffer(data, dtype=np.int32).copy())
        parts = [self._zeros(_local_shape(src), src.dtype) for _ in range(n)]
        guarded(
            self, "all_gather (consistency check)", group,
            dist.all_gather, parts, src, group=group.name,
        )  # fmt: skip
        return group.to_coord_order([p.asnumpy().tobytes() for p in parts])

    # ------------------------------------------------------------ autograd & wrapping
    def custom_autograd(self, fwd: Callable, bwd: Callable, x: Any) -> Tensor:
        return _Custom.apply(ms_local(x), fwd, bwd)

    def custom_autograd_n(self, fwd: Callable, bwd: Callable, inputs: Sequence[Any]) -> Tensor:
        return _CustomN.apply(*[ms_local(x) for x in inputs], fwd, bwd)

    def requires_grad(self, t: Any) -> bool:
        """True while MindSpore records gradients (inside ``ms.grad``/``value_and_grad``) for
        a tensor that takes part (``_requires_grad`` alone stays set after a grad call)."""
        return bool(t._requires_grad) and bool(_executor.grad_flag())

    def wrap(self, local: Tensor, spec: Any) -> Any:
        from .dtensor import wrap

        return wrap(local, spec)

    def make_leaf(self, local: Tensor, spec: Any, requires_grad: bool) -> Any:
        from .dtensor import make_leaf

        return make_leaf(local, spec, requires_grad)

    def local_of(self, dt: Any) -> Tensor:
        """The local data as a plain tensor: an alias (no copy) of a DTensor, a reshape of a
        DTensor *parameter* (MindSpore's ``weights=`` gradients do not flow through an
        alias of a ``Parameter``)."""
        if isinstance(dt, Parameter):
            with NoFallbackGuard():
                return mint.reshape(dt, _local_shape(dt))
        return Tensor._make_subclass(Tensor, dt)

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> TensorMeta:
        shp = tuple(_local_shape(t)) if shape is None else tuple(shape)
        return TensorMeta(shp, contiguous_stride(shp), t.dtype, int(t.itemsize))

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, Tensor)

    def copy_into(self, dst: Any, src: Any) -> None:
        """Give DTensor ``dst`` a copy of DTensor ``src``'s local data (same layout).

        On CPU, ``copy_`` into a view silently does nothing or fails, so ``dst``'s data is
        rebound (``assign_value``) to a fresh copy."""
        with NoFallbackGuard():
            Tensor.assign_value(dst, ops.deepcopy(self.local_of(src)))


def _exchange(send: Tensor, dst: int, recv: Tensor, src: int, group: str | None) -> None:
    out = dist.isend(send, dst, group=group)
    inc = dist.irecv(recv, src, group=group)
    out.wait()
    inc.wait()


_comm_initialized = hooks.comm_initialized


def _patch_world_defaults() -> None:
    """``mint.distributed``'s object/point-to-point helpers look up ranks in the group
    ``"hccl_world_group"`` by default, which does not exist on CPU: point them at the real
    world group (:func:`.hooks.set_world_group_defaults`, undone by ``hooks.uninstall()``)."""
    hooks.set_world_group_defaults(GlobalComm.WORLD_COMM_GROUP)


def _module_adapter() -> Any:
    from .parallel import MindSporeModuleAdapter

    return MindSporeModuleAdapter()


register_adapter(_module_adapter)  # parallelize_module on mindspore.nn.Cell

from .autograd import grad, optimizer_grads, value_and_grad  # noqa: E402  (needs the above)

__all__ += ["value_and_grad", "grad", "optimizer_grads"]

hooks.install()  # version gate, self-check, the run_op and jit hooks (see hooks.py)
