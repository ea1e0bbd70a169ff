"""The Registry: every loaded entry, and the per-platform map from op name to op.

``get_registry()`` builds it on first use (reading the environment's directories then);
``reload()`` reads every source again, checks the new specs against every platform already
in use, and only then replaces the registry and clears the dispatcher's caches.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .loader import LoadedEntry, load_all
from .platforms import platform_keys, registered_platforms

__all__ = ["Registry", "get_registry", "reload"]


class Registry:
    """Loaded op specs.

    Args:
        entries: the loaded entries (as :func:`~hyper_shard.registry.loader.load_all`
            returns them).

    Attributes:
        entries: entry name -> :class:`LoadedEntry` (file, validated entry, op instance).
    """

    def __init__(self, entries: Iterable[LoadedEntry]) -> None:
        self.entries: dict[str, LoadedEntry] = {e.name: e for e in entries}
        self._bindings: dict[str, Any] = {}

    def names(self, platform: str) -> dict[str, LoadedEntry]:
        """Platform op name -> entry, for a registered platform key.

        Raises:
            ValueError: no platform is registered under ``platform`` (the message lists
                the registered keys).
        """
        if platform not in platform_keys():
            raise ValueError(
                f"unknown platform {platform!r}; the registered platforms are "
                f"{', '.join(sorted(platform_keys()))}"
            )
        out = {}
        for e in self.entries.values():
            for n in e.bindings.get(platform, ()):
                out[n] = e
        return out

    def unregistered_keys(self) -> dict[str, list[LoadedEntry]]:
        """Platform keys the entries bind (``bindings: {KEY: ...}``) that no registered
        platform has -> the entries naming each (their names are kept and unused)."""
        keys = platform_keys()
        out: dict[str, list[LoadedEntry]] = {}
        for e in self.entries.values():
            for k, names in e.bindings.items():
                if names and k not in keys:
                    out.setdefault(k, []).append(e)
        return out

    def binding(self, platform: str, build: Callable[[Registry], Any]) -> Any:
        """The platform's lookup table, built once by ``build(registry)``.

        Raises:
            OpSpecError: whatever ``build`` raises for a name the platform does not have.
        """
        b = self._bindings.get(platform)
        if b is None:  # threads racing here keep the first table stored
            b = self._bindings.setdefault(platform, build(self))
        return b

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def __getitem__(self, name: str) -> LoadedEntry:
        return self.entries[name]

    def __len__(self) -> int:
        return len(self.entries)


_REGISTRY: Registry | None = None
_BUILDING = threading.RLock()
_EXTRA: list[Path] = []
#: entries made in the program (register_sharding), kept across reloads
_RUNTIME: list[LoadedEntry] = []


def get_registry() -> Registry:
    """The process-wide registry (built on first use).

    Raises:
        OpSpecError: a malformed spec in any source (the registry stays unbuilt, so the
            next call tries again).
    """
    global _REGISTRY
    if _REGISTRY is None:
        with _BUILDING:  # one build when threads (ranks as threads) ask at once
            if _REGISTRY is None:
                _REGISTRY = Registry(load_all(_EXTRA, _RUNTIME))
    return _REGISTRY


def _bind_loaded_platforms(reg: Registry) -> None:
    """Build the table of every platform in use (``PlatformBindings.in_use``), so a spec
    naming an op a platform does not have fails here (keeping the old registry) instead
    of at the next op call."""
    for b in registered_platforms():
        if b.in_use():
            reg.binding(b.key, b.load("build_table"))


def reload(extra_dirs: Iterable[str | Path] = ()) -> Registry:
    """Read every source again (built-ins, entry points, ``HYPER_PARALLEL_OPS_YAML_DIR``,
    ``HYPER_PARALLEL_OPS_PYTHON_PATH``, plus ``extra_dirs``), bind the new specs to every
    platform already in use, then replace the registry and clear the dispatcher's layout
    cache.

    Args:
        extra_dirs: more directories of YAML specs (kept for later :func:`get_registry`
            calls until the next ``reload``).

    Returns:
        The new registry.

    Raises:
        OpSpecError: any malformed spec, or an op name a platform in use does not have;
            the previous registry stays in place.
    """
    global _REGISTRY
    extra = [Path(d) for d in extra_dirs]
    new = Registry(load_all(extra, _RUNTIME))  # raises before anything is replaced
    _bind_loaded_platforms(new)  # likewise (unknown op names)
    _EXTRA[:] = extra
    _REGISTRY = new
    from ..dispatch.dispatcher import clear_cache

    clear_cache()
    for hook in list(RELOAD_HOOKS):
        hook(new)
    return new


#: callables run with the new registry after every reload (platforms drop their tables)
RELOAD_HOOKS: list = []


def add_runtime_entry(entry: LoadedEntry) -> Registry:
    """Add (or replace, by name) an entry made in the program, then :func:`reload` with the
    current extra directories, so it binds on every platform in use and the layout cache
    forgets earlier decisions.

    Raises:
        OpSpecError: as :func:`reload` (the entry is then not kept).
    """
    old = list(_RUNTIME)
    _RUNTIME[:] = [e for e in _RUNTIME if e.name != entry.name] + [entry]
    try:
        return reload(_EXTRA)
    except Exception:
        _RUNTIME[:] = old
        raise


def remove_runtime_entry(name: str) -> Registry:
    """Drop the program-made entry ``name`` (see :func:`add_runtime_entry`) and reload."""
    _RUNTIME[:] = [e for e in _RUNTIME if e.name != name]
    return reload(_EXTRA)
