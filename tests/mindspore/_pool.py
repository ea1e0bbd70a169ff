"""A pool of spawned MindSpore ranks (mccl on 127.0.0.1) that run test functions.

The pytest process never imports MindSpore: each worker is a fresh *spawned* interpreter
(never a fork of a process that imported MindSpore) that joins the world once through
:func:`hyper_shard.platform.mindspore.launch.init_process` (TCPStore + the mccl store init,
``launch_blocking``) and then runs module-level functions ``fn(rank, world, *args)``.
A worker that raises reports its traceback; ranks that do not finish in time (a rank
stuck in a collective) make the pool kill every worker and start again, so a failing
test never hangs the session.
"""

from __future__ import annotations

import importlib
import multiprocessing as mp
import os
import pickle
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


def _framework_object(x: Any) -> str | None:
    """The type name of the first MindSpore object inside ``x`` (lists, tuples, dicts)."""
    if type(x).__module__.split(".")[0] == "mindspore":
        return type(x).__name__
    if isinstance(x, (list, tuple, set)):
        items: Any = x
    elif isinstance(x, dict):
        items = list(x.keys()) + list(x.values())
    else:
        mod = type(x).__module__.split(".")[0]
        return type(x).__name__ if mod == "hyper_shard" and hasattr(x, "_spec") else None
    for y in items:
        bad = _framework_object(y)
        if bad is not None:
            return bad
    return None


def _worker(
    rank: int, world: int, port: int, tasks: Any, results: Any, path: list[str], env: dict
) -> None:
    sys.path[:] = path
    os.environ.update(env)
    try:
        from hyper_shard.platform.mindspore.launch import finish_process, init_process

        init_process(rank, world, port, timeout=90, seed=0)
    except BaseException:
        results.put((rank, False, "init failed:\n" + traceback.format_exc()))
        return
    while True:
        task = tasks.get()
        if task is None:
            break
        mod, name, args = task
        try:
            fn = getattr(importlib.import_module(mod), name)
            out = fn(rank, world, *args)
            bad = _framework_object(out)
            if bad is not None:
                raise TypeError(
                    f"{name} returned a {bad} (inside its result): return numpy arrays and "
                    f"python values, the pytest process does not import MindSpore"
                )
            results.put((rank, True, pickle.dumps(out)))
        except BaseException:  # report everything, including assertion errors
            results.put((rank, False, traceback.format_exc()))
    try:
        finish_process()
    except BaseException:
        pass
    results.close()
    results.join_thread()
    os._exit(0)  # skip MindSpore's slow interpreter teardown


def warm(rank: int, world: int) -> None:
    """Build the op registry: what the first test would pay."""
    from hyper_shard.registry import get_registry

    get_registry()


class MSPool:
    """``world`` spawned MindSpore ranks that run functions ``fn(rank, world, *args)``.

    One call at a time (a lock): :meth:`warm_up` runs :func:`warm` from a background
    thread, and the first test to use the pool waits for it.
    """

    def __init__(self, world: int, env: dict | None = None) -> None:
        self.world = world
        self.env = dict(env or {})
        self._lock = threading.Lock()
        self._start()

    def warm_up(self) -> None:
        """Start the ranks' start-up in the background (see the class)."""

        def go() -> None:
            try:
                self.run(warm, timeout=600)
            except AssertionError:
                pass  # a broken start-up: the first real call restarts the pool and says so

        threading.Thread(target=go, name=f"warm-ms{self.world}", daemon=True).start()

    def _start(self) -> None:
        port = _free_port()
        self.results = _CTX.Queue()
        self.tasks = [_CTX.Queue() for _ in range(self.world)]
        env = {"OMP_NUM_THREADS": "1", "GLOG_v": "3", **self.env}
        self.procs = [
            _CTX.Process(
                target=_worker,
                args=(r, self.world, port, self.tasks[r], self.results, list(sys.path), env),
                daemon=True,
            )
            for r in range(self.world)
        ]
        for p in self.procs:
            p.start()

    def run(self, fn: Any, *args: Any, timeout: float = 120) -> list[Any]:
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
                    out[rank] = pickle.loads(val)
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
                p.join()
