"""hyper_shard.checkpoint on torch: save / load / async_save through torch.distributed.checkpoint.

The framework-neutral API is :mod:`hyper_shard.checkpoint`; this is its torch adapter.
Everything goes through DCP (``dcp.save``, ``dcp.load``, ``dcp.async_save``): the
DTensors describe their shards with DCP's tensor-subclass protocol (``dcp.py``), the
storage is :mod:`.dcp_storage` (or DCP's own ``FileSystemReader`` and the Hugging Face
safetensors reader/writer). What this module adds around DCP:

* **checked loads** (:class:`CheckedLoadPlanner`): every key of the state dict must be in
  the checkpoint with the same global shape and dtype (unless ``allow_dtype_cast``) and,
  with ``strict``, the checkpoint may hold no other key; errors name the keys and the
  checkpoint. They are raised while DCP plans, so every rank raises them.
* **atomic loads**: a hyper_shard checkpoint's :class:`HyperShardReader` maps every slice
  a rank needs, checks and checksums it, all-gathers the errors and checksums, and only
  then copies the slices into the tensors, so DCP loads straight into the state dict (a
  ``Partial(sum)`` target reads into a Replicate *shadow* buffer, committed after). DCP's
  own readers (plain DCP and Hugging Face directories) write as they read: they load into
  shadow buffers of the same layouts, copied into the tensors once every rank succeeded.
  A failed load changes nothing.
* **key maps**: ``key_map`` maps a state-dict key to the checkpoint's name for it (loading
  a checkpoint of another framework or naming scheme).
* **async staging** (:func:`stage_state_dict`): ``async_save`` copies the local shards to
  CPU (reducing ``Partial`` values) on the calling thread, then writes in the background
  on a dedicated process group, so training collectives never interleave with the save's.
"""

from __future__ import annotations

import concurrent.futures
import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch._C import DisableTorchFunctionSubclass
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.stateful import Stateful

from ...checkpoint.errors import CheckpointError
from ...checkpoint.format import INDEX_NAME
from ...checkpoint.state import rename
from ...dtensor import DTensor
from ...placement import Partial, Replicate
from . import dcp as _dcp
from .dcp_storage import HyperShardReader, HyperShardWriter

__all__ = ["save", "load", "async_save", "stage_state_dict", "CheckedLoadPlanner"]

_FORMATS = ("hyper_shard", "hf")


# ---------------------------------------------------------------------- helpers
def _local(dt: Any) -> torch.Tensor:
    with DisableTorchFunctionSubclass():
        return dt.as_subclass(torch.Tensor)


def _error(e: CheckpointException) -> CheckpointError:
    """The first rank's failure of a DCP collective as a CheckpointError (the same
    message on every rank)."""
    failures = e.failures
    for rank in sorted(failures):
        exc = failures[rank][0]
        if isinstance(exc, CheckpointError):
            return CheckpointError(str(exc))
    rank = min(failures)
    exc = failures[rank][0]
    return CheckpointError(f"rank {rank}: {type(exc).__name__}: {exc}")


def _resolve(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Stateful values replaced by their ``state_dict()`` (as dcp.save does)."""
    return {k: v.state_dict() if isinstance(v, Stateful) else v for k, v in state_dict.items()}


def _flat(state_dict: dict[str, Any], key_map: Mapping[str, str] | None) -> tuple[dict, dict]:
    """(checkpoint key -> leaf, checkpoint key -> path in ``state_dict``), flattened as DCP
    flattens, renamed by ``key_map`` (state-dict key -> checkpoint key)."""
    flat, paths = flatten_state_dict(state_dict)
    return rename(flat, paths, key_map)


def _detect(path: Path) -> str:
    if (path / INDEX_NAME).exists():
        return "hyper_shard"
    if (path / ".metadata").exists():
        return "dcp"
    if path.is_dir() and any(
        not p.name.startswith("shard-") for p in path.glob("*.safetensors")
    ):  # (shard-*.safetensors without an index: a hyper_shard save that never committed)
        return "hf"
    return "hyper_shard"  # read_index raises the clear "no committed checkpoint" error


def _reader(path: Path, kind: str, process_group: Any) -> Any:
    if kind == "hyper_shard":
        # (an unreadable index raises inside DCP's planning step, on every rank)
        return HyperShardReader(path, process_group=process_group)
    if kind == "dcp":
        return dcp.FileSystemReader(path)
    return dcp.HuggingFaceStorageReader(str(path))


def _needs_shadow(v: Any) -> bool:
    """A ``Partial(sum|prod)`` DTensor: DCP must read it in its Replicate form."""
    return isinstance(v, DTensor) and any(
        type(p) is Partial and p.reduce_op in ("sum", "prod") for p in v._spec.placements
    )


def _shadow(v: Any) -> Any:
    """A fresh buffer with ``v``'s layout (Partial(sum|prod) -> Replicate) to load into."""
    if isinstance(v, DTensor):
        from .dtensor import make_leaf

        spec = v._spec
        placements = [
            Replicate() if type(p) is Partial and p.reduce_op in ("sum", "prod") else p
            for p in spec.placements
        ]
        local = _local(v)
        with DisableTorchFunctionSubclass():
            buf = torch.empty_like(local, memory_format=torch.contiguous_format)
        return make_leaf(buf, spec.with_placements(placements), False)
    if isinstance(v, torch.Tensor):
        with DisableTorchFunctionSubclass():
            return torch.empty_like(v, memory_format=torch.contiguous_format)
    return copy.copy(v)


@torch.no_grad()
def _commit_tensor(dst: Any, src: Any) -> None:
    """Copy the loaded ``src`` into ``dst`` in place (a Partial(sum) target keeps the value
    on coordinate 0 of each partial mesh dim and zeros elsewhere)."""
    if isinstance(dst, DTensor):
        spec = dst._spec
        local, value = _local(dst), _local(src)
        coord = spec.mesh.get_coordinate()
        zero = coord is not None and any(
            type(p) is Partial and p.reduce_op == "sum" and coord[m] != 0
            for m, p in enumerate(spec.placements)
        )
        with DisableTorchFunctionSubclass():
            if zero:
                local.zero_()
            else:
                local.copy_(value)
        return
    with DisableTorchFunctionSubclass():
        dst.copy_(src)


# ---------------------------------------------------------------------- planner
class CheckedLoadPlanner(DefaultLoadPlanner):
    """DCP's default load planner plus the checks of ``hyper_shard.checkpoint.load``.

    Args:
        source: how errors name the checkpoint (its directory or index file).
        strict: the checkpoint must hold no key the state dict lacks (a checkpoint of
            another model raises).
        allow_dtype_cast: load a tensor saved in another dtype, casting it.
    """

    def __init__(self, source: str, *, strict: bool = True, allow_dtype_cast: bool = False) -> None:
        super().__init__(allow_partial_load=False)
        self.source = source
        self.strict = strict
        self.allow_dtype_cast = allow_dtype_cast

    def create_local_plan(self) -> Any:
        assert self.metadata is not None
        saved = self.metadata.state_dict_metadata
        src = self.source
        missing = [k for k in self.state_dict if k not in saved]
        unexpected = [k for k in saved if k not in self.state_dict] if self.strict else []
        if missing or unexpected:
            parts = []
            if missing:
                parts.append(f"missing key(s) {missing[:5]}{' ...' if len(missing) > 5 else ''}")
            if unexpected:
                parts.append(
                    f"unexpected key(s) {unexpected[:5]}{' ...' if len(unexpected) > 5 else ''}"
                )
            hint = (
                " (a checkpoint of another model? pass key_map= to rename, strict=False to "
                "ignore extra keys)"
            )
            raise CheckpointError(f"checkpoint {src}: {'; '.join(parts)}{hint}")
        for key, obj in self.state_dict.items():
            md = saved[key]
            is_tensor = isinstance(md, TensorStorageMetadata)
            if is_tensor != isinstance(obj, torch.Tensor):
                what = "a tensor" if is_tensor else "a non-tensor value"
                raise CheckpointError(
                    f"checkpoint {src}: {key!r} is saved as {what}, the state dict holds a "
                    f"{type(obj).__name__}"
                )
            if not is_tensor:
                continue
            shape, saved_shape = tuple(obj.size()), tuple(md.size)  # type: ignore[union-attr]
            if shape != saved_shape:
                raise CheckpointError(
                    f"checkpoint {src}: {key!r} has global shape {list(saved_shape)} in the "
                    f"checkpoint, {list(shape)} in the state dict"
                )
            sd = md.properties.dtype  # type: ignore[union-attr]
            if obj.dtype != sd and not self.allow_dtype_cast:
                raise CheckpointError(
                    f"checkpoint {src}: {key!r} is saved as {sd}, the state dict holds "
                    f"{obj.dtype}; pass allow_dtype_cast=True to cast it"
                )
        return super().create_local_plan()


# ---------------------------------------------------------------------- API
def save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    format: str = "hyper_shard",
    process_group: Any = None,
) -> int:
    """See :func:`hyper_shard.checkpoint.save`. Returns the bytes this rank wrote."""
    path = Path(checkpoint_id)
    if format not in _FORMATS:
        raise ValueError(f"hyper_shard.checkpoint.save: format {format!r}; use one of {_FORMATS}")
    flat, paths = _flat(_resolve(state_dict), key_map)
    if format == "hf":
        bad = [k for k, v in flat.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise CheckpointError(
                f"format='hf' holds tensors only; {bad[:5]} are not tensors (save them with "
                f"format='hyper_shard')"
            )
        writer: Any = dcp.HuggingFaceStorageWriter(
            str(path), save_distributed=True, enable_consolidation=True
        )
    else:
        writer = HyperShardWriter(path, paths=paths)
    try:
        dcp.save(flat, storage_writer=writer, process_group=process_group)
    except CheckpointException as e:
        raise _error(e) from None
    finally:
        _dcp._REDUCED.clear()
    return int(getattr(writer, "bytes_written", 0))


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
    resolved = _resolve(state_dict)
    flat, paths = _flat(resolved, key_map)
    kind = _detect(path)
    # HyperShardReader writes no tensor before every rank read and verified everything
    # (its read_data), so DCP loads straight into the state's tensors; DCP's own readers
    # write as they read, so they load into shadow buffers, copied in after success.
    # Python values always go to copies, set in the state dict at the end.
    direct = kind == "hyper_shard"
    shadow = {
        k: v if direct and isinstance(v, torch.Tensor) and not _needs_shadow(v) else _shadow(v)
        for k, v in flat.items()
    }
    source = str(path / INDEX_NAME) if kind == "hyper_shard" else str(path)
    planner = CheckedLoadPlanner(source, strict=strict, allow_dtype_cast=allow_dtype_cast)
    try:
        dcp.load(
            shadow,
            storage_reader=_reader(path, kind, process_group),
            planner=planner,
            process_group=process_group,
        )
    except CheckpointException as e:
        raise _error(e) from None
    for k, v in flat.items():  # every rank read and verified its slices: commit
        if isinstance(v, torch.Tensor):
            if shadow[k] is not v:
                _commit_tensor(v, shadow[k])
        else:
            set_element(resolved, paths[k], shadow[k])
    for k, v in state_dict.items():
        if isinstance(v, Stateful):
            v.load_state_dict(resolved[k])
        elif resolved[k] is not v:  # a top-level python value
            state_dict[k] = resolved[k]  # type: ignore[index]


# ---------------------------------------------------------------------- async
def stage_state_dict(state_dict: Any) -> Any:
    """A copy of ``state_dict`` that later training steps cannot change: DTensor shards
    copied to CPU with ``Partial`` mesh dims reduced (a collective on the calling thread,
    as every rank stages the same state dict), plain tensors copied to CPU, other values
    deep-copied. This is the ``AsyncStager.stage`` of :class:`HyperShardWriter` and
    :class:`DTensorStager`."""
    from .dtensor import make_leaf

    def go(v: Any) -> Any:
        if isinstance(v, DTensor):
            spec = v._spec
            local = _dcp.reduced_for_save(v)
            with DisableTorchFunctionSubclass():
                cpu = local.detach().to("cpu", copy=True).contiguous()
            pl = [Replicate() if type(p) is Partial else p for p in spec.placements]
            return make_leaf(cpu, spec.with_placements(pl), False)
        if isinstance(v, torch.Tensor):
            with DisableTorchFunctionSubclass():
                return v.detach().to("cpu", copy=True)
        if isinstance(v, Mapping):
            return {k: go(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            out = [go(x) for x in v]
            return out if isinstance(v, list) else tuple(out)
        return copy.deepcopy(v)

    return go(state_dict)


class DTensorStager:
    """An ``AsyncStager`` for ``torch.distributed.checkpoint.async_save`` with hyper_shard
    DTensors and DCP's own writers: ``dcp.async_save(sd, checkpoint_id=d,
    async_stager=DTensorStager())``. (DCP's default stager copies a tensor by its global
    size, which does not fit a DTensor whose storage is its local shard.)"""

    should_synchronize_after_execute = False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return stage_state_dict(state_dict)

    def synchronize_staging(self) -> None:
        return None

    def close(self) -> None:
        return None


_GROUPS: dict[int, Any] = {}


def _save_group() -> Any:
    """A gloo group over the world for background saves (created once; a collective)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    key = id(dist.group.WORLD)
    if key not in _GROUPS:
        _GROUPS[key] = dist.new_group(backend="gloo")
    return _GROUPS[key]


def async_save(
    state_dict: Mapping[str, Any],
    checkpoint_id: str | Path,
    *,
    key_map: Mapping[str, str] | None = None,
    process_group: Any = None,
) -> concurrent.futures.Future:
    """See :func:`hyper_shard.checkpoint.async_save`."""
    path = Path(checkpoint_id)
    flat, paths = _flat(_resolve(state_dict), key_map)
    writer = HyperShardWriter(path, paths=paths)
    pg = process_group if process_group is not None else _save_group()
    out: concurrent.futures.Future = concurrent.futures.Future()
    try:
        fut = dcp.async_save(flat, storage_writer=writer, process_group=pg)
    except CheckpointException as e:
        raise _error(e) from None
    upload: Any = getattr(fut, "upload_completion", fut)

    def done(f: Any) -> None:
        try:
            f.result()
            out.set_result(writer.bytes_written)
        except CheckpointException as e:
            out.set_exception(_error(e))
        except BaseException as e:
            out.set_exception(e)

    upload.add_done_callback(done)
    return out
