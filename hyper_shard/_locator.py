"""How the neutral core finds a platform without importing one.

A concrete mesh picks its platform (``DeviceMesh(platform=...)``, ``init_device_mesh``),
and ``DTensor.from_local`` on an abstract mesh takes the platform of its local tensor. The
core asks the two functions here; :mod:`hyper_shard.platform.select` installs their
implementations when it is imported (``hyper_shard/__init__.py`` imports it), so no module
below the platforms imports a platform (the ``layers`` contract of pyproject.toml).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .platform.base import Platform

__all__ = ["get_platform", "platform_of_tensor", "platform_of_object", "install"]

_IMPL: dict[str, Callable[..., Any]] = {}


def install(
    get_platform: Callable[..., Platform],
    platform_of_tensor: Callable[[Any], Platform],
    platform_of_object: Callable[[Any], Platform | None],
) -> None:
    """Install the platform lookups (done by :mod:`hyper_shard.platform.select`)."""
    _IMPL["get"] = get_platform
    _IMPL["of_tensor"] = platform_of_tensor
    _IMPL["of_object"] = platform_of_object


def _impl(name: str) -> Callable[..., Any]:
    fn = _IMPL.get(name)
    if fn is None:
        raise RuntimeError(
            "hyper_shard: no platform lookup installed; import hyper_shard (its __init__ "
            "imports hyper_shard.platform.select) before making a concrete mesh"
        )
    return fn


def get_platform(
    platform: str | Platform | None = None, *, device_type: str | None = None
) -> Platform:
    """The Platform to use: see :func:`hyper_shard.platform.select.get_platform`."""
    plat: Platform = _impl("get")(platform, device_type=device_type)
    return plat


def platform_of_tensor(t: Any) -> Platform:
    """The platform whose tensor type ``t`` is: see
    :func:`hyper_shard.platform.select.platform_of_tensor`."""
    plat: Platform = _impl("of_tensor")(t)
    return plat


def platform_of_object(obj: Any) -> Platform | None:
    """The platform whose object ``obj`` is (a tensor, a framework's own mesh...), or None:
    see :func:`hyper_shard.platform.select.platform_of_object`."""
    plat: Platform | None = _impl("of_object")(obj)
    return plat
