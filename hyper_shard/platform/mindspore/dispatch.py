"""Binding the registry to MindSpore Primitive names, and the MindSpore dispatcher.

``__fallback__`` receives ``func`` (an ``OpCall``/``TensorOverloadCall`` whose ``.name``
is the Primitive name: ``AddExt``, ``MatMulExt``, ``Dense``...) and the call's arguments,
always positional where the Primitive has a signature (``mint.sum(x, dim=1)`` arrives as
``SumExt(x, 1, False, None)``). Entries bind these names under ``mindspore:``; where the
Primitive's argument order differs from the torch one the entry gives a
``mindspore_signature``.

A name with a module path (``mindspore.ops.cross_entropy``) binds a Python-level function
instead (:mod:`hyper_shard.platform.mindspore.functions`): calls with a DTensor argument are
dispatched as one op, so a composite loss or dropout reaches its rule whole.

Legacy Primitives (``ops.ReduceSum()``, ``x[0:2]``'s ``StridedSlice``, ``ops.gather``)
arrive as ``(prim, "Name", (inputs...))``: they are unpacked, so a rule sees the inputs
as positional arguments, and packed again for the local call.

The local Primitive runs under ``NoFallbackGuard`` on plain local aliases. In-place
Primitives (``Inplace*``) write their result back into the target (on CPU, MindSpore 2.10's
``InplaceAddExt``/``InplaceMuls``... return a new tensor and leave the target unchanged).
"""

from __future__ import annotations

import sys
import threading
import weakref
from typing import Any

from mindspore import Parameter, Tensor, ops

from ...dispatch.dispatcher import Dispatcher
from ...dispatch.op import BoundOp, Decision, fmt_placements
from ...errors import HyperShardError
from ...registry.platforms import resolve_all
from ...registry.registry import RELOAD_HOOKS, Registry, get_registry
from .hooks import NoFallbackGuard

__all__ = [
    "ms_dispatch",
    "DISPATCHER",
    "build_ms_table",
    "resolve_ms_op",
    "getitem_call",
    "setitem_call",
    "PSEUDO_PRIMITIVES",
    "MISSING_KERNEL_HINTS",
]


class _PseudoPrimitive:
    """A Python-level Tensor method dispatched like a Primitive (``.name`` + call)."""

    __slots__ = ("name", "fn")

    def __init__(self, name: str, fn: Any) -> None:
        self.name = name
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<PseudoPrimitive {self.name}>"


def _setitem(x: Tensor, index: Any, value: Any) -> Tensor:
    Tensor.__setitem__(x, index, value)
    return x


#: ``dt[index]``: as ``Tensor.__getitem__`` (signature ``input, indices``)
getitem_call = _PseudoPrimitive("__getitem__", Tensor.__getitem__)
#: ``dt[index] = value``: as ``Tensor.__setitem__`` (in place on ``input``)
setitem_call = _PseudoPrimitive("__setitem__", _setitem)
PSEUDO_PRIMITIVES = frozenset({"__getitem__", "__setitem__"})
#: in-place Primitives whose name does not start with ``Inplace`` (they write ``args[0]``)
INPLACE_NAMES = frozenset({"__setitem__", "Assign", "AssignAdd", "AssignSub"})


class TensorMethod(_PseudoPrimitive):
    """A hot Tensor method a DTensor dispatches from Python (``Tensor.__add__``...): the
    call reaches hyper_shard without MindSpore's C++ ``__fallback__`` detour, and its
    local op is the plain Tensor method on local aliases. Entries bind it as
    ``Tensor.<name>`` (:data:`TENSOR_METHODS`)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<TensorMethod {self.name}>"


class BoundFunction(_PseudoPrimitive):
    """A Python-level MindSpore function bound whole by a dotted ``mindspore:`` name
    (``mindspore.mint.add``, ``mindspore.ops.cross_entropy``: see :mod:`.functions`); its
    local op is the original function on local aliases."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<BoundFunction {self.name}>"


#: the Tensor methods MindSporeDTensor dispatches from Python (bound as ``Tensor.<name>``)
TENSOR_METHODS = frozenset(
    f"Tensor.{n}"
    for n in ("__add__", "__sub__", "__mul__", "__truediv__", "__matmul__", "__neg__", "reshape", "unsqueeze")
)  # fmt: skip


def tensor_method(name: str) -> Any:
    """The Python method of MindSporeDTensor for Tensor method ``name``: dispatch it as
    ``Tensor.<name>`` when an entry binds that, else run MindSpore's own method (whose C++
    fallback then dispatches the Primitive it picks)."""
    fn = getattr(Tensor, name)
    op = TensorMethod(f"Tensor.{name}", fn)
    bound_name = op.name

    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        """As the ``mindspore.Tensor`` method of this name, on the global tensor."""
        bound = _TABLE.get(bound_name) or _lookup(op)  # _lookup: the first call, a reload
        # inside a local op that runs on the DTensors themselves (a Parameter DTensor in a
        # Python-level overload) the method is the local one
        if bound is None or (_ANY_LOCAL[0] and _LOCAL.depth):
            return fn(self, *args, **kwargs)
        args = (self, *args)
        try:
            return _dispatch_bound(bound, op, args, kwargs)
        except RuntimeError as e:
            raise_kernel_error(e, op, args)
            raise

    method.__name__ = method.__qualname__ = name
    return method


class _LocalDepth(threading.local):
    depth = 0  # > 0 while a local op runs on DTensor arguments under NoFallbackGuard


_LOCAL = _LocalDepth()
#: how many local ops run on DTensor arguments in any thread: the hot methods read the
#: (costlier) per-thread depth only while this is not 0
_ANY_LOCAL = [0]
_ANY_LOCK = threading.Lock()


#: Primitive -> what to use instead, for kernels MindSpore 2.10 lacks on CPU
MISSING_KERNEL_HINTS = {
    "Mm": "use mint.matmul (MatMulExt)",
    "StackExt": "use ops.stack, or mint.cat of unsqueezed tensors",
    "CumsumExt": "use ops.cumsum(x, axis) (CumSum)",
    "SortExt": "use ops.sort(x, axis, descending) or Tensor.sort",
    "Clone": "use ops.deepcopy or x * 1",
    "ZerosLikeExt": "use ops.zeros_like or mint.zeros(shape)",
    "OnesLikeExt": "use ops.ones_like or mint.ones(shape)",
    "LayerNormExt": "use ops.LayerNorm(-1, -1) or a manual mint layer norm",
    "Embedding": "use mindspore.nn.Embedding or ops.gather(weight, indices, 0) (Gather)",
    "LogSoftmaxExt": "use ops.log_softmax(x, axis)",
    "GeluExt": "use ops.gelu(x)",
    "DropoutExt": "use ops.dropout(x, p, training=True)",
    "ArgMaxExt": "use Tensor.argmax",
    "FillScalar": "use ops.full",
    "ArgSort": "use ops.argsort(x, axis, descending)",
    "TraceExt": "use ops.trace(x) or Tensor.trace",
    "DiagExt": "use ops.diag(x) (a 1-D input) or ops.diagonal(x) (a 2-D one)",
    "CountNonZero": "use ops.count_nonzero(x, axis)",
    "IsNegInf": "use ops.isneginf(x)",
}


class _LegacyCall:
    """A legacy Primitive call ``func(prim, name, inputs)`` seen as ``name(*inputs)``."""

    __slots__ = ("func", "prim", "name")

    def __init__(self, func: Any, prim: Any, name: str) -> None:
        self.func, self.prim, self.name = func, prim, name

    def __call__(self, *inputs: Any) -> Any:
        return self.func(self.prim, self.name, inputs)


def _is_dtensor(x: Any) -> bool:
    dt = _DT
    if dt is None:  # before the table is built (dtensor imports this module)
        from .dtensor import MindSporeDTensor

        dt = MindSporeDTensor
    return isinstance(x, dt)


def _known_primitive(name: str) -> bool:
    if name in PSEUDO_PRIMITIVES:
        return True
    import mindspore.ops.auto_generate.gen_ops_prim as gen
    import mindspore.ops.functional as functional
    import mindspore.ops.operations as legacy
    from mindspore.ops.primitive import Primitive

    if hasattr(gen, name) or hasattr(legacy, name):
        return True
    # functional Primitive instances such as ``typeof`` (its name is the attribute's)
    if isinstance(getattr(functional, name, None), Primitive):
        return True
    # C++-only Tensor-method overloads (``DeprecatedSum`` for ``Tensor.sum(axis=...)``)
    from mindspore.ops.auto_generate.cpp_create_prim_instance_helper import (
        op_args_default_value,
    )

    return name in op_args_default_value


def resolve_ms_op(n: str) -> str:
    """The platform's op-name resolver: a YAML name is its own lookup key (a Primitive
    name, a Tensor method hyper_shard dispatches, or a dotted Python-level function).

    Raises:
        LookupError: a name MindSpore does not have (the message says where it looked).
    """
    if n in TENSOR_METHODS:
        return n  # a method MindSporeDTensor dispatches from Python
    if "." in n:  # a Python-level function (hyper_shard/platform/mindspore/functions.py)
        from .functions import resolve

        if resolve(n) is None:
            raise LookupError(
                f"{n!r} is not an importable function (a dotted name binds a Python-level "
                f"function, e.g. mindspore.ops.cross_entropy)"
            )
    elif not _known_primitive(n):
        raise LookupError(
            f"{n!r} is not a MindSpore Primitive (mindspore.ops.auto_generate.gen_ops_prim / "
            f"ops.operations / a Tensor-method overload); "
            f"print func.name in a Tensor subclass's __fallback__ to find the name"
        )
    return n


def build_ms_table(reg: Registry) -> dict[str, BoundOp]:
    """Primitive name -> BoundOp for every ``mindspore:`` name in the registry
    (:func:`resolve_ms_op`).

    A name starting with ``Inplace`` (and ``__setitem__``) is in-place.

    Raises:
        OpSpecError: a name that is not a MindSpore Primitive (names file, entry, field).
    """
    global _DT
    from .dtensor import MindSporeDTensor

    _DT = MindSporeDTensor
    table: dict[str, BoundOp] = {}
    functions: list[str] = []
    for e, n, _ in resolve_all(reg, "mindspore", resolve_ms_op):
        if "." in n and n not in TENSOR_METHODS:
            functions.append(n)
        table[n] = BoundOp(
            e.op,
            n,
            inplace=n.startswith("Inplace") or n in INPLACE_NAMES,
            reflected=False,
            is_dtensor=_is_dtensor,
            tensor_type=Tensor,
            platform="mindspore",
            dt_type=MindSporeDTensor,
        )
    if functions:
        from .functions import install

        install(functions, MindSporeDTensor)
    return table


def bind() -> None:
    """Install the MindSpore hooks (:func:`.hooks.install`: legacy Primitive calls with
    DTensors inside tuple arguments, the jit refusal) if they are not, and build the
    binding table now (which wraps the bound Python-level functions), so the first call of
    a bound function on a DTensor already dispatches as one op."""
    from . import hooks

    hooks.install()
    _lookup(getitem_call)


_TABLE: dict[str, BoundOp] = {}  # Primitive name -> BoundOp; one dict, refilled on reload
_TABLE_OF: list[Registry | None] = [None]


def _lookup(func: Any) -> BoundOp | None:
    reg = get_registry()
    if _TABLE_OF[0] is not reg:
        table = reg.binding("mindspore", build_ms_table)
        _TABLE.clear()
        _TABLE.update(table)
        _TABLE_OF[0] = reg
    return _TABLE.get(func.name)


def _bound_of(func: Any) -> BoundOp | None:
    return _TABLE.get(func.name)


def _on_reload(reg: Registry) -> None:
    _TABLE.clear()
    _TABLE_OF[0] = None


RELOAD_HOOKS.append(_on_reload)


def _name_of(func: Any) -> str:
    return str(getattr(func, "name", None) or getattr(func, "__name__", repr(func)))


def _plain(a: Any) -> Any:
    # a DTensor becomes a plain alias (Python-level code then sees its local shape); a
    # Parameter stays itself (its weights= gradient does not flow through an alias).
    # Exact type checks first: isinstance(x, Tensor) goes through Tensor's ABC hook.
    t = type(a)
    if t is _DT:
        return _alias(Tensor, a)
    if t is Tensor or t in _SCALARS:
        return a
    if t is list or t is tuple:
        return t(_plain(x) for x in a)
    if isinstance(a, Tensor) and not isinstance(a, Parameter):
        return _alias(Tensor, a)
    return a


_alias = Tensor._make_subclass
_SCALARS = frozenset({int, float, bool, type(None), str})
_OWNED_SOURCES = frozenset({"InplaceCopy"})


def _run_local(fn: Any, args: tuple, kwargs: dict) -> Any:
    plain = tuple(_plain(a) for a in args)
    name = getattr(fn, "name", None)
    target: Any = args[0] if args and isinstance(args[0], Tensor) else None
    # an in-place Primitive, __setitem__, or a rule's local implementation may write into
    # the first argument's alias: watch it, so the write reaches the DTensor itself
    watch = target is not None and (
        name is None or name in INPLACE_NAMES or name.startswith("Inplace")
    )
    before = plain[0].data_ptr() if watch else 0
    with NoFallbackGuard():
        if name in _OWNED_SOURCES and len(plain) > 1 and isinstance(plain[1], Tensor):
            # MindSpore 2.10's CPU InplaceCopy checks a source view's whole storage size (a
            # redistributed Shard is a narrow view of the gathered tensor): copy it first
            plain = (plain[0], ops.deepcopy(plain[1]), *plain[2:])
        out = fn(*plain, **{k: _plain(v) for k, v in kwargs.items()} if kwargs else {})
        if watch and name is not None and isinstance(out, Tensor) and out is not target:
            # CPU: Inplace* kernels return a new tensor and leave the target unchanged
            if out.data_ptr() != target.data_ptr():
                Tensor.assign_value(target, out)
            out = target
        elif watch and plain[0] is not target and plain[0].data_ptr() != before:
            # the alias was rebound (Tensor.__setitem__ assigns its result on CPU)
            Tensor.assign_value(target, plain[0])
    return out


def _wrap_outputs(out: Any, dec: Decision) -> Any:
    from .dtensor import wrap

    if isinstance(out, Tensor):
        if dec.outputs and dec.outputs[0] is None:
            return out  # a declared plain result, or one a local implementation wrapped
        return wrap(out, dec.out_spec(0, out.dtype, out.itemsize))
    if isinstance(out, (tuple, list)):
        items = []
        i = 0
        for x in out:
            if isinstance(x, Tensor):
                if dec.self_wrapped or (i < len(dec.outputs) and dec.outputs[i] is None):
                    items.append(x)
                else:
                    items.append(wrap(x, dec.out_spec(i, x.dtype, x.itemsize)))
                i += 1
            else:
                items.append(x)
        return type(out)(items)
    return out


def _run_on_aliases(fn: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` (a Primitive call, a Tensor method, a Python-level function) on the local
    data of the DTensor arguments as plain Tensors, so that neither a Primitive nor a
    Python-level overload (``Narrow`` is ``deprecated_tensor_narrow``, which reads
    ``input.shape``) ever sees a DTensor and its global shape.

    When every DTensor is a top-level argument (the common call; a tuple or list of
    scalars, such as a shape, is fine) each is replaced by a plain alias
    (``Tensor._make_subclass``: same storage, autograd kept), so no DTensor reaches
    MindSpore and no ``NoFallbackGuard`` is needed. The DTensors themselves are never
    changed: another thread using them meanwhile sees DTensors (docs/mindspore.md,
    "Threads"). Otherwise (a list of DTensors, a Parameter DTensor, which stays itself)
    the local op runs on aliases under the guard, and a DTensor's own methods called
    inside it are the local ones."""
    if not kwargs:  # unrolled: one to three arguments, the first a DTensor
        n = len(args)
        if n == 2:
            a, b = args
            if type(a) is _DT:
                tb = type(b)
                if tb is _DT:
                    return fn(_alias(Tensor, a), _alias(Tensor, b))
                if tb is Tensor or tb in _SCALARS or (tb is tuple and _all_scalars(b)):
                    return fn(_alias(Tensor, a), b)
        elif n == 1:
            a = args[0]
            if type(a) is _DT:
                return fn(_alias(Tensor, a))
        elif n == 3:
            a, b, c = args
            if type(a) is _DT and type(b) is _DT and type(c) is _DT:
                return fn(_alias(Tensor, a), _alias(Tensor, b), _alias(Tensor, c))
    dts = False  # a top-level DTensor argument
    for a in args:
        t = type(a)
        if t is _DT:
            dts = True
        elif t is Tensor or t in _SCALARS:
            pass
        elif t is tuple or t is list:
            for x in a:
                if type(x) not in _SCALARS:
                    break
            else:
                continue
            break
        else:
            break
    else:
        simple = True
        if kwargs:
            for v in kwargs.values():
                if type(v) not in _SCALARS:
                    simple = False
                    break
        if simple:
            if not dts:
                return fn(*args, **kwargs)
            return fn(*[_alias(Tensor, a) if type(a) is _DT else a for a in args], **kwargs)
    plain = [_plain(a) for a in args]
    kw = {k: _plain(v) for k, v in kwargs.items()} if kwargs else {}
    _LOCAL.depth += 1
    with _ANY_LOCK:
        _ANY_LOCAL[0] += 1
    try:
        with NoFallbackGuard():
            return fn(*plain, **kw)
    finally:
        with _ANY_LOCK:
            _ANY_LOCAL[0] -= 1
        _LOCAL.depth -= 1


def _all_scalars(seq: tuple) -> bool:
    for x in seq:
        if type(x) not in _SCALARS:
            return False
    return True


def _fresh_refs() -> int:
    """What ``sys.getrefcount`` reports for an object only a local variable holds, as
    :func:`_run_wrap` reads it; -1 (never matched: every result is wrapped as an alias)
    where the count cannot tell, i.e. when an object also held elsewhere is not counted
    exactly one more (an interpreter that borrows or defers references) or the GIL is
    disabled (a free-threaded build: another thread may take a reference at any time)."""
    out = object()
    fresh = _getrefcount(out)
    held = object()
    keep = [held]
    also = _getrefcount(held)
    del keep
    gil = getattr(sys, "_is_gil_enabled", lambda: True)()
    return fresh if also == fresh + 1 and gil else -1


_getrefcount = sys.getrefcount
_weakrefs = weakref.getweakrefcount
#: see :func:`_fresh_refs`
_FRESH = _fresh_refs()


def _run_wrap(fn: Any, args: tuple, kwargs: dict, dec: Decision) -> Any:
    """Run ``fn`` on plain local aliases (:func:`_run_on_aliases`) and wrap a single tensor
    result as a DTensor. A rule's local implementation and the pseudo Primitives
    (``__getitem__``/``__setitem__``) run through :func:`_run_local`, which watches writes
    into the first argument.

    A result nothing else can reach *becomes* the DTensor: its class is set to the DTensor
    class, with no second object (``Tensor._make_subclass`` costs ~6.5k instructions, a
    third of hyper_shard's own cost on a cached call). Nothing else can reach it when its
    only reference is this frame's and it has no weak reference: under the GIL no other
    thread can then see the change (:func:`_fresh_refs` checks at import that the count
    can tell). A result something else holds (an op that returned one of its inputs, a
    cached tensor) is wrapped as an alias and keeps its own class."""
    tf = type(fn)
    if dec.impl is not None or tf is _Pseudo:
        out = _run_local(fn, args, kwargs)
    else:
        # a Tensor method or a Python-level function runs its original; a Primitive call
        # from __fallback__ (OpCall, TensorOverloadCall, a legacy call) runs itself
        out = _run_on_aliases(
            fn.fn if (tf is TensorMethod or tf is BoundFunction) else fn, args, kwargs
        )
    if type(out) is Tensor:
        dtype = out._dtype
        hot = dec.out0
        if hot is not None and hot[0] is dtype:
            spec = hot[1]
        else:
            spec = dec.out_spec(0, dtype, out.itemsize)
            dec.out0 = (dtype, spec)
        if _getrefcount(out) == _FRESH and not _weakrefs(out):
            out.__class__ = _DT
            out._spec = spec
            return out
        o = _alias(_DT, out)
        o._spec = spec
        return o
    return _wrap_outputs(out, dec)


def _platform() -> Any:
    from ..select import get_platform

    return get_platform("mindspore")


#: the MindSpore platform's dispatcher (the one dispatch path, with MindSpore's hooks)
DISPATCHER = Dispatcher(
    _platform,
    bound_of=_bound_of,
    lookup=_lookup,
    name_of=_name_of,
    run_local=_run_local,
    run_wrap=_run_wrap,
    wrap_outputs=_wrap_outputs,
    is_dtensor=_is_dtensor,
)
_dispatch = DISPATCHER.dispatch
_dispatch_bound = DISPATCHER.dispatch_bound
_KERNEL_ERRORS = ("unregistered", "Create kernelmod", "Unsupported op", "Select CPU operator")


def ms_dispatch(func: Any, args: tuple, kwargs: dict) -> Any:
    """Dispatch one Primitive call that has a DTensor argument (``__fallback__``).

    A legacy Primitive call ``(prim, "Name", (inputs...))`` is unpacked first; then the one
    dispatch path (:class:`~hyper_shard.dispatch.dispatcher.Dispatcher`) runs it.

    Raises:
        OpNotRegisteredError: no entry binds the Primitive (the message gives the YAML).
        HyperShardError: MindSpore has no kernel for the Primitive on this device (the
            message names the op, the placements and an alternative where one is known).
    """
    if len(args) == 3 and type(args[1]) is str and type(args[2]) is tuple:
        if args[1] == getattr(func, "name", None):  # a legacy Primitive: unpack its inputs
            func, args = _LegacyCall(func, args[0], args[1]), args[2]
    try:
        return _dispatch(func, args, kwargs)
    except RuntimeError as e:
        raise_kernel_error(e, func, args)
        raise


class _NestedLegacyCall:
    """A legacy Primitive call whose DTensors sit inside a tuple or list argument
    (``ops.stack((a, b))`` runs ``Stack(axis)((a, b))``): seen by :func:`ms_dispatch` as
    ``(prim, name, inputs)``, run locally by MindSpore's own ``_run_op``."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __call__(self, prim: Any, name: str, inputs: tuple) -> Any:
        return _ORIG_RUN_OP[0](prim, name, inputs)


#: MindSpore's ``mindspore.ops.primitive._run_op`` (set by :func:`.hooks.install`)
_ORIG_RUN_OP: list[Any] = [None]


def _run_op_hooked(obj: Any, op_name: str, args: Any) -> Any:
    """``mindspore.ops.primitive._run_op`` with DTensors inside sequence arguments
    dispatched: MindSpore's C++ hands a Primitive call to ``__fallback__`` only when a
    DTensor is a top-level argument, so a legacy Primitive given a tuple of DTensors
    (``Stack``, ``AddN``) would otherwise run on their local shards and return a plain
    tensor of local data. Plain calls pay one scan of the arguments. :mod:`.hooks` puts
    it in place of ``_run_op`` in every ``mindspore*`` module that holds it."""
    for a in args:
        t = type(a)
        if (t is tuple or t is list) and a:
            for x in a:
                if type(x) is _DT:
                    if _ANY_LOCAL[0] and _LOCAL.depth:  # a local op on the DTensors themselves
                        break
                    return ms_dispatch(_NestedLegacyCall(op_name), (obj, op_name, tuple(args)), {})
    return _ORIG_RUN_OP[0](obj, op_name, args)


def raise_kernel_error(e: RuntimeError, func: Any, args: tuple) -> None:
    """Raise a clear error instead of ``e`` when ``e`` says MindSpore lacks the kernel on
    this device (the kernel's own message is quoted; its C++ trace is noise); return for
    any other error, which the caller re-raises unchanged.

    Raises:
        HyperShardError: the kernel is missing; names the op, the DTensor placements and
            the CPU alternative where one is known (:data:`MISSING_KERNEL_HINTS`).
    """
    msg = str(e)
    if isinstance(e, HyperShardError) or not any(k in msg for k in _KERNEL_ERRORS):
        return
    name = _name_of(func)
    dts = [a for a in args if _is_dtensor(a)]
    hint = MISSING_KERNEL_HINTS.get(name, "see docs/mindspore.md for the CPU alternatives")
    device = getattr(DISPATCHER.platform, "device", "this device")
    raise HyperShardError(
        f"{name}({', '.join(fmt_placements(d._spec) for d in dts)}): MindSpore has no kernel "
        f"for it on {device} ({msg.splitlines()[0].strip()}); {hint}"
    ) from None


_Pseudo = _PseudoPrimitive
_DT: Any = None  # MindSporeDTensor (dtensor imports this module, then sets it)


def set_dtensor_type(cls: type) -> None:
    """Called by :mod:`.dtensor` once MindSporeDTensor exists: the hooks recognise
    DTensors from then on, before any table is built."""
    global _DT
    _DT = cls
