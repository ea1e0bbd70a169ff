"""Fresh, short-lived worlds of spawned ranks, for tests that break their process group
(a stalled or a dead rank, a divergent collective).

The session pools (``tests/_dist.py``, ``tests/mindspore/_pool.py``) must stay healthy, so
these tests never use them: :func:`run_fresh` spawns ``world`` new processes (gloo on
127.0.0.1 for torch, mccl for MindSpore), runs ``fn(rank, world, *args)`` on each and
collects every rank's :class:`Outcome` — returned, raised, died (``os._exit``, an abort) or
still running at the deadline (then killed). :func:`report` sends a partial result at once,
so what a rank found before it died is kept (several checks share one world: spawning is
the slow part). Each rank leaves with ``os._exit`` right after its result, so a broken
group never blocks the interpreter's exit.
"""

from __future__ import annotations

import dataclasses
import importlib
import multiprocessing as mp
import os
import socket
import sys
import time
import traceback
from typing import Any

_CTX = mp.get_context("spawn")
_RESULTS: list[Any] = []  # in a rank: (rank, results queue)


@dataclasses.dataclass
class Outcome:
    """One rank's end: ``status`` is ``"ok"`` (``value`` is what ``fn`` returned),
    ``"raised"`` (``error`` is the traceback), ``"died"`` (``exitcode``) or ``"hung"``."""

    rank: int
    status: str
    value: Any = None
    error: str = ""
    exitcode: int | None = None
    reports: dict[str, Any] = dataclasses.field(default_factory=dict)


def report(key: str, value: Any) -> None:
    """In a rank: send ``value`` to the test now, as ``Outcome.reports[key]``."""
    rank, q = _RESULTS[0]
    q.put((rank, "report", (key, value)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    framework: str,
    rank: int,
    world: int,
    port: int,
    target: tuple[str, str],
    args: tuple,
    results: Any,
    path: list[str],
    env: dict[str, str],
    init_timeout: float,
) -> None:
    sys.path[:] = path
    os.environ.update(env)
    _RESULTS.append((rank, results))
    try:
        if framework == "torch":
            import datetime

            import torch
            import torch.distributed as dist

            torch.set_num_threads(1)
            dist.init_process_group(
                "gloo",
                init_method=f"tcp://127.0.0.1:{port}",
                rank=rank,
                world_size=world,
                timeout=datetime.timedelta(seconds=init_timeout),
            )
        else:
            from hyper_shard.platform.mindspore.launch import init_process

            init_process(rank, world, port, timeout=init_timeout, seed=0)
        fn = getattr(importlib.import_module(target[0]), target[1])
        out = fn(rank, world, *args)
        results.put((rank, "ok", out))
    except BaseException:
        results.put((rank, "raised", traceback.format_exc()))
    os._exit(0)  # SimpleQueue.put is synchronous: the result is in the pipe


def run_fresh(
    fn: Any,
    *args: Any,
    world: int = 2,
    framework: str = "torch",
    deadline: float = 120.0,
    env: dict[str, str] | None = None,
    init_timeout: float = 120.0,
) -> list[Outcome]:
    """Run ``fn(rank, world, *args)`` (a module-level function) on ``world`` fresh ranks.

    The default process group (torch) or the world (MindSpore) is set up with
    ``init_timeout`` seconds (rendezvous under load); the tests build their own meshes with
    the short timeouts they test. Every rank still running ``deadline`` seconds after the
    start is killed and reported ``"hung"``. Returns the outcomes in rank order.
    """
    return start_fresh(
        fn,
        *args,
        world=world,
        framework=framework,
        deadline=deadline,
        env=env,
        init_timeout=init_timeout,
    ).collect()


class Fresh:
    """A started fresh world (:func:`start_fresh`); :meth:`collect` waits for its end."""

    def __init__(self, procs: list[Any], results: Any, deadline: float) -> None:
        self.procs = procs
        self.results = results
        self.end = time.monotonic() + deadline
        self._out: list[Outcome] | None = None

    def collect(self) -> list[Outcome]:
        """The outcomes in rank order (ranks still running at the deadline are killed)."""
        if self._out is None:
            self._out = self._collect()
        return self._out

    def _collect(self) -> list[Outcome]:
        procs, results, world = self.procs, self.results, len(self.procs)
        got: dict[int, Outcome] = {}
        reports: dict[int, dict[str, Any]] = {r: {} for r in range(world)}

        def take(rank: int, status: str, val: Any) -> None:
            if status == "report":
                reports[rank][val[0]] = val[1]
            else:
                got[rank] = _outcome(rank, status, val)

        try:
            while len(got) < world and time.monotonic() < self.end:
                if not results.empty():
                    take(*results.get())
                    continue
                for r, p in enumerate(procs):
                    if r not in got and not p.is_alive() and p.exitcode is not None:
                        while not results.empty():  # what it sent before it died
                            take(*results.get())
                        if r not in got:
                            got[r] = Outcome(r, "died", exitcode=p.exitcode)
                time.sleep(0.1)
        finally:
            for r, p in enumerate(procs):
                p.join(timeout=2 if r in got else 0.1)
                if p.is_alive():
                    p.kill()
                    p.join()
        out = [got.get(r, Outcome(r, "hung")) for r in range(world)]
        for o in out:
            o.reports = reports[o.rank]
        return out


def start_fresh(
    fn: Any,
    *args: Any,
    world: int = 2,
    framework: str = "torch",
    deadline: float = 120.0,
    env: dict[str, str] | None = None,
    init_timeout: float = 120.0,
) -> Fresh:
    """:func:`run_fresh` without waiting: several worlds can start together (their
    imports, rendezvous and timeouts overlap); ``.collect()`` each."""
    port = _free_port()
    results = _CTX.SimpleQueue()  # synchronous puts: a report survives os._exit
    full_env = {"OMP_NUM_THREADS": "1", "GLOG_v": "3", **(env or {})}
    procs = [
        _CTX.Process(
            target=_rank_main,
            args=(
                framework,
                r,
                world,
                port,
                (fn.__module__, fn.__name__),
                args,
                results,
                list(sys.path),
                full_env,
                init_timeout,
            ),
            daemon=True,
        )
        for r in range(world)
    ]
    for p in procs:
        p.start()
    return Fresh(procs, results, deadline)


def _outcome(rank: int, status: str, val: Any) -> Outcome:
    if status == "ok":
        return Outcome(rank, "ok", value=val)
    return Outcome(rank, "raised", error=str(val))


def caught(fn: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
    """Call ``fn``; describe how it ended (in the worker): ``{"error": class names of the
    exception's type and bases, "message", "reason", "cause", "seconds"}`` or
    ``{"error": None, "seconds"}``."""
    t0 = time.monotonic()
    try:
        fn(*args, **kwargs)
    except BaseException as e:  # noqa: BLE001 - reported to the test
        return {
            "error": [c.__name__ for c in type(e).__mro__],
            "message": str(e),
            "reason": getattr(e, "reason", None),
            "cause": type(e.__cause__).__name__ if e.__cause__ is not None else None,
            "doing": list(getattr(e, "doing", ())),
            "seconds": time.monotonic() - t0,
        }
    return {"error": None, "seconds": time.monotonic() - t0}
