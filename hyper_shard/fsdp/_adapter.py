"""What the framework-neutral FSDP core asks of a framework: hooks, autograd, parameters.

The core (:mod:`._group`, :mod:`._state`, :mod:`._param`) plans buffers and runs the
state machine; it reaches the framework only through a :class:`FSDPFramework` (torch:
:mod:`hyper_shard.fsdp._torch`) and the mesh's Platform (tensors and collectives).
MindSpore (:mod:`hyper_shard.fsdp._mindspore`) implements it for ``nn.Cell`` and builds
its units itself (:attr:`FSDPFramework.own_units`). Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["FSDPFramework", "framework_for", "register_framework"]


class FSDPFramework:
    """A framework's module system and autograd, as FSDP uses them."""

    name: str = "abstract"
    #: True: the framework builds a unit itself with :meth:`shard_unit` (MindSpore, whose
    #: functional autograd has no tensor hooks for the core's state machine); False: the
    #: core's FSDPParamGroup/FSDPState run it through the hooks below (torch)
    own_units: bool = False

    def shard_unit(
        self, module: Any, info: Any, params: list, mp: Any = None, dims: Any = None
    ) -> Any:
        """Shard ``params`` (``((fqn, parameter), sites)``, chosen by the core) of ``module``
        along ``dims`` (one tensor dim per parameter; None: all 0) and hook its forward,
        with the mixed-precision policy ``mp`` (only when :attr:`own_units`)."""
        raise NotImplementedError

    def owns(self, module: Any) -> bool:
        """True if ``module`` is this framework's module type."""
        raise NotImplementedError

    # ---------------------------------------------------------------- modules
    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        """Every submodule (duplicates included) with its qualified name, root first."""
        raise NotImplementedError

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        """The module's own parameters (not its children's), ``None`` entries skipped."""
        raise NotImplementedError

    def set_param(self, module: Any, name: str, param: Any) -> None:
        """Register ``param`` as ``module.<name>`` (no checks: the FSDP swap)."""
        raise NotImplementedError

    def new_param(self, tensor: Any, requires_grad: bool) -> Any:
        """A parameter object over ``tensor``'s data (an autograd leaf)."""
        raise NotImplementedError

    def requires_grad(self, param: Any) -> bool:
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
        self, module: Any, pre_save: Callable[[], None], pre_load: Callable[[dict, str], None]
    ) -> None:
        """``pre_save()`` before ``module.state_dict()``; ``pre_load(state_dict, prefix)``
        before the module loads its own entries (it may rewrite them)."""
        raise NotImplementedError

    # ---------------------------------------------------------------- autograd
    def grad_enabled(self) -> bool:
        raise NotImplementedError

    def in_backward(self) -> bool:
        """True while the framework's backward runs (a recomputed forward)."""
        raise NotImplementedError

    def hook_outputs(self, output: Any, fn: Callable[[], None]) -> Any:
        """Call ``fn()`` when the gradient of any tensor of ``output`` (a nested structure)
        is computed, before it flows further back; returns ``output`` (possibly rebuilt)."""
        raise NotImplementedError

    def hook_inputs(
        self, args: tuple, kwargs: dict, fn: Callable[[], None]
    ) -> tuple[tuple, dict, bool]:
        """Call ``fn()`` once the gradients of the tensors in ``args``/``kwargs`` that require
        grad are computed (after the module's backward); returns the rebuilt inputs and
        whether a hook was placed (False: grad disabled, or no input requires grad)."""
        raise NotImplementedError

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
        raise NotImplementedError

    def raw_grad(self, param: Any) -> Any:
        """``param``'s stored gradient as the framework holds it (a DTensor parameter's
        local gradient is a plain tensor unless FSDP stored a DTensor), or None."""
        raise NotImplementedError

    def set_raw_grad(self, param: Any, grad: Any) -> None:
        """Store ``grad`` (a plain tensor, a DTensor kept as is, or None) as ``param``'s
        gradient without conversion."""
        raise NotImplementedError

    def to_device(self, t: Any, like: Any) -> Any:
        """``t`` on ``like``'s device (no copy when already there)."""
        raise NotImplementedError

    def to_host(self, t: Any, pin: bool) -> Any:
        """``t`` in host memory (pinned if asked and possible)."""
        raise NotImplementedError

    def device_type(self, t: Any) -> str:
        raise NotImplementedError


_FRAMEWORKS: list[Callable[[], FSDPFramework | None]] = []
_BUILT: dict[int, FSDPFramework] = {}


def register_framework(loader: Callable[[], FSDPFramework | None]) -> None:
    """Add a lazily built framework (``loader()`` returns None while the framework is not
    imported)."""
    _FRAMEWORKS.append(loader)


def _load_torch() -> FSDPFramework | None:
    import sys

    if "torch" not in sys.modules:
        return None
    from ._torch import TorchFSDP

    return TorchFSDP()


register_framework(_load_torch)


def _load_mindspore() -> FSDPFramework | None:
    import sys

    if "mindspore" not in sys.modules:
        return None
    from ._mindspore import MindSporeFSDP

    return MindSporeFSDP()


register_framework(_load_mindspore)


def _candidates() -> Iterator[FSDPFramework]:
    for i, loader in enumerate(_FRAMEWORKS):
        fw = _BUILT.get(i)
        if fw is None:
            fw = loader()
            if fw is None:
                continue
            _BUILT[i] = fw
        yield fw


def framework_for(module: Any) -> FSDPFramework:
    """The FSDP framework adapter of ``module``.

    Raises:
        TypeError: ``module`` is not a module of a supported framework.
    """
    for fw in _candidates():
        if fw.owns(module):
            return fw
    raise TypeError(
        f"fully_shard: expected a torch.nn.Module or a mindspore.nn.Cell, got "
        f"{type(module).__module__}.{type(module).__qualname__}"
    )
