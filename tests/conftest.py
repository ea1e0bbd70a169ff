from __future__ import annotations

import pytest

from tests._dist import DistPool

_POOLS: dict[tuple, DistPool] = {}


def get_pool(world: int, **env: str) -> DistPool:
    key = (world, tuple(sorted(env.items())))
    pool = _POOLS.get(key)
    if pool is None:
        pool = _POOLS[key] = DistPool(world, env)
    return pool


@pytest.fixture(scope="session")
def dist2() -> DistPool:
    return get_pool(2)


@pytest.fixture(scope="session")
def dist4() -> DistPool:
    return get_pool(4)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
