"""The torch platform: torch.distributed collectives, local primitives and autograd."""

from __future__ import annotations

import itertools
import os
import warnings
import weakref
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.compiler as _compiler
import torch.distributed as dist
from torch._C import DisableTorchFunctionSubclass

from ...flight import collective, guarded
from ...parallel._adapter import register_adapter
from ...redistribute.cost import COLLECTIVES
from ...spec import TensorMeta, contiguous_stride
from ..base import GroupRanks, Platform
from ..timeouts import explicit_timeout, resolve_timeout
from . import attention_ops as _ops
from . import functional_comm as _fc
from . import p2p as _p2p
from .compiled_state import _TRACING
from .compiled_state import TracedDTensor as _TracedDTensor

__all__ = ["TorchPlatform", "TorchGroup"]

_BACKENDS = {"cpu": "gloo", "cuda": "nccl", "npu": "hccl", "xpu": "xccl"}
_OPS = {
    "sum": dist.ReduceOp.SUM,
    "max": dist.ReduceOp.MAX,
    "min": dist.ReduceOp.MIN,
    "prod": dist.ReduceOp.PRODUCT,
}
#: what torch.distributed runs natively on every backend (gloo included)
_NATIVE = COLLECTIVES | {"send_recv", "all_to_all_v"}
_reduce_scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _grouped_mm_ok(x: torch.Tensor, w: torch.Tensor) -> bool:
    """Whether ``torch._grouped_mm`` runs on these operands: a dtype its kernel takes, the
    same on both, rows present, and every stride but the unit one (and the data) aligned
    to 16 bytes (the CPU kernel's condition)."""
    if not hasattr(torch, "_grouped_mm") or x.dtype != w.dtype or x.shape[0] == 0:
        return False
    if x.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return False
    size = x.element_size()
    return not torch.compiler.is_compiling() and all(
        t.data_ptr() % 16 == 0 and all((st * size) % 16 == 0 for st in t.stride() if st != 1)
        for t in (x, w)
    )


def _exchange(ops: list[Any]) -> None:
    for req in dist.batch_isend_irecv(ops):
        req.wait()


class TorchGroup(GroupRanks):
    """A torch process group plus the map from mesh coordinate to group rank, and its
    collective timeout (None if unknown)."""

    __slots__ = ("pg", "timeout", "_p2p")

    def __init__(self, pg: Any, ranks: Sequence[int], timeout: timedelta | None = None) -> None:
        super().__init__(ranks)
        self.pg = pg
        self.timeout = timeout
        self._p2p: int | None = None

    def p2p_coord(self, numel: int) -> int | None:
        """This rank's coordinate if the group's all-gathers and reduce-scatters of
        ``numel``-element shards run by point-to-point messages (gloo, from
        :data:`.p2p.MIN_NUMEL` elements: [Note: collectives on gloo] in :mod:`.p2p`), else
        None (the backend is asked once per group)."""
        if numel < _p2p.MIN_NUMEL:
            return None
        if self._p2p is None:
            me = dist.get_rank()
            ok = len(self.ranks) > 1 and me in self.ranks and _p2p.enabled(self.pg)
            self._p2p = self.ranks.index(me) if ok else -1
        return None if self._p2p < 0 else self._p2p

    def __repr__(self) -> str:
        return f"TorchGroup(ranks={list(self.ranks)})"


#: torch DeviceMesh -> the hyper_shard mesh built from it (weakly keyed by the torch mesh)
_CONVERTED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: default process group -> its generation (:meth:`TorchPlatform.world_id`)
_WORLDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_WORLD_IDS = itertools.count(1)


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


#: the least time a new group's rendezvous may take (see :meth:`TorchPlatform.new_group`)
RENDEZVOUS_MIN = timedelta(seconds=60)


def _pg_timeout(pg: Any) -> timedelta | None:
    """The collective timeout of a torch process group (its backend's options), or None."""
    for dev in ("cpu", "cuda", "npu", "xpu"):
        try:
            return pg._get_backend(torch.device(dev)).options._timeout  # type: ignore[no-any-return]
        except Exception:  # no backend for this device, or no options on it
            continue
    return None


def _comm_device(pg: Any) -> torch.device:
    """The device a process group's collectives take tensors on (CPU for gloo, the current
    accelerator for NCCL/HCCL...)."""
    if dist.get_backend(pg) == "gloo":
        return torch.device("cpu")
    acc = torch.accelerator.current_accelerator()
    if acc is None:
        return torch.device("cpu")
    return torch.device(acc.type, torch.accelerator.current_device_index())


class TorchPlatform(Platform):
    """hyper_shard on PyTorch: gloo on CPU, NCCL on GPU, HCCL on Ascend (torch_npu).

    Every collective runs in :func:`hyper_shard.flight.collective`: a backend error
    (``RuntimeError``: gloo's "Timed out waiting ...", "Connection reset by peer"...; NCCL's
    ``DistBackendError``) becomes a :class:`~hyper_shard.errors.CollectiveError` with the
    backend's error as its cause.
    """

    name = "torch"
    view_semantics = True
    #: ``DTensor.from_local(shape=...)`` needs ``stride=`` too, as PyTorch DTensor's does
    from_local_needs_stride = True
    #: what torch.distributed raises for a failed collective (DistError is a RuntimeError)
    comm_errors: tuple[type[BaseException], ...] = (RuntimeError,)
    #: collectives with ``async_op=True`` return work handles (FSDP overlaps them)
    async_collectives = True

    #: the flat collectives (FSDP's ``*_into``) run with ``async_op=True`` and a handle
    async_collectives = True
    #: ``send_recv_start`` posts isend/irecv and returns (ring attention overlaps compute)
    async_point_to_point = True

    def __init__(self) -> None:
        compose = os.environ.get("HYPER_SHARD_COMPOSE", "")
        self.native_collectives = frozenset(
            c for c in _NATIVE if c not in {x.strip() for x in compose.split(",")}
        )

    # ------------------------------------------------------------ process groups
    def ensure_initialized(
        self, device_type: str, timeout: timedelta | float | None = None
    ) -> None:
        """Initialise the default process group if nobody has: from torchrun's environment
        (``RANK``/``WORLD_SIZE``...), else as a world of one; with ``timeout`` (see
        :mod:`hyper_shard.platform.timeouts`: default 10 minutes). A default group that
        already exists is left as it is."""
        if dist.is_initialized():
            return
        backend = _BACKENDS.get(device_type.lower(), "gloo")
        td = resolve_timeout(timeout)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend=backend, timeout=td)
        else:  # a lone process (notebook, single-device debugging): a world of one
            dist.init_process_group(
                backend=backend, store=dist.HashStore(), rank=0, world_size=1, timeout=td
            )

    def get_rank(self) -> int:
        return dist.get_rank()

    def get_world_size(self) -> int:
        return dist.get_world_size()

    def world_id(self) -> int:
        """The generation of the calling rank's default process group (each
        ``init_process_group`` makes a new one; under the threaded process group each rank
        thread has its own): 0 before any."""
        pg = dist.group.WORLD if dist.is_initialized() else None
        if pg is None:
            return 0
        wid = _WORLDS.get(pg)
        return wid if wid is not None else _WORLDS.setdefault(pg, next(_WORLD_IDS))

    def ranks_are_threads(self) -> bool:
        """True under PyTorch's threaded process group (one thread per rank, as its
        ``MultiThreadedTestCase`` runs them)."""
        return bool(dist.is_initialized() and dist.get_backend() == "threaded")

    def foreign_mesh(self, mesh: Any) -> Any:
        """A ``torch.distributed.device_mesh.DeviceMesh`` as a hyper_shard DeviceMesh over the
        same ranks, device type and dim names, reusing the torch mesh's process groups (no
        collective: safe on one rank alone). Cached per torch mesh; None for other objects."""
        from torch.distributed.device_mesh import DeviceMesh as TorchMesh

        if not isinstance(mesh, TorchMesh):
            return None
        out = _CONVERTED.get(mesh)
        if out is not None:
            return out
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():  # first met in a compiled region: read real ranks
            return self._convert_mesh(mesh)

    def _convert_mesh(self, mesh: Any) -> Any:
        out = self._foreign_sub_mesh(mesh)
        if out is not None:
            _CONVERTED[mesh] = out
            return out
        from ...mesh import DeviceMesh

        ranks = mesh.mesh.tolist()
        names = mesh.mesh_dim_names
        probe = DeviceMesh(mesh.device_type, ranks, mesh_dim_names=names, _abstract=True)
        me = dist.get_rank()
        groups: list[Any] = []
        for d in range(probe.ndim):
            members = next((g for g in probe._dim_groups_ranks(d) if me in g), None)
            if members is None:  # this rank is outside the mesh: no group, as PyTorch
                groups.append(None)
                continue
            groups.append(TorchGroup(mesh.get_group(d), members))
        out = DeviceMesh(
            mesh.device_type, ranks, mesh_dim_names=names, platform=self, _groups=groups
        )
        _CONVERTED[mesh] = out
        return out

    def _foreign_sub_mesh(self, mesh: Any) -> Any:
        """``mesh[names]`` of a torch mesh as the same slice of its converted root mesh, so
        sub-meshes sliced from one torch mesh (``mesh["dp"]``, ``mesh["tp"]``) stay
        sub-meshes of one hyper_shard mesh (FSDP over TP composes them); None for a root
        mesh, or a slice whose dim names the root does not have (a flattened dim)."""
        get_root = getattr(mesh, "_get_root_mesh", None)
        root = get_root() if get_root is not None else None
        names = mesh.mesh_dim_names
        if root is None or root is mesh or names is None or root.mesh_dim_names is None:
            return None
        if set(names) <= set(root.mesh_dim_names):
            return self.foreign_mesh(root)[names]
        flats = getattr(root, "_flatten_mapping", {})
        if len(names) == 1 and names[0] in flats:
            return self._foreign_flat_mesh(mesh, self.foreign_mesh(root))
        if all(n in root.mesh_dim_names or n in flats for n in names):
            for n in names:  # mesh["rep", "shard_cp"]: its flattened dims converted first
                if n not in root.mesh_dim_names and self.foreign_mesh(flats[n]) is None:
                    return None
            return self.foreign_mesh(root)[names]
        return None

    def _foreign_flat_mesh(self, mesh: Any, root: Any) -> Any:
        """A torch mesh flattened from ``root``'s (converted) dims, as hyper_shard's
        ``root[...]._flatten(name)`` would make it, over the torch mesh's own group (no
        collective), found again as ``root[name]``; None when its ranks are not a
        row-major run of ``root``'s adjacent dims."""
        ranks = mesh.mesh.tolist()
        coord = root.get_coordinate()
        if coord is None or mesh.ndim != 1:
            return None
        member = set(ranks)
        dims = []
        for d, n in enumerate(root.shape):
            moved = list(coord)
            moved[d] = (coord[d] + 1) % n
            if n > 1 and root._ranks[sum(c * st for c, st in zip(moved, root._strides))] in member:
                dims.append(d)
        if not dims or list(root._sub(dims)._ranks) != ranks:
            return None
        from ...mesh import DeviceMesh

        name = mesh.mesh_dim_names[0]
        group = TorchGroup(mesh.get_group(0), ranks)
        flat = DeviceMesh(
            mesh.device_type, ranks, mesh_dim_names=(name,), platform=self, _groups=[group]
        )
        flat.__dict__["_parts_of"] = (root, (tuple(dims),))
        root.__dict__.setdefault("_flattened", {})[name] = (tuple(dims), flat)
        return flat

    def stride(self, t: Any) -> tuple[int, ...]:
        with DisableTorchFunctionSubclass():
            return tuple(t.stride())

    def new_group(
        self, ranks: Sequence[int], timeout: timedelta | float | None = None
    ) -> TorchGroup:
        """A group over ``ranks`` (every rank of the world calls this, in the same order).

        The whole world reuses the default group, unless an explicit timeout (``timeout``
        or ``HYPER_SHARD_TIMEOUT``) differs from the default group's: then it gets its own
        group with that timeout. Other groups get ``timeout`` (default 10 minutes).

        The timeout bounds the group's collectives; its rendezvous (the backend connecting
        every pair of ranks, which waits for the slowest rank to arrive) gets at least
        :data:`RENDEZVOUS_MIN`, so a short collective timeout does not fail the creation of
        a group whose ranks started seconds apart on a loaded machine."""
        ranks = list(ranks)
        want = explicit_timeout(timeout)
        if sorted(ranks) == list(range(dist.get_world_size())):
            pg = dist.group.WORLD
            have = _pg_timeout(pg)
            if want is None or want == have:
                return TorchGroup(pg, ranks, have)
        td = want or resolve_timeout(None)
        if td >= RENDEZVOUS_MIN:
            return TorchGroup(dist.new_group(ranks, timeout=td), ranks, td)
        pg = dist.new_group(ranks, timeout=RENDEZVOUS_MIN)
        if pg is not None and pg is not dist.GroupMember.NON_GROUP_MEMBER:
            dist.distributed_c10d._set_pg_timeout(td, pg)  # the collectives' bound
        return TorchGroup(pg, ranks, td)

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

    # ------------------------------------------------------------ local math (kernels)
    def exp(self, t: torch.Tensor) -> torch.Tensor:
        return t.exp()

    def log(self, t: torch.Tensor) -> torch.Tensor:
        return t.log()

    def amax(self, t: torch.Tensor, dim: Any, keepdim: bool = False) -> torch.Tensor:
        return t.amax(dim, keepdim=keepdim)

    def amin(self, t: torch.Tensor, dim: Any, keepdim: bool = False) -> torch.Tensor:
        return t.amin(dim, keepdim=keepdim)

    def sum(self, t: torch.Tensor, dim: Any = None, keepdim: bool = False) -> torch.Tensor:
        return t.sum() if dim is None else t.sum(dim, keepdim=keepdim)

    def where(self, cond: torch.Tensor, a: Any, b: Any) -> torch.Tensor:
        return torch.where(cond, a, b)

    def gather(self, t: torch.Tensor, dim: int, index: torch.Tensor) -> torch.Tensor:
        return t.gather(dim, index)

    def take_rows(self, t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
        return t[index]

    def stack(self, ts: Sequence[torch.Tensor], dim: int) -> torch.Tensor:
        return torch.stack(list(ts), dim)

    def select(self, t: torch.Tensor, dim: int, index: int) -> torch.Tensor:
        return t.select(dim, index)

    def unsqueeze(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.unsqueeze(dim)

    def squeeze(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return t.squeeze(dim)

    def transpose(self, t: torch.Tensor, dim0: int, dim1: int) -> torch.Tensor:
        return t.transpose(dim0, dim1)

    def movedim(self, t: torch.Tensor, source: int, destination: int) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.movedim(source, destination)

    def matmul(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    def softmax(self, t: torch.Tensor, dim: int) -> torch.Tensor:
        return torch.softmax(t, dim)

    def attention_lse(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        return _ops.flash_lse(q, k, v, causal, scale)

    def attention_lse_backward(
        self,
        dout: torch.Tensor,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        out: torch.Tensor,
        lse: torch.Tensor,
        causal: bool,
        scale: float,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        return _ops.flash_lse_backward(dout, q, k, v, out, lse, causal, scale)

    def isfinite(self, t: torch.Tensor) -> torch.Tensor:
        return torch.isfinite(t)

    def grouped_mm(self, x: torch.Tensor, w: torch.Tensor, sizes: Sequence[int]) -> torch.Tensor:
        """``torch._grouped_mm`` where its kernel takes the operands (float32/bfloat16/
        float16, rows of 16-byte multiples; on CPU since torch 2.9), else the loop."""
        if _grouped_mm_ok(x, w):
            offs = torch.tensor(sizes, dtype=torch.int32, device=x.device).cumsum(
                0, dtype=torch.int32
            )
            return torch._grouped_mm(x, w, offs=offs)
        return super().grouped_mm(x, w, sizes)

    def argsort(self, t: torch.Tensor) -> torch.Tensor:
        return torch.argsort(t, stable=True)

    def bincount(self, t: torch.Tensor, length: int) -> torch.Tensor:
        return torch.bincount(t[(t >= 0) & (t < length)], minlength=length)

    def tolist(self, t: torch.Tensor) -> list[Any]:
        return t.tolist()  # type: ignore[no-any-return]

    def repeat_interleave(self, t: torch.Tensor, repeats: int, dim: int) -> torch.Tensor:
        return t.repeat_interleave(repeats, dim=dim)

    def full(
        self, shape: Sequence[int], value: Any, like: torch.Tensor, dtype: Any = None
    ) -> torch.Tensor:
        return torch.full(tuple(shape), value, dtype=dtype or like.dtype, device=like.device)

    def arange(self, start: int, end: int, like: torch.Tensor) -> torch.Tensor:
        return torch.arange(start, end, device=like.device)

    def clone(self, t: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.clone(memory_format=torch.contiguous_format)

    def dropout(self, t: torch.Tensor, p: float) -> torch.Tensor:
        return torch.nn.functional.dropout(t, p, True)

    def no_grad(self) -> Any:
        return torch.no_grad()

    def is_dtype(self, obj: Any) -> bool:
        return isinstance(obj, torch.dtype)

    def dtype_of(self, t: torch.Tensor) -> Any:
        return t.dtype

    def loss_precision(self, t: torch.Tensor) -> torch.Tensor:
        """float32 for a half-precision ``t`` while autocast is on for its device (autocast
        runs cross_entropy/nll_loss in float32; a composed kernel applies that itself)."""
        if t.dtype in (torch.float16, torch.bfloat16) and torch.is_autocast_enabled(t.device.type):
            return t.float()
        return t

    def set_requires_grad(self, t: torch.Tensor) -> torch.Tensor:
        return t.requires_grad_()

    def assign(self, dst: torch.Tensor, src: torch.Tensor, no_grad: bool = False) -> torch.Tensor:
        if no_grad:
            with torch.no_grad():
                return dst.copy_(src)
        return dst.copy_(src)

    def inplace_mul(self, dst: torch.Tensor, other: Any) -> torch.Tensor:
        return dst.mul_(other)

    def put_rows_(self, dst: torch.Tensor, index: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), DisableTorchFunctionSubclass():
            return dst.index_copy_(0, index, rows.to(dst.dtype))

    # ------------------------------------------------------------ collectives
    # gloo has no int16 kernels: such tensors travel as int32 (sums wrap the same way)
    def tracing(self) -> bool:
        return _TRACING[0] > 0

    def all_gather(self, t: torch.Tensor, group: TorchGroup, n: int) -> list[torch.Tensor]:
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.all_gather(t, group, n)
        if t.dtype is torch.int16:
            return [x.to(torch.int16) for x in self.all_gather(t.int(), group, n)]
        shape = tuple(t.shape)
        if t.numel() == 0:
            return [t] * n
        buf = torch.empty((n, *shape), dtype=t.dtype, device=t.device)
        coord = group.p2p_coord(t.numel())
        if coord is not None:  # gloo: by point-to-point messages (see _p2p)
            collective(
                self, "all_gather", group, shape, t.dtype,
                _p2p.all_gather, t.contiguous(), list(buf.unbind(0)), group.pg, group.ranks, coord,
            ).wait()  # fmt: skip
            return list(buf.unbind(0))
        src = t.contiguous().view(-1)
        collective(
            self, "all_gather", group, shape, t.dtype,
            _all_gather, buf.view(-1), src, group=group.pg,
        )  # fmt: skip
        return group.to_coord_order(list(buf.unbind(0)))

    def all_reduce(self, t: torch.Tensor, op: str, group: TorchGroup) -> torch.Tensor:
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.all_reduce(t, op, group)
        if t.dtype is torch.int16:
            return self.all_reduce(t.int(), op, group).to(torch.int16)
        out = t.contiguous().clone()
        if out.numel() == 0:
            return out
        rop = _OPS["sum" if op == "avg" else op]
        collective(
            self, "all_reduce", group, out.shape, out.dtype,
            dist.all_reduce, out, op=rop, group=group.pg,
        )  # fmt: skip
        if op == "avg":
            out = out / len(group.ranks) if out.is_floating_point() else out // len(group.ranks)
        return out

    def reduce_scatter(
        self, pieces: Sequence[torch.Tensor], op: str, group: TorchGroup
    ) -> torch.Tensor:
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.reduce_scatter(pieces, op, group)
        if pieces and pieces[0].dtype is torch.int16:
            return self.reduce_scatter([p.int() for p in pieces], op, group).to(torch.int16)
        out = torch.empty_like(pieces[0], memory_format=torch.contiguous_format)
        if out.numel() == 0:
            return out
        coord = group.p2p_coord(out.numel())
        if coord is not None:  # gloo: by point-to-point messages (see _p2p)
            chunks = [p.contiguous() for p in pieces]
            pend = collective(
                self, "reduce_scatter", group, out.shape, out.dtype,
                _p2p.reduce_scatter, chunks, out, op, group.pg, group.ranks, coord,
            )  # fmt: skip
            return pend.wait()
        inp = torch.stack(group.to_group_order(pieces))
        rop = _OPS["sum" if op == "avg" else op]
        collective(
            self, "reduce_scatter", group, inp.shape, inp.dtype,
            _reduce_scatter, out.view(-1), inp.view(-1), op=rop, group=group.pg,
        )  # fmt: skip
        if op == "avg":
            out = out / len(group.ranks)
        return out

    def all_to_all(self, pieces: Sequence[torch.Tensor], group: TorchGroup) -> list[torch.Tensor]:
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.all_to_all(pieces, group)
        if pieces and pieces[0].dtype is torch.int16:
            return [x.to(torch.int16) for x in self.all_to_all([p.int() for p in pieces], group)]
        inp = torch.stack(group.to_group_order(pieces))
        if inp.numel() == 0:
            return list(pieces)
        out = torch.empty_like(inp)
        collective(
            self, "all_to_all", group, inp.shape, inp.dtype,
            dist.all_to_all_single, out.view(-1), inp.view(-1), group=group.pg,
        )  # fmt: skip
        return group.to_coord_order(list(out.unbind(0)))

    def all_to_all_v(
        self,
        t: torch.Tensor,
        send_sizes: Sequence[int],
        recv_sizes: Sequence[int],
        group: TorchGroup,
    ) -> torch.Tensor:
        """``all_to_all_single`` with split sizes (gloo included); pieces travel in the
        backend's group-rank order."""
        if t.dtype is torch.int16:
            return self.all_to_all_v(t.int(), send_sizes, recv_sizes, group).to(torch.int16)
        inp = t.contiguous()
        if not group.identity:
            inp = torch.cat(group.to_group_order(list(inp.split(list(send_sizes)))))
        send, recv = group.to_group_order(send_sizes), group.to_group_order(recv_sizes)
        out = inp.new_empty((sum(recv_sizes), *inp.shape[1:]))
        collective(
            self, "all_to_all_v", group, inp.shape, inp.dtype,
            dist.all_to_all_single, out, inp, recv, send, group=group.pg,
        )  # fmt: skip
        if not group.identity:
            out = torch.cat(group.to_coord_order(list(out.split(recv))))
        return out

    def send_recv(
        self, t: torch.Tensor, dst: int, like: torch.Tensor, src: int, group: TorchGroup
    ) -> torch.Tensor:
        """One paired exchange (``batch_isend_irecv``): ``t`` to coordinate ``dst``, a
        tensor like ``like`` from coordinate ``src``."""
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.send_recv(t, dst, like, src, group)
        if t.dtype is torch.int16:
            return self.send_recv(t.int(), dst, like.int(), src, group).to(torch.int16)
        send = t.contiguous()
        recv = torch.empty_like(like, memory_format=torch.contiguous_format)
        if send.numel() == 0 and recv.numel() == 0:
            return recv
        ops = [
            dist.P2POp(dist.isend, send, group.ranks[dst], group.pg),
            dist.P2POp(dist.irecv, recv, group.ranks[src], group.pg),
        ]
        collective(self, "send_recv", group, send.shape, send.dtype, _exchange, ops)
        return recv

    def send_recv_start(
        self,
        t: torch.Tensor,
        dst: int,
        like: torch.Tensor,
        src: int,
        group: TorchGroup,
        tag: int = 0,
    ) -> Any:
        """isend ``t`` to coordinate ``dst`` and irecv a tensor like ``like`` from ``src``;
        returns at once (the handle's ``wait()`` completes them)."""
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.send_recv_start(t, dst, like, src, group)
        if t.dtype is torch.int16:
            return Platform.send_recv_start(self, t, dst, like, src, group, tag)
        send = t.contiguous()
        recv = torch.empty_like(like, memory_format=torch.contiguous_format)
        if send.numel() == 0 and recv.numel() == 0:
            return _ops.PendingRecv([], recv)
        reqs = collective(
            self, "send_recv (async)", group, send.shape, send.dtype,
            _ops.post, send, group.ranks[dst], recv, group.ranks[src], group.pg, tag,
        )  # fmt: skip
        return _ops.PendingRecv(reqs, recv)

    def broadcast(self, t: torch.Tensor, src_group_rank: int, group: TorchGroup) -> torch.Tensor:
        if _TRACING[0] or _compiler._is_compiling_flag:
            return _fc.broadcast(t, src_group_rank, group)
        if t.dtype is torch.int16:
            return self.broadcast(t.int(), src_group_rank, group).to(torch.int16)
        out = t.contiguous().clone()
        src = group.ranks[src_group_rank]
        collective(
            self, "broadcast", group, out.shape, out.dtype,
            dist.broadcast, out, src=src, group=group.pg,
        )  # fmt: skip
        return out

    def all_gather_object(self, obj: Any, group: TorchGroup, n: int) -> list[Any]:
        out: list[Any] = [None] * n
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            collective(
                self, "all_gather_object", group, None, None,
                dist.all_gather_object, out, obj, group=group.pg,
            )  # fmt: skip
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
        k = inp.numel()
        coord = group.p2p_coord(k)
        if coord is not None:  # gloo: by point-to-point messages (see _p2p)
            n = out.numel() // k
            pend = collective(
                self, "all_gather (fsdp unit)", group, inp.shape, inp.dtype,
                _p2p.all_gather, inp, [out.narrow(0, c * k, k) for c in range(n)],
                group.pg, group.ranks, coord,
            )  # fmt: skip
            return _p2p.handle(pend, async_op)
        if group.identity:
            return collective(
                self, "all_gather (fsdp unit)", group, inp.shape, inp.dtype,
                _all_gather, out, inp, group=group.pg, async_op=async_op,
            )  # fmt: skip
        # the backend orders chunks by group rank: gather, then put them in mesh order
        tmp = torch.empty_like(out)
        collective(
            self, "all_gather (fsdp unit)", group, inp.shape, inp.dtype,
            _all_gather, tmp, inp.clone(), group=group.pg,
        )  # fmt: skip
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
        if "reduce_scatter" not in self.native_collectives:  # the shared composition
            return Platform.reduce_scatter_into(self, out, inp, op, group)
        n = len(group.ranks)
        coord = group.p2p_coord(out.numel())
        if coord is not None:  # gloo: by point-to-point messages (see _p2p)
            if op == "avg":  # divide first, as the native route below
                inp.div_(n)
            elif op != "sum":
                raise ValueError(f"reduce_scatter_into: reduce op {op!r} (use 'sum' or 'avg')")
            k = out.numel()
            pend = collective(
                self, "reduce_scatter (fsdp unit)", group, inp.shape, inp.dtype,
                _p2p.reduce_scatter, [inp.narrow(0, c * k, k) for c in range(n)], out, "sum",
                group.pg, group.ranks, coord,
            )  # fmt: skip
            return _p2p.handle(pend, async_op)
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
        return collective(
            self, "reduce_scatter (fsdp unit)", group, inp.shape, inp.dtype,
            _reduce_scatter, out, inp, op=dist.ReduceOp.SUM, group=group.pg, async_op=async_op,
        )  # fmt: skip

    def all_reduce_into(
        self, t: torch.Tensor, op: str, group: TorchGroup, async_op: bool = False
    ) -> Any:
        if op == "avg":
            t.div_(len(group.ranks))
            op = "sum"
        return collective(
            self, "all_reduce (fsdp unit)", group, t.shape, t.dtype,
            dist.all_reduce, t, op=_OPS[op], group=group.pg, async_op=async_op,
        )  # fmt: skip

    def all_gather_bytes(self, data: bytes, group: TorchGroup, n: int) -> list[bytes]:
        """Every rank's ``data`` (the same length everywhere), in mesh-coordinate order:
        one all-gather of an int32 buffer, unrecorded (the consistency exchange)."""
        dev = _comm_device(group.pg)
        src = torch.frombuffer(bytearray(data), dtype=torch.int32).to(dev)
        buf = torch.empty(n * src.numel(), dtype=torch.int32, device=dev)
        guarded(
            self, "all_gather (consistency check)", group, _all_gather, buf, src, group=group.pg
        )
        rows = buf.cpu().view(n, -1).unbind(0)
        return group.to_coord_order([x.numpy().tobytes() for x in rows])

    # ------------------------------------------------------------ autograd & wrapping
    def custom_autograd(self, fwd: Callable, bwd: Callable, x: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return _Custom.apply(x, fwd, bwd)

    def custom_autograd_n(self, fwd: Callable, bwd: Callable, inputs: Sequence[Any]) -> Any:
        with DisableTorchFunctionSubclass():
            return _ops.CustomN.apply(fwd, bwd, *inputs)

    def alias_autograd(self, bwd: Callable, x: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return _Alias.apply(x, bwd)

    def shares_storage(self, a: Any, b: Any) -> bool:
        if _TRACING[0] or _compiler._is_compiling_flag:  # fake tensors have no data pointer
            with DisableTorchFunctionSubclass():
                return a is b or bool(torch._C._is_alias_of(a, b))  # type: ignore[attr-defined]
        with DisableTorchFunctionSubclass():
            return bool(a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr())

    def copy_plain(self, dst: Any, src: Any) -> None:
        with DisableTorchFunctionSubclass():
            dst.copy_(src)

    def native_group(self, group: Any) -> Any:
        return group.pg

    def group_from_native(self, native: Any) -> TorchGroup:
        return TorchGroup(native, dist.get_process_group_ranks(native))

    def rank_tensor(self, nested: list[Any]) -> torch.Tensor:
        return torch.tensor(nested, dtype=torch.int, device="cpu")

    def cast(self, t: Any, dtype: Any) -> torch.Tensor:
        with DisableTorchFunctionSubclass():
            return t.to(dtype)

    def requires_grad(self, t: Any) -> bool:
        with DisableTorchFunctionSubclass():
            return bool(t.requires_grad) and torch.is_grad_enabled()

    def wrap(self, local: torch.Tensor, spec: Any) -> Any:
        if _TRACING[0]:
            return _TracedDTensor(local, spec)
        from .dtensor import wrap

        return wrap(local, spec)

    def make_leaf(self, local: torch.Tensor, spec: Any, requires_grad: bool) -> Any:
        if _TRACING[0]:
            return _TracedDTensor(local, spec)
        from .dtensor import make_leaf

        return make_leaf(local, spec, requires_grad)

    def local_of(self, dt: Any) -> torch.Tensor:
        if type(dt) is _TracedDTensor:
            return dt._local  # type: ignore[no-any-return]
        with DisableTorchFunctionSubclass():
            return dt.as_subclass(torch.Tensor)

    def tensor_meta(self, t: Any, shape: Sequence[int] | None = None) -> TensorMeta:
        with DisableTorchFunctionSubclass():
            shp = tuple(t.shape) if shape is None else tuple(shape)
            return TensorMeta(shp, contiguous_stride(shp), t.dtype, t.element_size())

    def is_tensor(self, obj: Any) -> bool:
        return isinstance(obj, torch.Tensor)

    def op_schema(self, op: Any) -> Any:
        """``torch.ops.<ns>.<op>.<overload>`` (or its packet, meaning ``.default``): the
        registry names to bind (the overload; for ``.default`` also the packet, which
        ``torch.ops.<ns>.<op>(...)`` calls pass), its schema's argument names (positional
        ones first, then keyword-only), which are tensors, and how many tensor outputs.

        Raises:
            TypeError: ``op`` is not an OpOverload or OpOverloadPacket.
        """
        from ..._register_sharding import OpSchemaInfo
        from .names import torch_op_name

        if isinstance(op, torch._ops.OpOverloadPacket):
            op = op.default
        if not isinstance(op, torch._ops.OpOverload):
            raise TypeError(
                f"register_sharding takes torch.ops.<namespace>.<op>.<overload> ops (e.g. "
                f"torch.ops.aten.argmax.default, or a torch.library.custom_op's "
                f"torch.ops.mylib.my_op.default), got {op!r}; for a Python function, write a "
                f"YAML entry with a DistributedOp class (docs/custom_ops.md)"
            )
        names = [torch_op_name(op)]
        if op._overloadname == "default":
            names.append(torch_op_name(op._overloadpacket))
        args = op._schema.arguments
        positional = [a.name for a in args if not a.kwarg_only]
        kw_only = [a.name for a in args if a.kwarg_only]

        def is_tensor_type(t: Any) -> bool:
            s = str(t)
            return s.startswith("Tensor") or s.startswith("Optional[Tensor") or "Tensor[]" in s

        tensors = {a.name for a in args if is_tensor_type(a.type)}
        returns = [str(r.type) for r in op._schema.returns]
        n_out = sum(1 for r in op._schema.returns if is_tensor_type(r.type))
        return OpSchemaInfo(
            label=names[0],
            names=names,
            positional=positional,
            kw_only=kw_only,
            tensor_args=tensors,
            n_outputs=n_out,
            mutated={a.name for a in args if a.alias_info is not None and a.alias_info.is_write},
            variadic=returns == ["List[Tensor]"],
        )

    def meta_output_shapes(self, func: Any, args: tuple, kwargs: dict) -> list[Any]:
        """Runs ``func`` on ``meta`` tensors of the DTensor arguments' global shapes and
        dtypes (aten ops have meta kernels; a ``torch.library.custom_op`` needs its
        ``register_fake``, as PyTorch DTensor's sharding propagation does).

        Raises:
            RuntimeError: ``func`` has no meta/fake implementation (the message says so).
        """
        from ...dtensor import DTensor

        def meta(x: Any) -> Any:
            if isinstance(x, DTensor):
                return torch.empty(tuple(x._spec.shape), dtype=x._spec.dtype, device="meta")
            if type(x) in (list, tuple):
                return type(x)(meta(v) for v in x)
            return x

        margs = tuple(meta(a) for a in args)
        mkw = {k: meta(v) for k, v in kwargs.items()}
        try:
            with DisableTorchFunctionSubclass():
                out = func(*margs, **mkw)
        except Exception as e:
            raise RuntimeError(
                f"{func}: hyper_shard computes its output shapes on meta tensors and that "
                f"failed ({type(e).__name__}: {e}); give the op a fake implementation "
                f"(@<custom_op>.register_fake, as PyTorch DTensor needs too)"
            ) from e
        outs = list(out) if isinstance(out, (list, tuple)) else [out]
        return [tuple(o.shape) if isinstance(o, torch.Tensor) else None for o in outs]


def _module_adapter() -> Any:
    from .parallel import TorchModuleAdapter

    return TorchModuleAdapter()


register_adapter(_module_adapter)  # parallelize_module on torch.nn.Module
