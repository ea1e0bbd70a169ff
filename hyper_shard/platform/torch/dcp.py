"""torch.distributed.checkpoint (DCP) protocol of the torch DTensor.

DCP accepts tensor subclasses that describe their own shards (see
``torch/distributed/checkpoint/planner_helpers.py`` and ``utils.py``):

* ``__create_write_items__(fqn, obj)``: what this rank could write (called on every rank
  while DCP plans a save). One item per rank: its shard, at its global offset. Replicas
  of a shard (ranks that differ only on Replicate or Partial mesh dims) describe the same
  item, and DCP's own de-duplication (``dedup_save_plans``) keeps one writer per item,
  balancing bytes across ranks: no byte is written twice.
* ``__create_chunk_list__()``: the global box this rank needs on load; DCP intersects it
  with the saved chunks (``create_read_items_for_chunk_list``), so any saved layout loads
  into any target layout and every rank reads only the slices that overlap its shard.
* ``__get_tensor_shard__(index)``: the plain local tensor behind an item (the data to
  write, or the buffer DCP copies loaded slices into).

``Partial`` values are reduced before saving: ``__create_write_items__`` runs on every rank
in the same order, so it all-reduces the partial mesh dims there (one collective per
Partial DTensor) and keeps the reduced shard for ``__get_tensor_shard__``. PyTorch's own
DTensor raises on Partial instead. Loading *into* a ``Partial(sum)`` DTensor is refused
(every rank would receive the whole value and the sum would count it once per rank):
load into its Replicate form, or use :func:`hyper_shard.checkpoint.load`, which does that.

Empty shards (uneven ``torch.chunk`` layouts) describe no item and read nothing.
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C import DisableTorchFunctionSubclass
from torch.utils.weak import WeakIdKeyDictionary

from ...checkpoint.errors import CheckpointError
from ...placement import Partial, Replicate

__all__ = ["create_write_items", "create_chunk_list", "get_tensor_shard", "reduced_for_save"]

#: reduced local shards of Partial DTensors planned for a save, by DTensor
_REDUCED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _local(dt: Any) -> torch.Tensor:
    with DisableTorchFunctionSubclass():
        return dt.as_subclass(torch.Tensor)


def _version(t: torch.Tensor) -> int:
    with DisableTorchFunctionSubclass():
        return int(t._version)


def _box(dt: Any, fqn: str) -> tuple[torch.Size, torch.Size] | None:
    """(global offsets, sizes) of this rank's shard; None for an empty shard of a non-empty
    tensor or a rank outside the mesh.

    Raises:
        CheckpointError: the local tensor's shape is not the one its layout gives (e.g. a
            copy made by DCP's default async stager, which sizes tensors globally).
    """
    spec = dt._spec
    if spec.mesh.get_coordinate() is None:
        return None
    sizes, offsets = spec.local_shape_and_offset()
    with DisableTorchFunctionSubclass():
        have = tuple(dt.shape)
    if have != tuple(sizes):
        raise CheckpointError(
            f"DTensor {fqn!r} (global shape {list(spec.shape)}, placements "
            f"{[str(p) for p in spec.placements]}) holds a local tensor of shape {list(have)} "
            f"where its layout gives {list(sizes)}: was it copied by torch.distributed."
            f"checkpoint's default async stager? Pass async_stager=hyper_shard.checkpoint."
            f"DTensorStager() to dcp.async_save, or use hyper_shard.checkpoint.async_save"
        )
    if spec.ndim and 0 in sizes and 0 not in spec.shape:
        return None
    return torch.Size(offsets), torch.Size(sizes)


def reduced_for_save(dt: Any) -> torch.Tensor:
    """This rank's shard of ``dt`` with every Partial mesh dim reduced (a collective over
    those dims when there are any; every rank must call it for the same DTensors in the
    same order). Shard and Replicate DTensors return their local tensor unchanged."""
    spec = dt._spec
    local = _local(dt).detach()
    if not spec.has_partial():
        return local
    from ...dtensor import _redistribute_plain

    target = [Replicate() if type(p) is Partial else p for p in spec.placements]
    return _redistribute_plain(spec.mesh.platform, local, spec, target)


def create_write_items(dt: Any, fqn: str) -> list[Any]:
    """DCP ``__create_write_items__``: this rank's shard as one ``WriteItem`` (none for an
    empty shard). A Partial DTensor is reduced here (see the module docstring)."""
    from torch.distributed.checkpoint.metadata import (
        ChunkStorageMetadata,
        MetadataIndex,
        TensorProperties,
    )
    from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType

    spec = dt._spec
    if spec.has_partial() and spec.mesh.get_coordinate() is not None:
        _REDUCED[dt] = (reduced_for_save(dt), _version(_local(dt)))
    box = _box(dt, fqn)
    if box is None:
        return []
    offsets, sizes = box
    local = _local(dt)
    return [
        WriteItem(
            index=MetadataIndex(fqn, offsets),
            type=WriteItemType.SHARD,
            tensor_data=TensorWriteData(
                chunk=ChunkStorageMetadata(offsets=offsets, sizes=sizes),
                properties=TensorProperties.create_from_tensor(local),
                size=torch.Size(spec.shape),
            ),
        )
    ]


def create_chunk_list(dt: Any) -> list[Any]:
    """DCP ``__create_chunk_list__``: the global box this rank's shard covers.

    Raises:
        CheckpointError: ``dt`` has a ``Partial(sum)`` or ``Partial(prod)`` placement
            (loading the whole value on every rank would change the global value).
    """
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

    spec = dt._spec
    _REDUCED.pop(dt, None)  # a load: never hand DCP a reduced copy of a previous save
    bad = [p for p in spec.placements if type(p) is Partial and p.reduce_op in ("sum", "prod")]
    if bad:
        raise CheckpointError(
            f"torch.distributed.checkpoint.load into a DTensor with placements "
            f"{[str(p) for p in spec.placements]}: a Partial({bad[0].reduce_op}) target would "
            f"receive the whole value on every rank; load into its Replicate form and "
            f"redistribute, or use hyper_shard.checkpoint.load (which does that)"
        )
    box = _box(dt, "<load target>")
    if box is None:
        return []
    offsets, sizes = box
    return [ChunkStorageMetadata(offsets=offsets, sizes=sizes)]


def get_tensor_shard(dt: Any, index: Any) -> torch.Tensor:
    """DCP ``__get_tensor_shard__``: the plain local tensor of the item at ``index`` (an
    alias of this rank's shard; for a Partial DTensor being saved, its reduced shard).

    Raises:
        ValueError: ``index`` names another shard's offset, or a Partial DTensor was changed
            (or not planned) since DCP planned the save.
    """
    box = _box(dt, index.fqn)
    if index.offset is not None and (box is None or torch.Size(index.offset) != box[0]):
        raise ValueError(
            f"DCP asked DTensor {index.fqn!r} for the shard at global offset "
            f"{tuple(index.offset)}, but this rank holds "
            f"{'no shard' if box is None else f'the one at {tuple(box[0])}'}"
        )
    local = _local(dt)
    if dt._spec.has_partial():
        entry = _REDUCED.get(dt)
        if entry is None:  # a load into a Partial(avg|max|min) DTensor: its own buffer
            return local
        if entry[1] == _version(local):
            return entry[0]
        raise ValueError(
            f"DTensor {index.fqn!r} has Partial placements: its reduced value is computed when "
            f"DCP plans the save (__create_write_items__, on every rank), and it was modified "
            f"in place since; save again"
        )
    return local
