"""State dicts of ``fully_shard`` modules (framework-neutral): ``state_dict()`` reshards
first and returns the sharded DTensors; ``load_state_dict`` takes sharded DTensors (any
layout on the same mesh is redistributed) or full plain tensors (every rank holds the
whole value; each keeps its box, no communication)."""

from __future__ import annotations

from typing import Any

from ..dtensor import DTensor, redistribute_local
from ..spec import DTensorSpec
from ._group import FSDPParamGroup
from ._param import FSDPParam

__all__ = ["register_state_dict_hooks", "to_sharded_value"]


def register_state_dict_hooks(fw: Any, group: FSDPParamGroup) -> None:
    """Hook every module holding a parameter of ``group``: ``state_dict()`` reshards
    first; before a module loads its entries, each is converted to the parameter's
    sharded layout (:func:`to_sharded_value`) and handed to the adapter's
    :meth:`~._adapter.FSDPAdapter.load_value`."""
    by_module: dict[int, tuple[Any, list[tuple[str, FSDPParam]]]] = {}
    for fp in group.params:
        for m, name in fp.sites:
            by_module.setdefault(id(m), (m, []))[1].append((name, fp))

    def pre_save() -> None:
        group.discard_pending_unshard()
        group.reshard()

    for m, entries in by_module.values():
        done: list[str] = []

        def pre_load(sd: dict, prefix: str, entries: list = entries, done: list = done) -> None:
            pre_save()
            for name, fp in entries:
                key = prefix + name
                if key in sd:
                    value = to_sharded_value(fp, sd[key], key)
                    fw.load_value(sd, key, fp.sharded_param, value)
                    if key not in sd:
                        done.append(key)

        def loaded(done: list = done) -> list[str]:
            out = list(done)
            done.clear()
            return out

        fw.register_state_dict_hooks(m, pre_save, pre_load, loaded)


def to_sharded_value(fp: Any, value: Any, key: str) -> Any:
    """A state-dict value as a DTensor with ``fp``'s sharded layout (``fp``: an
    :class:`FSDPParam` or a sharded DTensor parameter, anything with a ``spec`` or a
    ``_spec``); a value of another kind is returned as is.

    Raises:
        ValueError: a plain tensor or DTensor whose global shape is not the parameter's.
    """
    spec = fp.spec if isinstance(fp, FSDPParam) else fp._spec
    plat = spec.mesh.platform
    if isinstance(value, DTensor):
        vs = value._spec
        if vs.shape != spec.shape:
            raise ValueError(
                f"load_state_dict: {key!r} has global shape {tuple(vs.shape)}, the parameter "
                f"{tuple(spec.shape)}"
            )
        if vs.mesh == spec.mesh and vs.placements == spec.placements:
            if vs.shard_order == spec.shard_order:
                return value  # copy_ casts a dtype difference
            value = value.full_tensor()
        elif vs.mesh != spec.mesh:
            value = value.full_tensor()
        else:
            dst = DTensorSpec(spec.mesh, spec.placements, vs.tensor_meta, spec.shard_order)
            local = redistribute_local(plat, plat.local_of(value), vs, dst)
            return plat.wrap(local, dst)
    if not plat.is_tensor(value):
        return value
    shape = tuple(plat.shape(value))
    if shape != tuple(spec.shape):
        raise ValueError(
            f"load_state_dict: {key!r} is a plain tensor of shape {shape}; a full state dict "
            f"entry must have the parameter's global shape {tuple(spec.shape)} (or load a "
            f"sharded state dict of DTensors)"
        )
    return _shard_of_full(plat, value, spec)


def _shard_of_full(plat: Any, full: Any, spec: DTensorSpec) -> Any:
    """This rank's box of a full tensor under ``spec`` (no communication)."""
    shape, offset = spec.local_shape_and_offset()
    t = plat.detach(full)
    for d, (o, ln) in enumerate(zip(offset, shape)):
        if ln != plat.shape(t)[d]:
            t = plat.narrow(t, d, o, ln)
    meta = plat.tensor_meta(t, spec.shape)._replace(stride=spec.stride)
    return plat.wrap(
        plat.contiguous(t), DTensorSpec(spec.mesh, spec.placements, meta, spec.shard_order)
    )
