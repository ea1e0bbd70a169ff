"""MindSpore test fixtures: pools of spawned mccl ranks (see ``_pool.py``).

Every test here runs its checks inside MindSpore worker processes; the pytest process
itself never imports MindSpore. The tests are skipped when MindSpore is not installed.
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.mindspore._pool import MSPool

_POOLS: dict[int, MSPool] = {}


def _pool(world: int) -> MSPool:
    if importlib.util.find_spec("mindspore") is None:
        pytest.skip("MindSpore is not installed")
    pool = _POOLS.get(world)
    if pool is None:
        pool = _POOLS[world] = MSPool(world)
    return pool


@pytest.fixture(scope="session")
def ms1() -> MSPool:
    """One MindSpore process: a world of one (no communication)."""
    return _pool(1)


@pytest.fixture(scope="session")
def ms2() -> MSPool:
    """Two MindSpore ranks (mccl)."""
    return _pool(2)


@pytest.fixture(scope="session")
def ms4() -> MSPool:
    """Four MindSpore ranks (mccl), for (2, 2) meshes."""
    return _pool(4)


def pytest_sessionfinish(session, exitstatus):  # noqa: ARG001
    for pool in _POOLS.values():
        pool.close()
    _POOLS.clear()
