"""hyper_shard DTensors in ``torch.distributed.checkpoint.state_dict``'s full and offloaded
state dicts.

``get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`` (and
``get_optimizer_state_dict``, ``get_state_dict``) gather every DTensor of the state dict
into a plain full tensor (with ``cpu_offload=True``: on rank 0 only, in host memory): the
FSDP2 way to write a consolidated checkpoint. Torch's helper behind them
(``torch.distributed._state_dict_utils._iterate_state_dict``) recognises its own
``DTensor`` class only and would hand a hyper_shard DTensor back untouched, so a "full"
state dict would silently hold rank 0's shards. :func:`install` makes that helper treat
hyper_shard DTensors as DTensors: the gather then calls their ``redistribute`` (to
``Replicate``) and ``to_local``, exactly as for torch's. Loading a full state dict back
(``set_model_state_dict`` / ``set_optimizer_state_dict`` with ``full_state_dict=True``,
from every rank or ``broadcast_from_rank0``) cuts each full tensor into the current
DTensor's layout again (``_distribute_state_dict`` / ``_broadcast_state_dict``).

Installed when hyper_shard's torch DTensor class is first used: at once if torch's module
is imported already, else right after its first import (a ``sys.meta_path`` finder; the
module costs about a second to import, which programs that build no state dict do not
pay). If torch's helper is not where this version of torch keeps it, nothing is patched.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys
from collections.abc import Callable
from typing import Any

__all__ = ["install"]

_ROUTED = "_hs_routes_dtensors"
_MODULE = "torch.distributed._state_dict_utils"


def _route(dtensor_func: Callable[..., Any], tensor_func: Callable[..., Any]) -> Any:
    """``tensor_func``, except that a hyper_shard DTensor goes to ``dtensor_func``."""
    if getattr(tensor_func, _ROUTED, False):
        return tensor_func
    from ...dtensor import DTensor

    def routed(value: Any, *args: Any) -> Any:
        if isinstance(value, DTensor):
            return dtensor_func(value, *args)
        return tensor_func(value, *args)

    setattr(routed, _ROUTED, True)
    return routed


def _reshard_loaded(orig: Callable[..., Any]) -> Callable[..., Any]:
    """``_distribute_state_dict`` / ``_broadcast_state_dict``, after which every entry whose
    current value was a hyper_shard DTensor and now holds the plain full tensor becomes a
    DTensor of the same layout again (this rank's shard of it, no communication): torch
    does this for its own DTensors only, and an optimizer state loaded as a plain full
    tensor would then step a shard with a whole moment."""

    def load(
        full_state_dict: dict[str, Any], local_state_dict: dict[str, Any], *a: Any, **k: Any
    ) -> None:
        from ...dtensor import DTensor, distribute_tensor

        before = {key: v for key, v in local_state_dict.items() if isinstance(v, DTensor)}
        orig(full_state_dict, local_state_dict, *a, **k)
        for key, cur in before.items():
            v = local_state_dict.get(key)
            if v is None or isinstance(v, DTensor) or tuple(v.shape) != tuple(cur._spec.shape):
                continue
            spec = cur._spec
            local_state_dict[key] = distribute_tensor(
                v.detach(), spec.mesh, spec.placements, src_data_rank=None,
                shard_order=spec.shard_order or None,
            )  # fmt: skip

    setattr(load, _ROUTED, True)
    load.__doc__ = orig.__doc__
    return load


def _patch(sdu: Any) -> bool:
    orig = getattr(sdu, "_iterate_state_dict", None)
    if orig is None or not callable(orig):  # pragma: no cover - another torch layout
        return False
    if getattr(orig, _ROUTED, False):
        return True
    users = [sdu, sys.modules.get("torch.distributed.checkpoint.state_dict")]
    for name in ("_distribute_state_dict", "_broadcast_state_dict"):
        fn = getattr(sdu, name, None)
        if fn is None or getattr(fn, _ROUTED, False):  # pragma: no cover
            continue
        wrapped = _reshard_loaded(fn)
        for mod in users:  # state_dict.py imports them by name
            if mod is not None and getattr(mod, name, None) is fn:
                setattr(mod, name, wrapped)

    def _iterate_state_dict(
        iter_object: Any,
        sharded_tensor_func: Callable[..., Any],
        dtensor_func: Callable[..., Any],
        tensor_func: Callable[..., Any],
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        return orig(
            iter_object,
            sharded_tensor_func,
            dtensor_func,
            _route(dtensor_func, tensor_func),
            *args,
            **kwargs,
        )

    setattr(_iterate_state_dict, _ROUTED, True)
    _iterate_state_dict.__doc__ = orig.__doc__
    sdu._iterate_state_dict = _iterate_state_dict
    return True


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches torch's module right after it is first imported (it costs about a second
    to import, through ``torch.distributed.tensor``: hyper_shard does not import it for
    every program, only programs that build state dicts do)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != _MODULE:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        loader = getattr(spec, "loader", None)
        if loader is None or not hasattr(loader, "exec_module"):  # pragma: no cover
            return spec
        run = loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


def install() -> bool:
    """Patch torch's state-dict iterator now if it is imported, else right after its first
    import (idempotent). Returns whether it is patched already."""
    mod = sys.modules.get(_MODULE)
    if mod is not None:
        return _patch(mod)
    if not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport())
    return False
