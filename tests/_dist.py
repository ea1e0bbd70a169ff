"""A pool of real worker processes (spawned, gloo on 127.0.0.1) that run test functions.

Starting torch in a process costs seconds, so each world size gets one pool per test
session; every multi-process test sends the pool a module-level function and its
arguments. A worker that raises reports its traceback; a collective that hangs makes
the pool time out, get killed and restart (a failing test never hangs the session).
"""

from __future__ import annotations

import datetime
import importlib
import multiprocessing as mp
import os
import queue
import socket
import sys
import threading
import traceback
from typing import Any

_CTX = mp.get_context("spawn")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(
    rank: int, world: int, port: int, tasks: Any, results: Any, path: list[str], env: dict
) -> None:
    sys.path[:] = path
    os.environ.update(env)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=datetime.timedelta(seconds=90),
    )
    while True:
        task = tasks.get()
        if task is None:
            break
        mod, name, args = task
        try:
            fn = getattr(importlib.import_module(mod), name)
            out = fn(rank, world, *args)
            results.put((rank, True, out))
        except BaseException:  # report everything, including assertion errors
            results.put((rank, False, traceback.format_exc()))
    dist.destroy_process_group()


def warm(rank: int, world: int, calls: tuple[str, ...]) -> None:
    """Build the op registry and call each ``"module:function"`` of ``calls`` (cached
    loaders): what the first tests would pay."""
    from hyper_shard.registry import get_registry

    get_registry()
    for c in calls:
        mod, _, name = c.partition(":")
        getattr(importlib.import_module(mod), name)()


class DistPool:
    """``world`` spawned gloo ranks that run functions ``fn(rank, world, *args)``.

    One call at a time (a lock): :meth:`warm_up` runs :func:`warm` from a background
    thread while the session runs single-process tests, and the first test to use the
    pool waits for it instead of paying the start-up itself.
    """

    def __init__(self, world: int, env: dict | None = None) -> None:
        self.world = world
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._start()

    def warm_up(self, calls: tuple[str, ...] = ()) -> None:
        """Start the ranks' start-up in the background: :func:`warm` (see the class)."""

        def go() -> None:
            try:
                self.run(warm, calls, timeout=600)
            except AssertionError:
                pass  # a broken start-up: the first real call restarts the pool and says so

        threading.Thread(target=go, name=f"warm-dist{self.world}", daemon=True).start()

    def _start(self) -> None:
        port = _free_port()
        self.results = _CTX.Queue()
        self.tasks = [_CTX.Queue() for _ in range(self.world)]
        env = {"OMP_NUM_THREADS": "1", **self.env}
        self.procs = [
            _CTX.Process(
                target=_worker,
                args=(r, self.world, port, self.tasks[r], self.results, list(sys.path), env),
                daemon=True,
            )
            for r in range(self.world)
        ]
        # Every rank iterates sets in the same order (PYTHONHASHSEED is read at interpreter
        # start, so it must be in the environment the children are spawned with): OpInfo's
        # sample generators iterate sets (meshgrid's {"xy", "ij"}), and ranks drawing their
        # samples in different orders would run different cases.
        saved = os.environ.get("PYTHONHASHSEED")
        os.environ["PYTHONHASHSEED"] = "0"
        try:
            for p in self.procs:
                p.start()
        finally:
            if saved is None:
                del os.environ["PYTHONHASHSEED"]
            else:
                os.environ["PYTHONHASHSEED"] = saved

    def run(self, fn: Any, *args: Any, timeout: float = 300) -> list[Any]:
        """Run ``fn(rank, world, *args)`` on every rank; return the per-rank results.

        Raises:
            AssertionError: some rank raised (its traceback is in the message) or the
                ranks did not finish within ``timeout`` seconds (the pool restarts).
        """
        with self._lock:
            return self._run(fn, args, timeout)

    def _run(self, fn: Any, args: tuple, timeout: float) -> list[Any]:
        for q in self.tasks:
            q.put((fn.__module__, fn.__name__, args))
        out: dict[int, Any] = {}
        errors = []
        try:
            for _ in range(self.world):
                rank, ok, val = self.results.get(timeout=timeout)
                if ok:
                    out[rank] = val
                else:
                    errors.append(f"--- rank {rank} ---\n{val}")
        except queue.Empty:
            self.close(force=True)
            self._start()
            raise AssertionError(
                f"{fn.__name__}: ranks {sorted(set(range(self.world)) - set(out))} did not finish "
                f"in {timeout}s; pool restarted.\n" + "\n".join(errors)
            ) from None
        if errors:
            raise AssertionError(f"{fn.__name__} failed:\n" + "\n".join(errors))
        return [out[r] for r in range(self.world)]

    def close(self, force: bool = False) -> None:
        if not force:
            for q in self.tasks:
                q.put(None)
            for p in self.procs:
                p.join(timeout=20)
        for p in self.procs:
            if p.is_alive():
                p.kill()
