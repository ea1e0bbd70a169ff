"""What the framework-neutral FSDP engine asks of a framework: its module system, its
parameters, its autograd (see [Note: FSDP adapters] below). Nothing here imports a
framework or names one.

[Note: FSDP adapters]
The engine (:mod:`._group`, :mod:`._state`, :mod:`._param`, :mod:`._collectives`) plans
buffers, runs the unit's state machine and issues the collectives through the mesh's
Platform. A framework joins it with one :class:`FSDPAdapter`, which lives in its platform
package as ``<platform package>.fsdp`` (``hyper_shard/platform/<framework>/fsdp.py``) and
exposes ``ADAPTER``; :func:`adapter_for` finds it from the module's platform, so adding a
framework edits nothing here. Two kinds of autograd are served by one engine, chosen by a
capability, never by a name:

* ``gather_on_tape = False`` (a framework with tensor gradient hooks and an
  end-of-backward callback, e.g. torch): the unit all-gathers into persistent unsharded
  parameters refilled in place; hooks on the forward outputs (pre-backward) and inputs
  (post-backward) drive the re-gather and the reduce-scatter.
* ``gather_on_tape = True`` (functional autograd without tensor hooks, e.g. MindSpore):
  the unsharded parameters are a differentiable function of the sharded ones, one
  custom-backward node per unit (``Platform.custom_autograd``) whose forward is the
  engine's all-gather and whose backward is the engine's reduce-scatter; nothing is kept
  between steps and there is no re-gather in backward.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

__all__ = ["FSDPAdapter", "adapter_for", "register_adapter"]


class FSDPAdapter:
    """A framework's module system and autograd, as FSDP uses them (see the module note)."""

    #: the unsharded parameters are recorded on the framework's tape (functional autograd);
    #: False: hook-driven units over persistent buffers
    gather_on_tape: bool = False

    def owns(self, module: Any) -> bool:
        """True if ``module`` is this framework's module type."""
        raise NotImplementedError

    def module_kind(self) -> str:
        """The framework's module type as users spell it (for error messages)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- modules
    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        """Every submodule (duplicates included) with its qualified name, root first."""
        raise NotImplementedError

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        """The module's own parameters (not its children's), ``None`` entries skipped."""
        raise NotImplementedError

    def fsdp_class(self, cls: type) -> type:
        """The class a module of class ``cls`` is swapped to (the framework's
        :class:`~hyper_shard.fsdp.FSDPModule` subclass first in its MRO, then ``cls``)."""
        raise NotImplementedError

    def register_forward_hooks(
        self,
        module: Any,
        pre: Callable[[Any, tuple, dict], tuple[tuple, dict]],
        post: Callable[[Any, Any, Any], Any],
    ) -> None:
        """Run ``pre(module, args, kwargs)`` before (first of all pre-hooks) and
        ``post(module, args, output)`` after every forward of ``module``."""
        raise NotImplementedError

    def register_state_dict_hooks(
        self,
        module: Any,
        pre_save: Callable[[], None],
        pre_load: Callable[[dict, str], None],
        loaded: Callable[[], list[str]],
    ) -> None:
        """``pre_save()`` before ``module.state_dict()``; ``pre_load(state_dict, prefix)``
        before the module loads its own entries (it may rewrite them or load them itself
        through :meth:`load_value`); ``loaded()`` then names the keys loaded that way."""
        raise NotImplementedError

    # ---------------------------------------------------------------- parameters
    def requires_grad(self, param: Any) -> bool:
        raise NotImplementedError

    def make_sharded_param(
        self, orig: Any, local: Any, spec: Any, grad_spec: Any, requires_grad: bool
    ) -> Any:
        """The sharded parameter replacing ``orig``: a parameter over a DTensor of layout
        ``spec`` with ``local`` (an owned plain tensor) as its data, whose gradients have
        the layout ``grad_spec``."""
        raise NotImplementedError

    def new_param(self, tensor: Any, requires_grad: bool) -> Any:
        """An unsharded parameter over ``tensor``'s data (an autograd leaf; only where
        ``gather_on_tape`` is False)."""
        raise NotImplementedError

    def register_sharded(self, module: Any, name: str, param: Any) -> None:
        """Make ``module.<name>`` the sharded parameter ``param`` again."""
        raise NotImplementedError

    def register_unsharded(self, module: Any, name: str, value: Any) -> None:
        """Make ``module.<name>`` the unsharded ``value`` until :meth:`register_sharded`."""
        raise NotImplementedError

    def load_value(self, sd: dict, key: str, param: Any, value: Any) -> None:
        """Load ``value`` (a DTensor with ``param``'s sharded layout) for ``sd[key]``: leave
        it in ``sd`` for the module's own loading, or copy it into ``param`` and drop it."""
        sd[key] = value

    # ---------------------------------------------------------------- autograd
    def grad_enabled(self) -> bool:
        raise NotImplementedError

    def in_backward(self) -> bool:
        """True while the framework's backward runs (a recomputed forward)."""
        return False

    def hook_outputs(self, output: Any, fn: Callable[[], None]) -> bool:
        """Call ``fn()`` when the gradient of any tensor of ``output`` (a nested structure)
        is computed, before it flows further back; whether a hook was placed."""
        return False

    def hook_inputs(
        self, args: tuple, kwargs: dict, fn: Callable[[], None]
    ) -> tuple[tuple, dict, bool]:
        """Call ``fn()`` once the gradients of the tensors in ``args``/``kwargs`` that require
        grad are computed (after the module's backward); returns the rebuilt inputs and
        whether a hook was placed (False: grad disabled, or no input requires grad)."""
        return args, kwargs, False

    def queue_callback(self, fn: Callable[[], None]) -> None:
        """Run ``fn()`` at the end of the current backward."""
        raise NotImplementedError

    def cast_floats(self, obj: Any, dtype: Any) -> Any:
        """``obj`` (a nested structure) with every floating-point tensor cast to ``dtype``."""
        raise NotImplementedError

    def no_grad(self) -> AbstractContextManager[Any]:
        raise NotImplementedError

    def preserve_versions(self, tensors: list[Any]) -> AbstractContextManager[Any]:
        """In-place writes to ``tensors`` inside this context do not count as
        modifications of the values autograd saved (the refilled unsharded parameters)."""
        return nullcontext()

    def raw_grad(self, param: Any) -> Any:
        """``param``'s stored gradient as the framework holds it, or None."""
        raise NotImplementedError

    def set_raw_grad(self, param: Any, grad: Any) -> None:
        """Store ``grad`` (a plain tensor, a DTensor kept as is, or None) as ``param``'s
        gradient without conversion."""
        raise NotImplementedError

    def to_device(self, t: Any, like: Any) -> Any:
        """``t`` on ``like``'s device (no copy when already there)."""
        return t

    def to_host(self, t: Any, pin: bool) -> Any:
        """``t`` in host memory (pinned if asked and possible)."""
        return t

    def device_type(self, t: Any) -> str:
        raise NotImplementedError

    def check_offload(self, mesh: Any) -> None:
        """Raise NotImplementedError if ``CPUOffloadPolicy`` cannot be honoured on ``mesh``
        (default: it can)."""

    # ---------------------------------------------------------------- profiling
    def record(self, name: str) -> AbstractContextManager[Any]:
        """A profiler range named ``name`` (``FSDP::all_gather``...) around a collective or
        a hook; a no-op where the framework's profiler has none."""
        return nullcontext()


_BY_PLATFORM: dict[type, FSDPAdapter] = {}


def register_adapter(platform_type: type, adapter: FSDPAdapter) -> None:
    """Use ``adapter`` for meshes and modules of platforms of class ``platform_type`` (a
    platform package may call this itself instead of providing ``<package>.fsdp``)."""
    _BY_PLATFORM[platform_type] = adapter


def _adapter_of_platform(plat: Any) -> FSDPAdapter:
    cls = type(plat)
    adapter = _BY_PLATFORM.get(cls)
    if adapter is None:
        package = sys.modules[cls.__module__].__package__ or cls.__module__
        adapter = importlib.import_module(f"{package}.fsdp").ADAPTER
        _BY_PLATFORM[cls] = adapter
    return adapter


def adapter_for(modules: tuple[Any, ...], plat: Any) -> FSDPAdapter:
    """The FSDP adapter of ``modules`` on platform ``plat`` (the mesh's, or the platform
    of the modules' parameters).

    Raises:
        TypeError: a module is not a module of ``plat``'s framework.
    """
    adapter = _adapter_of_platform(plat)
    for m in modules:
        if not adapter.owns(m):
            raise TypeError(
                f"fully_shard: expected a {adapter.module_kind()} (the module type of the "
                f"mesh's framework), got {type(m).__module__}.{type(m).__qualname__}"
            )
    return adapter
