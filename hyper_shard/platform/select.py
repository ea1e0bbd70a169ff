"""Choosing the platform (torch or MindSpore) for a mesh or a tensor.

Order: an explicit ``platform=`` argument; the ``HYPER_SHARD_PLATFORM`` environment
variable (``torch`` or ``mindspore``); the device type; otherwise torch if it is
importable, else MindSpore.

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
from .base import Platform

__all__ = ["get_platform", "platform_of_tensor", "platform_for_device"]

_INSTANCES: dict[str, Platform] = {}
_MS_DEVICES = {"CPU", "GPU", "Ascend", "ascend"}


def _load(name: str) -> Platform:
    plat = _INSTANCES.get(name)
    if plat is None:
        if name == "torch":
            from .torch import TorchPlatform

            plat = TorchPlatform()
        elif name == "mindspore":
            from .mindspore import MindSporePlatform

            plat = MindSporePlatform()
        else:
            raise ValueError(f"unknown platform {name!r}; use 'torch' or 'mindspore'")
        _INSTANCES[name] = plat
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


def platform_of_tensor(t: Any) -> Platform:
    """The platform whose tensor type ``t`` is.

    Raises:
        TypeError: ``t`` is neither a torch nor a MindSpore tensor.
    """
    mod = type(t).__module__.split(".")[0]
    if mod == "torch" or (("torch" in sys.modules) and isinstance(t, sys.modules["torch"].Tensor)):
        return _load("torch")
    if mod == "mindspore" or (
        "mindspore" in sys.modules and isinstance(t, sys.modules["mindspore"].Tensor)
    ):
        return _load("mindspore")
    raise TypeError(f"expected a torch or MindSpore tensor, got {type(t).__name__}")


_locator.install(get_platform, platform_of_tensor)
