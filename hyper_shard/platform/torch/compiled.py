"""hyper_shard DTensors under ``torch.compile``: dispatch at trace time, local kernels and
functional collectives in the graph.

[Note: compiled DTensor] The eager DTensor *is* its local shard (an ``as_subclass`` alias
whose ``__torch_function__`` reports the global shape), so autograd runs on local tensors.
Dynamo traces such a subclass by inlining its ``__torch_function__``; this module gives
that inlining three short paths (chosen in :meth:`TorchDTensor.__torch_function__`):

* metadata a user reads (``x.shape``, ``x.size()``, ``x.stride()``, ``x.numel()``...) is the
  *global* metadata, read from the spec (a guarded constant);
* every other call — an op, or the DTensor API (``redistribute``, ``to_local``,
  ``full_tensor``, ``from_local``) — is one ``torch._dynamo.nonstrict_trace`` call: dynamo
  does not trace our dispatcher, AOTAutograd runs it in Python on the local fake tensors
  (:data:`TRACE_DISPATCHER`, the same registry, rules, layout cache and planner as eager,
  with :class:`TracedDTensor` boxes around the local fakes). What it records is the local
  computation: local kernels, the redistribution plan's collectives as
  ``_c10d_functional`` ops with an explicit ``wait_tensor`` (:func:`tracing` switches the
  platform's collectives to them), and the collectives' custom backward;
* while dynamo *builds* its fake tensors and guards (Python-level calls during a compile,
  :func:`python_level`), a DTensor is its local tensor: sizes, strides and storage are the
  local ones, the same the C++ guards check at run time.

Specs go into the nonstrict call as pytree constants (guarded by equality: a second step
with equal placements and shapes does not recompile, a different placement does), and come
out as small interned ints (:data:`_SPECS`).
"""

from __future__ import annotations

import sys
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._C import DisableTorchFunctionSubclass

from ...dispatch.dispatcher import Dispatcher
from ...dispatch.op import BoundOp, Decision
from ...dtensor import DTensor
from ...errors import HyperShardError
from ...mesh import DeviceMesh
from ...placement import Partial, Placement, Replicate, Shard
from ...spec import DTensorSpec

__all__ = ["TracedDTensor", "TRACE_DISPATCHER", "tracing", "is_tracing"]

from .compiled_hooks import _MODULES_SEEN, install, skip_frames  # noqa: F401
from .compiled_state import _TRACING, TracedDTensor, is_tracing, tracing  # noqa: F401


def _is_traced(x: Any) -> bool:
    return type(x) is TracedDTensor


def _unbox(x: Any) -> Any:
    t = type(x)
    if t is TracedDTensor:
        return x._local
    if t in (list, tuple):
        return t(_unbox(a) for a in x)
    return x


def _run_local(fn: Any, args: tuple, kwargs: dict) -> Any:
    a = tuple(_unbox(x) for x in args)
    k = {n: _unbox(v) for n, v in kwargs.items()} if kwargs else kwargs
    with DisableTorchFunctionSubclass():
        return fn(*a, **k)


def _wrap_outputs(out: Any, dec: Decision) -> Any:
    if isinstance(out, torch.Tensor):
        if dec.outputs and dec.outputs[0] is None:
            return out
        return TracedDTensor(out, dec.out_spec(0, out.dtype, out.element_size()))
    if isinstance(out, (tuple, list)):
        items: list[Any] = []
        i = 0
        for x in out:
            if isinstance(x, torch.Tensor):
                if dec.self_wrapped or (i < len(dec.outputs) and dec.outputs[i] is None):
                    items.append(x)
                else:
                    items.append(TracedDTensor(x, dec.out_spec(i, x.dtype, x.element_size())))
                i += 1
            else:
                items.append(x)
        return type(out)(items)
    return out


def _run_wrap(fn: Any, args: tuple, kwargs: dict, dec: Decision) -> Any:
    return _wrap_outputs(_run_local(fn, args, kwargs), dec)


_TRACE_TABLE: dict[Any, BoundOp | None] = {}


def _trace_lookup(func: Any) -> BoundOp | None:
    if func in _TRACE_TABLE:
        return _TRACE_TABLE[func]
    from .dispatch import _lookup

    eager = _lookup(func)
    bound = None
    if eager is not None:
        bound = BoundOp(
            eager.op,
            eager.name,
            inplace=eager.inplace,
            reflected=eager.reflected,
            is_dtensor=_is_traced,
            tensor_type=torch.Tensor,
            dt_type=TracedDTensor,
        )
    _TRACE_TABLE[func] = bound
    return bound


def _on_reload(reg: Any) -> None:
    _TRACE_TABLE.clear()


def _platform() -> Any:
    from ..select import get_platform

    return get_platform("torch")


def _name_of(func: Any) -> str:
    from .names import torch_op_name

    return torch_op_name(func)


def _decompose(func: Any) -> Any:
    from .dispatch import _decompose as eager_decompose

    return eager_decompose(func)


#: the dispatcher a compiled region's trace runs: the eager one's rules, cache and planner,
#: on :class:`TracedDTensor` boxes
TRACE_DISPATCHER = Dispatcher(
    _platform,
    bound_of=lambda f: _TRACE_TABLE.get(f),
    lookup=_trace_lookup,
    name_of=_name_of,
    run_local=_run_local,
    run_wrap=_run_wrap,
    wrap_outputs=_wrap_outputs,
    is_dtensor=_is_traced,
    decompose=_decompose,
)


# ---------------------------------------------------------------------- interned values
#: (function or API name, argument skeleton) of every traced call site, by id: the
#: skeleton is the call's arguments with each tensor replaced by :data:`_HOLE`
_CALLS: list[tuple[Any, Any]] = []
_CALL_IDS: dict[Any, int] = {}
#: spec id (``DTensorSpec._id``, one int per layout) -> a spec with that id: the specs of
#: the DTensors a region reads (registered while dynamo builds their fakes) and makes
_BY_ID: dict[int, DTensorSpec] = {}
_HOLE = "\x00hyper_shard.tensor"


@torch._dynamo.assume_constant_result
def _call_id(func: Any, skeleton: Any) -> str:
    """Intern one call site's function and constant arguments (run by dynamo at trace time,
    the result a constant of the graph: no runtime cost)."""
    key = (func, _freeze(skeleton))
    i = _CALL_IDS.get(key)
    if i is None:
        i = _CALL_IDS[key] = len(_CALLS)
        _CALLS.append((func, skeleton))
    return str(i)  # a string: never made symbolic


def _freeze(x: Any) -> Any:
    if type(x) in (list, tuple):
        return (type(x), tuple(_freeze(a) for a in x))
    if type(x) is dict:
        return (dict, tuple((k, _freeze(v)) for k, v in x.items()))
    if type(x) is slice:
        return (slice, x.start, x.stop, x.step)
    return x


class _SpecTable:
    """Every interned output spec as an attribute ``s<id>``: dynamo reads each through a
    source of its own (a global list would be read once per trace and go stale while the
    trace interns new specs)."""


_SPEC_TABLE = _SpecTable()


def _spec_id(spec: DTensorSpec) -> int:
    i = spec._id
    if i not in _BY_ID:
        _BY_ID[i] = spec
        setattr(_SPEC_TABLE, f"s{i}", spec)
    return i


pytree.register_constant(DeviceMesh)
# AOTAutograd's first-call check of custom ops' aliasing runs the graph under a dispatch
# mode that refuses tensor subclasses it does not know, and a compiled region's inputs are
# DTensors (each one its local tensor to the graph's aten ops): the check is a debugging
# aid, off for hyper_shard's regions (a custom op's aliasing is not checked then)
torch._functorch.config.check_custom_op_aliasing = False


# ---------------------------------------------------------------------- the nonstrict call
def _fill(skeleton: Any, tensors: list, specs: tuple, pos: list) -> Any:
    """The skeleton's holes refilled: a tensor that was a DTensor (a spec in ``specs``)
    becomes a :class:`TracedDTensor` box, a plain one stays plain."""
    t = type(skeleton)
    if t is str and skeleton == _HOLE:
        i = pos[0]
        pos[0] += 1
        a, s = tensors[i], specs[i]
        if s is False:
            return a
        s = _BY_ID[int(s)]
        if isinstance(a, DTensor):  # backend="eager": the real DTensor arrives
            with DisableTorchFunctionSubclass():
                a = a.as_subclass(torch.Tensor)  # type: ignore[attr-defined]
        _specialize(a, s)
        return TracedDTensor(a, s)
    if t in (list, tuple):
        return t(_fill(x, tensors, specs, pos) for x in skeleton)
    if t is dict:
        return {k: _fill(v, tensors, specs, pos) for k, v in skeleton.items()}
    return skeleton


def _specialize(local: Any, spec: DTensorSpec) -> None:
    """A DTensor's layout is static in a region: symbolic sizes of its local tensor (a
    ``mark_dynamic`` dim, automatic dynamic shapes) are specialized to the layout's local
    shape here (a guard each), even when the decision comes from the layout cache without
    reading them (they would otherwise be bound to the DTensor's global sizes at run time)."""
    if spec.mesh.get_coordinate() is None:
        return
    for n, m in zip(local.shape, spec.local_shape()):
        if isinstance(n, torch.SymInt):
            bool(n == m)


def _unbox_outputs(out: Any, inputs: list) -> tuple[Any, tuple[int, ...]]:
    """The call's outputs as local tensors, and each one's spec id (-1: plain). An output
    that is one of the call's input tensors (``to_local``, ``from_local`` with nothing to
    convert) leaves as a view of it: dynamo would take the output for the input's variable
    (a DTensor for a plain result, or the reverse)."""
    flat, tree = pytree.tree_flatten(out, is_leaf=_is_traced)
    ids = []
    res = []
    for o in flat:
        if type(o) is TracedDTensor:
            ids.append(_spec_id(o._spec))
            o = o._local
        elif isinstance(o, DTensor):  # backend="eager": a real DTensor
            ids.append(_spec_id(o._spec))
            with DisableTorchFunctionSubclass():
                o = o.as_subclass(torch.Tensor)  # type: ignore[attr-defined]
        else:
            ids.append(-1)
        if isinstance(o, torch.Tensor) and any(o is t for t in inputs):
            with DisableTorchFunctionSubclass():
                o = o.view(o.shape)
        res.append(o)
    return pytree.tree_unflatten(res, tree), tuple(ids)


#: what a traced call returns for its spec ids when it raised a hyper_shard error
_FAILED_IDS = (-2,)
#: the last such error, as (its class, its message): raised again in dynamo-land
_FAILED: list[Any] = [HyperShardError, ""]


@torch._dynamo.nonstrict_trace
def _traced_call(cid: str, specs: tuple, tensors: list) -> Any:
    func, skeleton = _CALLS[int(cid)]
    if len(sys.modules) != _MODULES_SEEN[0]:
        skip_frames()  # hyper_shard modules imported since
    with tracing():
        args, kwargs = _fill(skeleton, tensors, specs, [0])
        try:
            if isinstance(func, str):
                out = _API[func](*args, **kwargs)  # type: ignore[operator]
            else:
                out = TRACE_DISPATCHER.dispatch(func, args, kwargs)
        except HyperShardError as e:
            if not _remember_failure(e):
                raise
            return 0, _FAILED_IDS
        return _unbox_outputs(out, tensors)


def _remember_failure(e: HyperShardError) -> bool:
    """Keep ``e`` to raise again in dynamo-land (:func:`_call`): dynamo hides an error
    raised inside a nonstrict call behind "Unsupported output type for nonstrict_trace-ed
    function", while an exception raised by the traced code itself is the eager one after
    a graph break and, under ``fullgraph=True``, is named with its message and the user's
    line. Only errors that rebuild from their message alone (the class and text of the
    eager error)."""
    try:
        again = type(e)(str(e))
    except Exception:
        return False
    if str(again) != str(e):
        return False
    _FAILED[:] = [type(e), str(e)]
    return True


def _api_redistribute(x: Any, mesh: Any, pl: tuple, async_op: bool, fdt: Any, bdt: Any) -> Any:
    return DTensor.redistribute(
        x,
        mesh,
        [_decode(p) for p in pl],
        async_op=async_op,
        forward_dtype=fdt,
        backward_dtype=bdt,
    )


def _api_to_local(x: Any, gp: tuple | None) -> Any:
    return DTensor.to_local(x, grad_placements=None if gp is None else [_decode(p) for p in gp])


def _api_full_tensor(x: Any, gp: tuple | None) -> Any:
    return DTensor.full_tensor(x, grad_placements=None if gp is None else [_decode(p) for p in gp])


#: the last traced from_local: (local tensor, its version, arguments, the DTensor)
_LAST_WRAP: list[Any] = [None]


def _version(t: Any) -> Any:
    try:
        return t._version
    except (AttributeError, RuntimeError):  # no version counter: never reused
        return object()


def _api_from_local(
    t: Any, mesh: Any, pl: tuple, run_check: bool, shape: Any, stride: Any, gp: Any
) -> Any:
    """``from_local`` while tracing. A second wrap of the same traced tensor with the same
    arguments (the input a ColwiseParallel style wraps for each of q/k/v, gate/up) is a
    view of the first: the consumers' gradients meet at one node and the backward
    reduces them once, as the eager styles' shared wrap does (a linear map: the same
    values as one reduction per wrap)."""
    from .dtensor import TorchDTensor

    key = (mesh, pl, run_check, shape, stride, gp)
    last = _LAST_WRAP[0]
    if last is not None and last[0] is t and last[1] == _version(t) and last[2] == key:
        out = last[3]
        with DisableTorchFunctionSubclass():
            return TracedDTensor(out._local.view(out._local.shape), out._spec)
    out = _from_local(TorchDTensor, t, mesh, pl, run_check, shape, stride, gp)
    _LAST_WRAP[0] = (t, _version(t), key, out) if type(out) is TracedDTensor else None
    return out


def _from_local(
    cls: Any, t: Any, mesh: Any, pl: tuple, run_check: bool, shape: Any, stride: Any, gp: Any
) -> Any:
    return cls.from_local(
        t,
        mesh,
        [_decode(p) for p in pl],
        run_check=run_check,
        shape=shape,
        stride=stride,
        grad_placements=None if gp is None else [_decode(p) for p in gp],
    )


def _api_local_tensor(x: Any, gp: None) -> Any:
    return DTensor._local_tensor.fget(x)  # type: ignore[attr-defined]


def _api_cp_attention(
    q: Any, k: Any, v: Any, mesh: Any, kind: str, even: bool, args: tuple, kwargs: dict
) -> Any:
    """``scaled_dot_product_attention`` on local sequence pieces inside ``context_parallel``
    (:func:`~hyper_shard.platform.torch.context_parallel.traced_attention`)."""
    from .context_parallel import attention_in_region

    return attention_in_region(mesh, kind, even, q, k, v, args, kwargs)


def _api_ep_moe(key: str, x: Any, index: Any, weights: Any, params: tuple) -> Any:
    from .compiled_moe import ep_moe

    return ep_moe(key, x, index, weights, params)


_API = {
    "cp_attention": _api_cp_attention,
    "ep_moe": _api_ep_moe,
    "from_local": _api_from_local,
    "local_tensor": _api_local_tensor,
    "redistribute": _api_redistribute,
    "to_local": _api_to_local,
    "full_tensor": _api_full_tensor,
}


# ---------------------------------------------------------------------- dynamo-land side
def _encode(p: Placement) -> tuple:
    """A placement as a tuple of primitives (a placement built inside the compiled region
    is no constant dynamo can hand over)."""
    if type(p) is Shard:
        return ("S", p.dim)
    if type(p) is Partial:
        return ("P", p.reduce_op)
    return ("R",)


def _decode(code: tuple) -> Placement:
    if code[0] == "S":
        return Shard(code[1])
    if code[0] == "P":
        return Partial(code[1])
    return Replicate()


def _skeleton(x: Any, tensors: list) -> Any:
    """``x`` with every tensor replaced by :data:`_HOLE` (collected into ``tensors``);
    written without pytree, which dynamo would trace call by call."""
    if isinstance(x, torch.Tensor):
        tensors.append(x)
        return _HOLE
    t = type(x)
    if t in (list, tuple):
        return t(_skeleton(a, tensors) for a in x)
    if t is dict:
        return {k: _skeleton(v, tensors) for k, v in x.items()}
    return x


def _rewrap_one(o: Any, ids: tuple, pos: list) -> Any:
    from .dtensor import TorchDTensor

    if type(o) in (list, tuple):
        return type(o)(_rewrap_one(a, ids, pos) for a in o)
    i = ids[pos[0]]
    pos[0] += 1
    if i >= 0:
        o = o.as_subclass(TorchDTensor)
        o._spec = getattr(_SPEC_TABLE, "s" + str(i))
    return o


def _spec_token(t: Any) -> str:
    """How a DTensor's spec enters a nonstrict call: its id, as a string (the spec objects
    are no constants dynamo can hand over once made in the region, and an int would be
    made symbolic by automatic dynamic shapes when it differs between two compiles)."""
    return t._spec._cid  # type: ignore[no-any-return]


def _call(func: Any, args: Any, kwargs: dict, ints: tuple = ()) -> Any:
    """One nonstrict call of ``func`` (an op, or a DTensor API name); ``ints``: sizes that
    enter as inputs (they may be symbolic), in the order of the :data:`_HOLE` strings the
    arguments hold after their tensors."""
    from .dtensor import TorchDTensor

    tensors: list = []
    skeleton = _skeleton((args, kwargs), tensors)
    specs = tuple(_spec_token(t) if isinstance(t, TorchDTensor) else False for t in tensors)
    if ints:
        tensors.extend(ints)
        specs += (False,) * len(ints)
    for t in tensors:
        if isinstance(t, TorchDTensor):
            # a torch function dispatched on a DTensor (answered here, a constant) marks the
            # region as one that inlined __torch_function__: dynamo then runs the compiled
            # graph with it disabled, so the graph's aten ops on DTensor inputs are local
            # ops. A region of DTensor API calls alone (``x.to_local() + 2``) has no other.
            torch.numel(t)
            break
    out, ids = _traced_call(_call_id(func, skeleton) + "", specs, tensors)  # no source
    if ids == _FAILED_IDS:  # the call raised the eager error while traced: raise it here
        raise _FAILED[0](_FAILED[1])
    return _rewrap_one(out, ids, [0])


def torch_function(func: Any, args: tuple, kwargs: dict) -> Any:
    """``TorchDTensor.__torch_function__`` as dynamo traces it (see the module note)."""
    h = TRACED_HANDLERS.get(func)
    if h is not None:
        return h(args, kwargs)
    if isinstance(func, torch._ops.HigherOrderOperator):
        return _higher_order(func, args, kwargs)
    return _call(func, args, kwargs)


def _higher_order(func: Any, args: tuple, kwargs: dict) -> Any:
    """A higher-order op dynamo made of user code on DTensors (``checkpoint`` becomes
    ``tag_activation_checkpoint(body, *args)``): not traced yet. Raising here makes dynamo
    break the graph and run that code eagerly (with ``fullgraph=True``: the error), where
    it is right; checkpoint a compiled block instead to keep the block in one graph."""
    raise NotImplementedError(
        f"torch.compile: {func.__name__} (e.g. torch.utils.checkpoint) over hyper_shard "
        f"DTensors is not traced inside a compiled region; checkpoint a compiled block "
        f"instead: checkpoint(torch.compile(block), x, use_reentrant=False)"
    )


def _enc_placements(pl: Any) -> Any:
    if pl is None:
        return None
    return tuple(_encode(p) for p in pl)


def api_call(name: str, *args: Any) -> Any:
    """A DTensor API method called inside a compiled region (one nonstrict call), installed
    as ``hyper_shard.dtensor.COMPILED_API`` ([Note: compiled DTensor API])."""
    from ...mesh import as_mesh

    if name == "from_local":
        t, mesh, pl, run_check, shape, stride, gp = args
        if mesh is None or isinstance(mesh, DeviceMesh):
            mesh = as_mesh(mesh, "DTensor.from_local")
        # else a torch DeviceMesh: converted inside the call (dynamo cannot trace the
        # conversion, which imports the platform)
        pl = (("R",),) * mesh.ndim if pl is None else _enc_placements(pl)
        # the sizes enter the call as inputs: symbolic ones (dynamic=True) are no constants
        # (from_local specializes them: a layout is static)
        ints = tuple(shape or ()) + tuple(stride or ())
        sh = None if shape is None else (_HOLE,) * len(shape)
        st = None if stride is None else (_HOLE,) * len(stride)
        return _call(name, (t, mesh, pl, run_check, sh, st, _enc_placements(gp)), {}, ints)
    if name == "redistribute":
        x, mesh, pl, async_op, fdt, bdt = args
        mesh = x._spec.mesh if mesh is None else mesh
        pl = x._spec.placements if pl is None else pl
        return _call(name, (x, mesh, _enc_placements(pl), async_op, fdt, bdt), {})
    if name == "ep_moe":  # (layer key, tokens, router ids, router weights, weights)
        return _call(name, args, {})
    x, gp = args
    return _call(name, (x, _enc_placements(gp)), {})


T: Any = torch.Tensor


def _g_shape(args: Any, kwargs: dict) -> Any:
    return torch.Size(args[0]._spec.shape)


def _g_size(args: Any, kwargs: dict) -> Any:
    shape = args[0]._spec.shape
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    if dim is None:
        return torch.Size(shape)
    return shape[dim]


def _g_dim(args: Any, kwargs: dict) -> int:
    return len(args[0]._spec.shape)


def _g_numel(args: Any, kwargs: dict) -> int:
    n = 1
    for s in args[0]._spec.shape:
        n *= s
    return n


def _g_len(args: Any, kwargs: dict) -> int:
    return args[0]._spec.shape[0]


def _passthrough(func: Any) -> Any:
    def h(args: Any, kwargs: dict) -> Any:
        with DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    return h


#: metadata answered in dynamo-land without a nonstrict call
TRACED_HANDLERS: dict[Any, Any] = {
    T.shape.__get__: _g_shape,
    T.size: _g_size,
    T.dim: _g_dim,
    T.ndimension: _g_dim,
    T.ndim.__get__: _g_dim,
    T.numel: _g_numel,
    T.nelement: _g_numel,
    torch.numel: _g_numel,
    T.__len__: _g_len,
}
for _n in ("dtype", "device", "requires_grad", "is_leaf", "grad_fn", "layout", "is_cuda"):
    TRACED_HANDLERS[getattr(T, _n).__get__] = _passthrough(getattr(T, _n).__get__)
for _n in ("is_floating_point", "is_complex", "element_size", "get_device"):
    TRACED_HANDLERS[getattr(T, _n)] = _passthrough(getattr(T, _n))
