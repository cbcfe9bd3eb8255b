"""Issue 21 item 14: a reentrant lock's inner ``hold(at_least=S)`` must not release the lease
the outer hold still runs under. The inner block's end only counts down (its ``at_least`` is
kept for the outermost end); the owner's depth returns to 0, so it can acquire again.
Both front ends, on real servers."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import fencelock
import fencelock.asyncio as afencelock

TTL = 1.0
INNER_AT_LEAST = 0.5
BOUND_S = 10.0  # liveness bound for a rival's wait (s); never a speed assertion


def _rival_gets_nothing(urls: list[str], key: str) -> bool:
    rival = fencelock.Lock(urls, key, ttl=TTL).try_acquire()
    if rival is None:
        return True
    rival.release()
    return False


def test_an_inner_at_least_keeps_the_outer_hold_sync(topologies: Any, key: str) -> None:
    urls = topologies.urls(3)
    lock = fencelock.Lock(urls, key, ttl=TTL, reentrant=True)
    with lock.hold(wait=5) as outer:
        with lock.hold(wait=0, at_least=INNER_AT_LEAST) as inner:
            assert inner.token == outer.token
        # past the inner at_least and past one ttl: renewed, still ours
        time.sleep(INNER_AT_LEAST + TTL)
        assert not outer.lost.is_set()
        assert outer.valid
        assert _rival_gets_nothing(urls, key)
    again = lock.acquire(wait=5)  # the owner's depth is back to 0: a new acquisition
    assert again.token != outer.token
    again.release()
    free = fencelock.Lock(urls, key, ttl=TTL).acquire(wait=BOUND_S)
    free.release()


def test_the_outer_end_keeps_the_lock_until_an_inner_at_least_sync(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(3)
    at_least = 1.5
    lock = fencelock.Lock(urls, key, ttl=TTL, reentrant=True)
    with lock.hold(wait=5) as outer, lock.hold(wait=0, at_least=at_least):
        pass
    acquired_at = outer.acquired_at
    assert time.monotonic() - acquired_at < at_least / 2  # the blocks were short
    assert _rival_gets_nothing(urls, key)
    rival = fencelock.Lock(urls, key, ttl=TTL).acquire(wait=BOUND_S)
    granted_at = time.monotonic()
    rival.release()
    assert granted_at >= acquired_at + at_least - 0.01
    again = lock.acquire(wait=BOUND_S)  # depth back to 0
    again.release()


def test_an_inner_at_least_keeps_the_outer_hold_async(topologies: Any, key: str) -> None:
    urls = topologies.urls(3)

    async def main() -> None:
        lock = afencelock.Lock(urls, key, ttl=TTL, reentrant=True)
        async with lock.hold(wait=5) as outer:
            async with lock.hold(wait=0, at_least=INNER_AT_LEAST) as inner:
                assert inner.token == outer.token
            await asyncio.sleep(INNER_AT_LEAST + TTL)
            assert not outer.lost.is_set()
            assert outer.valid
            rival = await afencelock.Lock(urls, key, ttl=TTL).try_acquire()
            assert rival is None
        again = await lock.acquire(wait=5)
        assert again.token != outer.token
        await again.release()
        free = await afencelock.Lock(urls, key, ttl=TTL).acquire(wait=BOUND_S)
        await free.release()

    asyncio.run(main())


def test_the_outer_end_keeps_the_lock_until_an_inner_at_least_async(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(3)
    at_least = 1.5

    async def main() -> None:
        lock = afencelock.Lock(urls, key, ttl=TTL, reentrant=True)
        async with lock.hold(wait=5) as outer, lock.hold(wait=0, at_least=at_least):
            pass
        acquired_at = outer.acquired_at
        assert time.monotonic() - acquired_at < at_least / 2
        assert await afencelock.Lock(urls, key, ttl=TTL).try_acquire() is None
        rival = await afencelock.Lock(urls, key, ttl=TTL).acquire(wait=BOUND_S)
        granted_at = time.monotonic()
        await rival.release()
        assert granted_at >= acquired_at + at_least - 0.01
        again = await lock.acquire(wait=BOUND_S)
        await again.release()

    asyncio.run(main())


def test_an_outer_with_block_keeps_the_lock_until_an_inner_at_least_sync(
    topologies: Any, key: str
) -> None:
    urls = topologies.urls(1)
    at_least = 1.5
    lock = fencelock.Lock(urls, key, ttl=TTL, reentrant=True)
    with lock as outer, lock.hold(wait=0, at_least=at_least):
        pass
    assert time.monotonic() - outer.acquired_at < at_least / 2
    assert _rival_gets_nothing(urls, key)  # the outermost release kept it
    rival = fencelock.Lock(urls, key, ttl=TTL).acquire(wait=BOUND_S)
    granted_at = time.monotonic()
    rival.release()
    assert granted_at >= outer.acquired_at + at_least - 0.01
    again = lock.acquire(wait=BOUND_S)  # the owner's depth is back to 0
    assert again.token != outer.token
    again.release()
