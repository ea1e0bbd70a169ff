"""Shard files, slice reads, checksum verification and the commit of a checkpoint.

* :func:`write_shard`: one rank's chunks into one safetensors file (numpy API), synced.
* :class:`ShardFiles`: reads the slice ``[starts, starts + lengths)`` of a saved chunk and
  nothing else (the file's data memory-mapped behind its safetensors header: the slice's
  pages only, one copy), returning the slice and its partial checksum. A missing, truncated or foreign file, or an entry whose
  shape or dtype differs from the index, raises naming the key and the file.
* :func:`verify_reads`: given every rank's partial checksums, checks each saved chunk the
  ranks read completely (together) against the checksum the index holds.
* :func:`commit`: the commit protocol. Shard files carry the save's id in their name, so a
  new save never overwrites the files of the committed one; the index is written to a
  temporary name, synced, and renamed over ``hyper_shard.json`` (atomic on POSIX), then
  the directory is synced and files of other saves are removed. A save that fails before
  the rename leaves the previous checkpoint (or none) committed: never a partial one.

This module imports no framework.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from . import checksum as cs
from .errors import CheckpointError
from .format import FORMAT, INDEX_NAME, ChunkEntry, Index, storage_numpy_dtype

__all__ = ["write_shard", "ShardFiles", "verify_reads", "commit", "Box"]

#: (key, chunk index, box offsets within the chunk, box sizes) -> partial checksum
Box = tuple[str, int, tuple[int, ...], tuple[int, ...]]


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_shard(
    directory: Path, file: str, arrays: dict[str, Any], save_id: str, rank: int, sync: bool = True
) -> int:
    """Write ``arrays`` (entry name -> C-contiguous numpy array) as the safetensors file
    ``directory / file``; return the bytes of tensor data written.

    Raises:
        CheckpointError: the file cannot be written (naming it).
    """
    from safetensors.numpy import save_file

    path = directory / file
    meta = {"format": FORMAT, "save_id": save_id, "rank": str(rank)}
    try:
        save_file(arrays, str(path), metadata=meta)
        if sync:
            _fsync(path)
    except Exception as e:
        raise CheckpointError(f"cannot write checkpoint file {path}: {e}") from e
    return sum(int(a.nbytes) for a in arrays.values())


class _Mapped:
    """One shard file: its safetensors header (validated against the file's size) and a
    read-only memory map of its data."""

    __slots__ = ("header", "data", "meta")

    def __init__(self, path: Path) -> None:
        size = path.stat().st_size
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError(f"{size} bytes: shorter than a safetensors header")
            n = int.from_bytes(head, "little")
            if n > size - 8 or n > 100 * 2**20:
                raise ValueError(f"header length {n} does not fit the file's {size} bytes")
            header = json.loads(fh.read(n))
        self.meta = header.pop("__metadata__", None) or {}
        end = max((int(e["data_offsets"][1]) for e in header.values()), default=0)
        if 8 + n + end != size:
            raise ValueError(f"the header describes {8 + n + end} bytes, the file has {size}")
        self.header = header
        self.data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n) if end else None


class ShardFiles:
    """Slice reads from the shard files of one committed checkpoint.

    A file is opened once: its safetensors header is parsed and checked against the file's
    size (a truncated or padded file is refused), and its data is memory-mapped, so a read
    touches only the bytes of the slice asked for (one copy, into the caller's buffer).
    """

    def __init__(self, directory: Path, index: Index) -> None:
        self.directory = directory
        self.index = index
        self._open: dict[str, _Mapped] = {}
        self._chunks: dict[tuple[str, str], Any] = {}
        self.bytes_read = 0

    def close(self) -> None:
        self._open.clear()
        self._chunks.clear()

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _keys_in(self, name: str) -> str:
        held = sorted(
            k for k, t in self.index.tensors.items() if any(c.file == name for c in t.chunks)
        )
        return ", ".join(repr(k) for k in held[:5]) + (" ..." if len(held) > 5 else "")

    def _file(self, name: str) -> _Mapped:
        f = self._open.get(name)
        if f is not None:
            return f
        path = self.directory / name
        if not path.exists():
            raise CheckpointError(
                f"checkpoint {self.directory}: file {path} holding {self._keys_in(name)} is missing"
            )
        try:
            f = _Mapped(path)
        except Exception as e:
            raise CheckpointError(
                f"checkpoint file {path} (holding {self._keys_in(name)}) is truncated or "
                f"corrupted: {e}"
            ) from None
        if f.meta.get("format") != FORMAT or f.meta.get("save_id") != self.index.save_id:
            raise CheckpointError(
                f"checkpoint file {path} (holding {self._keys_in(name)}) belongs to save "
                f"{f.meta.get('save_id')!r}, not to the committed save {self.index.save_id!r} "
                f"of {self.directory / INDEX_NAME}"
            )
        self._open[name] = f
        return f

    def _chunk(self, key: str, chunk: ChunkEntry) -> Any:
        """The whole saved chunk as a read-only view of the mapped file, its entry checked
        against the index (once per chunk)."""
        f = self._file(chunk.file)
        path = self.directory / chunk.file
        want = storage_numpy_dtype(self.index.tensors[key].dtype)
        e = f.header.get(chunk.entry)
        if e is None:
            raise CheckpointError(
                f"checkpoint file {path} has no entry {chunk.entry!r} for {key!r} (corrupted or "
                f"replaced file)"
            )
        shape = [int(x) for x in e.get("shape", ())]
        begin, end = (int(x) for x in e["data_offsets"])
        if (
            shape != list(chunk.sizes)
            or np.dtype(_NP.get(e.get("dtype"), "V")) != want
            or end - begin != int(np.prod(shape, dtype=np.int64)) * want.itemsize
        ):
            raise CheckpointError(
                f"checkpoint file {path}: entry {chunk.entry!r} of {key!r} is {e.get('dtype')} "
                f"{shape}, the index says {want} {list(chunk.sizes)} (corrupted file)"
            )
        if f.data is None or end == begin:
            arr = np.zeros(shape, dtype=want)
        else:
            arr = f.data[begin:end].view(want).reshape(shape)
        self._chunks[(chunk.file, chunk.entry)] = arr
        return arr

    def read(
        self, key: str, chunk: ChunkEntry, starts: Sequence[int], lengths: Sequence[int]
    ) -> tuple[Any, int]:
        """The slice ``starts .. starts + lengths`` (relative to the chunk) of a saved chunk
        of ``key`` and its partial checksum. The slice is a read-only numpy view of the
        mapped file (the chunk's storage dtype): copy it where it belongs.

        Raises:
            CheckpointError: the file is missing, truncated, corrupted or from another save,
                or its entry does not match the index (naming ``key`` and the file).
        """
        arr = self._chunks.get((chunk.file, chunk.entry))
        if arr is None:
            arr = self._chunk(key, chunk)
        if len(starts):  # (indexing a 0-d array by () would give a numpy scalar)
            arr = arr[tuple(slice(s, s + n) for s, n in zip(starts, lengths))]
        self.bytes_read += int(arr.nbytes)
        return arr, cs.box_checksum(arr, int(starts[0]) if len(starts) else 0)


#: safetensors dtype names -> numpy dtype names
_NP = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "U16": "uint16",
    "I16": "int16",
    "F16": "float16",
    "U32": "uint32",
    "I32": "int32",
    "F32": "float32",
    "U64": "uint64",
    "I64": "int64",
    "F64": "float64",
    "C64": "complex64",
    "C128": "complex128",
}


def _disjoint(a: tuple, b: tuple) -> bool:
    (ao, asz), (bo, bsz) = a, b
    return any(x >= y + m or y >= x + n for x, n, y, m in zip(ao, asz, bo, bsz))


def verify_reads(directory: Path, index: Index, per_rank: Iterable[dict[Box, int]]) -> list[str]:
    """Check the saved chunks that the ranks' reads cover completely.

    ``per_rank`` holds every rank's partial checksums by box. Identical boxes (replicas
    that read the same slice) count once; a chunk whose distinct boxes are disjoint and
    cover it is checked against the index. Chunks read only in part are not checked.

    Returns:
        One message per corrupted chunk (naming key and file), or ``[]``.
    """
    boxes: dict[tuple[str, int], dict[tuple, int]] = {}
    errors = []
    for part in per_rank:
        for (key, ci, off, size), value in part.items():
            seen = boxes.setdefault((key, ci), {})
            prev = seen.setdefault((off, size), value)
            if prev != value:
                chunk = index.tensors[key].chunks[ci]
                errors.append(
                    f"checkpoint file {directory / chunk.file}: two ranks read different bytes "
                    f"for {key!r} at the same place (the file changed while loading)"
                )
    for (key, ci), got in boxes.items():
        chunk = index.tensors[key].chunks[ci]
        vol = sum(int(np.prod(s, dtype=np.int64)) for _, s in got)
        if vol != int(np.prod(chunk.sizes, dtype=np.int64)):
            continue
        keys = list(got)
        if any(not _disjoint(keys[i], keys[j]) for i in range(len(keys)) for j in range(i)):
            continue
        if cs.add(*got.values()) != cs.from_hex(chunk.checksum):
            errors.append(
                f"checkpoint file {directory / chunk.file}: the data of {key!r} (chunk at "
                f"offsets {chunk.offsets}) does not match its checksum: corrupted file"
            )
    return errors


def commit(directory: Path, index: Index, sync: bool = True) -> None:
    """Commit ``index`` as the checkpoint in ``directory`` (see the module docstring) and
    remove shard files of other saves.

    Raises:
        CheckpointError: the index cannot be written or renamed.
    """
    final = directory / INDEX_NAME
    tmp = directory / f"{INDEX_NAME}.tmp-{index.save_id}"
    try:
        tmp.write_text(index.to_json(), encoding="utf-8")
        if sync:
            _fsync(tmp)
        os.replace(tmp, final)
        if sync:
            _fsync(directory)
    except OSError as e:
        raise CheckpointError(f"cannot commit checkpoint index {final}: {e}") from e
    keep = {c.file for t in index.tensors.values() for c in t.chunks}
    for p in directory.glob("shard-*.safetensors"):
        if p.name not in keep:
            with contextlib.suppress(OSError):
                p.unlink()
    for p in directory.glob(f"{INDEX_NAME}.tmp-*"):
        with contextlib.suppress(OSError):
            p.unlink()
