"""The dispatcher's switches are ContextVars: two threads (and two asyncio tasks) in
different implicit-replication settings each see their own, at the same time; the hot path
stays exact while another thread holds the switch on."""

from __future__ import annotations

import asyncio
import threading

import pytest
import torch
from torch._C import DisableTorchFunctionSubclass

from hyper_shard import DeviceMesh, DTensor, Replicate, Shard
from hyper_shard.dispatch import switches
from hyper_shard.errors import ShardingError
from hyper_shard.experimental import implicit_replication


def _local(dt: torch.Tensor) -> torch.Tensor:
    with DisableTorchFunctionSubclass():
        return dt.as_subclass(torch.Tensor)


def _pair() -> tuple[DTensor, torch.Tensor, torch.Tensor]:
    mesh = DeviceMesh.abstract((2,), rank=0)  # no collective runs: the decisions move nothing
    full = torch.arange(12.0).reshape(4, 3)
    dt = DTensor.from_local(full.clone(), mesh, [Replicate()], shape=(4, 3), stride=(3, 1))
    return dt, full, torch.ones(4, 3)


def test_two_threads_see_their_own_setting() -> None:
    dt, full, plain = _pair()
    inside, outside = threading.Barrier(2), threading.Barrier(2)
    seen: dict[str, object] = {}

    def replicating() -> None:
        with implicit_replication():
            inside.wait()  # the other thread runs outside the block now
            outside.wait()
            seen["on"] = switches.implicit_replication_enabled()
            seen["sum"] = _local(dt + plain).clone()

    def strict() -> None:
        inside.wait()
        seen["off"] = switches.implicit_replication_enabled()
        try:
            dt + plain
        except ShardingError as e:
            seen["error"] = str(e)
        outside.wait()

    threads = [threading.Thread(target=replicating), threading.Thread(target=strict)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert seen["on"] is True and seen["off"] is False
    assert "implicit_replication" in str(seen["error"])  # refused, naming the way out
    torch.testing.assert_close(seen["sum"], full + plain)
    assert switches.ACTIVE.n == 0


def test_hot_path_with_the_switch_on_elsewhere() -> None:
    """A cached DTensor-only call stays a cache hit with the same result while another
    thread holds implicit replication on (the hot path then takes the slow path, which
    reads this thread's own setting)."""
    dt, full, plain = _pair()
    want = _local(dt * 2).clone()
    entered, release = threading.Event(), threading.Event()

    def hold() -> None:
        with implicit_replication():
            entered.set()
            release.wait(60)

    t = threading.Thread(target=hold)
    t.start()
    try:
        assert entered.wait(60)
        assert switches.ACTIVE.n == 1 and not switches.implicit_replication_enabled()
        torch.testing.assert_close(_local(dt * 2), want)
        with pytest.raises(ShardingError):
            dt + plain
    finally:
        release.set()
        t.join(timeout=60)


def test_asyncio_tasks_see_their_own_setting() -> None:
    dt, full, plain = _pair()

    async def replicating() -> bool:
        with implicit_replication():
            await asyncio.sleep(0.01)
            torch.testing.assert_close(_local(dt + plain), full + plain)
            return switches.implicit_replication_enabled()

    async def strict() -> bool:
        await asyncio.sleep(0)
        with pytest.raises(ShardingError):
            dt + plain
        return switches.implicit_replication_enabled()

    async def both() -> list[bool]:
        return list(await asyncio.gather(replicating(), strict()))

    assert asyncio.run(both()) == [True, False]


def test_nested_blocks_restore() -> None:
    assert not switches.implicit_replication_enabled()
    with implicit_replication():
        with implicit_replication():
            assert switches.implicit_replication_enabled()
        assert switches.implicit_replication_enabled()
        with pytest.raises(RuntimeError):
            with implicit_replication():
                raise RuntimeError("body fails")
        assert switches.implicit_replication_enabled()
    assert not switches.implicit_replication_enabled() and switches.ACTIVE.n == 0


def test_shard_inputs_too() -> None:
    """Implicit replication of a plain tensor next to a Shard DTensor chunks it locally."""
    mesh = DeviceMesh.abstract((2,), rank=1)
    full = torch.arange(12.0).reshape(4, 3)
    dt = DTensor.from_local(full[2:].clone(), mesh, [Shard(0)], shape=(4, 3), stride=(3, 1))
    with implicit_replication():
        out = dt + torch.ones(4, 3)
    assert out.placements == (Shard(0),)
    torch.testing.assert_close(_local(out), full[2:] + 1)
