"""Starting MindSpore ranks on one machine without ``msrun`` (tests, examples, notebooks).

Users launch with ``msrun`` (see docs/mindspore.md); :class:`~hyper_shard.DeviceMesh`
then joins the world through ``mindspore.communication.init()``. On one machine,
:func:`spawn` starts ``world`` processes (``multiprocessing`` *spawn* context: never fork
a process that imported MindSpore) and each calls :func:`init_process`: a
``mint.distributed.TCPStore`` hosted by rank 0 and MindSpore's store-based mccl init
(``init_process_group(init_method=...)`` only accepts HCCL in 2.10).

Every step is bounded: a rank that fails or hangs makes :func:`spawn` kill the others
and raise with every rank's traceback (a hang is never silent).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from datetime import timedelta
from multiprocessing import util as _mp_util
from typing import Any

__all__ = ["init_process", "finish_process", "spawn", "free_port", "SpawnError"]

_STORE: list[Any] = []  # keep rank 0's TCPStore alive for the process lifetime


class SpawnError(RuntimeError):
    """A spawned rank raised, exited early or timed out (the message has every rank's
    traceback or status)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def init_process(
    rank: int,
    world: int,
    port: int,
    *,
    device: str = "CPU",
    timeout: float = 60.0,
    blocking: bool = True,
    seed: int | None = None,
    collective_timeout: timedelta | float | None = None,
) -> None:
    """Join a ``world``-rank MindSpore job as ``rank`` (PyNative; mccl on CPU).

    Args:
        rank / world: this process's rank and the number of processes.
        port: the TCP port rank 0's store listens on (127.0.0.1).
        device: ``"CPU"`` (mccl); Ascend/GPU jobs should use ``msrun``.
        timeout: seconds for the rendezvous (the store and the mccl init).
        collective_timeout: how long a collective waits for its group before it fails
            (a timedelta or seconds; default ``HYPER_SHARD_TIMEOUT`` or 10 minutes): sets
            ``MS_CPU_COMM_OP_TIMEOUT`` unless it is exported (process-wide, fixed from now on).
        blocking: call ``mindspore.runtime.launch_blocking()`` (on a CPU with few cores
            MindSpore's asynchronous launch is ~10x slower).
        seed: ``mindspore.set_seed(seed)`` on every rank (random factories then agree).

    Raises:
        RuntimeError: the rendezvous failed (a rank missing, a port in use).
    """
    os.environ.setdefault("GLOG_v", "3")  # MindSpore C++ logs: errors only
    import mindspore as ms

    ms.set_device(device)
    if blocking:
        ms.runtime.launch_blocking()
    if seed is not None:
        ms.set_seed(seed)
    if world > 1:
        from mindspore.mint.distributed import TCPStore

        from .hooks import init_with_store

        td = timedelta(seconds=timeout)
        store = TCPStore("127.0.0.1", port, world_size=world, is_master=rank == 0, timeout=td)
        _STORE.append(store)
        from .timeouts import set_collective_timeout

        set_collective_timeout(device, collective_timeout)
        init_with_store(backend="mccl", timeout=td, world_size=world, rank=rank, store=store)
        from . import _patch_world_defaults

        _patch_world_defaults()
        # rank 0 returns from the init at once: meet before any real work, first through
        # the store (bounded by the rendezvous timeout, however late a rank is), then in a
        # collective (bounded by the collective timeout, which may be short)
        _store_barrier(store, "hyper_shard/init_process", world, timeout)
        barrier()


def _store_barrier(store: Any, key: str, world: int, timeout: float) -> None:
    """Wait until ``world`` ranks have called this with ``key`` (a counter in the store).

    Raises:
        RuntimeError: not every rank arrived within ``timeout`` seconds.
    """
    store.add(key, 1)
    deadline = time.monotonic() + timeout
    while store.add(key, 0) < world:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"init_process: only {store.add(key, 0)} of {world} ranks joined within "
                f"{timeout} s; a rank failed to start (see its log) or the machine is "
                f"overloaded (raise timeout=)"
            )
        time.sleep(0.01)


def barrier() -> None:
    """A barrier over the whole world (no-op in a world of one): a one-element all-reduce.

    Not ``mint.distributed.barrier``: in MindSpore 2.10 it calls
    ``mindspore.runtime.synchronize()``, which on CPU logs ``[ERROR] CPU device is not
    supported`` on every rank (the barrier itself works); an all-reduce returns only when
    every rank has joined it and logs nothing."""
    from mindspore.communication import GlobalComm

    from .hooks import comm_initialized

    if comm_initialized():
        import mindspore as ms
        import mindspore.mint.distributed as dist

        dist.all_reduce(ms.Tensor([1.0], ms.float32), group=GlobalComm.WORLD_COMM_GROUP)


def finish_process() -> None:
    """Meet every rank before exiting (rank 0 hosts the store: it must not leave first)."""
    barrier()


def _entry(fn: Callable, rank: int, world: int, port: int, q: Any, args: tuple, opts: dict) -> None:
    try:
        init_process(rank, world, port, **opts)
        out = fn(rank, world, *args)
        finish_process()
        q.put((rank, True, out))
    except BaseException:
        q.put((rank, False, traceback.format_exc()))
    # MindSpore's interpreter teardown takes seconds; the result is all the parent needs
    q.close()
    q.join_thread()
    # what multiprocessing's own exit runs first: semaphores this rank made (tqdm's lock)
    # are unlinked, else the parent's resource tracker warns of "leaked semaphore objects"
    _mp_util._run_finalizers(0)  # type: ignore[attr-defined]
    os._exit(0)


def spawn(
    fn: Callable,
    world: int,
    *args: Any,
    timeout: float = 300.0,
    device: str = "CPU",
    seed: int | None = None,
    blocking: bool = True,
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned MindSpore ranks; return the
    per-rank results (``fn`` must be importable: a module-level function).

    Raises:
        SpawnError: some rank raised, exited without a result, or the ranks did not
            finish within ``timeout`` seconds (all ranks are then killed).
    """
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    port = free_port()
    opts = {"device": device, "seed": seed, "blocking": blocking}
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world, port, q, args, opts), daemon=True)
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple[bool, Any]] = {}
    deadline = time.monotonic() + timeout
    try:
        while len(results) < world:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                rank, ok, val = q.get(timeout=min(1.0, left))
            except queue.Empty:
                if any(not p.is_alive() and p.exitcode not in (0, None) for p in procs):
                    time.sleep(0.5)  # let a dying rank's report arrive
                    while not q.empty():
                        rank, ok, val = q.get()
                        results[rank] = (ok, val)
                    break
                continue
            results[rank] = (ok, val)
            if not ok:  # a failed rank: the others may wait in a collective forever
                deadline = min(deadline, time.monotonic() + 5.0)
    finally:
        for p in procs:
            p.join(timeout=5 if len(results) == world else 0.1)
            if p.is_alive():
                p.kill()
                p.join()
    errors = [f"--- rank {r} ---\n{v}" for r, (ok, v) in sorted(results.items()) if not ok]
    missing = [r for r in range(world) if r not in results]
    if errors or missing:
        status = "".join(
            f"--- rank {r}: no result (exit code {procs[r].exitcode}) ---\n" for r in missing
        )
        raise SpawnError(f"{getattr(fn, '__name__', fn)} failed:\n" + "\n".join(errors) + status)
    return [results[r][1] for r in range(world)]
