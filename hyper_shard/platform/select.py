"""Choosing the platform (torch, MindSpore, or another registered one) for a mesh or a
tensor.

Order: an explicit ``platform=`` argument (a Platform, or a registered platform's key);
the ``HYPER_SHARD_PLATFORM`` environment variable (a key); the device type; otherwise
torch if it is importable, else MindSpore. A key's Platform is made once, by the factory
its declaration names (:class:`~hyper_shard.registry.platforms.PlatformBindings`).

The device type: a name a registered platform declares in its ``device_types`` chooses it.

The device type: ``"CPU"``/``"GPU"``/``"Ascend"`` (MindSpore's spelling) name MindSpore.
Other names (``"cpu"``, ``"cuda"``, ``"npu"``: torch's spelling) go to the framework whose
communication is initialised (``torch.distributed.is_initialized()``, MindSpore's
``init()``/:func:`~hyper_shard.platform.mindspore.launch.init_process`) or whose launcher
started the process (torchrun, msrun); with both or neither, to torch, unless only
MindSpore is imported: that is ambiguous and raises, naming both ways to say MindSpore.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from .. import _locator
from ..registry.platforms import platform_bindings, platform_key_of, registered_platforms
from .base import Platform

__all__ = ["get_platform", "platform_of_tensor", "platform_for_device", "platform_of_object"]

_INSTANCES: dict[str, Platform] = {}
_MS_DEVICES = {"CPU", "GPU", "Ascend", "ascend"}


def _load(name: str) -> Platform:
    plat = _INSTANCES.get(name)
    if plat is None:
        try:
            factory = platform_bindings(name).load("platform")
        except KeyError as e:
            raise ValueError(f"unknown platform {name!r}: {e.args[0]}") from None
        if factory is None:
            raise ValueError(f"platform {name!r} declares no Platform (PlatformBindings.platform)")
        # threads (ranks as threads) may race here: the first instance stored is the one
        plat = _INSTANCES.setdefault(name, factory())
    return plat


def get_platform(platform: Any = None, *, device_type: str | None = None) -> Platform:
    """The Platform to use (see the module docstring for the order of choice).

    Raises:
        ValueError: an unknown platform name, or an ambiguous device type (see
            :func:`platform_for_device`).
        ImportError: the chosen framework is not installed.
    """
    if isinstance(platform, Platform):
        return platform
    if platform is None:
        platform = os.environ.get("HYPER_SHARD_PLATFORM") or None
    if platform is None and device_type is not None:
        platform = platform_for_device(device_type)
    if platform is None:
        if "mindspore" in sys.modules and "torch" not in sys.modules:
            platform = "mindspore"
        elif importlib.util.find_spec("torch") is not None:
            platform = "torch"
        else:
            platform = "mindspore"
    return _load(str(platform))


def _communication(name: str) -> bool:
    """True if ``name``'s communication is initialised, or its launcher started us."""
    if name == "torch":
        if "TORCHELASTIC_RUN_ID" in os.environ:
            return True
        if "torch" not in sys.modules:
            return False
        import torch.distributed as dist

        return bool(dist.is_available() and dist.is_initialized())
    if os.environ.get("MS_ROLE") in ("MS_WORKER", "MS_SCHED"):
        return True
    if "mindspore" not in sys.modules:
        return False
    try:
        from mindspore.communication._comm_helper import _is_initialized
    except ImportError:  # pragma: no cover - another MindSpore layout
        return False
    return bool(_is_initialized())


def platform_for_device(device_type: str) -> str | None:
    """The platform a mesh on ``device_type`` belongs to (see the module docstring), or
    None for a name neither framework spells (the default choice then applies).

    Raises:
        ValueError: a torch-spelled device (``"cpu"``...) in a process where only MindSpore
            is imported and no communication is initialised; the message names both ways
            to choose (``"CPU"`` or ``platform="mindspore"``, ``platform="torch"``).
    """
    for b in registered_platforms():
        if device_type in b.device_types:
            return b.key
    low = device_type.lower()
    if device_type in _MS_DEVICES or low in ("gpu", "ascend"):
        return "mindspore"
    if low not in ("cpu", "cuda", "npu", "meta", "xpu"):
        return None
    live = [n for n in ("torch", "mindspore") if _communication(n)]
    if live == ["mindspore"] and low in ("cpu", "cuda", "npu"):
        return "mindspore"
    if live or "torch" in sys.modules or "mindspore" not in sys.modules:
        return "torch"
    ms_name = {"cpu": "CPU", "cuda": "GPU", "npu": "Ascend"}.get(low, "CPU")
    raise ValueError(
        f"init_device_mesh({device_type!r}): MindSpore is imported and torch is not, and "
        f"neither framework's communication is initialised, so {device_type!r} (torch's "
        f"name for the device) is ambiguous. For MindSpore pass {ms_name!r} (MindSpore's "
        f"name) or platform='mindspore'; for PyTorch pass platform='torch'"
    )


def platform_of_object(obj: Any) -> Platform | None:
    """The platform whose object ``obj`` is (a tensor, a mesh, an op: by its declared
    ``modules`` and ``tensor_type``), or None."""
    key = platform_key_of(obj)
    return None if key is None else _load(key)


def platform_of_tensor(t: Any) -> Platform:
    """The platform whose tensor type ``t`` is.

    Raises:
        TypeError: ``t`` is no registered platform's tensor.
    """
    plat = platform_of_object(t)
    if plat is None:
        keys = ", ".join(b.key for b in registered_platforms())
        raise TypeError(
            f"expected a tensor of a registered platform ({keys}), got {type(t).__name__}"
        )
    return plat


_locator.install(get_platform, platform_of_tensor, platform_of_object)
