"""hyper_shard.checkpoint on MindSpore: the same files as on torch, planned without DCP.

The framework-neutral parts do the work: :mod:`hyper_shard.checkpoint.layout` (which rank
writes which box, what each rank reads), :mod:`~hyper_shard.checkpoint.format` (the index),
:mod:`~hyper_shard.checkpoint.storage` (safetensors files, checksums, the commit). This
adapter only turns MindSpore tensors into numpy arrays and back, and runs the two
agreements over the world group (``all_gather_object``), so every rank raises the same
error or none does.

State dicts are mappings (nested as on torch) of ``mindspore.Parameter`` / ``Tensor``
values (DTensors or plain) and python values, e.g. ``net.parameters_dict()``.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Tensor

from ...checkpoint import checksum as cs
from ...checkpoint.errors import CheckpointError
from ...checkpoint.format import (
    INDEX_NAME,
    VERSION,
    ChunkEntry,
    Index,
    LayoutEntry,
    TensorEntry,
    decode_object,
    encode_object,
    entry_name,
    read_index,
    shard_file_name,
    storage_numpy_dtype,
)
from ...checkpoint.layout import Chunk, assign_writers, chunk_of, read_boxes
from ...checkpoint.state import flatten, rename, set_element
from ...checkpoint.storage import ShardFiles, commit, verify_reads, write_shard
from ...dtensor import DTensor
from ...placement import Partial, Replicate
from ..select import get_platform

__all__ = ["save", "load", "async_save", "dtype_name", "ms_dtype"]

_NAMES = {
    ms.float64: "float64",
    ms.float32: "float32",
    ms.float16: "float16",
    ms.bfloat16: "bfloat16",
    ms.int64: "int64",
    ms.int32: "int32",
    ms.int16: "int16",
    ms.int8: "int8",
    ms.uint64: "uint64",
    ms.uint32: "uint32",
    ms.uint16: "uint16",
    ms.uint8: "uint8",
    ms.bool_: "bool",
    ms.complex64: "complex64",
    ms.complex128: "complex128",
}
_DTYPES = {v: k for k, v in _NAMES.items()}


def dtype_name(dtype: Any) -> str:
    """The format's neutral name of a MindSpore dtype (``mindspore.float32`` ->
    ``"float32"``).

    Raises:
        CheckpointError: a dtype the format does not store.
    """
    try:
        return _NAMES[dtype]
    except KeyError:
        raise CheckpointError(f"MindSpore dtype {dtype} cannot be stored in a checkpoint") from None


def ms_dtype(name: str) -> Any:
    """The MindSpore dtype of a neutral dtype name.

    Raises:
        CheckpointError: MindSpore has no such dtype.
    """
    try:
        return _DTYPES[name]
    except KeyError:
        raise CheckpointError(
            f"dtype {name!r} of the checkpoint is not a MindSpore dtype"
        ) from None


def _is_tensor(v: Any) -> bool:
    return isinstance(v, Tensor)


def _plat() -> Any:
    plat = get_platform("mindspore")
    plat.ensure_initialized(str(ms.get_context("device_target")))
    return plat


class _World:
    """The world group of the MindSpore job (its rank, size and object all-gather)."""

    def __init__(self) -> None:
        self.plat = _plat()
        self.rank = self.plat.get_rank()
        self.size = self.plat.get_world_size()
        self.group = self.plat.new_group(list(range(self.size))) if self.size > 1 else None

    def gather(self, obj: Any) -> list[Any]:
        if self.size == 1:
            return [obj]
        return self.plat.all_gather_object(obj, self.group, self.size)

    def agree(self, error: str | None) -> None:
        """Raise on every rank if any rank had an error."""
        errors = [e for e in self.gather(error) if e]
        if errors:
            more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
            raise CheckpointError(errors[0] + more)


def _reduced(v: Any) -> Any:
    """``v`` with its ``Partial`` mesh dims reduced (a collective over them, so every rank
    calls it for the same tensors in the same order); other values unchanged."""
    if isinstance(v, DTensor) and v._spec.has_partial():
        spec = v._spec
        target = [Replicate() if type(p) is Partial else p for p in spec.placements]
        return v.redistribute(spec.mesh, target)
    return v


def _local_numpy(v: Any) -> np.ndarray:
    """The local data of a DTensor or the value of a plain tensor, as a C-contiguous numpy
    array of its storage dtype."""
    local = _plat().local_of(v) if isinstance(v, DTensor) else v
    if local.dtype == ms.bfloat16:
        return np.ascontiguousarray(local.view(ms.uint16).asnumpy())
    return np.ascontiguousarray(local.asnumpy())


def _to_ms(a: np.ndarray, name: str) -> Tensor:
    if name == "bfloat16":
        return Tensor(np.ascontiguousarray(a)).view(ms.bfloat16)
    return Tensor(np.ascontiguousarray(a))


def _box(v: Any) -> tuple[Chunk | None, Any]:
    """(this rank's box, the spec or None) of a tensor leaf; a plain tensor is whole on
    every rank."""
    if isinstance(v, DTensor):
        spec = v._spec
        coord = spec.mesh.get_coordinate()
        return (None if coord is None else chunk_of(spec, coord)), spec
    shape = tuple(int(s) for s in v.shape)
    return Chunk((0,) * len(shape), shape), None


def _layout(spec: Any) -> LayoutEntry | None:
    if spec is None:
        return None
    names = spec.mesh.mesh_dim_names
    return LayoutEntry(
        mesh=list(spec.mesh.shape),
        dim_names=list(names) if names else None,
        placements=[str(p) for p in spec.placements],
    )


# ---------------------------------------------------------------------- save
def save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    format: str = "hyper_shard",
    process_group: Any = None,
) -> int:
    """See :func:`hyper_shard.checkpoint.save`."""
    if format != "hyper_shard":
        raise ValueError(
            f"hyper_shard.checkpoint.save on MindSpore: format {format!r} (only "
            f"'hyper_shard'; 'hf' is torch only)"
        )
    path = Path(checkpoint_id)
    world = _World()
    flat, paths = rename(*flatten(state_dict, _is_tensor), key_map)
    save_id = world.gather(uuid.uuid4().hex[:16])[0]
    file = shard_file_name(save_id, world.rank)
    # the plan: which ranks hold each box (one all-gather of the boxes: a DTensor on a
    # sub-mesh has replicas on ranks its own mesh does not list), then the same writer per
    # box computed on every rank
    tensors = {k: v for k, v in flat.items() if _is_tensor(v)}
    boxes = {k: _box(v) for k, v in tensors.items()}
    mine_all = {k: b[0] for k, b in boxes.items() if b[0] is not None}
    hold: dict[tuple[str, Chunk], list[int]] = {}
    for r, theirs in enumerate(world.gather(mine_all)):
        for k, c in theirs.items():
            hold.setdefault((k, Chunk(*c)), []).append(r)
    items = []
    for (k, c), ranks in hold.items():
        itemsize = np.dtype(storage_numpy_dtype(dtype_name(tensors[k].dtype))).itemsize
        items.append((k, c, ranks, c.numel * itemsize))
    writers = assign_writers(items)
    error = None
    chunks: dict[str, list[dict]] = {}
    objects: dict[str, Any] = {}
    nbytes = 0
    # every rank, in the same order, before anything may fail on one rank only: the
    # all-reduce of each Partial DTensor
    reduced = {k: _reduced(v) for k, v in tensors.items()}
    try:
        path.mkdir(parents=True, exist_ok=True)
        arrays: dict[str, np.ndarray] = {}
        for k, v in reduced.items():
            mine = boxes[k][0]
            if mine is None or writers.get((k, mine)) != world.rank:
                continue
            arr = _local_numpy(v)
            name = entry_name(k, mine.offsets)
            arrays[name] = arr
            chunks[k] = [
                ChunkEntry(
                    offsets=list(mine.offsets),
                    sizes=list(mine.sizes),
                    file=file,
                    entry=name,
                    checksum=cs.to_hex(cs.box_checksum(arr)),
                ).model_dump()
            ]
        if world.rank == 0:
            for k, v in flat.items():
                if not _is_tensor(v):
                    objects[k] = encode_object(k, v).model_dump(by_alias=True, exclude_none=True)
        if arrays:
            nbytes = write_shard(path, file, arrays, save_id, world.rank)
    except CheckpointError as e:
        error = str(e)
    except Exception as e:
        error = f"rank {world.rank}: {type(e).__name__}: {e}"
    gathered = world.gather((error, chunks, objects))
    world.agree(next((e for e, _, _ in gathered if e), None))
    error = None
    if world.rank == 0:
        try:
            entries: dict[str, TensorEntry] = {}
            for k, v in tensors.items():
                found = [ChunkEntry(**c) for _, ch, _ in gathered for c in ch.get(k, [])]
                entries[k] = TensorEntry(
                    dtype=dtype_name(v.dtype),
                    shape=[int(s) for s in v.shape],
                    chunks=sorted(found, key=lambda c: c.offsets),
                    layout=_layout(boxes[k][1]),
                )
            index = Index(
                format="hyper_shard.checkpoint",
                version=VERSION,
                save_id=save_id,
                framework="mindspore",
                world_size=world.size,
                tensors=entries,
                objects=gathered[0][2],
                paths={k: list(p) for k, p in paths.items()},
            )
            index.check(path / INDEX_NAME)
            commit(path, index)
        except CheckpointError as e:
            error = str(e)
        except Exception as e:
            error = f"rank 0: {type(e).__name__}: {e}"
    world.agree(error)
    return nbytes


def async_save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    process_group: Any = None,
) -> Any:
    """MindSpore has no background checkpoint engine here: :func:`save`, then a done
    future (the same files)."""
    import concurrent.futures

    fut: concurrent.futures.Future = concurrent.futures.Future()
    fut.set_result(save(state_dict, checkpoint_id, key_map=key_map))
    return fut


# ---------------------------------------------------------------------- load
def _check(
    flat: dict[str, Any], index: Index, src: Path, strict: bool, allow_dtype_cast: bool
) -> None:
    saved = set(index.tensors) | set(index.objects)
    missing = [k for k in flat if k not in saved]
    unexpected = [k for k in index.keys() if k not in flat] if strict else []
    if missing or unexpected:
        parts = []
        if missing:
            parts.append(f"missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
        if unexpected:
            parts.append(
                f"unexpected key(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
            )
        raise CheckpointError(
            f"checkpoint {src}: {'; '.join(parts)} (a checkpoint of another model? pass "
            f"key_map= to rename, strict=False to ignore extra keys)"
        )
    for k, v in flat.items():
        is_t = k in index.tensors
        if is_t != _is_tensor(v):
            what = "a tensor" if is_t else "a non-tensor value"
            raise CheckpointError(
                f"checkpoint {src}: {k!r} is saved as {what}, the state dict holds a "
                f"{type(v).__name__}"
            )
        if not is_t:
            continue
        t = index.tensors[k]
        if [int(s) for s in v.shape] != t.shape:
            raise CheckpointError(
                f"checkpoint {src}: {k!r} has global shape {t.shape} in the checkpoint, "
                f"{[int(s) for s in v.shape]} in the state dict"
            )
        if dtype_name(v.dtype) != t.dtype and not allow_dtype_cast:
            raise CheckpointError(
                f"checkpoint {src}: {k!r} is saved as {t.dtype}, the state dict holds "
                f"{dtype_name(v.dtype)}; pass allow_dtype_cast=True to cast it"
            )


def _read(k: str, v: Any, index: Index, files: ShardFiles, partials: dict) -> np.ndarray | None:
    """This rank's box of ``k`` read from the saved chunks (None: it holds no data)."""
    mine = _box(v)[0]
    entry = index.tensors[k]
    if mine is None:
        return None
    buf = np.empty(mine.sizes, dtype=storage_numpy_dtype(entry.dtype))
    saved = [Chunk(tuple(c.offsets), tuple(c.sizes)) for c in entry.chunks]
    for r in read_boxes(saved, mine):
        arr, part = files.read(k, entry.chunks[r.chunk], r.src, r.lengths)
        partials[(k, r.chunk, r.src, r.lengths)] = part
        buf[tuple(slice(d, d + n) for d, n in zip(r.dst, r.lengths))] = arr
    return buf


def _commit(v: Any, buf: np.ndarray | None, name: str) -> None:
    """Copy a loaded box into the leaf ``v`` in place (a Partial(sum) target keeps the
    value on coordinate 0 of each partial mesh dim, zeros elsewhere)."""
    if buf is None:
        return
    if isinstance(v, DTensor):
        spec = v._spec
        coord = spec.mesh.get_coordinate()
        if coord is not None and any(
            type(p) is Partial and p.reduce_op == "sum" and coord[m] != 0
            for m, p in enumerate(spec.placements)
        ):
            buf = np.zeros_like(buf)
    new = _to_ms(buf, name)
    if new.dtype != v.dtype:
        new = new.astype(v.dtype)
    Tensor.assign_value(v, new)


def load(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    strict: bool = True,
    allow_dtype_cast: bool = False,
    process_group: Any = None,
) -> None:
    """See :func:`hyper_shard.checkpoint.load`."""
    path = Path(checkpoint_id)
    world = _World()
    flat, paths = rename(*flatten(state_dict, _is_tensor), key_map)
    error = None
    index = None
    try:
        index, ipath = read_index(path)
        _check(flat, index, ipath, strict, allow_dtype_cast)
    except CheckpointError as e:
        error = str(e)
    world.agree(error)
    assert index is not None
    bufs: dict[str, Any] = {}
    values: dict[str, Any] = {}
    partials: dict = {}
    error = None
    try:
        with ShardFiles(path, index) as files:
            for k, v in flat.items():
                if _is_tensor(v):
                    bufs[k] = _read(k, v, index, files, partials)
                else:
                    values[k] = decode_object(k, index.objects[k], path / INDEX_NAME)
    except CheckpointError as e:
        error = str(e)
    except Exception as e:
        error = f"rank {world.rank}: {type(e).__name__}: {e}"
    gathered = world.gather((error, partials))
    errors = [e for e, _ in gathered if e]
    if not errors:
        errors = verify_reads(path, index, [p for _, p in gathered])
    if errors:
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise CheckpointError(errors[0] + more)
    for k, v in flat.items():  # every rank read and verified its slices: commit
        if _is_tensor(v):
            _commit(v, bufs[k], index.tensors[k].dtype)
        else:
            set_element(state_dict, paths[k], values[k])
