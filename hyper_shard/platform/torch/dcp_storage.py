"""torch.distributed.checkpoint storage for hyper_shard's checkpoint format.

DCP does the planning (which rank writes which chunk, de-duplicated; which slices each
rank reads, resharded); this module only stores and fetches bytes in the
framework-neutral format of :mod:`hyper_shard.checkpoint.format` (one safetensors file
per writing rank, an index committed last), so a torch checkpoint loads on MindSpore and
back:

* :class:`HyperShardWriter` (a DCP ``StorageWriter`` and ``AsyncStager``): each rank
  writes the chunks its plan holds (with a checksum per chunk); the coordinator builds the
  index from DCP's metadata and commits it (temporary name, then rename).
* :class:`HyperShardReader` (a DCP ``StorageReader``): serves every read item from a slice
  of the saved chunk (only those bytes), checks shapes and dtypes against the index, and
  verifies checksums collectively: every rank reports its errors and partial checksums in
  one all-gather, so every rank raises the same error or none does.

Also works with torch's own DTensors and plain tensors (it is only storage).
"""

from __future__ import annotations

import dataclasses
import io
import os
import uuid
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadItemType,
    LoadPlan,
    LoadPlanner,
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.staging import AsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from ...checkpoint import checksum as cs
from ...checkpoint.errors import CheckpointError
from ...checkpoint.format import (
    INDEX_NAME,
    VERSION,
    ChunkEntry,
    Index,
    LayoutEntry,
    ObjectEntry,
    TensorEntry,
    decode_object,
    encode_object,
    entry_name,
    read_index,
    shard_file_name,
    storage_numpy_dtype,
)
from ...checkpoint.storage import ShardFiles, commit, verify_reads, write_shard

__all__ = ["HyperShardWriter", "HyperShardReader", "dtype_name", "torch_dtype", "to_numpy"]


def dtype_name(dtype: torch.dtype) -> str:
    """The format's neutral name of a torch dtype (``torch.float32`` -> ``"float32"``)."""
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a neutral dtype name.

    Raises:
        CheckpointError: torch has no such dtype.
    """
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise CheckpointError(f"dtype {name!r} of the checkpoint is not a torch dtype")
    return dt


def to_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor's data as a C-contiguous numpy array of its storage dtype (raw bits
    for bfloat16 / float8, which numpy lacks). Shares memory where possible."""
    t = t.detach().cpu().contiguous()
    want = storage_numpy_dtype(dtype_name(t.dtype))
    if t.dtype in (torch.bfloat16,):
        return t.view(torch.int16).numpy().view(want)
    if t.dtype.itemsize == 1 and t.dtype.is_floating_point:
        return t.view(torch.uint8).numpy()
    return t.numpy()


def from_numpy(a: np.ndarray, name: str) -> torch.Tensor:
    """The torch tensor (dtype ``name``) whose bits a stored numpy array holds: a view of
    it (also of a read-only memory map: copy it before writing)."""
    dt = torch_dtype(name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "non-writable tensors": only read, by copy_
        t = torch.from_numpy(a)
    if dt is torch.bfloat16:
        return t.view(torch.int16).view(torch.bfloat16)
    if t.dtype != dt:
        return t.view(dt)
    return t


def _layout(obj: Any) -> LayoutEntry | None:
    spec = getattr(obj, "_spec", None)
    if spec is None:
        mesh = getattr(obj, "device_mesh", None)  # torch.distributed.tensor.DTensor
        if mesh is None or not hasattr(obj, "placements"):
            return None
        return LayoutEntry(
            mesh=list(mesh.shape),
            dim_names=list(mesh.mesh_dim_names) if mesh.mesh_dim_names else None,
            placements=[str(p) for p in obj.placements],
        )
    names = spec.mesh.mesh_dim_names
    return LayoutEntry(
        mesh=list(spec.mesh.shape),
        dim_names=list(names) if names else None,
        placements=[str(p) for p in spec.placements],
    )


def _rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def _world() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


# ---------------------------------------------------------------------- writer
class HyperShardWriter(StorageWriter, AsyncStager):
    """Writes a hyper_shard checkpoint through ``torch.distributed.checkpoint.save``.

    Args:
        path: the checkpoint directory (created if missing). Writing over a committed
            checkpoint replaces it only at the final commit.
        sync_files: fsync every file before committing (default True).
        paths: flat key -> path in the nested state dict, recorded in the index (default:
            DCP's own flattening).
    """

    _synchronize_after_execute = False

    def __init__(
        self, path: str | Path, *, sync_files: bool = True, paths: dict | None = None
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.sync_files = sync_files
        self.paths = paths
        self.save_id = uuid.uuid4().hex[:16]
        self.rank = 0
        self.bytes_written = 0

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.save_id = uuid.uuid4().hex[:16]
        self.bytes_written = 0

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")
        self.rank = _rank() if rank is None else int(rank)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise CheckpointError(f"cannot create the checkpoint directory {self.path}: {e}") from e
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return [
            dataclasses.replace(
                p, storage_data={"file": shard_file_name(self.save_id, i), "save_id": self.save_id}
            )
            for i, p in enumerate(plans)
        ]

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        file, save_id = plan.storage_data["file"], plan.storage_data["save_id"]
        flat = getattr(planner, "state_dict", {})
        arrays: dict[str, np.ndarray] = {}
        results = []
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                obj = (
                    flat[fqn]
                    if fqn in flat
                    else torch.load(planner.resolve_data(item), weights_only=False)  # type: ignore[arg-type]
                )
                entry = encode_object(fqn, obj)
                obj_data = {"object": entry.model_dump(by_alias=True, exclude_none=True)}
                results.append(
                    WriteResult(index=item.index, size_in_bytes=0, storage_data=obj_data)
                )
                continue
            assert item.tensor_data is not None and item.tensor_data.chunk is not None
            tensor = planner.resolve_data(item)
            arr = to_numpy(tensor)  # type: ignore[arg-type]
            offsets = tuple(int(o) for o in item.tensor_data.chunk.offsets)
            name = entry_name(fqn, offsets)
            arrays[name] = arr
            layout = _layout(flat.get(fqn))
            data: dict[str, Any] = {
                "file": file,
                "entry": name,
                "sizes": [int(s) for s in item.tensor_data.chunk.sizes],
                "checksum": cs.to_hex(cs.box_checksum(arr)),
                "layout": None if layout is None else layout.model_dump(),
            }
            results.append(
                WriteResult(index=item.index, size_in_bytes=arr.nbytes, storage_data=data)
            )
        if arrays:
            self.bytes_written = write_shard(
                self.path, file, arrays, save_id, self.rank, sync=self.sync_files
            )
        fut: Future[list[WriteResult]] = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        tensors: dict[str, dict] = {}
        objects: dict[str, ObjectEntry] = {}
        for key, md in metadata.state_dict_metadata.items():
            if isinstance(md, TensorStorageMetadata):
                tensors[key] = {
                    "dtype": dtype_name(md.properties.dtype),
                    "shape": [int(s) for s in md.size],
                    "chunks": [],
                    "layout": None,
                }
        for wr in (w for ws in results for w in ws):
            key, data = wr.index.fqn, wr.storage_data
            if "object" in data:
                objects[key] = ObjectEntry.model_validate(data["object"])
                continue
            t = tensors[key]
            t["chunks"].append(
                ChunkEntry(
                    offsets=[int(o) for o in wr.index.offset or ()],
                    sizes=data["sizes"],
                    file=data["file"],
                    entry=data["entry"],
                    checksum=data["checksum"],
                )
            )
            if data["layout"] is not None:
                t["layout"] = LayoutEntry.model_validate(data["layout"])
        paths = self.paths if self.paths is not None else dict(metadata.planner_data or {})
        index = Index(
            format="hyper_shard.checkpoint",
            version=VERSION,
            save_id=self.save_id,
            framework="torch",
            world_size=len(results),
            tensors={k: TensorEntry(**v) for k, v in tensors.items()},
            objects=objects,
            paths={k: list(v) for k, v in paths.items() if k in tensors or k in objects},
        )
        index.check(self.path / INDEX_NAME)
        commit(self.path, index, sync=self.sync_files)

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=str(self.path), save_id=self.save_id)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    # AsyncStager: dcp.async_save stages through the writer (see checkpoint.stage_state_dict)
    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        from .checkpoint import stage_state_dict

        return stage_state_dict(state_dict)

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


# ---------------------------------------------------------------------- reader
class HyperShardReader(StorageReader):
    """Reads a hyper_shard checkpoint through ``torch.distributed.checkpoint.load``.

    Args:
        path: the checkpoint directory.
        process_group: the group ``dcp.load`` runs on (default: the world), used for the
            collective checksum verification.
        index: the checkpoint's index, if already read.
    """

    def __init__(
        self, path: str | Path, *, process_group: Any = None, index: Index | None = None
    ) -> None:
        super().__init__()
        self.path = Path(path)
        self.process_group = process_group
        self.index: Index | None = index
        self.error: str | None = None
        self.bytes_read = 0

    def reset(self, checkpoint_id: str | os.PathLike | None = None) -> None:
        if checkpoint_id:
            self.path = Path(checkpoint_id)
        self.index = None
        self.error = None

    def read_metadata(self) -> Metadata:  # type: ignore[override]
        # (no **kwargs: DCP then does not retry with rank-local metadata, which this
        # format does not have.) An unreadable index is reported by set_up_storage_reader,
        # inside DCP's planning step, whose failures DCP gathers and raises on every rank:
        # DCP would turn an error here into "metadata is None".
        if self.index is None and self.error is None:
            try:
                self.index, _ = read_index(self.path)
            except CheckpointError as e:
                self.error = str(e)
        index = self.index
        if index is None:
            return Metadata(state_dict_metadata={})
        sdm: dict[str, Any] = {}
        storage: dict[MetadataIndex, Any] = {}
        for key, t in index.tensors.items():
            props = TensorProperties(dtype=torch_dtype(t.dtype))
            chunks = []
            for ci, c in enumerate(t.chunks):
                chunks.append(
                    ChunkStorageMetadata(offsets=torch.Size(c.offsets), sizes=torch.Size(c.sizes))
                )
                storage[MetadataIndex(key, torch.Size(c.offsets))] = (key, ci)
            sdm[key] = TensorStorageMetadata(props, torch.Size(t.shape), chunks)
        for key in index.objects:
            sdm[key] = BytesStorageMetadata()
            storage[MetadataIndex(key)] = (key, None)
        return Metadata(
            state_dict_metadata=sdm,
            planner_data={k: tuple(v) for k, v in index.paths.items()},
            storage_data=storage,
            storage_meta=StorageMeta(checkpoint_id=str(self.path), load_id=uuid.uuid4().hex),
        )

    def set_up_storage_reader(
        self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        if self.error is not None:
            raise CheckpointError(self.error)
        self.storage_data = metadata.storage_data
        if self.index is None:
            self.index, _ = read_index(self.path)

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        """Two phases, so that nothing reaches the planner's tensors unless every rank read
        and verified everything: (1) map each read item's slice of its saved chunk (no
        copy), check it against the index and compute its partial checksum; all-gather the
        errors and partial checksums and verify the covered chunks; (2) only then copy the
        slices into their targets (and hand the python values to the planner). The files of
        a committed save are never rewritten (a new save writes new files), so the bytes
        copied are the bytes verified."""
        assert self.index is not None
        index = self.index
        partials: dict = {}
        error = None
        with ShardFiles(self.path, index) as files:
            pending: list = []
            try:
                self._read(plan, planner, index, files, partials, pending)
            except CheckpointError as e:
                error = str(e)
            except Exception as e:  # reported on every rank below
                error = f"{type(e).__name__}: {e}"
            errors = [error] if error else []
            if _world() > 1:
                group = self.process_group
                n = dist.get_world_size(group)
                gathered: list[Any] = [None] * n
                dist.all_gather_object(gathered, (error, partials), group=group)
                errors = [e for e, _ in gathered if e]
                parts = [p for _, p in gathered]
            else:
                parts = [partials]
            if not errors:
                errors = verify_reads(self.path, index, parts)
            if errors:
                more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
                raise CheckpointError(errors[0] + more)
            with torch.no_grad():  # every rank read and verified: write the targets
                for req, target, src in pending:
                    if target is None:
                        planner.load_bytes(req, src)
                        continue
                    target.copy_(src)
                    planner.commit_tensor(req, target)
            self.bytes_read += files.bytes_read
        fut: Future[None] = Future()
        fut.set_result(None)
        return fut

    def _read(
        self,
        plan: LoadPlan,
        planner: LoadPlanner,
        index: Index,
        files: ShardFiles,
        partials: dict,
        pending: list,
    ) -> None:
        """Phase 1 of :meth:`read_data`: every item's source (a view of the mapped file,
        checked and checksummed) and target, appended to ``pending``; nothing written."""
        items = sorted(plan.items, key=self._order)
        for req in items:
            key, ci = self.storage_data[req.storage_index]
            if req.type == LoadItemType.BYTE_IO:
                obj = decode_object(key, index.objects[key], self.path / INDEX_NAME)
                buf = io.BytesIO()
                torch.save(obj, buf)
                buf.seek(0)
                pending.append((req, None, buf))
                continue
            entry = index.tensors[key]
            chunk = entry.chunks[ci]
            starts = tuple(int(s) for s in req.storage_offsets)
            lengths = tuple(int(n) for n in req.lengths)
            arr, part = files.read(key, chunk, starts, lengths)
            partials[(key, ci, starts, lengths)] = part
            src = from_numpy(arr, entry.dtype)
            target = planner.resolve_tensor(req).detach()
            if target.shape != src.shape:
                raise CheckpointError(
                    f"checkpoint {self.path}: a read of {key!r} gives shape "
                    f"{tuple(src.size())} for a target slice of {tuple(target.size())}"
                )
            pending.append((req, target, src))

    def _order(self, req: Any) -> tuple:
        key, ci = self.storage_data[req.storage_index]
        if ci is None or self.index is None:
            return ("", 0)
        return (self.index.tensors[key].chunks[ci].file, ci)

    @property
    def checkpoint_id(self) -> str:
        return str(self.path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike) -> bool:
        return (Path(checkpoint_id) / INDEX_NAME).exists()
