"""Binding the registry to torch functions, and the torch dispatcher.

Every ``torch:`` name of every entry (``torch.add``, ``Tensor.add_``,
``torch.nn.functional.linear``, ``Tensor.__radd__``...) is resolved to the function object
``__torch_function__`` receives (the resolver the platform declares in
:mod:`hyper_shard.platform.bindings`); names ending in ``_`` (and ``__iadd__``-style operators)
are in-place, ``__radd__``-style ones reflected.
"""

from __future__ import annotations

import threading
import types
from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass

from ...dispatch.dispatcher import Dispatcher
from ...dispatch.op import BoundOp, Decision
from ...registry.platforms import resolve_all
from ...registry.registry import RELOAD_HOOKS, Registry, get_registry
from .dtensor import TorchDTensor as _DT
from .dtensor import wrap as _wrap
from .names import aten_aliases, resolve_torch_op, torch_op_name

__all__ = ["torch_dispatch", "build_torch_table", "DISPATCHER", "KEY"]

#: the platform's key (YAML ``torch:``; :data:`hyper_shard.platform.bindings.TORCH`)
KEY = "torch"

_INPLACE_DUNDERS = {
    "__iadd__", "__isub__", "__imul__", "__itruediv__", "__ifloordiv__", "__imod__", "__ipow__",
    "__iand__", "__ior__", "__ixor__", "__ilshift__", "__irshift__", "__imatmul__",
    "__setitem__",
}  # fmt: skip


def _flags(name: str) -> tuple[bool, bool]:
    last = name.split(".")[-1]
    if last.startswith("__") and last.endswith("__"):
        return last in _INPLACE_DUNDERS, last.startswith("__r") and last not in (
            "__repr__",
            "__reduce__",
            "__reduce_ex__",
        )
    return last.endswith("_") and not last.startswith("_"), False


def _is_dtensor(x: Any) -> bool:
    from .dtensor import TorchDTensor

    return isinstance(x, TorchDTensor)


def build_torch_table(reg: Registry) -> dict[Any, BoundOp]:
    """torch function -> BoundOp for every ``torch:`` name in the registry (resolved by
    :func:`~hyper_shard.platform.torch.names.resolve_torch_op`).

    Raises:
        OpSpecError: a name that is not a torch function (names file, entry, field).
    """
    from .dtensor import TorchDTensor

    def is_dt(x: Any) -> bool:
        return isinstance(x, TorchDTensor)

    table: dict[Any, BoundOp] = {}
    for e, n, fn in resolve_all(reg, KEY, resolve_torch_op):
        inplace, reflected = _flags(n)
        table[fn] = BoundOp(
            e.op,
            n,
            inplace=inplace,
            reflected=reflected,
            is_dtensor=is_dt,
            tensor_type=torch.Tensor,
            platform=KEY,
            dt_type=TorchDTensor,
        )
    return table


_TABLE: dict[Any, BoundOp] = {}  # function -> BoundOp; one dict, refilled on registry reload
_TABLE_OF: list[Registry | None] = [None]


_FILLING = threading.Lock()


def _lookup(func: Any) -> BoundOp | None:
    reg = get_registry()
    if _TABLE_OF[0] is not reg:
        with _FILLING:  # threads (ranks as threads) never see a half-filled table
            if _TABLE_OF[0] is not reg:
                table = reg.binding(KEY, build_torch_table)
                for gone in set(_TABLE) - set(table):
                    _TABLE.pop(gone, None)
                _TABLE.update(table)
                _TABLE_OF[0] = reg
    bound = _TABLE.get(func)
    if bound is None:
        bound = _bind_aten(func)
    return bound


def _bind_aten(func: Any) -> BoundOp | None:
    """A ``torch.ops.aten`` op with no entry of its own takes the entry of the public torch
    function it stands for (``aten.add.Tensor`` -> ``torch.add``, ``aten.add_.Tensor`` ->
    ``Tensor.add_``), as PyTorch DTensor shards aten calls; bound once, then on the hot path."""
    for alias in aten_aliases(func):
        known = _TABLE.get(alias)
        if known is None:
            continue
        bound = BoundOp(
            known.op,
            torch_op_name(func),
            inplace=known.inplace,
            reflected=False,
            is_dtensor=_is_dtensor,
            tensor_type=torch.Tensor,
            platform=KEY,
            dt_type=known.dt_type,
        )
        _TABLE[func] = bound
        return bound
    return None


def _on_reload(reg: Registry) -> None:
    _TABLE.clear()
    _TABLE_OF[0] = None


RELOAD_HOOKS.append(_on_reload)

_NoTF = DisableTorchFunctionSubclass
_Tensor = torch.Tensor


def _run_local(fn: Any, args: tuple, kwargs: dict) -> Any:
    with _NoTF():
        return fn(*args, **kwargs)


def _wrap_outputs(out: Any, dec: Decision) -> Any:
    if isinstance(out, torch.Tensor):
        if dec.outputs and dec.outputs[0] is None:
            return out  # the rule declares a plain (unsharded) result
        return _wrap(out, dec.out_spec(0, out.dtype, out.element_size()))
    if isinstance(out, (tuple, list)):
        items = []
        i = 0
        for x in out:
            if isinstance(x, torch.Tensor):
                if dec.self_wrapped or (i < len(dec.outputs) and dec.outputs[i] is None):
                    # a plain result the rule declares, or the outputs of a local
                    # implementation that wraps its own (rules._util.ReplicatedResult)
                    items.append(x)
                    i += 1
                    continue
                items.append(_wrap(x, dec.out_spec(i, x.dtype, x.element_size())))
                i += 1
            else:
                items.append(x)
        return type(out)(items)
    return out


def _run_wrap(fn: Any, args: tuple, kwargs: dict, dec: Decision) -> Any:
    """Run ``fn`` with torch functions off (autograd records the local op) and wrap a
    single tensor result as an alias DTensor (``as_subclass`` keeps the graph)."""
    with _NoTF():
        out = fn(*args, **kwargs)
    if type(out) is _Tensor:
        dtype = out.dtype
        hot = dec.out0  # (dtype, spec) of the last result wrapped: no tuple key, no hash
        if hot is not None and hot[0] is dtype:
            spec = hot[1]
        else:
            if dec.outputs[0] is None:
                return out  # the rule declares a plain (unsharded) result
            spec = dec.out_spec(0, dtype, out.element_size())
            dec.out0 = (dtype, spec)
        o = out.as_subclass(_DT)
        o._spec = spec
        return o
    return _wrap_outputs(out, dec)


_DECOMPOSED: dict[Any, Any] = {}
_NO_TF = {
    "has_torch_function": lambda *a, **k: False,
    "has_torch_function_unary": lambda *a, **k: False,
    "has_torch_function_variadic": lambda *a, **k: False,
}


def _decompose(func: Any) -> Any:
    """A copy of a Python-level torch function whose own torch-function check is off, so
    its body runs on DTensors and dispatches each inner op; None for builtins."""
    fn = _DECOMPOSED.get(func)
    if fn is not None or func in _DECOMPOSED:
        return fn
    out = None
    if isinstance(func, types.FunctionType) and (func.__module__ or "").startswith("torch"):
        g = dict(func.__globals__)
        if any(k in g for k in _NO_TF):
            g.update({k: v for k, v in _NO_TF.items() if k in g})
            out = types.FunctionType(
                func.__code__, g, func.__name__, func.__defaults__, func.__closure__
            )
            out.__kwdefaults__ = func.__kwdefaults__
    _DECOMPOSED[func] = out
    return out


def _platform() -> Any:
    from ..select import get_platform

    return get_platform("torch")


#: the torch platform's dispatcher (the one dispatch path, with torch's hooks)
DISPATCHER = Dispatcher(
    _platform,
    bound_of=_TABLE.get,
    lookup=_lookup,
    name_of=torch_op_name,
    run_local=_run_local,
    run_wrap=_run_wrap,
    wrap_outputs=_wrap_outputs,
    is_dtensor=_is_dtensor,
    decompose=_decompose,
)
#: dispatch one torch function call on DTensors (``TorchDTensor.__torch_function__``)
torch_dispatch = DISPATCHER.dispatch
