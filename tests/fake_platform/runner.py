"""Running a function on every rank of a simulated world, each rank a thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from hyper_shard.mesh import DeviceMesh, init_device_mesh

from .exchange import Exchange
from .platform import KEY, PLATFORM, WORLD

__all__ = ["run_ranks", "sim_mesh"]


def run_ranks(world: int, fn: Callable[[int], Any], timeout: float = 120.0) -> list[Any]:
    """``fn(rank)`` on every rank of a world of ``world`` ranks, each in a thread whose
    sim platform collectives meet the others'; the results by rank.

    Raises:
        The first exception a rank raised (the others' collectives are released).
        TimeoutError: a rank did not finish within ``timeout`` seconds.
    """
    ex = Exchange(world)
    results: list[Any] = [None] * world
    errors: list[BaseException] = []

    def work(r: int) -> None:
        WORLD.rank, WORLD.exchange = r, ex
        try:
            results[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported to the caller below
            errors.append(e)
            ex.abort()
        finally:
            WORLD.exchange = None

    threads = [threading.Thread(target=work, args=(r,), name=f"sim-rank-{r}") for r in range(world)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        ex.abort()
        raise TimeoutError(f"a sim rank did not finish within {timeout} s")
    return results


def sim_mesh(
    shape: Sequence[int], names: Sequence[str] | None = None, platform: Any = None
) -> DeviceMesh:
    """This rank's mesh of ``shape`` over the whole world (inside :func:`run_ranks`), on
    ``platform`` (default: the registered sim platform; a ``SimPlatform(native=...)``
    composes the collectives it lacks)."""
    plat = PLATFORM if platform is None else platform
    return init_device_mesh(KEY, tuple(shape), mesh_dim_names=names, platform=plat)
