"""Where op specs come from: the built-in directory, installed packages' entry points
(group ``hyper_shard.op_specs``), ``HYPER_PARALLEL_OPS_YAML_DIR``, and the Python path of
custom op classes (``HYPER_PARALLEL_OPS_PYTHON_PATH``, appended to ``sys.path``: never
placed before the standard library or site-packages).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import OpSpecError

__all__ = [
    "YAML_ENV",
    "PY_ENV",
    "EP_GROUP",
    "builtin_dirs",
    "env_dirs",
    "entry_point_dirs",
    "python_path_dirs",
    "add_python_path",
    "add_python_path_at_import",
]

YAML_ENV = "HYPER_PARALLEL_OPS_YAML_DIR"
PY_ENV = "HYPER_PARALLEL_OPS_PYTHON_PATH"
EP_GROUP = "hyper_shard.op_specs"


def builtin_dirs() -> list[Path]:
    """The built-in op-spec directory (wheel layout, else the source checkout's)."""
    here = Path(__file__).resolve().parent.parent
    for d in (here / "op_specs", here.parent / "op_specs"):
        if d.is_dir():
            return [d]
    return []


def env_dirs() -> list[Path]:
    """The directories in ``HYPER_PARALLEL_OPS_YAML_DIR`` (``os.pathsep``-separated).

    Raises:
        OpSpecError: a listed directory does not exist.
    """
    out = []
    for part in os.environ.get(YAML_ENV, "").split(os.pathsep):
        if not part.strip():
            continue
        p = Path(part.strip()).expanduser()
        if not p.is_dir():
            raise OpSpecError(
                f"{YAML_ENV}: {part!r} is not a directory; create it, or remove it from "
                f"{YAML_ENV} (entries are separated by {os.pathsep!r})"
            )
        out.append(p)
    return out


def entry_point_dirs() -> list[Path]:
    """Directories contributed by installed packages (entry-point group ``hyper_shard.op_specs``).

    An entry point may load to a module or package (its directory is used), a path, or a
    callable returning one path or a list of them.

    Raises:
        OpSpecError: an entry point fails to load or gives something that is not a directory.
    """
    out: list[Path] = []
    for ep in importlib.metadata.entry_points(group=EP_GROUP):
        where = f"entry point {ep.name!r} = {ep.value!r} (group {EP_GROUP!r})"
        try:
            obj = ep.load()
            if callable(obj) and not isinstance(obj, type):
                obj = obj()
        except Exception as e:
            raise OpSpecError(
                f"{where}: loading it failed: {type(e).__name__}: {e}; fix or uninstall the "
                f"package that declares it"
            ) from None
        items: Iterable[Any] = obj if isinstance(obj, (list, tuple)) else [obj]
        for it in items:
            if getattr(it, "__file__", None):
                p = Path(it.__file__).parent
            elif getattr(it, "__path__", None):  # a namespace package
                p = Path(next(iter(it.__path__)))
            else:
                p = Path(str(it))
            if not p.is_dir():
                raise OpSpecError(
                    f"{where}: {p} is not a directory; the entry point must name a package "
                    f"holding YAML files, a directory, or a callable returning directories"
                )
            out.append(p)
    return out


def python_path_dirs() -> list[str]:
    out = []
    for part in os.environ.get(PY_ENV, "").split(os.pathsep):
        part = part.strip()
        if not part:
            continue
        if not Path(part).expanduser().is_dir():
            raise OpSpecError(
                f"{PY_ENV}: {part!r} is not a directory; create it, or remove it from {PY_ENV} "
                f"(entries are separated by {os.pathsep!r})"
            )
        out.append(str(Path(part).expanduser()))
    return out


def add_python_path_at_import() -> None:
    """Append the existing directories of ``HYPER_PARALLEL_OPS_PYTHON_PATH`` to ``sys.path``
    when hyper_shard is imported, so a user's op module (``import scaled_add_ops``) imports
    before the registry is first built; a bad entry is left for the registry to report."""
    added = False
    for part in os.environ.get(PY_ENV, "").split(os.pathsep):
        d = str(Path(part.strip()).expanduser()) if part.strip() else ""
        if d and Path(d).is_dir() and d not in sys.path:
            sys.path.append(d)  # after the stdlib and site-packages, never before
            added = True
    if added:
        importlib.invalidate_caches()


def add_python_path() -> None:
    added = False
    for part in python_path_dirs():
        if part not in sys.path:
            sys.path.append(part)  # after the stdlib and site-packages, never before
            added = True
    if added:
        importlib.invalidate_caches()
