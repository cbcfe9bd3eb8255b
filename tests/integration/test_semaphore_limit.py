"""Two Semaphores of different ``limit`` on one name are refused (issue 21, "left alone").

Each would count only its own slots (limit 3 sees slots 0-2, limit 1 only slot 0), so between
them more permits than either limit would be valid. The servers keep the limit beside the
permits (as long as the longest lease granted); another limit is a ConfigError, with the
permit the others granted given back. Once the old permits ran out, a new limit applies.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis

import fencelock
import fencelock.asyncio as flasync
from fencelock import ConfigError
from fencelock._core.keys import limit_key

BOUND = 10.0  # liveness bound (s), never a speed assertion


def _until_the_limit_ran_out(clients: list[redis.Redis], key: str) -> None:
    deadline = time.monotonic() + BOUND  # the limit lasts as long as the longest lease
    while any(c.exists(limit_key(key)) for c in clients):
        assert time.monotonic() < deadline, "the limit outlived every lease"
        time.sleep(0.05)


@pytest.mark.parametrize("n", [1, 3])
def test_another_limit_on_the_same_name_is_refused(topologies: Any, key: str, n: int) -> None:
    urls = topologies.urls(n)
    clients = [redis.Redis.from_url(url) for url in urls]
    small = fencelock.Semaphore(urls, key, 1, ttl=0.8)
    big = fencelock.Semaphore(urls, key, 3, ttl=0.8)
    permit = small.acquire(wait=1.0)
    with pytest.raises(ConfigError, match="limit=3, but permits with limit 1"):
        big.try_acquire()
    assert permit.valid
    permit.release()
    _until_the_limit_ran_out(clients, key)  # a new limit applies once the old permits ran out
    permits = [big.acquire(wait=1.0) for _ in range(3)]
    assert len({p.slot for p in permits}) == 3
    with pytest.raises(ConfigError, match="limit=1, but permits with limit 3"):
        small.acquire(wait=0.5)
    assert all(p.valid for p in permits)
    for p in permits:
        p.release()
    assert all(not c.keys(f"*{key}*slot*") for c in clients)  # nothing of the refused is left


def test_asyncio_another_limit_on_the_same_name_is_refused(topologies: Any, key: str) -> None:
    urls = topologies.urls(3)

    async def job() -> None:
        small = flasync.Semaphore(urls, key, 1, ttl=5.0)
        big = flasync.Semaphore(urls, key, 2, ttl=5.0)
        permit = await big.acquire(wait=1.0)
        try:
            with pytest.raises(ConfigError, match="limit=1, but permits with limit 2"):
                await small.acquire(wait=1.0)
            assert permit.valid
        finally:
            await permit.release()
            await small.aclose()
            await big.aclose()

    asyncio.run(job())
