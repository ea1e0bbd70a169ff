"""Shard files, slice reads, checksum verification and the commit of a checkpoint.

* :func:`write_shard`: one rank's chunks into one safetensors file (numpy API), synced.
* :class:`ShardFiles`: reads the slice ``[starts, starts + lengths)`` of a saved chunk and
  nothing else (safetensors maps the file and copies just those elements), returning the
  slice and its partial checksum. A missing, truncated or foreign file, or an entry whose
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


class ShardFiles:
    """Slice reads from the shard files of one committed checkpoint (files opened once)."""

    def __init__(self, directory: Path, index: Index) -> None:
        self.directory = directory
        self.index = index
        self._open: dict[str, Any] = {}
        self._stack = contextlib.ExitStack()
        self.bytes_read = 0

    def close(self) -> None:
        self._stack.close()
        self._open.clear()

    def __enter__(self) -> ShardFiles:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _file(self, name: str, key: str) -> Any:
        f = self._open.get(name)
        if f is not None:
            return f
        from safetensors import safe_open

        path = self.directory / name
        held = sorted(
            k for k, t in self.index.tensors.items() if any(c.file == name for c in t.chunks)
        )
        keys = ", ".join(repr(k) for k in held[:5]) + (" ..." if len(held) > 5 else "")
        if not path.exists():
            raise CheckpointError(
                f"checkpoint {self.directory}: file {path} holding {keys} is missing"
            )
        try:
            f = self._stack.enter_context(safe_open(str(path), framework="np"))
        except Exception as e:
            raise CheckpointError(
                f"checkpoint file {path} (holding {keys}) is truncated or corrupted: {e}"
            ) from None
        meta = f.metadata() or {}
        if meta.get("format") != FORMAT or meta.get("save_id") != self.index.save_id:
            raise CheckpointError(
                f"checkpoint file {path} (holding {keys}) belongs to save "
                f"{meta.get('save_id')!r}, not to the committed save {self.index.save_id!r} "
                f"of {self.directory / INDEX_NAME}"
            )
        self._open[name] = f
        return f

    def read(
        self, key: str, chunk: ChunkEntry, starts: Sequence[int], lengths: Sequence[int]
    ) -> tuple[Any, int]:
        """The slice ``starts .. starts + lengths`` (relative to the chunk) of a saved chunk
        of ``key``, as a numpy array of the chunk's storage dtype, and its partial checksum.

        Raises:
            CheckpointError: the file is missing, truncated, corrupted or from another save,
                or its entry does not match the index (naming ``key`` and the file).
        """
        f = self._file(chunk.file, key)
        path = self.directory / chunk.file
        want = storage_numpy_dtype(self.index.tensors[key].dtype)
        try:
            sl = f.get_slice(chunk.entry)
        except Exception:
            raise CheckpointError(
                f"checkpoint file {path} has no entry {chunk.entry!r} for {key!r} (corrupted or "
                f"replaced file)"
            ) from None
        shape = list(sl.get_shape())
        if shape != list(chunk.sizes) or np.dtype(_NP.get(sl.get_dtype(), "V")) != want:
            raise CheckpointError(
                f"checkpoint file {path}: entry {chunk.entry!r} of {key!r} is {sl.get_dtype()} "
                f"{shape}, the index says {want} {list(chunk.sizes)} (corrupted file)"
            )
        idx = tuple(slice(s, s + n) for s, n in zip(starts, lengths))
        try:
            arr = sl[idx]
        except Exception as e:
            raise CheckpointError(
                f"checkpoint file {path}: cannot read {key!r} ({e}): truncated or corrupted"
            ) from None
        arr = np.asarray(arr)
        if arr.shape != tuple(lengths) and arr.size == int(np.prod(lengths, dtype=np.int64)):
            arr = arr.reshape(tuple(lengths))  # a 0-d slice comes back as shape (1,)
        if arr.dtype != want:  # safetensors returns e.g. bool for BOOL: same bits
            arr = arr.view(want)
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
