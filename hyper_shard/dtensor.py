"""The framework-neutral DTensor API (as PyTorch DTensor, on torch and MindSpore).

``DTensor`` here is the base class of every platform's DTensor (torch's subclasses
``torch.Tensor``, MindSpore's ``mindspore.Tensor``): ``isinstance(x, hyper_shard.DTensor)``
is true on both. A DTensor *is* its local shard to the framework (its data, its autograd
node) and carries a :class:`~hyper_shard.spec.DTensorSpec` that gives the global view.

Gradient contract: local autograd computes on every rank the derivative of the global
objective with respect to the local data. ``x.grad`` is a DTensor on ``x``'s mesh whose
``full_tensor()`` equals the single-device gradient; its placements follow
:func:`~hyper_shard.placement.grad_placement` (Shard -> Shard, Replicate ->
Partial(sum), Partial(sum) -> Replicate).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ._locator import platform_of_tensor
from .flight.context import RedistributeFrame, stack
from .mesh import DeviceMesh, as_mesh
from .placement import (
    Partial,
    Placement,
    Replicate,
    Shard,
    grad_placement,
    normalize_placements,
    strided_shard_order,
)
from .redistribute.executor import (
    COUNTERS,
    execute_plan,
    redistribute_local,
    redistribute_with_plan,
)
from .redistribute.planner import plan_redistribute
from .spec import DTensorSpec

if TYPE_CHECKING:
    from .platform.base import CommOps, Runtime

__all__ = [
    "DTensor",
    "distribute_tensor",
    "redistribute_local",
    "local_derivative",
    "zeros",
    "ones",
    "empty",
    "full",
    "rand",
    "randn",
]


#: [Note: compiled DTensor API] a platform whose compiler traces DTensor code installs
#: ``(is_tracing, call)`` here (torch: ``platform/torch/compiled.py``): while
#: ``is_tracing()`` (dynamo is tracing the caller), ``from_local`` / ``to_local`` /
#: ``full_tensor`` / ``redistribute`` become ``call(name, *args)``, one opaque call the
#: compiler records, instead of Python it would trace line by line.
COMPILED_API: list[Any] = []


class DTensor:
    """A global tensor laid out over a DeviceMesh by one placement per mesh dim.

    Create one with :meth:`from_local`, :func:`distribute_tensor` or a factory
    (:func:`zeros`, :func:`ones`, ...). ``shape``/``size()`` report the *global* shape;
    ``to_local()`` returns this rank's shard.
    """

    _spec: DTensorSpec

    # ------------------------------------------------------------------ metadata
    @property
    def device_mesh(self) -> DeviceMesh:
        """The DeviceMesh the tensor lives on."""
        return self._spec.mesh

    @property
    def placements(self) -> tuple[Placement, ...]:
        """One placement per mesh dimension."""
        return self._spec.placements

    # ------------------------------------------------------------------ creation
    @classmethod
    def from_local(
        cls,
        local_tensor: Any,
        device_mesh: DeviceMesh | None = None,
        placements: Sequence[Placement] | None = None,
        *,
        run_check: bool = False,
        shape: Sequence[int] | None = None,
        stride: Sequence[int] | None = None,
        grad_placements: Sequence[Placement] | None = None,
    ) -> Any:
        """Wrap every rank's local shard as one DTensor (as ``DTensor.from_local`` in torch).

        Args:
            local_tensor: this rank's shard (torch.Tensor or mindspore.Tensor).
            device_mesh: the mesh (a ``torch.distributed.device_mesh.DeviceMesh`` is taken
                too); default: the mesh of the innermost ``with mesh:``.
            placements: one per mesh dim; default all ``Replicate()``.
            run_check: check across the mesh's ranks that dtypes, ``requires_grad`` and
                memory layouts agree, and (with ``shape``) that every shard is its
                ``torch.chunk`` piece; ``Replicate`` mesh dims then take coordinate 0's
                values, as PyTorch (a few metadata gathers and one broadcast per Replicate
                mesh dim).
            shape: the global shape. When omitted and some placement is a ``Shard``, the
                true global shape is inferred with one all-gather of the local sizes
                (uneven shards included): a wrong shape is never assumed silently.
            stride: the global stride; must be given with ``shape`` (as PyTorch); default:
                the stride PyTorch reports, from the local tensor's layout.
            grad_placements: the placements of the gradient the local tensor receives in
                backward; default: ``Shard`` stays ``Shard``, ``Replicate`` receives the
                whole gradient (an all-reduce), ``Partial`` receives the exact local
                derivative (the whole gradient for ``Partial(sum)``, as PyTorch).

        Returns:
            A DTensor whose local data is ``local_tensor`` (autograd-connected to it). On a
            rank outside the mesh the local shard is empty (as PyTorch) and the global shape
            is the local one times the mesh sizes (or ``shape``).

        Raises:
            RuntimeError: ``shape`` without ``stride`` or the reverse, or a DTensor as
                ``local_tensor`` (PyTorch's messages).
            ValueError: no mesh, placements that do not fit the mesh, local shards that are
                not the ``torch.chunk`` layout of ``shape`` (the message gives the expected
                local shape and how to fix it), or with ``run_check=True`` ranks that
                disagree on metadata. With ``shape`` given and ``run_check=False`` (no
                communication) only the ranks whose own shard does not fit can see it and
                raise; pass ``run_check=True`` to make every rank raise together, so no rank
                goes on to a collective the others never join.
        """
        if COMPILED_API and COMPILED_API[0]():
            return COMPILED_API[1](
                "from_local", local_tensor, device_mesh, placements, run_check, shape, stride,
                grad_placements,
            )  # fmt: skip
        from . import _creation as C

        if isinstance(local_tensor, DTensor):
            raise RuntimeError(
                f"DTensor.from_local: the local_tensor argument only accepts torch.Tensor but "
                f"got {type(local_tensor)} value (a DTensor{list(local_tensor._spec.shape)}); "
                f"pass its to_local(), or redistribute() it to other placements"
            )
        device_mesh = as_mesh(device_mesh, "DTensor.from_local")
        plat = (
            device_mesh.platform
            if not device_mesh.is_abstract
            else platform_of_tensor(local_tensor)
        )
        placements = (
            tuple(placements) if placements is not None else (Replicate(),) * device_mesh.ndim
        )
        local_shape = plat.shape(local_tensor)
        placements, order = strided_shard_order(placements, device_mesh.shape, len(local_shape))
        placements = normalize_placements(placements, device_mesh.ndim, len(local_shape))
        C.check_shape_stride_pair(plat, shape, stride)
        shape_given = shape is not None
        inside = device_mesh.get_coordinate() is not None
        if (
            shape is None
            and inside
            and any(type(p) is Shard for p in placements)
            and not plat.tracing()  # a compiled region assumes even shards, as PyTorch
        ):
            shape = C.infer_global_shape(plat, device_mesh, placements, local_shape)
        elif shape is None:
            shape = C.even_global_shape(device_mesh, placements, local_shape)
        shape = tuple(int(s) for s in shape)
        if run_check and inside:
            C.check_metadata_collectively(
                plat, device_mesh, placements, local_tensor, shape if shape_given else None
            )
        meta = plat.tensor_meta(local_tensor, shape)
        if stride is not None:
            meta = meta._replace(stride=tuple(int(x) for x in stride))
        elif inside:
            lst = C.local_stride(plat, local_tensor)
            meta = meta._replace(
                stride=C.infer_global_stride(device_mesh, placements, local_shape, lst, shape)
            )
        spec = DTensorSpec(device_mesh, placements, meta, order)
        if not inside:  # a rank outside the mesh holds nothing and takes part in nothing
            empty = C.empty_local(plat, device_mesh, meta.dtype, 1)
            return plat.make_leaf(empty, spec, plat.requires_grad(local_tensor))
        expected = spec.local_shape()
        if tuple(local_shape) != tuple(expected):
            raise ValueError(
                f"DTensor.from_local: rank {device_mesh.get_rank()} holds a local shard of shape "
                f"{tuple(local_shape)} but global shape {shape} with placements "
                f"{[str(p) for p in placements]} on mesh {device_mesh.shape} gives it "
                f"{tuple(expected)} (torch.chunk layout). Pass the right `shape`, or omit it "
                f"to infer it, or split the data with torch.chunk semantics"
            )
        gp = tuple(grad_placements) if grad_placements is not None else None

        def bwd(g: Any) -> Any:
            return _from_local_backward(plat, g, spec, gp)

        # run_check: replicas are made equal (a broadcast, so the result is new data);
        # otherwise an alias of local_tensor (no copy) that may be modified in place, as in
        # PyTorch: the DTensor shares local_tensor's data, not its autograd history
        if run_check and C.has_replicate_to_broadcast(device_mesh, placements):

            def fwd(x: Any) -> Any:
                return C.broadcast_replicated(plat, device_mesh, placements, x)

            if plat.requires_grad(local_tensor):
                local = plat.custom_autograd(fwd, bwd, local_tensor)
            else:
                local = fwd(local_tensor)
        elif plat.requires_grad(local_tensor):
            local = plat.alias_autograd(bwd, local_tensor)
        else:
            local = local_tensor
        return plat.wrap(local, spec)

    # ------------------------------------------------------------------ conversion
    @property
    def _local_tensor(self) -> Any:
        """The local shard as a plain framework tensor: an alias (same storage), as the
        attribute of this name on PyTorch DTensor. Prefer :meth:`to_local`."""
        if COMPILED_API and COMPILED_API[0]():
            return COMPILED_API[1]("local_tensor", self, None)
        return self._spec.mesh.platform.local_of(self)

    def to_local(self, *, grad_placements: Sequence[Placement] | None = None) -> Any:
        """This rank's shard as a plain framework tensor (as PyTorch DTensor).

        Args:
            grad_placements: the placements of the gradient that will arrive at the
                returned local tensor in backward. Default: this DTensor's placements,
                except ``Partial`` -> ``Replicate`` (as PyTorch). A ``Replicate`` gradient
                is read as one value computed identically by every rank (counted once).

        Returns:
            The local shard (local shape), autograd-connected to this DTensor.
        """
        if COMPILED_API and COMPILED_API[0]():
            return COMPILED_API[1]("to_local", self, grad_placements)
        plat = self._spec.mesh.platform
        local = plat.local_of(self)
        if not plat.requires_grad(local):
            return local
        spec = self._spec
        gp = (
            normalize_placements(grad_placements, spec.mesh.ndim, spec.ndim)
            if grad_placements is not None
            else tuple(Replicate() if type(p) is Partial else p for p in spec.placements)
        )
        if _needs_no_conversion(gp, spec.placements):
            return local  # the local gradient already is this DTensor's gradient form
        fwd = local if _needs_forward_local(spec.placements) else None
        return plat.custom_autograd(
            lambda x: x, lambda g: local_derivative(plat, g, gp, spec, fwd), local
        )

    def full_tensor(self, *, grad_placements: Sequence[Placement] | None = None) -> Any:
        """The whole global tensor on every rank (as ``redistribute`` to Replicate then
        ``to_local``); shape = global shape. A collective: every rank must call it.

        Backward reads the incoming gradient as ``grad_placements`` (default Replicate: one
        value computed identically on every rank) and converts it straight to this DTensor's
        gradient form: a Replicate gradient needs no communication (Shard sources keep their
        chunk, Replicate sources keep it on coordinate 0), as in PyTorch.
        """
        if COMPILED_API and COMPILED_API[0]():
            return COMPILED_API[1]("full_tensor", self, grad_placements)
        spec = self._spec
        mesh = spec.mesh
        plat = mesh.platform
        local = plat.local_of(self)
        if mesh.get_coordinate() is None:
            return local  # a rank outside the mesh: its empty shard, no communication
        dst = (Replicate(),) * mesh.ndim
        plan = plan_redistribute(spec, dst)
        if not plan.steps and not plat.requires_grad(local):
            return local
        frames = stack()  # what a CollectiveError / recent_ops() name
        frames.append(RedistributeFrame("full_tensor", spec, dst))
        try:
            if not plat.requires_grad(local):
                return execute_plan(plat, local, spec, plan)
            gp = (
                normalize_placements(grad_placements, mesh.ndim, spec.ndim)
                if grad_placements is not None
                else dst
            )
            fwd_local = local if _needs_forward_local(spec.placements) else None
            return plat.custom_autograd(
                lambda x: execute_plan(plat, x, spec, plan),
                lambda g: local_derivative(plat, g, gp, spec, fwd_local),
                local,
            )
        finally:
            frames.pop()

    def redistribute(
        self,
        device_mesh: DeviceMesh | None = None,
        placements: Sequence[Placement] | None = None,
        *,
        async_op: bool = False,
        forward_dtype: Any = None,
        backward_dtype: Any = None,
    ) -> Any:
        """The same global tensor with other placements on the same mesh (as PyTorch).

        Runs the cheapest plan of local chunks, all-gathers, all-reduces,
        reduce-scatters and all-to-alls (see :mod:`hyper_shard.redistribute`);
        differentiable. A collective: every rank of the mesh must call it (a rank outside
        the mesh returns its empty shard and takes part in nothing).

        Args:
            device_mesh: must be this DTensor's mesh (or None; a torch DeviceMesh over the
                same ranks is taken).
            placements: the target placements (None with ``forward_dtype``: a cast only).
                A ``Partial`` target is accepted only where the DTensor already has that
                same ``Partial``, as PyTorch (making values partial is internal).
            async_op: accepted for PyTorch compatibility; collectives complete before return.
            forward_dtype: as PyTorch DTensor: the local tensor is cast to this dtype before
                the forward collectives and the result has this dtype (e.g. bf16 traffic).
            backward_dtype: as PyTorch DTensor: the gradient is cast to this dtype for the
                backward collectives, then back to the gradient's own dtype.

        Returns:
            A new DTensor (global shape unchanged) that shares no memory with this one
            (modifying it in place never changes ``self``), or ``self`` when the placements
            are already ``placements``.

        Raises:
            RuntimeError: no ``placements`` (and no ``forward_dtype``), or a ``Partial``
                target the DTensor does not already have ("Can not redistribute", as
                PyTorch).
            ValueError: another mesh (cross-mesh redistribution is not supported), or
                placements that do not fit the mesh/tensor.
        """
        if COMPILED_API and COMPILED_API[0]():
            return COMPILED_API[1](
                "redistribute", self, device_mesh, placements, async_op, forward_dtype,
                backward_dtype,
            )  # fmt: skip
        spec = self._spec
        if device_mesh is not None and as_mesh(device_mesh, "redistribute") != spec.mesh:
            raise ValueError(
                f"redistribute: cannot move a DTensor from {spec.mesh} to another mesh "
                f"{device_mesh}; redistribute on the same mesh, then to_local and from_local"
            )
        if placements is None and forward_dtype is None:
            raise RuntimeError(
                "placements is needed for redistribute! (pass the target placements, e.g. "
                "[Replicate()])"
            )
        order: Any = "keep"
        if placements is not None:
            placements, strided = strided_shard_order(placements, spec.mesh.shape, spec.ndim)
            if strided is not None:
                order = strided
            if len(placements) == len(spec.placements):
                for src, p in zip(spec.placements, placements):
                    if type(p) is Partial and src != p:
                        raise RuntimeError(
                            f"Can not redistribute from {src} to {p}, redistributing to Partial "
                            f"is for internal use only! (a Partial value comes from an op, e.g. "
                            f"a sum over a sharded dim, or DTensor.from_local)"
                        )
        plat = spec.mesh.platform
        local = plat.local_of(self)
        if forward_dtype is not None and forward_dtype != spec.dtype:
            local = plat.cast(local, forward_dtype)
            spec = DTensorSpec(spec.mesh, spec.placements, plat.tensor_meta(local, spec.shape))
            if placements is None:
                return plat.wrap(local, spec)
        if placements is None:
            return self
        dst = spec.with_placements(placements, order)
        if dst.placements == spec.placements and dst.shard_order == spec.shard_order:
            return self if spec is self._spec else plat.wrap(local, spec)
        if spec.mesh.get_coordinate() is None:
            return plat.wrap(local, dst)  # outside the mesh: nothing to move
        src_local = local
        frames = stack()  # what a CollectiveError / recent_ops() name
        frames.append(RedistributeFrame("redistribute", spec, dst.placements))
        try:
            if backward_dtype is None:
                local = redistribute_local(plat, local, spec, dst)
            else:
                plan = plan_redistribute(spec, dst.placements, shard_order=dst.shard_order)
                local = redistribute_with_plan(plat, local, spec, plan, backward_dtype)
        finally:
            frames.pop()
        if plat.shares_storage(local, src_local):
            # a local-only plan (R -> S keeps a chunk) gives a view of the source: the
            # result is a tensor of its own, so an in-place op on it never reaches self
            local = plat.clone(local)
        return plat.wrap(local, dst)

    def __repr__(self) -> str:  # framework classes override through their hooks
        return _format(self)


def _format(dt: Any) -> str:
    spec = dt._spec
    pl = repr(tuple(spec.placements))  # "(Shard(dim=0),)", as PyTorch DTensor's repr
    local = spec.mesh.platform.local_of(dt)
    return (
        f"DTensor(local_tensor={local}, device_mesh={spec.mesh}, placements={pl}, "
        f"shape={list(spec.shape)})"
    )


# ---------------------------------------------------------------------- helpers
def _redistribute_plain(
    plat: CommOps, g: Any, spec: DTensorSpec, dst: Sequence[Placement], shard_order: Any = "keep"
) -> Any:
    """Redistribute a gradient (no autograd) from ``spec``'s placements to ``dst`` (shard
    order as :func:`plan_redistribute`)."""
    plan = plan_redistribute(spec, dst, shard_order=shard_order)
    return execute_plan(plat, g, spec, plan) if plan.steps else g


def _needs_no_conversion(
    g_placements: Sequence[Placement], placements: Sequence[Placement]
) -> bool:
    """True when a gradient read as ``g_placements`` is already the local-derivative form
    of a value placed ``placements`` (Shard read as the same Shard, Partial(sum) read as
    Replicate, Replicate read as Partial(sum))."""
    for g, p in zip(g_placements, placements):
        tp = type(p)
        if tp is Shard:
            if g != p:
                return False
        elif tp is Replicate:
            if not (type(g) is Partial and g.reduce_op == "sum"):
                return False
        elif p.reduce_op != "sum" or type(g) is not Replicate:  # type: ignore[attr-defined]
            return False
    return True


def _needs_forward_local(placements: Sequence[Placement]) -> bool:
    """Whether :func:`local_derivative` needs the forward local value: only for
    ``Partial(max|min)`` (the derivative goes to the ranks holding the extremum). A backward
    closure holds that value until backward runs, so it is captured only then (a
    ``Partial(sum)`` row-parallel output is freed once reduced, as in PyTorch)."""
    return any(type(p) is Partial and p.reduce_op in ("max", "min") for p in placements)


def local_derivative(
    plat: Runtime,
    g: Any,
    g_placements: Sequence[Placement],
    spec: DTensorSpec,
    forward_local: Any = None,
) -> Any:
    """Convert a local gradient whose global reading has ``g_placements`` into the local
    derivative form of a value laid out by ``spec`` (see the gradient contract).

    For ``Partial(max|min)`` values the derivative goes to the ranks holding the extremum
    (ties split evenly), which needs the forward local value ``forward_local``.

    Raises:
        NotImplementedError: a ``Partial(prod)`` value, or ``Partial(max|min)`` without
            ``forward_local``.
    """
    target: list[Placement] = []
    avg_dims, ext_dims = [], []
    for m, p in enumerate(spec.placements):
        if type(p) is Partial:
            if p.reduce_op == "prod" or (p.reduce_op in ("max", "min") and forward_local is None):
                raise NotImplementedError(
                    f"the gradient of a local tensor of a Partial({p.reduce_op}) DTensor is not "
                    f"defined by its global gradient alone; redistribute it to Replicate() first"
                )
            target.append(Replicate())
            if p.reduce_op == "avg":
                avg_dims.append(m)
            elif p.reduce_op in ("max", "min"):
                ext_dims.append((m, p.reduce_op))
        else:
            target.append(grad_placement(p))
    gspec = spec.with_placements(g_placements)
    out = _redistribute_plain(plat, g, gspec, target)
    for m in avg_dims:
        out = plat.scale(out, 1.0 / spec.mesh.shape[m])
    if ext_dims:
        x = forward_local
        for m, op in ext_dims:  # mask each partial mesh dim in turn (nested reductions)
            group = spec.mesh._group(m)
            y = plat.all_reduce(x, op, group)
            mask = plat.eq_mask(x, y)
            out = plat.div(plat.mul(out, mask), plat.all_reduce(mask, "sum", group))
            x = y
    return out


def _from_local_backward(
    plat: CommOps, g: Any, spec: DTensorSpec, grad_placements: Sequence[Placement] | None
) -> Any:
    """The gradient a ``from_local`` input receives: the local-derivative form ``g`` (read
    globally with :func:`grad_placement`) redistributed to ``grad_placements`` (default:
    Replicate values receive the whole gradient, the others their exact local derivative)."""
    read = tuple(grad_placement(p) for p in spec.placements)
    if grad_placements is None:
        target = tuple(
            Replicate() if type(p) is Replicate else r for p, r in zip(spec.placements, read)
        )
    else:
        target = normalize_placements(grad_placements, spec.mesh.ndim, spec.ndim)
    return _redistribute_plain(plat, g, spec.with_placements(read), target)


# ---------------------------------------------------------------------- creation API
def distribute_tensor(
    tensor: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    *,
    src_data_rank: int | None = 0,
    shard_order: Any = None,
) -> Any:
    """Shard a full tensor (present on every rank) over ``device_mesh`` (as PyTorch's
    ``distribute_tensor``).

    Args:
        tensor: the whole global tensor (global shape), on every rank; a leaf (or a tensor
            that needs no gradient). A DTensor already on ``device_mesh`` with
            ``placements`` is returned as is. A ``meta`` tensor gives a ``meta`` DTensor
            (no communication), to be materialised later (``torch.empty_like(dt,
            device=...)``, ``module.to_empty``).
        device_mesh: the mesh (a ``torch.distributed.device_mesh.DeviceMesh`` is taken too);
            default: the mesh of the innermost ``with mesh:``.
        placements: one per mesh dim (default all Replicate). ``Partial`` keeps the value
            on coordinate 0 of that mesh dim (zeros elsewhere, or the value itself for
            avg/max/min).
        src_data_rank: the mesh's flat index whose data everyone takes (broadcast along
            every mesh dim), or None to use each rank's own tensor without communication.
        shard_order: the split order of tensor dims sharded by several mesh dims, as
            ``(tensor_dim, mesh_dims)`` entries (default: left to right; see
            :class:`~hyper_shard.spec.DTensorSpec`).

    Returns:
        A leaf DTensor with ``requires_grad`` as ``tensor``'s. On a rank outside the mesh
        its local shard is empty (as PyTorch) and nothing is communicated.

    Raises:
        RuntimeError: a non-leaf tensor that requires grad (PyTorch's message: distribute
            the leaf, e.g. the parameter, then compute on the DTensor).
        ValueError: no mesh, placements that do not fit the mesh/tensor, or a DTensor on
            another mesh or with other placements (redistribute it instead).
    """
    device_mesh = as_mesh(device_mesh, "distribute_tensor")
    placements = tuple(placements) if placements is not None else (Replicate(),) * device_mesh.ndim
    placements, strided = strided_shard_order(
        placements, device_mesh.shape, len(getattr(tensor, "shape", ()))
    )
    if strided is not None:
        if shard_order is not None:
            raise ValueError(
                "distribute_tensor: pass either _StridedShard placements or shard_order, not both"
            )
        shard_order = strided
    if isinstance(tensor, DTensor):
        have = tensor._spec
        if have.mesh != device_mesh:
            raise ValueError(
                f"Cannot distribute a DTensor with device mesh {have.mesh} to a different "
                f"device mesh {device_mesh}; DTensors move between meshes by to_local/from_local"
            )
        want = normalize_placements(placements, device_mesh.ndim, have.ndim)
        if want != have.placements:
            raise ValueError(
                f"Cannot distribute a DTensor with placements {list(have.placements)} to a "
                f"different placements {list(want)}. do you want to call `redistribute` "
                f"instead?"
            )
        return tensor
    if getattr(tensor, "requires_grad", False) and not getattr(tensor, "is_leaf", True):
        raise RuntimeError(
            "`distribute_tensor` should be used to distribute leaf tensors! but found non-leaf "
            "tensor! Distribute the leaf (e.g. the parameter) and compute on the DTensor, or "
            "detach() it first"
        )
    plat = device_mesh.platform if not device_mesh.is_abstract else platform_of_tensor(tensor)
    shape = plat.shape(tensor)
    meta = plat.tensor_meta(tensor, shape)
    req = plat.requires_grad(tensor)
    spec = DTensorSpec(device_mesh, placements, meta, shard_order)
    if device_mesh.get_coordinate() is None:
        from ._creation import empty_local

        return plat.make_leaf(empty_local(plat, device_mesh, meta.dtype, 1), spec, req)
    full = plat.detach(tensor)
    rspec = DTensorSpec(device_mesh, (Replicate(),) * device_mesh.ndim, meta)
    if src_data_rank is not None and not getattr(tensor, "is_meta", False):
        src_coord = device_mesh._compute_coordinate(device_mesh.ranks[src_data_rank])
        assert src_coord is not None
        frames = stack()  # what a CollectiveError / recent_ops() name
        frames.append(RedistributeFrame("distribute_tensor", rspec, placements))
        try:
            for m in range(device_mesh.ndim):
                if device_mesh.shape[m] > 1:
                    full = plat.broadcast(full, src_coord[m], device_mesh._group(m))
                    me = device_mesh.get_rank()
                    for rank, counter in COUNTERS:  # debug.comm_counter / CommDebugMode
                        if rank is None or rank == me:
                            counter["broadcast"] = counter.get("broadcast", 0) + 1
        finally:
            frames.pop()
    local = plat.contiguous(
        _redistribute_plain(plat, full, rspec, spec.placements, spec.shard_order)
    )
    if local is not full and plat.shares_storage(local, full):
        # a shard must own its memory: a view would keep the whole tensor alive on every
        # rank (and report the whole tensor's storage offsets, as PyTorch's scatter does not)
        local = plat.clone(local)
    return plat.make_leaf(local, spec, req)


def _factory(
    kind: str,
    size: Sequence[Any],
    fill_value: Any,
    device_mesh: DeviceMesh | None,
    placements: Sequence[Placement] | None,
    dtype: Any,
    requires_grad: bool,
    layout: Any = None,
) -> Any:
    if layout is not None and str(layout).rpartition(".")[2] != "strided":
        # PyTorch DTensor's factories take ``layout=torch.strided`` and refuse any other
        raise ValueError(f"hyper_shard.{kind}: layout {layout} is not supported (strided only)")
    device_mesh = as_mesh(device_mesh, f"hyper_shard.{kind}")
    if len(size) == 1 and isinstance(size[0], (list, tuple)):
        size = tuple(size[0])
    shape = tuple(int(s) for s in size)
    plat = device_mesh.platform
    placements = tuple(placements) if placements is not None else (Replicate(),) * device_mesh.ndim
    dev = device_mesh.device_type
    probe = plat.new_tensor(kind, (0,) * len(shape), fill_value, dtype, dev)
    spec = DTensorSpec(device_mesh, placements, plat.tensor_meta(probe, shape))
    if device_mesh.get_coordinate() is None:  # outside the mesh: an empty shard, as PyTorch
        local = plat.new_tensor("empty", (0,), None, spec.dtype, dev)
        return plat.make_leaf(local, spec, requires_grad)
    if kind in ("rand", "randn"):
        # every rank draws the whole tensor from the same generator state and keeps its
        # shard, so the result equals the single-device draw for the same seed
        full = plat.new_tensor(kind, shape, fill_value, dtype, dev)
        rspec = spec.with_placements((Replicate(),) * device_mesh.ndim)
        local = plat.contiguous(_redistribute_plain(plat, full, rspec, spec.placements))
        if local is not full and plat.shares_storage(local, full):
            local = plat.clone(local)  # own the shard's memory, not the whole draw's
    else:
        if any(type(p) is Partial for p in spec.placements) and kind not in ("empty", "zeros"):
            raise ValueError(
                f"hyper_shard.{kind}: Partial placements are ambiguous for a factory; create it "
                f"Replicate and redistribute"
            )
        local = plat.new_tensor(kind, spec.local_shape(), fill_value, dtype, dev)
    return plat.make_leaf(local, spec, requires_grad)


def zeros(
    *size: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """A DTensor of zeros with global shape ``size`` (as ``torch.distributed.tensor.zeros``)."""
    return _factory("zeros", size, 0, device_mesh, placements, dtype, requires_grad, layout)


def ones(
    *size: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """A DTensor of ones with global shape ``size``."""
    return _factory("ones", size, 1, device_mesh, placements, dtype, requires_grad, layout)


def empty(
    *size: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """An uninitialised DTensor with global shape ``size``."""
    return _factory("empty", size, None, device_mesh, placements, dtype, requires_grad, layout)


def full(
    size: Sequence[int],
    fill_value: Any,
    *,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """A DTensor filled with ``fill_value``, global shape ``size``."""
    return _factory(
        "full", tuple(size), fill_value, device_mesh, placements, dtype, requires_grad, layout
    )


def rand(
    *size: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """Uniform [0, 1) DTensor; equals the single-device ``rand`` for the same seed (every
    rank must share the generator state, as after ``manual_seed`` with one seed)."""
    return _factory("rand", size, None, device_mesh, placements, dtype, requires_grad, layout)


def randn(
    *size: Any,
    device_mesh: DeviceMesh | None = None,
    placements: Sequence[Placement] | None = None,
    dtype: Any = None,
    requires_grad: bool = False,
    layout: Any = None,
) -> Any:
    """Standard-normal DTensor; equals the single-device ``randn`` for the same seed."""
    return _factory("randn", size, None, device_mesh, placements, dtype, requires_grad, layout)
