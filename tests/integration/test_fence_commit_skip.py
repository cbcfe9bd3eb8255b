"""The N-server fence commit is skipped when the grant already put the fence on a majority
(``fencing.committed_by_grant``, docs/fencing.md), and taken when it did not: real servers,
both front ends, a Lock built per key (the asyncio one under ``asyncio.run()`` per job)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pytest
import redis

import fencelock
import fencelock.asyncio
from fencelock._core.fencing import FLOOR_STEP_US
from fencelock._core.keys import lock_keys

CYCLES = 20


def _scripts_run(admins: list[redis.Redis]) -> int:
    """Scripts run so far on all the servers (EVALSHA and EVAL)."""
    total = 0
    for admin in admins:
        stats = admin.info("commandstats")
        for name in ("cmdstat_evalsha", "cmdstat_eval"):
            total += int(stats.get(name, {}).get("calls", 0))
    return total


def _settled(admins: list[redis.Redis], before: int, at_least: int) -> int:
    """Scripts run since ``before``, once at least ``at_least`` ran (a round's stragglers
    arrive after it returned) or 2 s passed; the ``INFO`` calls are not scripts."""
    deadline = time.monotonic() + 2.0
    while True:
        ran = _scripts_run(admins) - before
        if ran >= at_least or time.monotonic() >= deadline:
            return ran
        time.sleep(0.01)


def _sync_cycle(urls: list[str], key: str, **options: object) -> int:
    lock = fencelock.Lock(urls, key, ttl=10, **options)  # type: ignore[arg-type]
    try:
        lease = lock.acquire(wait=0)
        fence = lease.fence
        lease.release()
        return fence
    finally:
        lock.close()


def _async_cycle(urls: list[str], key: str, **options: object) -> int:
    async def job() -> int:
        lock = fencelock.asyncio.Lock(urls, key, ttl=10, **options)  # type: ignore[arg-type]
        try:
            lease = await lock.acquire(wait=0)
            fence = lease.fence
            await lease.release()
            return fence
        finally:
            await lock.aclose()

    return asyncio.run(job())


CYCLERS: dict[str, Callable[..., int]] = {"sync": _sync_cycle, "async": _async_cycle}


@pytest.fixture
def three(topologies: object) -> list[str]:
    return topologies.urls(3)  # type: ignore[attr-defined, no-any-return]


@pytest.fixture
def admins(three: list[str]) -> list[redis.Redis]:
    clients = [redis.Redis.from_url(url) for url in three]
    yield clients  # type: ignore[misc]
    for client in clients:
        client.close()


@pytest.mark.parametrize("front", ["sync", "async"])
def test_healthy_servers_hand_the_lease_out_after_one_round(
    three: list[str], admins: list[redis.Redis], key: str, front: str
) -> None:
    cycle = CYCLERS[front]
    committed = 0
    fences = []
    for _ in range(CYCLES):
        before = _scripts_run(admins)
        fences.append(cycle(three, key))
        # acquire and release on each of the 3 servers; a commit adds one per granting server
        ran = _settled(admins, before, 6)
        committed += ran > 6
    assert fences == sorted(set(fences))  # they only grow
    # a round across a 10 ms boundary of the servers' clocks still commits: rare, not never
    assert committed <= CYCLES // 2, committed
    # the first grant over an empty register is the clock rounded up to the step
    assert fences[0] % FLOOR_STEP_US == 0


@pytest.mark.parametrize("front", ["sync", "async"])
def test_registers_that_disagree_get_the_commit(
    three: list[str], admins: list[redis.Redis], key: str, front: str
) -> None:
    # two registers far ahead, each a different value: no majority can return one value
    register = lock_keys(key).fence
    ahead = [10**16, 2 * 10**16]
    admins[0].set(register, ahead[0])
    admins[1].set(register, ahead[1])
    before = _scripts_run(admins)
    fence = CYCLERS[front](three, key)
    assert fence in (ahead[0] + 1, ahead[1] + 1)
    # 3 acquires, the commit on the (at least two) granting servers, 3 releases
    assert _settled(admins, before, 8) >= 8
    stored = [int(admin.get(register) or 0) for admin in admins]
    assert sum(value >= fence for value in stored) >= 2, stored


def test_without_restart_delay_the_floor_is_the_clock_itself(
    three: list[str], admins: list[redis.Redis], key: str
) -> None:
    # no step: the servers' microsecond clocks differ, so the grants disagree and commit
    committed = 0
    for _ in range(10):
        before = _scripts_run(admins)
        _sync_cycle(three, key, restart_delay=False)
        committed += _settled(admins, before, 8) > 6
    assert committed >= 8, committed
