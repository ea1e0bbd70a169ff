"""Framework platforms: the only place torch or MindSpore is imported.

Importing this package (hyper_shard does, on import) registers the built-in platforms'
bindings (:mod:`.bindings`); :func:`register_platform` registers another one.
"""

from ..registry.platforms import PlatformBindings, register_platform, registered_platforms
from .base import Platform
from .bindings import MINDSPORE, TORCH
from .select import get_platform, platform_of_tensor

register_platform(TORCH)
register_platform(MINDSPORE)


def preload_imported() -> None:
    """Import the ``preload`` module of every registered platform whose framework is
    already imported (hyper_shard does on import)."""
    import importlib

    for b in registered_platforms():
        if b.preload is not None and b.imported():
            importlib.import_module(b.preload)


__all__ = [
    "Platform",
    "PlatformBindings",
    "get_platform",
    "platform_of_tensor",
    "preload_imported",
    "register_platform",
    "registered_platforms",
]
