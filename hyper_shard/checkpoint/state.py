"""Flattening nested state dicts to dotted keys, framework-neutrally.

The rule is torch.distributed.checkpoint's (``_traverse.traverse_state_dict``), so a key
means the same on torch and MindSpore: mappings are walked (keys ``str``-ed and joined
with ``.``); a list is walked (by index) only if it holds a tensor, a mapping or such a
list; everything else (tuples, scalars, lists of scalars) is one value.

This module imports no framework: ``is_tensor`` tells tensors apart.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from .errors import CheckpointError

__all__ = ["flatten", "set_element", "rename"]

Path = tuple[Any, ...]


def flatten(
    state_dict: Mapping[str, Any], is_tensor: Callable[[Any], bool]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """(flat key -> value, flat key -> path), in traversal order."""
    flat: dict[str, Any] = {}
    paths: dict[str, Path] = {}

    def terminal(v: Any) -> bool:
        if isinstance(v, Mapping):
            return False
        if not isinstance(v, list):
            return True
        for e in v:
            if isinstance(e, (Mapping, list)) and not terminal(e):
                return False
            if is_tensor(e):
                return False
        return True

    def walk(path: Path, v: Any) -> None:
        if isinstance(v, Mapping):
            for k, x in v.items():
                walk(path + (str(k),), x)
        elif terminal(v):
            key = ".".join(map(str, path))
            if key in flat:
                raise CheckpointError(f"two state-dict entries flatten to the key {key!r}")
            flat[key] = v
            paths[key] = path
        else:
            for i, x in enumerate(v):
                walk(path + (i,), x)

    for k, v in state_dict.items():
        walk((str(k),), v)
    return flat, paths


def set_element(root: Any, path: Path, value: Any) -> None:
    """Set ``value`` at ``path`` in the nested ``root`` (creating dicts/lists as needed)."""
    cur = root
    for i in range(len(path) - 1):
        k, nxt = path[i], path[i + 1]
        default: Any = {} if isinstance(nxt, str) else []
        if isinstance(cur, Mapping):
            cur = cur.setdefault(k, default)  # type: ignore[attr-defined]
        else:
            while len(cur) <= k:
                cur.append(None)
            if cur[k] is None:
                cur[k] = default
            cur = cur[k]
    last = path[-1]
    if isinstance(last, int) and isinstance(cur, list):
        while len(cur) <= last:
            cur.append(None)
    cur[last] = value


def rename(
    flat: dict[str, Any], paths: dict[str, Path], key_map: Mapping[str, str] | None
) -> tuple[dict[str, Any], dict[str, Path]]:
    """Rename flat keys by ``key_map`` (state-dict key -> checkpoint key).

    Raises:
        CheckpointError: ``key_map`` names unknown keys, or maps two keys to one name.
    """
    if not key_map:
        return flat, paths
    unknown = sorted(set(key_map) - set(flat))
    if unknown:
        raise CheckpointError(
            f"key_map names keys the state dict does not have: {unknown[:5]} (its keys look "
            f"like {sorted(flat)[:3]})"
        )
    out: dict[str, Any] = {}
    opaths: dict[str, Path] = {}
    for k, v in flat.items():
        ck = key_map.get(k, k)
        if ck in out:
            raise CheckpointError(f"key_map maps two state-dict keys to checkpoint key {ck!r}")
        out[ck], opaths[ck] = v, paths[k]
    return out, opaths
