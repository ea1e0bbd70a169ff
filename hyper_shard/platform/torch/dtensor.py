"""The PyTorch DTensor: a ``torch.Tensor`` subclass hooked with ``__torch_function__``.

To torch, a DTensor *is* its local shard: its storage is the local data and autograd
records local ops on it (backward runs in torch's own engine, on local shards). The
subclass adds a :class:`~hyper_shard.spec.DTensorSpec`, reports the global shape, and
sends every public torch function called on it to the hyper_shard dispatcher, which
runs the local op with torch-function handling disabled and wraps the result as an
alias that keeps the autograd graph (``as_subclass``).

A small table of *protocol* functions (metadata, ``grad``, ``backward``, ``detach``,
``requires_grad_``, repr, deepcopy...) is answered here without the dispatcher.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.compiler import is_dynamo_compiling as _is_dynamo_compiling

from ...dtensor import DTensor, local_derivative, redistribute_local
from ...mesh import FOREIGN_CURRENT as _FOREIGN_CURRENT
from ...placement import Partial, Replicate, grad_placement
from ...spec import DTensorSpec, contiguous_stride, view_stride
from . import dcp as _dcp
from .grad_sync import WHOLE_GRAD, whole_replicate_grad

_R = Replicate()
_OpOverload = torch._ops.OpOverload

__all__ = ["TorchDTensor", "wrap", "make_leaf", "PROTOCOL_HANDLERS"]


class TorchDTensor(DTensor, torch.Tensor):  # type: ignore[misc]
    """hyper_shard's DTensor on PyTorch (see :class:`hyper_shard.DTensor`)."""

    _spec: DTensorSpec

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if _is_dynamo_compiling():  # dynamo traces this call: [Note: compiled DTensor]
            return _compiled.torch_function(func, args, kwargs or {})
        if type(func) is _OpOverload and _in_compiled_backward():
            return _local_op(func, args, kwargs or {})  # [Note: compiled DTensor]
        h = PROTOCOL_HANDLERS.get(func)
        if h is not None:
            return h(args, kwargs or {})
        return _dm.torch_dispatch(func, args, kwargs or {})

    # torch.distributed.checkpoint's tensor-subclass protocol (see platform/torch/dcp.py)
    def __create_write_items__(self, fqn: str, object: Any) -> list[Any]:
        return _dcp.create_write_items(self, fqn)

    def __create_chunk_list__(self) -> list[Any]:
        return _dcp.create_chunk_list(self)

    def __get_tensor_shard__(self, index: Any) -> torch.Tensor:
        return _dcp.get_tensor_shard(self, index)


def wrap(local: torch.Tensor, spec: DTensorSpec) -> TorchDTensor:
    """Wrap a plain local tensor as a DTensor alias (autograd history kept). A DTensor leaf
    marked ``_hs_fresh_leaf`` (a factory's ``requires_grad=True`` result) is the result
    itself: an alias of a leaf would not be a leaf, and its ``.grad`` would stay empty."""
    if type(local) is TorchDTensor and local.__dict__.pop("_hs_fresh_leaf", False):
        local._spec = spec
        return local
    out = local.as_subclass(TorchDTensor)
    out._spec = spec
    return out


def make_leaf(local: torch.Tensor, spec: DTensorSpec, requires_grad: bool) -> TorchDTensor:
    """A new autograd leaf DTensor sharing ``local``'s storage."""
    with DisableTorchFunctionSubclass():
        data = local.detach()
    out = torch.Tensor._make_subclass(TorchDTensor, data, requires_grad)
    out._spec = spec
    return out


def _local(dt: Any) -> torch.Tensor:
    with DisableTorchFunctionSubclass():
        return dt.as_subclass(torch.Tensor)


def _plat(dt: Any) -> Any:
    return dt._spec.mesh.platform


# ---------------------------------------------------------------------- handlers
PROTOCOL_HANDLERS: dict[Any, Callable[[Any, dict], Any]] = {}


def _on(*funcs: Any) -> Callable:
    def deco(fn: Callable) -> Callable:
        for f in funcs:
            PROTOCOL_HANDLERS[f] = fn
        return fn

    return deco


T: Any = torch.Tensor  # descriptors (T.grad.__get__) are untyped in the stubs


@_on(T.shape.__get__)
def _shape(args: Any, kwargs: dict) -> torch.Size:
    return torch.Size(args[0]._spec.shape)


@_on(T.size)
def _size(args: Any, kwargs: dict) -> Any:
    shape = args[0]._spec.shape
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None:
        return torch.Size(shape)
    if isinstance(dim, str):
        raise NotImplementedError("named dims are not supported on DTensor")
    return shape[dim]


@_on(T.dim, T.ndimension, T.ndim.__get__)
def _dim(args: Any, kwargs: dict) -> int:
    spec = args[0]._spec
    if not spec.is_replicated() and sys._getframe(2).f_code is _vmap_inputs_code():
        _refuse_vmap(spec)
    return len(spec.shape)


_VMAP_CODE: list[Any] = []


def _vmap_inputs_code() -> Any:
    """The code object of functorch's ``_process_batched_inputs`` (which asks every
    vmapped input for its ``dim()``), or None."""
    if not _VMAP_CODE:
        try:
            from torch._functorch.vmap import _process_batched_inputs

            _VMAP_CODE.append(_process_batched_inputs.__code__)
        except (ImportError, AttributeError):  # another torch: no detection
            _VMAP_CODE.append(None)
    return _VMAP_CODE[0]


def _refuse_vmap(spec: DTensorSpec) -> None:
    """``torch.func.vmap`` over a sharded (or Partial) DTensor would run on this rank's
    local shard only: functorch transforms act below ``__torch_function__``, where a
    hyper_shard DTensor is its local tensor. Refused with the alternatives, rather than
    returning a plain per-rank result silently."""
    pl = ", ".join(str(p) for p in spec.placements)
    raise NotImplementedError(
        f"torch.func.vmap over a DTensor{list(spec.shape)}[{pl}]: functorch transforms run "
        f"below hyper_shard's __torch_function__ hook and would see only this rank's local "
        f"shard. vmap a Replicate DTensor (redistribute to Replicate(): the result is the "
        f"plain tensor of the whole batch), or vmap the local shard when the function acts "
        f"per element of an unsharded batch dim: torch.func.vmap(f)(x.to_local())"
    )


@_on(T.numel, T.nelement)
def _numel(args: Any, kwargs: dict) -> int:
    return math.prod(args[0]._spec.shape)


@_on(T.stride)
def _stride(args: Any, kwargs: dict) -> Any:
    """The global stride, as PyTorch DTensor reports it: the local tensor's strides when no
    mesh dim shards it (the local tensor is the global one), else the global tensor laid out
    in memory like the local shard (``transpose``/``permute`` permute it, ``contiguous()``
    restores the row-major one; :func:`~hyper_shard.spec.global_stride`)."""
    self = args[0]
    spec = self._spec
    with DisableTorchFunctionSubclass():
        lshape, lstride = tuple(self.shape), tuple(self.stride())
    if lshape == spec.shape:
        st = lstride
    else:
        st = view_stride(spec.shape, lshape, lstride)
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    return st if dim is None else st[dim]


@_on(T.is_contiguous)
def _is_contiguous(args: Any, kwargs: dict) -> bool:
    """Whether the *global* tensor is contiguous in ``memory_format`` (as PyTorch DTensor,
    whose wrapper has the global sizes and strides): the global stride against the
    row-major one, ignoring size-1 dims; a local shard of one row is contiguous either way."""
    self = args[0]
    fmt = args[1] if len(args) > 1 else kwargs.get("memory_format", torch.contiguous_format)
    if fmt is not torch.contiguous_format:
        with DisableTorchFunctionSubclass():
            return bool(T.is_contiguous(self, memory_format=fmt))
    shape = self._spec.shape
    if math.prod(shape) == 0:
        return True
    stride = _stride((self,), {})
    expected = 1
    for size, st in zip(reversed(shape), reversed(stride)):
        if size != 1:
            if st != expected:
                return False
            expected *= size
    return True


@_on(torch.numel)
def _torch_numel(args: Any, kwargs: dict) -> int:
    return math.prod(args[0]._spec.shape)


@_on(T.is_same_size, torch.is_same_size)
def _is_same_size(args: Any, kwargs: dict) -> bool:
    a, b = args[0], args[1] if len(args) > 1 else kwargs["other"]
    sa = a._spec.shape if isinstance(a, DTensor) else tuple(a.shape)
    sb = b._spec.shape if isinstance(b, DTensor) else tuple(b.shape)
    return tuple(sa) == tuple(sb)


@_on(T.type)
def _type(args: Any, kwargs: dict) -> Any:
    """``x.type()``: the type name (a metadata query); ``x.type(dtype)``: a conversion,
    dispatched as ``x.to(dtype)``."""
    self = args[0]
    dtype = args[1] if len(args) > 1 else kwargs.get("dtype")
    if dtype is None:
        with DisableTorchFunctionSubclass():
            return T.type(self)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.rsplit(".", 1)[-1]).dtype
    elif isinstance(dtype, type) and hasattr(dtype, "dtype"):
        dtype = dtype.dtype
    return self.to(dtype, non_blocking=bool(kwargs.get("non_blocking", False)))


@_on(T.contiguous)
def _contiguous(args: Any, kwargs: dict) -> Any:
    """``self`` when the local shard is already contiguous (as torch returns ``self``), else
    the dispatched op (a local copy; placements kept)."""
    self = args[0]
    with DisableTorchFunctionSubclass():
        done = T.is_contiguous(self, *args[1:], **kwargs)
    if done:
        if len(args) > 1 or kwargs or _is_contiguous((self,), {}):
            return self
        # a local shard whose size-1 dims keep a transposed layout (a one-row shard of a
        # transpose): the same data restrided row-major, so the global stride is too
        with DisableTorchFunctionSubclass():
            local = self.as_subclass(torch.Tensor)
            shape = tuple(local.shape)
            local = local.as_strided(shape, contiguous_stride(shape), local.storage_offset())
        return wrap(local, self._spec)
    return _dm.torch_dispatch(T.contiguous, args, kwargs)


@_on(T.__len__)
def _len(args: Any, kwargs: dict) -> int:
    shape = args[0]._spec.shape
    if not shape:
        raise TypeError("len() of a 0-d DTensor")
    return shape[0]


@_on(T.nbytes.__get__)
def _nbytes(args: Any, kwargs: dict) -> int:
    spec = args[0]._spec
    return math.prod(spec.shape) * spec.tensor_meta.itemsize


_PASSTHROUGH_GET = [
    "dtype", "device", "layout", "requires_grad", "is_leaf", "grad_fn", "is_cuda", "is_cpu",
    "is_meta", "is_sparse", "is_sparse_csr", "is_quantized", "is_nested", "is_mkldnn", "is_xpu",
    "is_mps", "is_xla", "is_ipu", "is_vulkan", "is_maia", "is_mtia", "_version", "output_nr",
    "itemsize", "name", "retains_grad", "_base", "_backward_hooks", "_post_accumulate_grad_hooks",
    "_grad_fn", "_cdata", "_python_dispatch", "_has_symbolic_sizes_strides", "volatile", "grad_dtype",
]  # fmt: skip
_PASSTHROUGH_METHODS = [
    "element_size", "is_floating_point", "is_complex", "is_signed", "data_ptr", "get_device",
    "is_pinned", "is_shared", "retain_grad", "_is_view", "is_inference",
    "untyped_storage", "storage_offset", "__hash__", "requires_grad_", "__setstate__",
    "_fix_weakref", "_is_zerotensor", "is_conj", "is_neg", "has_names", "__dlpack_device__",
]  # fmt: skip


def _passthrough(func: Any) -> Callable:
    def h(args: Any, kwargs: dict) -> Any:
        with DisableTorchFunctionSubclass():
            out = func(*args, **kwargs)
        return args[0] if out is args[0] or (func is T.requires_grad_) else out

    return h


for _f in (torch.is_inference, torch.is_conj, torch.is_neg, torch.is_signed):
    PROTOCOL_HANDLERS[_f] = _passthrough(_f)  # metadata of the local tensor = of the DTensor
for _n in _PASSTHROUGH_GET:
    if hasattr(T, _n):
        PROTOCOL_HANDLERS[getattr(T, _n).__get__] = _passthrough(getattr(T, _n).__get__)
for _n in _PASSTHROUGH_METHODS:
    if hasattr(T, _n):
        PROTOCOL_HANDLERS[getattr(T, _n)] = _passthrough(getattr(T, _n))
PROTOCOL_HANDLERS[T.requires_grad.__set__] = _passthrough(T.requires_grad.__set__)
# nn.Module._apply (to_empty, .to) asks whether it may swap a parameter's data in place
PROTOCOL_HANDLERS[torch._has_compatible_shallow_copy_type] = _passthrough(
    torch._has_compatible_shallow_copy_type
)


@_on(T.grad.__get__, T._grad.__get__)
def _grad_get(args: Any, kwargs: dict) -> Any:
    self = args[0]
    with DisableTorchFunctionSubclass():
        g = T.grad.__get__(self)
    if g is None:
        return None
    if isinstance(g, DTensor):
        return g
    cache = self.__dict__.get("_grad_wrapper")
    if cache is not None and cache[0] is g and cache[1] == g._version:
        return cache[2]
    spec = self._spec
    whole = self.__dict__.get(WHOLE_GRAD, ())  # a style's Replicate parameter (grad_sync.py)
    gspec = spec.with_placements(
        [_R if m in whole else grad_placement(p) for m, p in enumerate(spec.placements)]
    )
    out = wrap(g, gspec)
    out.__dict__["_hs_grad_of"] = g  # `.grad.data = ...` must reach the real gradient
    self.__dict__["_grad_wrapper"] = (g, g._version, out)
    return out


@_on(T.grad.__set__, T._grad.__set__)
def _grad_set(args: Any, kwargs: dict) -> None:
    self, value = args[0], args[1]
    if value is not None:
        if isinstance(value, DTensor):
            vspec = value._spec
            if vspec.mesh != self._spec.mesh or vspec.shape != self._spec.shape:
                raise ValueError(
                    f"cannot set .grad of a DTensor {self._spec} to a DTensor {vspec}: the mesh "
                    f"and global shape must match"
                )
            value = local_derivative(
                _plat(self), _local(value).detach(), vspec.placements, self._spec
            )
            whole = self.__dict__.get(WHOLE_GRAD, ())
            if whole:  # a whole gradient on those dims: sum the contributions
                value = _all_reduce_dims(self._spec.mesh, value, whole)
        elif isinstance(value, torch.Tensor) and not _compiled_autograd_accumulates(self, value):
            raise TypeError(
                "a DTensor's .grad must be a DTensor on the same mesh (or None); wrap the local "
                "gradient with DTensor.from_local"
            )
    with DisableTorchFunctionSubclass():
        T.grad.__set__(self, value)
    self.__dict__.pop("_grad_wrapper", None)


def _compiled_autograd_accumulates(self: Any, value: torch.Tensor) -> bool:
    """Compiled autograd (``torch._dynamo.compiled_autograd``) runs the backward on the
    local tensors and sets ``param.grad`` to the accumulated local gradient, as the eager
    engine does below ``__torch_function__``: a plain tensor of the local shard's shape is
    taken as the local derivative there."""
    ca = sys.modules.get("torch._dynamo.compiled_autograd")
    if ca is None or not getattr(ca, "in_compiled_autograd_region", False):
        return False
    with DisableTorchFunctionSubclass():
        return tuple(value.shape) == tuple(self.shape)


def _all_reduce_dims(mesh: Any, t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    from ...kernels import all_reduce, groups_of

    return all_reduce(mesh.platform, t, "sum", groups_of(mesh, dims))


@_on(T.grad.__delete__)
def _grad_del(args: Any, kwargs: dict) -> None:
    with DisableTorchFunctionSubclass():
        T.grad.__delete__(args[0])


@_on(T.data.__get__)
def _data_get(args: Any, kwargs: dict) -> Any:
    self = args[0]
    with DisableTorchFunctionSubclass():
        d = T.data.__get__(self)
    return wrap(d, self._spec)


@_on(T.data.__set__)
def _data_set(args: Any, kwargs: dict) -> None:
    self, value = args
    if not isinstance(value, DTensor):
        raise TypeError("DTensor.data must be set to a DTensor with the same spec")
    if value._spec.shape != self._spec.shape or value._spec.mesh != self._spec.mesh:
        raise ValueError(f"DTensor.data: {value._spec} does not match {self._spec}")
    spec, new = value._spec, _local(value).detach()
    ss = self._spec
    if spec.placements != ss.placements or spec.shard_order != ss.shard_order:
        # internal: a Partial target is allowed here (DTensor.redistribute refuses it, as PyTorch)
        dst = DTensorSpec(spec.mesh, ss.placements, spec.tensor_meta, ss.shard_order)
        if spec.mesh.get_coordinate() is not None:
            new = redistribute_local(spec.mesh.platform, new, spec, dst)
        spec = dst
    with DisableTorchFunctionSubclass():
        T.data.__set__(self, new)
        real = self.__dict__.get("_hs_grad_of")
        if real is not None:  # self is a parameter's .grad view: set the gradient itself
            T.data.__set__(real, new)
    self._spec = spec  # the new data's dtype (nn.Module.to(dtype) sets .data)
    self.__dict__.pop("_grad_wrapper", None)


@_on(torch._has_compatible_shallow_copy_type)
def _compatible_shallow_copy(args: Any, kwargs: dict) -> bool:
    """``torch._has_compatible_shallow_copy_type(a, b)`` (asked by ``nn.Module._apply`` to
    decide whether ``param.data = new`` may replace a parameter's data in place): a metadata
    query answered on the local tensors; a DTensor and a plain tensor are never compatible
    (the parameter would lose its layout)."""
    a, b = (list(args) + [kwargs.get("input"), kwargs.get("from")])[:2]
    if isinstance(a, DTensor) != isinstance(b, DTensor):
        return False
    with DisableTorchFunctionSubclass():
        return bool(
            torch._has_compatible_shallow_copy_type(
                a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor)
            )
        )


@_on(T.detach, torch.ops.aten.detach.default)
def _detach(args: Any, kwargs: dict) -> Any:
    self = args[0]
    with DisableTorchFunctionSubclass():
        d = T.detach(self)
    return wrap(d, self._spec)


@_on(T.detach_, torch.ops.aten.detach_.default)
def _detach_(args: Any, kwargs: dict) -> Any:
    """``x.detach_()``: an op's DTensor result is an autograd alias (a view) of its local
    result, which torch's ``detach_`` refuses ("Can't detach views in-place"); the object is
    then given a detached leaf's tensor in place (same storage, same layout, same Python
    object), as ``detach_`` of the plain result would."""
    self = args[0]
    with DisableTorchFunctionSubclass():
        if not (T._is_view(self) and self.requires_grad):
            T.detach_(self)
            return self
        new = make_leaf(self, self._spec, False)
    new.__dict__.update(self.__dict__)
    torch.utils.swap_tensors(self, new)
    return self


@_on(T.backward)
def _backward(args: Any, kwargs: dict) -> None:
    """``loss.backward()`` on a DTensor: seeds the local-derivative form of the gradient
    (a Replicate scalar loss is counted once, not once per rank)."""
    self = args[0]
    names = ("gradient", "retain_graph", "create_graph", "inputs")
    opts = dict(zip(names, args[1:]))
    opts.update(kwargs)
    local, seed = _seed(self, opts.pop("gradient", None))
    _run_backward((local,), (seed,), opts)


def _run_backward(outs: tuple, seeds: tuple, opts: dict) -> None:
    # outs and seeds are plain tensors; torch functions stay enabled so that tensor hooks
    # (register_hook) run during this backward see DTensor arithmetic, not plain locals.
    # inputs= must be the DTensor leaves themselves (an alias would be another node), so
    # that form runs with torch functions off to reach the engine.
    if opts.get("inputs") is not None:
        with DisableTorchFunctionSubclass():
            torch.autograd.backward(outs, seeds, **opts)
    else:
        torch.autograd.backward(outs, seeds, **opts)


def _seed(self: Any, gradient: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """The local tensor of ``self`` and the local gradient to start its backward with.

    A ``Partial`` placement other than ``sum`` (a ``max()`` of a sharded tensor) is reduced
    first, so the gradient reaches the ranks holding the value. ``gradient`` is a DTensor
    read by its placements; a plain one-element tensor for a one-element output is taken as
    ``Replicate`` (as PyTorch takes ``y.backward(torch.tensor(2.0))``)."""
    spec = self._spec
    if gradient is None and math.prod(spec.shape) != 1:
        raise RuntimeError(
            f"grad can be implicitly created only for scalar outputs; this DTensor has global "
            f"shape {tuple(spec.shape)}: pass gradient= (a DTensor of that shape)"
        )
    if gradient is not None and not isinstance(gradient, DTensor):
        if not (
            isinstance(gradient, torch.Tensor)
            and gradient.numel() == 1
            and math.prod(spec.shape) == 1
        ):
            raise TypeError(
                "DTensor.backward(gradient=...): the gradient must be a DTensor with the same "
                "global shape and mesh (or a one-element tensor for a one-element output)"
            )
    target = self
    if any(type(p) is Partial and p.reduce_op != "sum" for p in spec.placements):
        fix = [
            Replicate() if type(p) is Partial and p.reduce_op != "sum" else p
            for p in spec.placements
        ]
        target = self.redistribute(spec.mesh, fix)
    tspec = target._spec
    local = _local(target)
    if gradient is None:
        with DisableTorchFunctionSubclass():
            seed = torch.ones_like(local)
        coord = tspec.mesh.get_coordinate()
        assert coord is not None
        if any(type(p) is Replicate and coord[m] != 0 for m, p in enumerate(tspec.placements)):
            with DisableTorchFunctionSubclass():
                seed = torch.zeros_like(local)
        return local, seed
    if isinstance(gradient, DTensor):
        g, g_placements = _local(gradient).detach(), gradient._spec.placements
    else:
        with DisableTorchFunctionSubclass():
            g = gradient.detach().reshape(tuple(tspec.shape)).to(local.device, local.dtype)
        g_placements = (Replicate(),) * tspec.mesh.ndim
    return local, local_derivative(_plat(self), g, g_placements, tspec)


@_on(torch.autograd.backward)
def _autograd_backward(args: Any, kwargs: dict) -> None:
    """``torch.autograd.backward(tensors, grad_tensors, ...)`` with DTensors: each DTensor
    output is seeded as by ``DTensor.backward`` (a DTensor gradient read by its placements,
    none for a scalar loss); a plain gradient of a DTensor output is taken as its local
    gradient, which is what autograd hands a custom Function's backward (reentrant
    activation checkpointing calls this way). Shapes of such plain gradients must be the
    local ones.

    Raises:
        ValueError: a plain gradient whose shape is not the output's local shape.
    """
    names = ("tensors", "grad_tensors", "retain_graph", "create_graph", "grad_variables", "inputs")
    opts = dict(zip(names, args))
    opts.update(kwargs)
    tensors = opts.pop("tensors")
    grads = opts.pop("grad_tensors", None)
    legacy = opts.pop("grad_variables", None)
    grads = legacy if grads is None else grads
    ts = (tensors,) if isinstance(tensors, torch.Tensor) else tuple(tensors)
    if grads is None:
        gs: tuple = (None,) * len(ts)
    elif isinstance(grads, torch.Tensor):
        gs = (grads,)
    else:
        gs = tuple(grads)
    # the local aliases must keep the graph: autograd may be off here (a backward run
    # inside another backward, as reentrant checkpointing does)
    with torch.enable_grad():
        pairs = [_pair(t, g) for t, g in zip(ts, gs)]
    _run_backward(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs), opts)


@_on(torch.autograd.grad)
def _autograd_grad(args: Any, kwargs: dict) -> Any:
    """``torch.autograd.grad(outputs, inputs, grad_outputs, ...)`` with DTensors: outputs
    are seeded as by :func:`_autograd_backward`; the gradient of a DTensor input is a
    DTensor in the local-derivative form, as its ``.grad`` would be."""
    names = (
        "outputs", "inputs", "grad_outputs", "retain_graph", "create_graph", "only_inputs",
        "allow_unused", "is_grads_batched", "materialize_grads",
    )  # fmt: skip
    opts = dict(zip(names, args))
    opts.update(kwargs)
    outputs, inputs = opts.pop("outputs"), opts.pop("inputs")
    gouts = opts.pop("grad_outputs", None)
    os_ = (outputs,) if isinstance(outputs, torch.Tensor) else tuple(outputs)
    ins = (inputs,) if isinstance(inputs, torch.Tensor) else tuple(inputs)
    if gouts is None:
        gs: tuple = (None,) * len(os_)
    elif isinstance(gouts, torch.Tensor):
        gs = (gouts,)
    else:
        gs = tuple(gouts)
    with torch.enable_grad():
        pairs = [_pair(o, g) for o, g in zip(os_, gs)]
    with DisableTorchFunctionSubclass():  # the DTensor inputs are the graph's own nodes
        res = torch.autograd.grad(
            tuple(p[0] for p in pairs), ins, tuple(p[1] for p in pairs), **opts
        )
    out = []
    for i, r in zip(ins, res):
        if isinstance(i, DTensor) and r is not None:
            spec = i._spec
            r = wrap(r, spec.with_placements([grad_placement(p) for p in spec.placements]))
        out.append(r)
    return tuple(out)


def _pair(t: Any, g: Any) -> tuple[Any, Any]:
    """(the tensor to run backward from, its gradient), both plain."""
    if not isinstance(t, DTensor):
        return t, (_local(g) if isinstance(g, DTensor) else g)
    if g is None or isinstance(g, DTensor):
        return _seed(t, g)
    local = _local(t)
    if tuple(g.shape) != tuple(local.shape):
        raise ValueError(
            f"torch.autograd.backward: a plain gradient of shape {tuple(g.shape)} for a "
            f"DTensor output {_fmt(t)} must have its local shape {tuple(local.shape)}; pass "
            f"a DTensor gradient for a global one"
        )
    return local, g


def _fmt(t: Any) -> str:
    spec = t._spec
    return f"DTensor{list(spec.shape)}[{', '.join(str(p) for p in spec.placements)}]"


@_on(T.register_hook)
def _register_hook(args: Any, kwargs: dict) -> Any:
    self, hook = args[0], args[1] if len(args) > 1 else kwargs["hook"]
    spec = self._spec
    gspec = spec.with_placements([grad_placement(p) for p in spec.placements])

    def local_hook(g: torch.Tensor) -> Any:
        out = hook(wrap(g, gspec))
        if out is None:
            return None
        if isinstance(out, DTensor):
            return local_derivative(_plat(self), _local(out), out._spec.placements, spec)
        raise TypeError("a DTensor gradient hook must return None or a DTensor")

    with DisableTorchFunctionSubclass():
        return T.register_hook(self, local_hook)


@_on(T.__repr__, T.__str__)
def _repr(args: Any, kwargs: dict) -> str:
    from ...dtensor import _format

    return _format(args[0])


@_on(T.__format__)
def _format_spec(args: Any, kwargs: dict) -> str:
    self, spec = args[0], args[1] if len(args) > 1 else ""
    if spec == "":
        return _repr((self,), {})
    return format(self.full_tensor(), spec)


@_on(T.__deepcopy__)
def _deepcopy(args: Any, kwargs: dict) -> Any:
    self = args[0]
    memo = args[1] if len(args) > 1 else kwargs.get("memo", {})
    if id(self) in memo:
        return memo[id(self)]
    with DisableTorchFunctionSubclass():
        local = T.clone(self).detach()
        rg = self.requires_grad
    out = make_leaf(local, self._spec, rg)
    if self.__dict__.get("_is_param"):
        out._is_param = True  # type: ignore[attr-defined]
    if self.__dict__.get(WHOLE_GRAD):  # a copied model's style parameters stay whole
        whole_replicate_grad(out)
    memo[id(self)] = out
    return out


@_on(T.__reduce_ex__)
def _reduce_ex(args: Any, kwargs: dict) -> Any:
    """Pickling (``torch.save``, ``copy``): this rank's local shard (saved by torch as usual)
    with the mesh (by description), placements and global metadata, as PyTorch DTensor.
    Each rank saves and loads its own shard; loading needs the mesh built first."""
    self = args[0]
    with DisableTorchFunctionSubclass():
        local = self.as_subclass(torch.Tensor).detach()
        rg = bool(self.requires_grad)
    spec = self._spec
    return (
        _rebuild_dtensor,
        (
            local,
            spec.mesh,
            tuple(spec.placements),
            tuple(spec.shape),
            tuple(spec.stride),
            rg,
            bool(self.__dict__.get("_is_param")),
            spec.mesh.get_coordinate(),
            spec.shard_order,
        ),
    )


def _rebuild_dtensor(
    local: torch.Tensor,
    mesh: Any,
    placements: tuple,
    shape: tuple,
    stride: tuple,
    requires_grad: bool,
    is_param: bool,
    coordinate: tuple | None = None,
    shard_order: tuple | None = None,
) -> TorchDTensor:
    """Unpickle a DTensor (see :func:`_reduce_ex`).

    Raises:
        ValueError: the saved local shard does not fit this rank's place in the mesh (a file
            saved by another rank).
    """
    from ...spec import TensorMeta

    spec = DTensorSpec(
        mesh,
        placements,
        TensorMeta(tuple(shape), tuple(stride), local.dtype, local.element_size()),
        shard_order,
    )
    want = spec.local_shape()
    here = mesh.get_coordinate()
    moved = (
        coordinate is not None
        and here is not None
        and any(
            c != h and type(p) is not Replicate
            for c, h, p in zip(coordinate, here, spec.placements)
        )
    )
    if moved or tuple(local.shape) != tuple(want):
        raise ValueError(
            f"loading a DTensor of global shape {tuple(shape)} with placements "
            f"{list(placements)}: the file holds the shard of mesh coordinate {coordinate} "
            f"(shape {tuple(local.shape)}), this rank is at {here} (shard shape "
            f"{tuple(want)}); each rank must load the file its own rank saved (or save "
            f"full_tensor() to share one file)"
        )
    out = make_leaf(local, spec, requires_grad)
    if is_param:
        out._is_param = True  # type: ignore[attr-defined]
    return out


def _allow_in_weights_only_load() -> None:
    """``torch.load(weights_only=True)`` (torch's default) unpickles only allowlisted
    callables: DTensors, meshes and placements are added, as PyTorch does for its own."""
    from ...mesh import _rebuild_mesh
    from ...placement import Shard
    from ...spec import ShardOrderEntry

    add = getattr(torch.serialization, "add_safe_globals", None)
    if add is not None:
        add([_rebuild_dtensor, _rebuild_mesh, Shard, Replicate, Partial, ShardOrderEntry])


_allow_in_weights_only_load()


def _allow_foreach_in_optimizers() -> None:
    """``torch.optim`` takes its foreach (multi-tensor) path by default only for tensor
    types in ``_foreach_supported_types``: DTensor is added, as PyTorch adds its own (the
    foreach rule decides each element; lists over several meshes are split per mesh)."""
    try:
        from torch.optim.optimizer import _foreach_supported_types as types
    except ImportError:  # an older torch without the list
        return
    if DTensor not in types:
        types.append(DTensor)  # type: ignore[arg-type]


_allow_foreach_in_optimizers()


def _full_then(method: Any) -> Callable:
    def h(args: Any, kwargs: dict) -> Any:
        self = args[0]
        full = self.full_tensor()
        return method(full, *args[1:], **kwargs)

    return h


for _m in (T.item, T.tolist, T.__bool__, T.__float__, T.__int__, T.__index__, T.numpy, T.__array__):
    PROTOCOL_HANDLERS[_m] = _full_then(_m)

# the same metadata answers for ``torch.ops.aten.<op>`` calls (as PyTorch DTensor answers
# them): detach, is_same_size, numel, dim, stride, is_contiguous
for _aten, _m in (
    ("detach", T.detach), ("is_same_size", T.is_same_size), ("numel", T.numel),
    ("dim", T.dim), ("stride", T.stride), ("is_contiguous", T.is_contiguous),
):  # fmt: skip
    _packet = getattr(torch.ops.aten, _aten)
    for _f in (_packet, *(getattr(_packet, o) for o in _packet.overloads())):
        PROTOCOL_HANDLERS.setdefault(_f, PROTOCOL_HANDLERS[_m])


from . import compiled as _compiled  # noqa: E402  (compiled imports the dispatcher)
from . import dispatch as _dm  # noqa: E402  (dispatch imports this module's class)
from . import inplace_views as _inplace_views  # noqa: E402,F401  (registers its handlers)
from .compiled_hooks import in_compiled_backward as _in_compiled_backward  # noqa: E402
from .compiled_hooks import local_op as _local_op  # noqa: E402
from .state_dict_utils import install as _install_state_dict_utils  # noqa: E402

_compiled.install()

_install_state_dict_utils()  # full/offloaded DCP state dicts gather hyper_shard DTensors too

from .vmap import install as _install_vmap  # noqa: E402

_install_vmap()  # torch.vmap over DTensors runs on whole local samples (platform/torch/vmap.py)


def _torch_entered_mesh() -> Any:
    """The innermost ``torch.distributed`` DeviceMesh entered with ``with mesh:`` (PyTorch's
    tests build their meshes so), as a hyper_shard mesh; None when none is entered."""
    dm = sys.modules.get("torch.distributed.device_mesh")  # not imported: none entered
    res = getattr(dm, "_mesh_resources", None)
    stack = getattr(res, "mesh_stack", None)
    if not stack:
        return None
    from ...mesh import as_mesh

    return as_mesh(stack[-1], "with mesh:")  # converted by the torch platform (cached)


_FOREIGN_CURRENT.append(_torch_entered_mesh)
