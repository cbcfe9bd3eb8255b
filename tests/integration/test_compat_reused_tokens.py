"""The compat layer's tokens are chosen by its caller and granted again (python-redis-lock's
``id``, redis-py's ``token=``): a release of one that was refused or came too late must not
delete the next grant of the same token (``LockPlan.tokens_reused``).

Before the fix, a release answered "not ours" was repeated from the background at once and
50 ms later (as it must be for fencelock's own tokens, one per attempt, whose acquire may still
be on its way), and the repeat deleted the key of the next acquire under the same token: the
caller held a lease whose key was gone, so a second holder could take the lock. python-redis-
lock's own ``test_bogus_release`` failed on it one run in a few hundred; in a loop, 170 of 300.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.exceptions import LockNotOwnedError

from fencelock.compat import AsyncRedisPyLock, NotAcquired, RedisLock, RedisPyLock

#: Longer than the background's repeat of a release (sent again 50 ms after its answer).
SETTLE_S = 0.3


@pytest.fixture
def conn(topologies: Any) -> Any:
    client = redis.Redis.from_url(topologies.urls(1)[0])
    yield client
    client.close()


def test_a_release_of_a_lock_not_held_does_not_delete_the_next_grant(conn: Any, key: str) -> None:
    # python-redis-lock's test_bogus_release, many times, each grant checked after the repeat
    # (the last one long after it)
    rounds = 21
    for round_ in range(rounds):
        lock = RedisLock(conn, key)
        with pytest.raises(NotAcquired):
            lock.release()
        assert lock.acquire()
        time.sleep(SETTLE_S if round_ == rounds - 1 else 0.06)
        assert conn.get(f"lock:{key}") == lock.id.encode()
        other = RedisLock(conn, key, id=lock.id)
        other.release()
        assert conn.get(f"lock:{key}") is None


def test_an_expired_lock_released_and_taken_again_under_its_id_keeps_its_key(
    conn: Any, key: str
) -> None:
    lock = RedisLock(conn, key, expire=1)
    assert lock.acquire()
    time.sleep(1.2)
    with pytest.raises(NotAcquired):
        lock.release()  # it expired
    assert lock.acquire()
    time.sleep(SETTLE_S)
    assert conn.get(f"lock:{key}") == lock.id.encode()
    assert not RedisLock(conn, key).acquire(blocking=False)  # nobody else takes it
    lock.release()


def test_a_redis_py_token_refused_then_granted_again_keeps_its_key(conn: Any, key: str) -> None:
    lock = conn.lock(key, timeout=1, lock_class=RedisPyLock)
    assert lock.acquire(blocking=False, token="chosen")
    time.sleep(1.2)
    with pytest.raises(LockNotOwnedError):
        lock.release()  # it expired
    assert lock.acquire(blocking=False, token="chosen")
    time.sleep(SETTLE_S)
    assert conn.get(key) == b"chosen"
    assert not conn.lock(key, timeout=1, lock_class=RedisPyLock).acquire(blocking=False)
    lock.release()


def test_the_same_on_asyncio(topologies: Any, key: str) -> None:
    async def main() -> None:
        client = redis.asyncio.Redis.from_url(topologies.urls(1)[0])
        try:
            lock = client.lock(key, timeout=1, lock_class=AsyncRedisPyLock)
            assert await lock.acquire(blocking=False, token="chosen")
            await asyncio.sleep(1.2)
            with pytest.raises(LockNotOwnedError):
                await lock.release()
            assert await lock.acquire(blocking=False, token="chosen")
            await asyncio.sleep(SETTLE_S)
            assert await client.get(key) == b"chosen"
            await lock.release()
        finally:
            await client.aclose()

    asyncio.run(main())
