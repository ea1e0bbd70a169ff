"""What the neutral tensor-parallel API asks of a framework's module system.

The styles (:mod:`hyper_shard.parallel.style`) and :func:`parallelize_module` are written
against this small protocol. A framework's adapter lives in its platform package
(``platform/<framework>/parallel.py``: ``torch.nn.Module``, MindSpore's ``nn.Cell``), which
registers it here with :func:`register_adapter`. Nothing here imports a framework.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .._locator import get_platform

__all__ = ["ModuleAdapter", "adapter_for", "register_adapter"]

#: input hook: ``fn(module, args, kwargs) -> (args, kwargs)``;
#: output hook: ``fn(module, args, output) -> output``
InputHook = Callable[[Any, tuple, dict], tuple[tuple, dict]]
OutputHook = Callable[[Any, tuple, Any], Any]


class ModuleAdapter:
    """A framework's module system, as the tensor-parallel API uses it."""

    name: str = "abstract"

    def owns(self, module: Any) -> bool:
        """True if ``module`` is this framework's module type."""
        raise NotImplementedError

    def module_kind(self, module: Any) -> str | None:
        """``"linear"`` (``nn.Linear``/``nn.Dense``: weight ``[out, in]``), ``"embedding"``
        (weight ``[num_embeddings, dim]``) or None."""
        raise NotImplementedError

    def param_roles(self, module: Any, kind: str) -> dict[str, str]:
        """Role (``weight``, ``bias``) -> the module's attribute name, for parameters that
        exist (a Linear without bias has no ``bias`` role)."""
        raise NotImplementedError

    def named_modules(self, module: Any) -> list[tuple[str, Any]]:
        """Every submodule with its qualified name, the root first as ``""``."""
        raise NotImplementedError

    def direct_params(self, module: Any) -> list[tuple[str, Any]]:
        """The module's own parameters (not its children's): ``(name, parameter)``."""
        raise NotImplementedError

    def direct_buffers(self, module: Any) -> list[tuple[str, Any]]:
        """The module's own tensor buffers: ``(name, tensor)``."""
        raise NotImplementedError

    def set_param(self, module: Any, name: str, value: Any, requires_grad: bool) -> None:
        """Replace parameter ``name`` by a parameter wrapping the DTensor ``value``."""
        raise NotImplementedError

    def set_buffer(self, module: Any, name: str, value: Any) -> None:
        raise NotImplementedError

    def whole_replicate_grad(self, param: Any) -> None:
        """Make the gradient of a parameter the style leaves ``Replicate`` whole on every
        rank after backward (PyTorch's ``Replicate`` ``.grad``), where the framework
        stores gradients on parameters. Default: nothing (hyper_shard's ``Partial(sum)``
        gradient, reduced by the optimizer step)."""

    def tie_param(self, module: Any, name: str, param: Any) -> None:
        """Make ``module.<name>`` the very parameter object ``param`` (weight tying)."""
        raise NotImplementedError

    def accept_full_state(self, module: Any) -> None:
        """Make the module's state-dict loading take a full plain tensor (every rank holds
        the whole value) for a DTensor parameter or buffer: each rank keeps its shard of it,
        with no communication. Default: nothing (the framework's own loading)."""

    def requires_grad(self, param: Any) -> bool:
        raise NotImplementedError

    def register_input_hook(self, module: Any, fn: InputHook) -> Any:
        """Run ``fn`` on the module's positional and keyword inputs before each forward."""
        raise NotImplementedError

    def register_output_hook(self, module: Any, fn: OutputHook) -> Any:
        """Run ``fn`` on the module's output after each forward; its result replaces it."""
        raise NotImplementedError

    def set_forward(self, module: Any, fn: Callable[..., Any]) -> None:
        """Make ``fn(*args, **kwargs)`` this module's forward computation (its hooks still
        run around it): how :class:`~hyper_shard.parallel.expert.ExpertParallel` runs an
        experts module's layer on its local experts."""
        raise NotImplementedError


_ADAPTERS: dict[int, ModuleAdapter] = {}
_LOADERS: list[Callable[[], ModuleAdapter | None]] = []


def register_adapter(loader: Callable[[], ModuleAdapter | None]) -> None:
    """Add a lazily built adapter: ``loader()`` returns it, or None while its framework is
    not imported (it is asked again for the next module)."""
    _LOADERS.append(loader)


def adapter_for(module: Any) -> ModuleAdapter:
    """The adapter of ``module``'s framework.

    Raises:
        TypeError: ``module`` is neither a ``torch.nn.Module`` nor a supported framework's
            module (the message names its type).
    """
    for ad in _ADAPTERS.values():
        if ad.owns(module):
            return ad
    found = _build(module)
    if found is None:
        # the module's framework package names its platform: load that platform, whose
        # package registers its adapter, and look again
        try:
            get_platform(type(module).__module__.split(".")[0])
        except (ValueError, ImportError):
            pass
        found = _build(module)
    if found is None:
        raise TypeError(
            f"hyper_shard.parallel: cannot parallelize a {type(module).__module__}."
            f"{type(module).__qualname__}; pass a module of a framework with a hyper_shard "
            f"platform (torch.nn.Module, mindspore.nn.Cell)"
        )
    return found


def _build(module: Any) -> ModuleAdapter | None:
    """Build the registered adapters not built yet; the first that owns ``module``."""
    for i, loader in enumerate(_LOADERS):
        if i in _ADAPTERS:
            continue
        built = loader()  # None while its framework is not imported: tried again next time
        if built is not None:
            _ADAPTERS[i] = built
            if built.owns(module):
                return built
    return None
