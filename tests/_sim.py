"""One check, two kinds of ranks: a check function ``fn(rank, world, *args)`` written for
the gloo pools (``tests/_dist.py``) also runs on the thread-simulated platform
(``tests/fake_platform``: every rank a thread of the pytest process, every collective
through an in-process exchange, the same planner, executor and rules), where a test only
checks layouts, plans, placements or values the sim computes the same way. The sim skips
the processes, so it is the cheap place for large sweeps; the collectives of a real
backend keep their own tests on the pools.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from hyper_shard import init_device_mesh
from tests.fake_platform import run_ranks, sim_mesh
from tests.fake_platform.platform import WORLD


def in_sim() -> bool:
    """True on a sim rank (a thread inside :func:`run_sim`)."""
    return WORLD.exchange is not None


def mesh(shape: Sequence[int], names: Sequence[str] | None = None, platform: Any = None) -> Any:
    """This rank's mesh of ``shape``: on the sim inside :func:`run_sim` (on ``platform``
    when given, e.g. a ``SimPlatform(native=...)``), else ``init_device_mesh("cpu", ...)``
    (a gloo pool worker)."""
    if in_sim():
        return sim_mesh(shape, names, platform)
    return init_device_mesh("cpu", tuple(shape), mesh_dim_names=names)


def run_sim(world: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """``fn(rank, world, *args)`` on every rank of a sim world; the results by rank, as
    ``DistPool.run`` gives them."""
    return run_ranks(world, lambda r: fn(r, world, *args))
