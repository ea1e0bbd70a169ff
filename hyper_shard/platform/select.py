"""Choosing the platform (torch or MindSpore) for a mesh or a tensor.

Order: an explicit ``platform=`` argument; the ``HYPER_SHARD_PLATFORM`` environment
variable (``torch`` or ``mindspore``); the device type (``"CPU"``/``"Ascend"``/``"GPU"``
name MindSpore devices, ``"cpu"``/``"cuda"``/``"npu"`` torch ones); otherwise torch if it
is importable, else MindSpore.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from typing import Any

from .base import Platform

__all__ = ["get_platform", "platform_of_tensor"]

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
        ValueError: an unknown platform name.
        ImportError: the chosen framework is not installed.
    """
    if isinstance(platform, Platform):
        return platform
    if platform is None:
        platform = os.environ.get("HYPER_SHARD_PLATFORM") or None
    if platform is None and device_type is not None:
        if device_type in _MS_DEVICES:
            platform = "mindspore"
        elif device_type.lower() in ("cpu", "cuda", "npu", "meta", "xpu"):
            platform = "torch"
    if platform is None:
        if "mindspore" in sys.modules and "torch" not in sys.modules:
            platform = "mindspore"
        elif importlib.util.find_spec("torch") is not None:
            platform = "torch"
        else:
            platform = "mindspore"
    return _load(str(platform))


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
