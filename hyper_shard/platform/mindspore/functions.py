"""Binding MindSpore's Python-level functions (``ops.cross_entropy``, ``ops.dropout``...).

MindSpore hooks a Tensor subclass at the Primitive level only (``__fallback__``): a
composite Python function such as ``mindspore.ops.cross_entropy`` reaches hyper_shard as
the many Primitives it is made of (``typeof``, ``ReduceMax``, ``SubExt``, ``GatherD``...),
which loses the op a rule exists for (a vocab-parallel loss, a sharded dropout draw). torch
has ``__torch_function__`` for this; MindSpore has nothing, so hyper_shard adds it for the
functions the op specs name:

* a ``mindspore:`` name with a module path (``mindspore.ops.cross_entropy``) binds that
  function. When the registry is bound, :func:`hyper_shard.platform.mindspore.hooks.
  wrap_functions` replaces every loaded ``mindspore*`` module attribute that *is* the
  function (``mindspore.ops.cross_entropy`` is also
  ``mindspore.ops.function.nn_func.cross_entropy`` and ``mindspore.ops.functional...``)
  by a thin wrapper, as it does the attribute of the function's own module and
  MindSpore's ``tensor_operator_registry`` entries that are the function (the Python
  ``Tensor`` methods call those: ``Tensor.diff`` is the registry's ``diff``); every
  replaced site is recorded there and put back by ``hooks.uninstall()``;
* the wrapper passes plain calls straight to the original function (one scan of the
  arguments, and of a tuple or list argument's items, for a DTensor, well under a
  microsecond); a call with a DTensor argument (or a DTensor inside one) is
  dispatched as one op named by the dotted name, whose local op is the original function
  run on the local tensors.

Code that captured the original function object before hyper_shard bound it (``from
mindspore.ops import cross_entropy`` at import time) keeps calling the original, which
decomposes into Primitives as before: the hooks name every such ``module.name`` in a
warning, or rebind them with ``hooks.install(rebind_captured=True)``.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from mindspore import Tensor

from . import dispatch as _dispatch_mod
from .dispatch import _ANY_LOCAL, _LOCAL, _SCALARS, _TABLE, BoundFunction, raise_kernel_error

__all__ = ["resolve", "install", "bound_functions", "reapply", "forget_applied"]

#: dotted name -> the original function (never a wrapper)
_ORIGINALS: dict[str, Callable] = {}
#: dotted name -> its wrapper (made once, reused after an uninstall)
_WRAPPERS: dict[str, Callable] = {}
#: the names whose wrapper the hooks have put in place (cleared by ``hooks.uninstall()``)
_APPLIED: set[str] = set()


def resolve(name: str) -> Callable | None:
    """The function ``name`` (``package.module.attr``) names, or None if it does not exist.
    A name already bound resolves to its original function."""
    if name in _ORIGINALS:
        return _ORIGINALS[name]
    mod_name, _, attr = name.rpartition(".")
    if not mod_name:
        return None
    try:
        mod = importlib.import_module(mod_name)
    except ImportError:
        return None
    fn = getattr(mod, attr, None)
    if fn is None or not callable(fn):
        return None
    return getattr(fn, "__hyper_shard_original__", fn)


def bound_functions() -> dict[str, Callable]:
    """Dotted name -> original function, for every function bound so far."""
    return dict(_ORIGINALS)


def _holds_dtensor(seq: tuple | list, dt_type: type) -> bool:
    for x in seq:
        t = type(x)
        if t is dt_type or (t is not Tensor and t not in _SCALARS and isinstance(x, dt_type)):
            return True
    return False


def _make_wrapper(name: str, orig: Callable, dt_type: type) -> Callable:
    pseudo = BoundFunction(name, orig)

    @functools.wraps(orig)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        # exact type checks first: isinstance(x, Tensor) goes through Tensor's ABC hook,
        # and plain calls (no DTensor argument) pay this loop too
        for a in args:
            t = type(a)
            if t is dt_type:
                break
            if t is tuple or t is list:  # ops.stack((a, b)): DTensors inside a sequence
                if _holds_dtensor(a, dt_type):
                    break
            elif t is not Tensor and t not in _SCALARS and isinstance(a, dt_type):
                break
        else:
            for v in kwargs.values():
                t = type(v)
                if t is dt_type:
                    break
                if t is not Tensor and t not in _SCALARS and isinstance(v, dt_type):
                    break
            else:
                return orig(*args, **kwargs)
        if _ANY_LOCAL[0] and _LOCAL.depth:  # a local op running on the DTensors themselves
            return orig(*args, **kwargs)
        bound = _TABLE.get(name) or _dispatch_mod._lookup(pseudo)
        try:
            if bound is None:  # the registry changed and no longer binds the name
                return _dispatch_mod._dispatch(pseudo, args, kwargs)
            # the one dispatch path (read at call time: tests and tools may wrap it)
            return _dispatch_mod._dispatch_bound(bound, pseudo, args, kwargs)
        except RuntimeError as e:
            raise_kernel_error(e, pseudo, args)
            raise

    wrapper.__hyper_shard_original__ = orig  # type: ignore[attr-defined]
    return wrapper


def install(names: Iterable[str], dt_type: type) -> None:
    """Wrap every function in ``names`` (idempotent; see the module docstring): the
    sites are replaced by :func:`hyper_shard.platform.mindspore.hooks.wrap_functions`
    (nothing while the hooks are uninstalled; :func:`reapply` then does it).

    Raises:
        ValueError: a name that does not resolve to a function.
    """
    for name in names:
        if name in _WRAPPERS:
            continue
        orig = resolve(name)
        if orig is None:
            raise ValueError(f"{name!r} is not an importable function")
        _ORIGINALS[name] = orig
        _WRAPPERS[name] = _make_wrapper(name, orig, dt_type)
    reapply()


def reapply(rescan: bool = False) -> None:
    """Put the wrapper of every bound function not in place (after an uninstall, or the
    first binding) where its original is; ``rescan``: of every bound function (modules
    that imported an original since, names to rebind)."""
    from . import hooks

    todo = [(n, _ORIGINALS[n], w) for n, w in _WRAPPERS.items() if rescan or n not in _APPLIED]
    if todo and hooks.installed():
        hooks.wrap_functions(todo)
        _APPLIED.update(n for n, _, _ in todo)


def forget_applied() -> None:
    """The hooks were uninstalled: no wrapper is in place any more."""
    _APPLIED.clear()
