"""The Registry: every loaded entry, and the per-platform map from op name to op.

``get_registry()`` builds it on first use (reading the environment's directories then);
``reload()`` reads every source again and clears the dispatcher's caches.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .loader import LoadedEntry, load_all

__all__ = ["Registry", "get_registry", "reload"]


class Registry:
    """Loaded op specs.

    Attributes:
        entries: entry name -> :class:`LoadedEntry` (file, validated entry, op instance).
    """

    def __init__(self, entries: Iterable[LoadedEntry]) -> None:
        self.entries: dict[str, LoadedEntry] = {e.name: e for e in entries}
        self._bindings: dict[str, Any] = {}

    def names(self, platform: str) -> dict[str, LoadedEntry]:
        """Platform op name -> entry, for ``"torch"`` or ``"mindspore"``."""
        out = {}
        for e in self.entries.values():
            for n in e.torch if platform == "torch" else e.mindspore:
                out[n] = e
        return out

    def binding(self, platform: str, build: Any) -> Any:
        """The platform's lookup table, built once by ``build(registry)``."""
        b = self._bindings.get(platform)
        if b is None:
            b = self._bindings[platform] = build(self)
        return b

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)


_REGISTRY: Registry | None = None
_EXTRA: list[Path] = []


def get_registry() -> Registry:
    """The process-wide registry (built on first use)."""
    global _REGISTRY
    if _REGISTRY is None:
        _REGISTRY = Registry(load_all(_EXTRA))
    return _REGISTRY


def reload(extra_dirs: Iterable[str | Path] = ()) -> Registry:
    """Read every source again (built-ins, entry points, ``HYPER_PARALLEL_OPS_YAML_DIR``,
    plus ``extra_dirs``) and clear the dispatcher's layout cache.

    Raises:
        OpSpecError: any malformed spec; the previous registry stays in place.
    """
    global _REGISTRY
    extra = [Path(d) for d in extra_dirs]
    new = Registry(load_all(extra))  # raises before anything is replaced
    _EXTRA[:] = extra
    _REGISTRY = new
    from ..dispatch.dispatcher import clear_cache

    clear_cache()
    return new
