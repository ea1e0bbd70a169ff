"""The sim platform's bindings: its op-name resolver, its binding table and its
dispatcher (the one neutral :class:`~hyper_shard.dispatch.dispatcher.Dispatcher`, with the
sim's hooks).

Every rank is a thread of one process; one binding table serves them all, as on torch:
hyper_shard keys its layout cache on the ranks' meshes, whose identity holds the rank
(docs/architecture.md, "Ranks as threads"), so the ranks' decisions stay apart.
"""

from __future__ import annotations

import difflib
import threading
from typing import Any

import torch

from hyper_shard.dispatch.dispatcher import Dispatcher
from hyper_shard.dispatch.op import BoundOp, Decision
from hyper_shard.registry.platforms import resolve_all
from hyper_shard.registry.registry import RELOAD_HOOKS, Registry, get_registry

from .platform import KEY
from .tensor import FUNCTIONS, METHODS, SimDTensor, SimOp

__all__ = ["resolve_sim_op", "build_sim_table", "DISPATCHER"]


def resolve_sim_op(name: str) -> SimOp:
    """``sim.<function>`` or ``SimTensor.<method>`` -> the op.

    Raises:
        LookupError: no such function or method (with the closest name).
    """
    head, _, attr = name.partition(".")
    known = {"sim": FUNCTIONS, "SimTensor": METHODS}.get(head)
    if known is None:
        raise LookupError(f"{name!r}: sim op names are 'sim.<function>' or 'SimTensor.<method>'")
    op = known.get(attr)
    if op is None:
        close = difflib.get_close_matches(attr, list(known), n=1)
        hint = f"; did you mean '{head}.{close[0]}'?" if close else ""
        raise LookupError(f"{name!r}: the sim platform has no {head} op {attr!r}{hint}")
    return op


def build_sim_table(reg: Registry) -> list[tuple[Any, str, SimOp]]:
    """Every ``sim:`` name of the registry, resolved: ``(entry, name, op)``.

    Raises:
        OpSpecError: a name the sim does not have (names file, entry, field).
    """
    return list(resolve_all(reg, KEY, resolve_sim_op))


def _flags(name: str) -> tuple[bool, bool]:
    last = name.rsplit(".", 1)[-1]
    return last.endswith("_") and not last.startswith("_"), last.startswith("__r")


def _is_dtensor(x: Any) -> bool:
    return isinstance(x, SimDTensor)


def _table(resolved: list[tuple[Any, str, SimOp]]) -> dict[SimOp, BoundOp]:
    table = {}
    for e, n, op in resolved:
        inplace, reflected = _flags(n)
        table[op] = BoundOp(
            e.op,
            n,
            inplace=inplace,
            reflected=reflected,
            is_dtensor=_is_dtensor,
            tensor_type=torch.Tensor,
            platform=KEY,
            dt_type=SimDTensor,
        )
    return table


#: the table of the registry it was built from (one object, swapped whole on a reload)
_BOUND: list[tuple[Any, dict[SimOp, BoundOp]]] = [(None, {})]
_FILLING = threading.Lock()


def _bound_of(func: Any) -> BoundOp | None:
    return _BOUND[0][1].get(func)


def _lookup(func: Any) -> BoundOp | None:
    reg = get_registry()
    if _BOUND[0][0] is not reg:
        with _FILLING:  # the rank threads build it once
            if _BOUND[0][0] is not reg:
                _BOUND[0] = (reg, _table(reg.binding(KEY, build_sim_table)))
    return _BOUND[0][1].get(func)


def _on_reload(reg: Registry) -> None:
    _BOUND[0] = (None, {})


RELOAD_HOOKS.append(_on_reload)


def _local(a: Any) -> Any:
    if type(a) is SimDTensor:
        return a._local
    if type(a) in (list, tuple):
        return type(a)(_local(x) for x in a)
    return a


def _run_local(fn: Any, args: tuple, kwargs: dict) -> Any:
    f = fn.local if type(fn) is SimOp else fn  # a rule's local implementation: itself
    return f(*[_local(a) for a in args], **{k: _local(v) for k, v in kwargs.items()})


def _wrap_outputs(out: Any, dec: Decision) -> Any:
    if isinstance(out, torch.Tensor):
        if dec.outputs and dec.outputs[0] is None:
            return out  # a plain result the rule declares
        return SimDTensor(out, dec.out_spec(0, out.dtype, out.element_size()))
    if isinstance(out, (tuple, list)):
        items, i = [], 0
        for x in out:
            if isinstance(x, torch.Tensor):
                plain = dec.self_wrapped or (i < len(dec.outputs) and dec.outputs[i] is None)
                items.append(
                    x if plain else SimDTensor(x, dec.out_spec(i, x.dtype, x.element_size()))
                )
                i += 1
            else:
                items.append(x)
        return type(out)(items)
    return out


def _run_wrap(fn: Any, args: tuple, kwargs: dict, dec: Decision) -> Any:
    return _wrap_outputs(_run_local(fn, args, kwargs), dec)


def _name_of(func: Any) -> str:
    return str(getattr(func, "name", None) or getattr(func, "__name__", repr(func)))


def _platform() -> Any:
    from hyper_shard.platform.select import get_platform

    return get_platform(KEY)


#: the sim platform's dispatcher
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
