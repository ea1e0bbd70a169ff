"""Opt-in behaviours that PyTorch DTensor keeps under ``torch.distributed.tensor.experimental``.

:func:`implicit_replication` lets plain tensors take part in ops on DTensors, as PyTorch
DTensor's context of the same name does. :func:`local_map` runs a function of plain tensors
on DTensors' local shards and wraps its outputs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from .dispatch.switches import implicit_replication_block
from .mesh import DeviceMesh
from .placement import Placement

__all__ = [
    "context_parallel",
    "context_parallel_unshard",
    "set_rotate_method",
    "set_context_parallel_method",
    "get_context_parallel_method",
    "set_load_balance",
    "implicit_replication",
    "local_map",
    "LocalMapError",
    "register_sharding",
]


class LocalMapError(TypeError, AssertionError):
    """A :func:`local_map` call whose placements do not match its arguments or outputs in
    number or kind. It is a ``TypeError`` and, for code written against PyTorch DTensor
    (which raises ``AssertionError`` there), an ``AssertionError``."""


@contextmanager
def implicit_replication() -> Iterator[None]:
    """Treat plain tensors mixed with DTensors as ``Replicate`` DTensors, as PyTorch
    DTensor's ``torch.distributed.tensor.experimental.implicit_replication``.

    Inside the context, an op on DTensors that also receives a plain tensor of rank >= 1
    (a mask, an index tensor, a bias, labels...) wraps that tensor as a ``Replicate``
    DTensor on the mesh of the op's first DTensor argument (an alias: no copy, autograd
    kept), then dispatches as usual. Outside it, such a call raises
    :class:`~hyper_shard.errors.ShardingError` naming the op and the argument (a 0-d tensor
    argument is accepted as a scalar; a 0-d tensor inside a tensor list, as in
    ``torch.stack([dt_norm, plain_norm])``, is a tensor and needs this context).

    The plain tensor must hold the same values on every rank (it is the global tensor);
    nothing checks that. A gradient flowing back to it is each rank's local contribution
    (as with PyTorch DTensor), so give it ``requires_grad=False`` or reduce it yourself.
    Works on both backends (PyTorch and MindSpore). The switch is a ``ContextVar``:
    nestable, local to the thread (or asyncio task) that entered it, restored on exit,
    also when the body raises.
    """
    with implicit_replication_block(True):
        yield


def _flatten(tree: Any) -> tuple[list[Any], Callable[[list[Any]], Any]]:
    """The leaves of nested tuples / lists / dicts (namedtuples kept), in order, and a
    function that rebuilds the same structure from new leaves (as torch's pytree does for
    these containers)."""
    if isinstance(tree, (tuple, list)):
        parts = [_flatten(x) for x in tree]
        leaves = [leaf for p in parts for leaf in p[0]]
        sizes = [len(p[0]) for p in parts]

        def rebuild_seq(new: list[Any]) -> Any:
            items, i = [], 0
            for (_, rb), n in zip(parts, sizes):
                items.append(rb(new[i : i + n]))
                i += n
            if isinstance(tree, tuple) and hasattr(tree, "_fields"):
                return type(tree)(*items)
            return type(tree)(items)

        return leaves, rebuild_seq
    if isinstance(tree, dict):
        keys = list(tree)
        dparts = [_flatten(tree[k]) for k in keys]
        dsizes = [len(p[0]) for p in dparts]

        def rebuild_dict(new: list[Any]) -> Any:
            out, i = {}, 0
            for k, (_, rb), n in zip(keys, dparts, dsizes):
                out[k] = rb(new[i : i + n])
                i += n
            return type(tree)(out) if type(tree) is not dict else out

        return [leaf for p in dparts for leaf in p[0]], rebuild_dict
    return [tree], lambda new: new[0]


def _is_placements(spec: Any) -> bool:
    """A leaf of a placements spec: None or a sequence of Placements."""
    return spec is None or (
        isinstance(spec, (tuple, list)) and all(isinstance(p, Placement) for p in spec)
    )


def _mirrored(spec: Any, tree: Any) -> list[Any] | None:
    """The placement entries of ``spec`` given in the shape of ``tree`` (a list of
    placements for a list argument, a dict for a dict output), one per leaf of ``tree`` in
    :func:`_flatten`'s order; None when ``spec`` does not mirror ``tree``."""
    if _is_placements(spec):
        return [spec] if len(_flatten(tree)[0]) == 1 else None
    if isinstance(tree, (tuple, list)) and isinstance(spec, (tuple, list)):
        if len(spec) != len(tree):
            return None
        parts = [_mirrored(s, t) for s, t in zip(spec, tree)]
    elif isinstance(tree, dict) and isinstance(spec, dict) and set(spec) == set(tree):
        parts = [_mirrored(spec[k], tree[k]) for k in tree]
    else:
        return None
    if any(p is None for p in parts):
        return None
    return [x for p in parts for x in p]  # type: ignore[union-attr]


def _per_leaf(given: Any, tree: Any, n_leaves: int) -> Any:
    """``given`` placements as one entry per leaf: flat as given (one per flattened leaf,
    as PyTorch 2.13), or mirroring the arguments' / outputs' structure (pytorch/pytorch
    #182031); anything else is returned as is (the length check names it)."""
    if given is None or (isinstance(given, (tuple, list)) and len(given) == n_leaves):
        return given
    return _mirrored(given, tree) or given


def _is_tensor(obj: Any) -> bool:
    from .platform.select import platform_of_tensor

    try:
        return platform_of_tensor(obj).is_tensor(obj)
    except TypeError:
        return False


def local_map(
    func: Callable[..., Any] | None = None,
    out_placements: Any = None,
    in_placements: Sequence[Sequence[Placement] | None] | None = None,
    in_grad_placements: Sequence[Sequence[Placement] | None] | None = None,
    device_mesh: DeviceMesh | None = None,
    *,
    redistribute_inputs: bool = False,
) -> Any:
    """Run ``func``, written for plain tensors, on the local shards of DTensor arguments and
    wrap its tensor outputs as DTensors (as PyTorch DTensor's
    ``torch.distributed.tensor.experimental.local_map``; same signature, also a decorator
    when ``func`` is omitted; works on torch and MindSpore).

    Arguments are flattened through tuples, lists and dicts (namedtuples included), as
    torch's pytree does. Every DTensor leaf is passed as ``to_local()`` (its local shard:
    local shape); other leaves as they are. Outputs are flattened the same way and every
    tensor leaf ``t`` becomes ``DTensor.from_local(t, device_mesh, placements)``. When no
    argument is a DTensor, ``func``'s result is returned unchanged (as PyTorch).

    Unlike PyTorch 2.13 (pytorch/pytorch#172812), an output with a ``Shard`` placement
    gets its true global shape also when the shards are uneven: ``from_local`` infers it
    with one all-gather of the local sizes, so ``func`` must be called by every rank of
    the mesh (it is SPMD code anyway).

    Args:
        func: the function of local tensors.
        out_placements: placements of the flattened output: one placement sequence for a
            single output, else a tuple with one per output leaf (``None`` for a
            non-tensor leaf), or the output's own structure (a dict of placements for a
            dict output, as pytorch/pytorch#182031 asks).
        in_placements: per flattened input leaf, the placements a DTensor must have
            (``None`` for a non-tensor leaf; a plain tensor's entry is not checked), or
            ``None`` to check nothing; or nested as the arguments are (a list of
            placements for a list argument). ``in_grad_placements`` likewise.
        in_grad_placements: per flattened input leaf, the ``grad_placements`` passed to
            ``to_local`` (the layout of the gradient ``func`` gives that input).
        device_mesh: the outputs' mesh; default: the first DTensor argument's.
        redistribute_inputs: redistribute a DTensor whose placements differ from
            ``in_placements`` instead of raising.

    Returns:
        The wrapped function (or a decorator when ``func`` is None).

    Raises:
        ValueError: a DTensor argument's placements differ from ``in_placements`` and
            ``redistribute_inputs`` is False (the message names the argument, both
            placements and the fix).
        LocalMapError: (a ``TypeError`` and ``AssertionError``, where PyTorch raises
            ``AssertionError``) ``in_placements`` / ``out_placements`` without one entry per
            flattened leaf, a DTensor argument given ``None`` placements ("expects
            placements"), a non-tensor leaf given placements, or ``func`` returning a
            DTensor (it must return local tensors).

    A tensor output whose ``out_placements`` entry is ``None`` becomes a Replicate DTensor
    (``from_local``'s default, as PyTorch).
    """
    if func is None:

        def decorate(f: Callable[..., Any]) -> Any:
            return local_map(
                f,
                out_placements,
                in_placements,
                in_grad_placements,
                device_mesh,
                redistribute_inputs=redistribute_inputs,
            )

        return decorate
    fn = func

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> Any:
        return _local_map_call(
            fn,
            out_placements,
            in_placements,
            in_grad_placements,
            device_mesh,
            redistribute_inputs,
            args,
            kwargs,
        )

    return wrapped


def _fmt(pl: Sequence[Placement]) -> str:
    return "(" + ", ".join(repr(p) for p in pl) + ")"


def _local_map_call(
    func: Callable[..., Any],
    out_placements: Any,
    in_placements: Sequence[Sequence[Placement] | None] | None,
    in_grad_placements: Sequence[Sequence[Placement] | None] | None,
    mesh: DeviceMesh | None,
    redistribute_inputs: bool,
    args: tuple,
    kwargs: dict,
) -> Any:
    from .dtensor import DTensor

    name = getattr(func, "__name__", "func")
    leaves, rebuild = _flatten(args)
    in_placements = _per_leaf(in_placements, args, len(leaves))
    in_grad_placements = _per_leaf(in_grad_placements, args, len(leaves))
    for what, given in (
        ("in_placements", in_placements),
        ("in_grad_placements", in_grad_placements),
    ):
        if given is not None and len(given) != len(leaves):
            raise LocalMapError(
                f"local_map({name}): {what} has {len(given)} entries but the call has "
                f"{len(leaves)} flattened arguments; give one entry per argument leaf "
                f"(None for non-tensors)"
            )
    local_leaves: list[Any] = []
    seen_dtensor = False
    for i, arg in enumerate(leaves):
        if not isinstance(arg, DTensor):
            if in_placements is not None and in_placements[i] is not None and not _is_tensor(arg):
                raise LocalMapError(
                    f"local_map({name}): non-tensor argument {i} ({type(arg).__name__}) expects None "
                    f"placements but in_placements[{i}] = {in_placements[i]!r}; give None for it"
                )
            local_leaves.append(arg)
            continue
        seen_dtensor = True
        if mesh is None:
            mesh = arg.device_mesh
        if in_placements is not None:
            want = in_placements[i]
            if want is None:
                raise LocalMapError(
                    f"local_map({name}): DTensor argument {i} expects placements (it has "
                    f"{_fmt(arg.placements)}) but in_placements[{i}] is None; give its placements"
                )
            want = tuple(want)
            if tuple(arg.placements) != want:
                if not redistribute_inputs:
                    raise ValueError(
                        f"local_map({name}): argument {i} has placements "
                        f"{_fmt(arg.placements)} but in_placements[{i}] asks for {_fmt(want)}; "
                        f"redistribute it first, or set redistribute_inputs=True to local_map"
                    )
                arg = arg.redistribute(placements=want)
        grad = None
        if in_grad_placements is not None:
            grad = in_grad_placements[i]
            if grad is None:
                raise LocalMapError(
                    f"local_map({name}): DTensor argument {i} expects in grad placements but "
                    f"in_grad_placements[{i}] is None; give the placements of the gradient "
                    f"func returns for it"
                )
        local_leaves.append(arg.to_local(grad_placements=grad))
    out = func(*rebuild(local_leaves), **kwargs)
    if not seen_dtensor:
        return out
    assert mesh is not None
    outs, rebuild_out = _flatten(out)
    specs = out_placements if isinstance(out_placements, tuple) else (out_placements,)
    if len(specs) != len(outs):
        specs = tuple(_mirrored(out_placements, out) or specs)
    if len(specs) != len(outs):
        raise LocalMapError(
            f"local_map({name}): out_placements gives {len(specs)} entries but func returned "
            f"{len(outs)} values; give one placement sequence per output (None for non-tensors)"
        )
    wrapped_outs: list[Any] = []
    for j, (o, spec) in enumerate(zip(outs, specs)):
        if isinstance(o, DTensor):
            raise LocalMapError(
                f"local_map({name}): output {j} is a DTensor; func runs on local tensors and "
                f"must return local tensors (call to_local() inside it, or leave it out of local_map)"
            )
        if _is_tensor(o):
            pl = tuple(spec) if spec is not None else None
            wrapped_outs.append(DTensor.from_local(o, mesh, pl))
        else:
            if spec is not None:
                raise LocalMapError(
                    f"local_map({name}): output {j} is a {type(o).__name__}, not a tensor, but "
                    f"out_placements[{j}] = {spec!r}; give None for it"
                )
            wrapped_outs.append(o)
    return rebuild_out(wrapped_outs)


def register_sharding(op: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register a sharding strategy function for ``op`` (as PyTorch DTensor's
    ``torch.distributed.tensor.experimental.register_sharding``; a decorator).

    The decorated function takes the op's arguments, with each DTensor replaced by its
    :class:`~hyper_shard.spec.DTensorSpec` (``.shape`` / ``.ndim`` global, ``.placements``,
    ``.mesh``), and returns the acceptable strategies for one mesh dim: pairs
    ``(output placements, input placements)`` with one placement per tensor output and one
    entry per argument (positional, then keyword; ``None`` for non-tensors; for a list of
    tensors one placement for all or a list with one per element). hyper_shard expands
    them over the mesh dims and redistributes the inputs into the cheapest one, as for a
    YAML entry (docs/custom_ops.md); it is called once per call signature (every
    non-tensor argument's value is part of it) and the decision is cached. A registration
    replaces any earlier rule for the op (built-in, YAML, or an earlier registration) and
    survives ``hyper_shard.registry.reload()``.

    Args:
        op: ``torch.ops.<namespace>.<op>.<overload>`` (its packet means ``.default`` and
            binds both), e.g. an aten op called directly or a ``torch.library.custom_op``;
            or a list of them.

    Returns:
        The decorator; it returns the function unchanged.

    Raises:
        TypeError: ``op`` is not such an op (MindSpore Primitives are not supported yet:
            the message points to a YAML entry with a DistributedOp class).

    The global output shapes come from running the op on meta tensors: a custom op needs
    its ``register_fake`` (as in PyTorch). A public function (``torch.argmax``) keeps its
    own rule: registering ``aten.argmax.default`` changes ``torch.ops.aten.argmax`` calls.
    """
    from ._register_sharding import register
    from .platform.select import get_platform, platform_of_object

    ops = list(op) if isinstance(op, (list, tuple)) else [op]

    def wrapper(fn: Callable[..., Any]) -> Callable[..., Any]:
        for o in ops:  # the op's framework's platform (the default one for anything else)
            register(platform_of_object(o) or get_platform(), o, fn)
        return fn

    return wrapper


@contextmanager
def context_parallel(
    mesh: Any,
    *,
    buffers: list[Any] | None = None,
    buffer_seq_dims: list[int] | None = None,
    no_restore_buffers: set[Any] | None = None,
) -> Iterator[None]:
    """Context parallelism, as PyTorch's ``torch.distributed.tensor.experimental.
    context_parallel`` (same signature and semantics; torch and MindSpore).

    Inside the block, each of ``buffers`` (plain tensors: input ids, labels, position
    ids... never parameters) holds, in place, this rank's piece of its sequence dim
    ``buffer_seq_dims[i]`` (its shape changes) in the context's *sequence layout*: by
    default head-tail load-balanced when the sequence splits into ``2 n`` equal chunks
    (rank ``r`` holds chunks ``r`` and ``2 n - 1 - r``, so causal attention costs every
    rank the same, as PyTorch's default load balancer), else contiguous ``torch.chunk``
    pieces (:func:`set_load_balance` changes that). Every buffer gets the same layout, so
    per-token losses over the pieces of ids, labels and position ids sum to the whole
    sequence's.

    Scaled dot-product attention called on plain local ``(*batch, heads, seq_piece, E)``
    pieces inside the block (torch: ``torch.nn.functional.scaled_dot_product_attention``;
    MindSpore: ``hyper_shard.platform.mindspore.functional.scaled_dot_product_attention``)
    attends over the whole sequence and returns the local output piece: ring attention
    (key/value pieces passed round the ranks, merged by log-sum-exp, memory O(seq / n)),
    all-to-all (Ulysses) attention (heads split over the ranks), or key/value all-gathered,
    as the attention rule's cost model picks (:mod:`hyper_shard.rules.attention_cp`) or
    :func:`set_rotate_method` / :func:`set_context_parallel_method` fix; ``is_causal``
    follows the layout; gradients flow to every piece. On exit every buffer gets its
    original values back, except those in ``no_restore_buffers`` (a buffer whose
    ``requires_grad`` was turned on in the block too, where PyTorch fails to resize it;
    its ``.grad`` stays the piece's); the function is restored.
    :func:`context_parallel_unshard` turns pieces back into whole tensors.

    Differences from PyTorch: a non-causal attention in the load-balanced layout is
    computed (PyTorch raises "Load balancing requires `is_causal=True`"); a length the
    forced head-tail layout cannot split is an error (PyTorch silently falls back to
    contiguous pieces); the default method is the cost model's (PyTorch's: all-gather);
    an explicit ``attn_mask`` raises ``NotImplementedError`` (as PyTorch's SDPA path).
    Model code must look the function up at call time (``F.scaled_dot_product_attention
    (...)``), as with PyTorch's patch.

    Args:
        mesh: a 1-D DeviceMesh (hyper_shard's or torch's) over the context-parallel ranks
            (``mesh["cp"]`` of a larger mesh).
        buffers: the tensors to shard along their sequence dims.
        buffer_seq_dims: one sequence dim per buffer.
        no_restore_buffers: buffers (a subset of ``buffers``) left as pieces on exit.

    Raises:
        ValueError: ``buffers`` and ``buffer_seq_dims`` of different lengths,
            ``no_restore_buffers`` not a subset of ``buffers``, a Parameter buffer, a
            buffer that requires grad on entry (torch: resized in place), a mesh
            that is not 1-D (PyTorch's messages where it has them), or load balancing
            forced on with a sequence length that is not a multiple of ``2 n`` (on every
            rank, before anything communicates).
        NotImplementedError: a platform that declares no ``context_parallel``.
    """
    from .mesh import as_mesh
    from .registry.platforms import platform_bindings

    m = as_mesh(mesh, "context_parallel")
    impl = platform_bindings(m.platform.name).load("context_parallel")
    if impl is None:
        raise NotImplementedError(
            f"context_parallel is not available for {m.platform.name} meshes (its platform "
            f"declares none); shard the sequence with DTensors (distribute_tensor(x, mesh, "
            f"[Shard(seq_dim)])): their attention rule runs the same context-parallel "
            f"attention"
        )
    with impl(
        m, buffers=buffers, buffer_seq_dims=buffer_seq_dims, no_restore_buffers=no_restore_buffers
    ):
        yield


def context_parallel_unshard(
    mesh: Any, buffers: Sequence[Any], seq_dims: Sequence[int]
) -> list[Any]:
    """The whole tensors back from :func:`context_parallel`'s sequence pieces, as PyTorch's
    ``torch.distributed.tensor.experimental._attention.context_parallel_unshard`` (same
    signature): each of ``buffers`` (this rank's piece: an output of attention inside the
    context, a buffer left sharded by ``no_restore_buffers``, a piece's gradient) is
    all-gathered along ``seq_dims[i]`` in mesh-coordinate order and put back in natural
    order when the layout is head-tail (the layout :func:`context_parallel` gives a
    sequence of that length under the current :func:`set_load_balance`, as PyTorch reads
    its load balancer); every rank gets the whole tensors, plain tensors on every
    framework. Contiguous pieces may be uneven (``torch.chunk`` sizes).

    Raises:
        ValueError: ``buffers`` and ``seq_dims`` of different lengths (PyTorch's message);
            load balancing forced on and a length the head-tail layout cannot split.
    """
    from .dtensor import DTensor
    from .kernels.attention_layout import cp_options, natural_order
    from .mesh import as_mesh
    from .placement import Shard

    if len(buffers) != len(seq_dims):
        raise ValueError("`seq_dims` must have the same number of elements as `buffers`.")
    m = as_mesh(mesh, "context_parallel_unshard")
    n = m.size()
    out = []
    for b, d in zip(buffers, seq_dims):
        full = DTensor.from_local(b, m, [Shard(d)]).full_tensor()
        layout = cp_options().layout_for(int(full.shape[d]), n)
        out.append(natural_order(m.platform, full, d % len(full.shape), layout, n))
    return out


def set_rotate_method(rotate_method: str) -> None:
    """How context-parallel attention moves key/value pieces, as PyTorch's
    ``torch.distributed.tensor.experimental.set_rotate_method``: ``"allgather"`` gathers
    them (one all-gather of key and value, backward a reduce-scatter), ``"alltoall"``
    passes them round the ranks (ring attention by point-to-point shifts: PyTorch names it
    after the all-to-all it permutes with). Fixes the method for every later attention
    call (clears the layout cache); :func:`set_context_parallel_method` also chooses the
    all-to-all (Ulysses) form or the cost model.

    Raises:
        NotImplementedError: another string (PyTorch's message).
    """
    methods = {"allgather": "allgather", "alltoall": "ring"}
    if rotate_method not in methods:
        raise NotImplementedError(
            f"Context Parallel does not support using {rotate_method} for kv shards rotation"
        )
    set_context_parallel_method(methods[rotate_method])


def set_context_parallel_method(method: str) -> None:
    """Which context-parallel attention sequence-sharded query/key/value run:
    ``"auto"`` (the default: the attention rule's cost model picks, per call signature),
    ``"ring"`` (ring attention), ``"ulysses"`` (all-to-all to heads-sharded; the heads must
    split over the ranks, else the attention call raises) or ``"allgather"`` (key and
    value all-gathered). A method that does not apply to a call (a mask, dropout, a causal
    query and key of different lengths) falls back to ``"allgather"``. Process-wide;
    clears the layout cache so cached decisions are made again.

    Raises:
        ValueError: an unknown method.
    """
    from .dispatch.dispatcher import clear_cache
    from .kernels.attention_layout import METHODS, cp_options

    if method not in METHODS:
        raise ValueError(
            f"set_context_parallel_method({method!r}): use one of {', '.join(METHODS)}"
        )
    cp_options().method = method
    clear_cache()


def get_context_parallel_method() -> str:
    """The method :func:`set_context_parallel_method` set (``"auto"`` by default)."""
    from .kernels.attention_layout import cp_options

    return cp_options().method


def set_load_balance(enabled: bool | None) -> None:
    """Whether :func:`context_parallel` lays sequences out head-tail (load-balanced):
    None (the default, as PyTorch) where ``2 n`` divides the length, else contiguous
    pieces; True always (a length it cannot split is an error); False never. Process-wide
    (also read by :func:`context_parallel_unshard`).

    Raises:
        TypeError: not a bool or None.
    """
    from .kernels.attention_layout import cp_options

    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"set_load_balance({enabled!r}): pass True, False or None")
    cp_options().load_balance = enabled
