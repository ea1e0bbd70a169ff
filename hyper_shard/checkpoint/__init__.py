"""Checkpoints that load on any layout, on torch and MindSpore (one format for both).

``save(state_dict, dir)`` writes each rank's shards once (one rank per replica, ``Partial``
values reduced first); ``load(state_dict, dir)`` fills the state dict's tensors, whatever
their layout now: another number of ranks, another plan (1-D TP, FSDP-style ``Shard(0)``,
FSDP x TP on a 2-D mesh, one process), uneven shards. Each rank reads exactly the slices
of the saved chunks that overlap its own shards.

* On **torch** everything runs through ``torch.distributed.checkpoint`` (DCP): hyper_shard
  DTensors speak DCP's tensor-subclass protocol, so ``dcp.save`` / ``dcp.load`` /
  ``dcp.async_save`` work on them directly too; this package adds the checked, atomic load
  and the cross-framework storage (see ``hyper_shard/platform/torch/checkpoint.py``).
  ``format="hf"`` writes a consolidated Hugging Face safetensors checkpoint (DCP's
  ``HuggingFaceStorageWriter``) that ``transformers`` ``from_pretrained`` loads; ``load``
  reads Hugging Face safetensors directories (and plain DCP directories) straight into
  the shards.
* On **MindSpore** the same API writes the same files (safetensors via numpy, the layout
  metadata in the index), planned by :mod:`.layout`; a torch checkpoint loads into the
  same architecture on MindSpore and back, names mapped with ``key_map``.

Errors (:class:`CheckpointError`) name the key and the file and are raised on every rank;
a failed ``load`` leaves the tensors as they were; a save that fails never commits (see
:mod:`.storage`).
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..registry.platforms import platform_key_of, registered_platforms
from .errors import CheckpointError
from .format import INDEX_NAME, Index, read_index

__all__ = [
    "save",
    "load",
    "async_save",
    "read_index",
    "Index",
    "CheckpointError",
    "INDEX_NAME",
    "DTensorStager",
    "HyperShardWriter",
    "HyperShardReader",
]


def __getattr__(name: str) -> Any:
    """A platform's own checkpoint name (``DTensorStager`` on torch: its declared
    ``checkpoint_exports``), imported on first use (this package imports no framework)."""
    for b in registered_platforms():
        ref = b.checkpoint_exports.get(name)
        if ref is not None:
            module, _, attr = ref.partition(":")
            return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'hyper_shard.checkpoint' has no attribute {name!r}")


def _default_framework() -> str | None:
    """The first platform (in registration order) whose framework is imported and which
    declares a checkpoint adapter."""
    for b in registered_platforms():
        if b.checkpoint is not None and b.imported():
            return b.key
    return None


def _framework_of(obj: Any) -> str | None:
    key = platform_key_of(obj)
    if key is not None:
        return key
    if isinstance(obj, Mapping):
        vals: Any = obj.values()
    elif isinstance(obj, (list, tuple)):
        vals = obj
    elif hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict"):  # a Stateful
        return _default_framework()
    else:
        return None
    for v in vals:
        f = _framework_of(v)
        if f is not None:
            return f
    return None


def _adapter(state_dict: Any, framework: str | None) -> Any:
    name = framework or _framework_of(state_dict) or _default_framework()
    adapters = {b.key: b.checkpoint for b in registered_platforms() if b.checkpoint}
    if name not in adapters:
        keys = ", ".join(repr(k) for k in adapters)
        raise CheckpointError(
            f"hyper_shard.checkpoint: the state dict holds no tensor of a platform with "
            f"checkpoints; pass framework= one of {keys}"
        )
    return importlib.import_module(adapters[name])


def save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    format: str = "hyper_shard",
    framework: str | None = None,
    process_group: Any = None,
) -> int:
    """Save ``state_dict`` (nested dicts/lists of DTensors, plain tensors and python values)
    to the directory ``checkpoint_id``, as ``torch.distributed.checkpoint.save``. A
    collective: every rank calls it with the same keys.

    Each rank writes only its own shards, one rank per replica (no byte twice); ``Partial``
    DTensors are reduced first; plain tensors are taken as replicated (one rank writes
    them). The checkpoint commits atomically when every rank has written.

    Args:
        state_dict: e.g. ``{"model": model.state_dict(), "optim": optim_state, "step": 7}``
            (torch ``Stateful`` values are replaced by their ``state_dict()``).
        checkpoint_id: the directory (created if missing; an older checkpoint there is
            replaced only when this one commits).
        key_map: state-dict key (flattened with ``.``) -> the name to save it under.
        format: ``"hyper_shard"`` (default, loads on torch and MindSpore) or ``"hf"``
            (torch only: a consolidated Hugging Face safetensors checkpoint, tensors only).
        framework: ``"torch"`` / ``"mindspore"``; default: the state dict's tensors'.
        process_group: torch only: the group to save on (default the world).

    Returns:
        The bytes of tensor data this rank wrote.

    Raises:
        CheckpointError: on every rank, naming the key and file (an unsaveable value, a
            file that cannot be written); nothing is committed.
    """
    return _adapter(state_dict, framework).save(
        state_dict, checkpoint_id, key_map=key_map, format=format, process_group=process_group
    )


def load(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    strict: bool = True,
    allow_dtype_cast: bool = False,
    framework: str | None = None,
    process_group: Any = None,
) -> None:
    """Load the checkpoint in ``checkpoint_id`` into ``state_dict`` in place, whatever its
    tensors' layouts (as ``torch.distributed.checkpoint.load``). A collective.

    Every rank reads only the slices of the saved chunks that overlap its shards; the
    slices are verified against the saved checksums (collectively) and copied into the
    tensors only when every rank succeeded. Non-tensor values are replaced in the dict.

    Args:
        state_dict: the target, e.g. ``{"model": model.state_dict(), ...}`` whose tensors
            have the layout wanted now.
        checkpoint_id: a hyper_shard checkpoint directory; on torch also a
            ``torch.distributed.checkpoint`` directory or a Hugging Face safetensors one.
        key_map: state-dict key (flattened with ``.``) -> its name in the checkpoint.
        strict: refuse a checkpoint that holds keys the state dict lacks.
        allow_dtype_cast: cast tensors saved in another dtype (else an error).
        framework / process_group: as :func:`save`.

    Raises:
        CheckpointError: on every rank, naming the key and the file: a missing or
            unexpected key, another global shape, another dtype, a missing, truncated or
            corrupted file, no committed checkpoint. The state dict is unchanged.
    """
    _adapter(state_dict, framework).load(
        state_dict,
        checkpoint_id,
        key_map=key_map,
        strict=strict,
        allow_dtype_cast=allow_dtype_cast,
        process_group=process_group,
    )


def async_save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    framework: str | None = None,
    process_group: Any = None,
) -> Any:
    """:func:`save` in the background (torch: ``torch.distributed.checkpoint.async_save``).

    The local shards are copied to CPU (``Partial`` values reduced) before this returns, so
    training may change the tensors at once; the files are written on a background thread
    over a dedicated gloo group. A collective.

    Returns:
        A ``concurrent.futures.Future`` whose result is the bytes this rank wrote (it
        raises :class:`CheckpointError` if the save failed; nothing is then committed).
    """
    return _adapter(state_dict, framework).async_save(
        state_dict, checkpoint_id, key_map=key_map, process_group=process_group
    )
