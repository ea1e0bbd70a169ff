"""The on-disk format of a hyper_shard checkpoint (the same for torch and MindSpore).

A checkpoint is a directory::

    hyper_shard.json                         the index, written last (the commit)
    shard-<save_id>-r00000.safetensors       the chunks rank 0 wrote
    shard-<save_id>-r00001.safetensors       ...

Each shard file is a plain safetensors file (written with the ``safetensors`` package's
numpy API) holding the chunks one rank wrote, one safetensors entry per chunk, named
``<key>@<offsets>``; its header metadata names the save it belongs to. The index holds,
for every tensor, its dtype, global shape, the layout it was saved from (mesh, dim names,
placements: informational) and its chunks (global offsets, sizes, file, entry, checksum);
for every non-tensor value, its JSON form (tuples and non-string keys tagged) or, when JSON
cannot hold it, a base64 pickle. ``paths`` maps a flat key to its path in the nested state
dict (as torch.distributed.checkpoint's ``planner_data``).

Dtypes are named framework-neutrally (``float32``, ``bfloat16``...). numpy has no bfloat16
or float8: such chunks are stored as same-width unsigned integers holding the raw bits (the
index dtype is the truth).

This module imports no framework.
"""

from __future__ import annotations

import base64
import json
import pickle
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .errors import CheckpointError

__all__ = [
    "FORMAT",
    "VERSION",
    "INDEX_NAME",
    "ChunkEntry",
    "LayoutEntry",
    "TensorEntry",
    "ObjectEntry",
    "Index",
    "read_index",
    "shard_file_name",
    "entry_name",
    "storage_numpy_dtype",
    "encode_object",
    "decode_object",
]

FORMAT = "hyper_shard.checkpoint"
VERSION = 1
INDEX_NAME = "hyper_shard.json"

#: neutral dtype name -> numpy dtype the chunk is stored as (raw bits where numpy lacks it)
_STORAGE = {
    "float64": np.float64,
    "float32": np.float32,
    "float16": np.float16,
    "bfloat16": np.uint16,
    "float8_e4m3fn": np.uint8,
    "float8_e5m2": np.uint8,
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint64": np.uint64,
    "uint32": np.uint32,
    "uint16": np.uint16,
    "uint8": np.uint8,
    "bool": np.bool_,
    "complex64": np.complex64,
    "complex128": np.complex128,
}


def storage_numpy_dtype(dtype: str) -> Any:
    """The numpy dtype a chunk of neutral dtype ``dtype`` is stored as.

    Raises:
        CheckpointError: a dtype the format cannot store.
    """
    try:
        return np.dtype(_STORAGE[dtype])
    except KeyError:
        raise CheckpointError(
            f"dtype {dtype!r} cannot be stored in a hyper_shard checkpoint (supported: "
            f"{', '.join(_STORAGE)})"
        ) from None


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChunkEntry(_Model):
    """One saved chunk: the global box it covers and where its bytes are."""

    offsets: list[int]
    sizes: list[int]
    file: str
    entry: str
    checksum: str = Field(description="row-weighted sum mod 2**64, hex (see checksum.py)")


class LayoutEntry(_Model):
    """The layout a tensor was saved from (informational: loading reshards anyway)."""

    mesh: list[int]
    dim_names: list[str] | None = None
    placements: list[str]


class TensorEntry(_Model):
    dtype: str
    shape: list[int]
    chunks: list[ChunkEntry]
    layout: LayoutEntry | None = None


class ObjectEntry(_Model):
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    json_value: Any = Field(default=None, alias="json")
    pickle: str | None = None


class Index(_Model):
    """The committed index of a checkpoint (``hyper_shard.json``)."""

    format: Literal["hyper_shard.checkpoint"]
    version: int
    save_id: str
    framework: str
    world_size: int
    tensors: dict[str, TensorEntry]
    objects: dict[str, ObjectEntry] = {}
    paths: dict[str, list[str | int]] = {}

    def to_json(self) -> str:
        return json.dumps(self.model_dump(by_alias=True, exclude_none=True), separators=(",", ":"))

    def keys(self) -> list[str]:
        return list(self.tensors) + list(self.objects)

    def check(self, path: Path) -> None:
        """Every tensor's chunks lie inside its shape and cover it exactly once.

        Raises:
            CheckpointError: naming the key and ``path``.
        """
        for key, t in self.tensors.items():
            nd = len(t.shape)
            storage_numpy_dtype(t.dtype)
            total = 0
            for c in t.chunks:
                if (
                    len(c.offsets) != nd
                    or len(c.sizes) != nd
                    or any(
                        o < 0 or s < 0 or o + s > n for o, s, n in zip(c.offsets, c.sizes, t.shape)
                    )
                ):
                    raise CheckpointError(
                        f"checkpoint index {path}: tensor {key!r} has a chunk at offsets "
                        f"{c.offsets} sizes {c.sizes} outside its shape {t.shape} (corrupted index)"
                    )
                total += int(np.prod(c.sizes, dtype=np.int64))
            if total != int(np.prod(t.shape, dtype=np.int64)):
                raise CheckpointError(
                    f"checkpoint index {path}: the chunks of tensor {key!r} cover {total} of its "
                    f"{int(np.prod(t.shape, dtype=np.int64))} elements (corrupted or incomplete "
                    f"index)"
                )


def read_index(directory: str | Path) -> tuple[Index, Path]:
    """Read and validate the committed index of the checkpoint in ``directory``.

    Raises:
        CheckpointError: no committed index (no checkpoint, or a save that never finished),
            or an index that is not valid JSON / not this format (naming the file and field).
    """
    path = Path(directory) / INDEX_NAME
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        hint = ""
        d = Path(directory)
        if d.is_dir() and any(d.glob("shard-*.safetensors")):
            hint = " (shard files are there: a save that did not finish never commits one)"
        elif d.is_dir() and (d / ".metadata").exists():
            hint = " (this is a torch.distributed.checkpoint directory: load it with dcp.load)"
        raise CheckpointError(
            f"no committed checkpoint in {d}: {path} does not exist{hint}"
        ) from None
    except OSError as e:
        raise CheckpointError(f"cannot read the checkpoint index {path}: {e}") from None
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(
            f"checkpoint index {path} is not valid JSON ({e}): corrupted"
        ) from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a {FORMAT} index (format {raw.get('format')!r})")
    try:
        index = Index.model_validate(raw)
    except ValidationError as e:
        err = e.errors()[0]
        loc = ".".join(str(x) for x in err["loc"])
        raise CheckpointError(f"checkpoint index {path}: field {loc}: {err['msg']}") from None
    if index.version > VERSION:
        raise CheckpointError(
            f"checkpoint index {path} has format version {index.version}; this hyper_shard reads "
            f"up to {VERSION}: upgrade hyper_shard"
        )
    index.check(path)
    return index, path


def shard_file_name(save_id: str, rank: int) -> str:
    """The shard file rank ``rank`` writes in save ``save_id``."""
    return f"shard-{save_id}-r{rank:05d}.safetensors"


def entry_name(key: str, offsets: Any) -> str:
    """The safetensors entry of the chunk of ``key`` at global ``offsets``."""
    return f"{key}@{','.join(str(int(o)) for o in offsets)}"


# ---------------------------------------------------------------------- objects
def _to_json(obj: Any) -> Any:
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [_to_json(x) for x in obj]
    if type(obj) is tuple:
        return {"__tuple__": [_to_json(x) for x in obj]}
    if type(obj) is dict:
        if all(isinstance(k, str) and k not in ("__tuple__", "__items__") for k in obj):
            return {k: _to_json(v) for k, v in obj.items()}
        return {"__items__": [[_to_json(k), _to_json(v)] for k, v in obj.items()]}
    raise TypeError(type(obj).__name__)


def _from_json(obj: Any) -> Any:
    if isinstance(obj, list):
        return [_from_json(x) for x in obj]
    if isinstance(obj, dict):
        if set(obj) == {"__tuple__"}:
            return tuple(_from_json(x) for x in obj["__tuple__"])
        if set(obj) == {"__items__"}:
            return {_hashable(_from_json(k)): _from_json(v) for k, v in obj["__items__"]}
        return {k: _from_json(v) for k, v in obj.items()}
    return obj


def _hashable(k: Any) -> Any:
    return tuple(_hashable(x) for x in k) if isinstance(k, list) else k


def encode_object(key: str, obj: Any) -> ObjectEntry:
    """A non-tensor state-dict value as an index entry: JSON when it is made of None,
    bool, int, float, str, lists, tuples and dicts; else a pickle.

    Raises:
        CheckpointError: the value can be neither (naming ``key``).
    """
    try:
        return ObjectEntry(json=_to_json(obj))
    except TypeError:
        pass
    try:
        return ObjectEntry(pickle=base64.b64encode(pickle.dumps(obj, protocol=4)).decode())
    except Exception as e:
        raise CheckpointError(
            f"cannot save state-dict value {key!r} of type {type(obj).__name__}: it is neither "
            f"JSON-serialisable nor picklable ({e})"
        ) from None


def decode_object(key: str, entry: ObjectEntry, path: Path) -> Any:
    """The value an :class:`ObjectEntry` holds.

    Raises:
        CheckpointError: a pickle that does not unpickle here (naming ``key`` and ``path``).
    """
    if entry.pickle is None:
        return _from_json(entry.json_value)
    try:
        return pickle.loads(base64.b64decode(entry.pickle))  # noqa: S301 (the user's own file)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path}: value {key!r} was saved as a pickle that cannot be read here "
            f"({type(e).__name__}: {e})"
        ) from None
