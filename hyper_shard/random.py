"""Offset-based RNG tracker: a random op on a DTensor equals the single-device op.

Every rank of a mesh keeps the same generator state (seed them alike with
:func:`manual_seed`, or copy rank 0's state with :func:`sync_rng_state`). A random op on a
DTensor (dropout, ``rand_like``, ``Tensor.uniform_``, ``nn.init.normal_``...) then runs
inside the tracker: the op draws the *whole global tensor* from that shared state, with the
same kernel, shape and dtype as the single-device op, and each rank keeps the box its shard
owns (its global offset and local shape). So:

* every shard equals its slice of the single-device draw for the same seed (Shard,
  Replicate and nested placements alike, uneven shards included);
* the generator advances exactly as it would on one device, so the next random op, on a
  DTensor or a plain tensor, stays in lockstep with a single-device run.

**Cost** (the price of exactness): per random op, every rank does the RNG work of the
whole global tensor and holds one global-size temporary until its slice is copied out;
there is no communication. A sharded dropout therefore costs one full-size mask draw per
rank, a sharded ``nn.init`` one full-size parameter draw per rank.

Why not a true offset into the stream (as PyTorch's CUDA tracker does with Philox)? The
CPU generator is an mt19937 with no skip-ahead API, and the CPU kernels consume it in
kernel-specific ways (``normal_`` draws 16-wide Box-Muller blocks and recomputes the tail,
``bernoulli_`` one draw per element...). A rank drawing only a prefix or a skipped range
would neither reproduce the single-device values nor leave the generator in the
single-device state. Drawing the whole tensor is the exact choice.

Plain random ops on plain tensors are not tracked: a rank that draws alone (e.g. only
rank 0 samples data from the default generator) puts the ranks' generators out of step;
:func:`rng_synced` checks, :func:`sync_rng_state` repairs.

**Ranks as threads.** Where the ranks are threads of one process (PyTorch's threaded
process group: :meth:`~hyper_shard.platform.base.Comm.ranks_are_threads`) they share one
generator, so drawing once per rank would advance it once per rank and give each rank
other values. There the tracker draws each random op *once* for every rank of the mesh (the
first rank to reach its ``k``-th draw on a mesh draws it; the others take the same tensor)
and ``manual_seed(seed, mesh)`` / ``sync_rng_state`` set the generator once: values and
generator state equal one device's, as with one process per rank, provided the threads
draw from the generator only through DTensor ops (seed it once, before the threads draw,
or with ``manual_seed(seed, mesh)``). A Replicate DTensor's random op runs in the tracker
too there (each process's own generator makes it identical elsewhere). The counters
(:attr:`OffsetRNGTracker.stats`) are kept per rank.

Semantics follow the framework's own random ops (``torch.nn.functional.dropout``,
``torch.rand_like``...) on the global tensor. The generator is the one the platform declares
(``PlatformBindings.generator``; its state only where ``rng_state``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .mesh import DeviceMesh, this_rank

if TYPE_CHECKING:
    from .platform.base import LocalOps

__all__ = [
    "OffsetRNGTracker",
    "RNGStats",
    "get_rng_tracker",
    "manual_seed",
    "sync_rng_state",
    "rng_synced",
]


@dataclass
class RNGStats:
    """Counters of the tracker: ``draws`` (random ops run), ``elements`` (elements drawn,
    global-size draws included), ``kept`` (elements kept by this rank)."""

    draws: int = 0
    elements: int = 0
    kept: int = 0


class OffsetRNGTracker:
    """Runs the random draws of DTensor ops so each shard owns its slice of the
    single-device stream (see the module docstring).

    A rule's local kernel calls :meth:`draw_shard` with a function that draws the global
    tensor, the box (global offset, local shape) of this rank's shard and the mesh.
    """

    def __init__(self) -> None:
        #: per rank (one entry with one rank per process): counters, draws per root mesh
        self._stats: dict[int | None, RNGStats] = {}
        self._events: dict[tuple[Any, int], int] = {}

    @property
    def stats(self) -> RNGStats:
        """The calling rank's counters."""
        return self._stats_of(this_rank())

    def _stats_of(self, rank: int | None) -> RNGStats:
        st = self._stats.get(rank)
        return st if st is not None else self._stats.setdefault(rank, RNGStats())

    def draw_shard(
        self,
        plat: LocalOps,
        draw_global: Callable[[], Any],
        offset: Sequence[int],
        local_shape: Sequence[int],
        mesh: DeviceMesh | None = None,
    ) -> Any:
        """This rank's box of one global draw.

        Args:
            plat: the Platform (for ``shape``/``narrow``/``clone``).
            draw_global: draws the whole global tensor from the shared generator state.
            offset: the global index of the shard's first element (one entry per dim).
            local_shape: the shard's shape.
            mesh: the DTensor's mesh; where its ranks are threads of this process, the
                global tensor is drawn once for all of them (the module docstring).

        Returns:
            The box ``[offset, offset + local_shape)`` of the draw, a contiguous tensor that
            does not keep the global draw alive (the draw itself when the box is all of it
            and no other rank shares it).

        Raises:
            ValueError: the box does not fit inside the drawn tensor.
        """
        full, shared = self._draw(draw_global, mesh)
        shape = plat.shape(full)
        if len(shape) != len(offset) or len(shape) != len(local_shape):
            raise ValueError(
                f"RNG tracker: a draw of shape {tuple(shape)} cannot hold a box at offset "
                f"{tuple(offset)} of shape {tuple(local_shape)}"
            )
        stats = self._stats_of(this_rank() if mesh is None else mesh.get_rank())
        stats.draws += 1
        n = 1
        for s in shape:
            n *= s
        stats.elements += n
        out = full
        cut = False
        for d, (o, ln, s) in enumerate(zip(offset, local_shape, shape)):
            if o < 0 or o + ln > s:
                raise ValueError(
                    f"RNG tracker: box [{o}, {o + ln}) is outside dim {d} of size {s} of the draw"
                )
            if ln != s:
                out = plat.narrow(out, d, o, ln)
                cut = True
        k = 1
        for ln in local_shape:
            k *= ln
        stats.kept += k
        return plat.clone(out) if cut or shared else out

    def _draw(self, draw_global: Callable[[], Any], mesh: DeviceMesh | None) -> tuple[Any, bool]:
        """The global draw, and whether other ranks (threads) share the tensor."""
        if mesh is None or mesh.is_abstract or not mesh.platform.ranks_are_threads():
            return draw_global(), False
        return self._once(mesh, draw_global), True

    def _once(self, mesh: DeviceMesh, run: Callable[[], Any]) -> Any:
        """``run()`` once for every rank of ``mesh``'s root mesh, all threads of this
        process: the ``k``-th call of each rank on that root returns the result of the
        first rank's ``k``-th call. Ranks reach their ``k``-th call only after their
        ``k-1``-th, so the calls run (under a lock) in program order, as on one device."""
        root = mesh._root or mesh
        where = root._desc
        rank = mesh.get_rank()
        k = self._events.get((where, rank), 0)
        self._events[(where, rank)] = k + 1
        key = (where, k)
        with _SHARED_LOCK:
            slot = _SHARED.get(key)
            if slot is None:
                out = run()
                if root.size() > 1:
                    _SHARED[key] = [out, root.size() - 1]
                return out
            slot[1] -= 1
            if slot[1] <= 0:
                del _SHARED[key]
            return slot[0]


#: draws (and seeds) of ranks that are threads of this process, waiting for the other
#: ranks of their root mesh: (root mesh, k) -> [result, ranks still to take it]
_SHARED: dict[tuple[Any, int], list[Any]] = {}
_SHARED_LOCK = threading.Lock()

_TRACKER = OffsetRNGTracker()


def get_rng_tracker() -> OffsetRNGTracker:
    """The process's RNG tracker (used by the random, dropout and attention rules; its
    counters are per rank)."""
    return _TRACKER


def _generator(device_mesh: DeviceMesh | None, what: str, state: bool = False) -> Any:
    """The generator the mesh's platform (or the default one) declares.

    Raises:
        NotImplementedError: the platform declares none, or (``state``) one whose state it
            does not expose.
    """
    if device_mesh is not None and not device_mesh.is_abstract:
        key = device_mesh.platform.name
    else:
        from ._locator import get_platform

        key = get_platform().name
    from .registry.platforms import platform_bindings

    b = platform_bindings(key)
    if b.generator is None or (state and not b.rng_state):
        have = "no generator" if b.generator is None else "no generator state (rng_state=False)"
        raise NotImplementedError(
            f"hyper_shard.random.{what}: the {key} platform declares {have}; only platforms "
            f"that expose their generator's state can check or copy it"
        )
    return b.load("generator")


def manual_seed(seed: int, device_mesh: DeviceMesh | None = None) -> None:
    """Seed the framework's default generator with ``seed`` on this rank (call it on every
    rank with the same seed, as ``torch.manual_seed``).

    Args:
        seed: the seed (the same on every rank).
        device_mesh: if given, check across the mesh that every rank passed the same seed
            (one small all-gather per mesh dim).

    Raises:
        ValueError: ``device_mesh`` given and some rank passed another seed (the message
            lists the seeds seen).
    """
    seed = int(seed)
    if device_mesh is not None and not device_mesh.is_abstract:
        plat = device_mesh.platform
        seen = {seed}
        for m in range(device_mesh.ndim):
            got = plat.all_gather_object(sorted(seen), device_mesh._group(m), device_mesh.shape[m])
            seen = {s for lst in got for s in lst}
        if len(seen) > 1:
            raise ValueError(
                f"hyper_shard.random.manual_seed: ranks of mesh {device_mesh} passed different "
                f"seeds {sorted(seen)}; pass the same seed on every rank, so that sharded random "
                f"ops equal the single-device ones"
            )
    gen = _generator(device_mesh, "manual_seed")
    if device_mesh is not None and not device_mesh.is_abstract:
        if device_mesh.platform.ranks_are_threads():  # one generator for every rank: once
            _TRACKER._once(device_mesh, lambda: gen.manual_seed(seed))
            return
    gen.manual_seed(seed)


def rng_synced(device_mesh: DeviceMesh) -> bool:
    """True if every rank of ``device_mesh`` holds the same default-generator state (torch;
    one small all-gather per mesh dim). A collective: every rank must call it.

    Raises:
        NotImplementedError: a platform whose generator state is not exposed (MindSpore).
    """
    gen = _generator(device_mesh, "rng_synced", state=True)
    plat = device_mesh.platform
    seen = {gen.state_digest()}
    for m in range(device_mesh.ndim):
        got = plat.all_gather_object(sorted(seen), device_mesh._group(m), device_mesh.shape[m])
        seen = {s for lst in got for s in lst}
    return len(seen) == 1


def sync_rng_state(device_mesh: DeviceMesh) -> None:
    """Give every rank of ``device_mesh`` the default-generator state of the mesh's
    coordinate 0 (torch; one broadcast per mesh dim). A collective.

    Raises:
        NotImplementedError: a platform whose generator state is not exposed (MindSpore).
    """
    gen = _generator(device_mesh, "sync_rng_state", state=True)
    plat = device_mesh.platform
    state = gen.get_state()
    for m in range(device_mesh.ndim):
        state = plat.broadcast(state, 0, device_mesh._group(m))
    if plat.ranks_are_threads():  # one generator for every rank: set it once
        _TRACKER._once(device_mesh, lambda: gen.set_state(state))
    else:
        gen.set_state(state)
