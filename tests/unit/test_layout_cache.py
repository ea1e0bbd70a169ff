"""The layout cache's hot path: the unrolled cache keys equal the general ones, the bounded
cache keeps a decision that is still hit (second-chance eviction) and counts every hit, and
an override-only decision (a view's rank-local shape) gives the same local result on a
hit as on its first run."""

from __future__ import annotations

import pytest
import torch
from torch._C import DisableTorchFunctionSubclass

from hyper_shard import DeviceMesh, DTensor, Replicate, Shard
from hyper_shard.dispatch import dispatcher
from hyper_shard.platform.torch.dispatch import _TABLE, _lookup


def _local(dt: torch.Tensor) -> torch.Tensor:
    with DisableTorchFunctionSubclass():
        return dt.as_subclass(torch.Tensor)


def _mesh() -> DeviceMesh:
    return DeviceMesh.abstract((2,), rank=0)  # no collective runs: nothing moves


def _dt(full: torch.Tensor, placements: list) -> DTensor:
    mesh = _mesh()
    local = full.chunk(2, 0)[0].clone() if placements == [Shard(0)] else full.clone()
    return DTensor.from_local(local, mesh, placements, shape=full.shape, stride=full.stride())


@pytest.fixture
def small_cache():
    old = dispatcher.config.cache_size
    dispatcher.clear_cache()
    yield
    dispatcher.config.cache_size = old
    dispatcher.clear_cache()


def test_unrolled_keys_equal_the_general_key() -> None:
    a = _dt(torch.randn(4, 6), [Shard(0)])
    b = _dt(torch.randn(4, 6), [Replicate()])
    c = _dt(torch.randn(6), [Replicate()])
    cases = {
        torch.add: [(a, b), (a, 2.0), (a, 2), (a, None), (a, b, 3), (a,)],
        torch.sum: [(a, 1), (a, 0), (a, 1, True), (a, 1, False), (a,)],
        torch.Tensor.reshape: [(a, 2, 12), (a, 12, 2), (a, 3, 2, 4), (a, 24)],
        torch.nn.functional.linear: [(a, b.T, c), (b, a.T, c)],
        torch.where: [(a, a, b)],
    }
    for fn, calls in cases.items():
        bound = _TABLE.get(fn) or _lookup(fn)
        assert bound is not None
        keys = set()
        for args in calls:
            key, dts = bound.key(args, {})
            assert (key, dts) == bound._key(args, {}), (fn, args)
            keys.add(key)
        assert len(keys) == len(calls), fn  # different static values, types, specs: different keys


def test_bounded_cache_keeps_a_decision_still_hit(small_cache: None) -> None:
    dispatcher.config.cache_size = 4
    hot = _dt(torch.randn(4, 6), [Shard(0)])
    hot_full = torch.cat([_local(hot), _local(hot)])  # what the hot call's local data stands for
    torch.testing.assert_close(_local(hot * hot), (hot_full * hot_full).chunk(2, 0)[0])
    (hot_key,) = dispatcher._CACHE
    calls = 1
    for n in range(1, 13):  # 12 other decisions through a cache of 4
        x = _dt(torch.randn(2 * n, 3), [Shard(0)])
        torch.testing.assert_close(_local(x + x), 2 * _local(x))
        calls += 1
        torch.testing.assert_close(_local(hot * hot), (hot_full * hot_full).chunk(2, 0)[0])
        calls += 1
        assert len(dispatcher._CACHE) <= 4
        assert hot_key in dispatcher._CACHE  # hit since it was last looked at: kept
    info = dispatcher.cache_info()
    assert info["misses"] == 13 and info["hits"] == calls - 13  # the hot op: 1 miss, 12 hits
    assert info["size"] <= info["max_size"] == 4


def test_evicted_decisions_keep_their_hits(small_cache: None) -> None:
    dispatcher.config.cache_size = 2
    for n in range(1, 6):
        x = _dt(torch.randn(2 * n, 3), [Shard(0)])
        for _ in range(3):
            x + x
    info = dispatcher.cache_info()
    assert info == {"hits": 10, "misses": 5, "size": 2, "max_size": 2}


def test_override_only_decision_on_a_hit(small_cache: None) -> None:
    # Shard(0) of (4, 6) on 2 ranks: the local (2, 6) becomes (1, 12); the decision
    # overrides the shape argument with the local shape and moves nothing
    full = torch.arange(24.0).reshape(4, 6)
    want = full.reshape(2, 12).chunk(2, 0)[0]
    for form in ((2, 12), ((2, 12),)):
        dt = _dt(full, [Shard(0)])
        outs = [dt.reshape(*form) for _ in range(3)]  # a miss, then two hits
        for out in outs:
            assert out.shape == (2, 12) and out.placements == (Shard(0),)
            torch.testing.assert_close(_local(out), want)
    info = dispatcher.cache_info()
    assert info["hits"] == 4 and info["misses"] == 2
    decs = list(dispatcher._CACHE.values())
    assert all(d.overrides and d.splice is not None for d in decs)
