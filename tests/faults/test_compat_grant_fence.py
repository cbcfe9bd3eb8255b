"""A compat token is chosen by its caller and granted again; a request of an earlier grant
that lands after the same token's next grant must not touch that grant.

A release (or an extend) of a compat lease is stuck in its TCP connection and times out
(``ServersUnavailable``); the caller takes the lock again under the same token, on a new
connection; then the stuck request reaches the server. It used to delete the new grant's key
(or cut its TTL to the extend's) while its lease was valid: another client could take the
lock. The requests now carry their grant's fence, which the scripts compare with the fence
register: the next grant wrote another, so the stuck request is refused ("not ours").

The stuck requests come from :meth:`fencelock.testing.proxy.Proxy.hold_connections`;
redis-py's shape on both front ends, and python-redis-lock's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

from fencelock.compat import AsyncRedisPyLock, RedisLock, RedisPyLock, ServersUnavailable
from fencelock.testing import Server, wait_trusted
from fencelock.testing.proxy import Proxy

TIMEOUT_S = 10.0  # the lock's timeout (its lease); its server timeout is 1 s then
LANDED_S = 0.5  # after the delivery, long enough for the stuck request to have run
BOUND_S = 15.0  # liveness bound of every wait (s), never a speed assertion
TOKEN = "chosen-by-the-caller"

# (each test's redis-py client reaches the server through the proxy too: its own connections
# open at the hold are held as well, so a test that uses it after the hold drops them)


def _pttl(lone_server: Server, key: str) -> int:
    with lone_server.client() as client:
        return int(client.pttl(key))


def _stuck_then_granted_again(
    lone_server: Server,
    draining_proxy: Proxy,
    lock_key: str,
    make: Callable[[redis.Redis], Any],
    stuck: Callable[[Any], object],
    between: Callable[[Any], object],
) -> None:
    """``make(conn)`` a compat lock and take it; ``stuck(lock)``, held in its connection,
    raises ServersUnavailable; once the server is trusted again, ``between(lock)`` frees the
    key and a new lock takes it under the same token; then the stuck request lands. The new
    grant's key must keep its whole timeout."""
    conn = redis.Redis.from_url(draining_proxy.url)
    try:
        lock = make(conn)
        assert lock.acquire(blocking=False)
        assert draining_proxy.hold_connections() >= 1
        with pytest.raises(ServersUnavailable):
            stuck(lock)
        assert wait_trusted([draining_proxy.url], within_s=BOUND_S), (
            "the server was not trusted again"
        )
        conn.connection_pool.disconnect()  # its connections are held too: new ones
        between(lock)
        again = make(conn)
        assert again.acquire(blocking=False)
        draining_proxy.deliver()
        time.sleep(LANDED_S)
        left = _pttl(lone_server, lock_key)
        assert left > (TIMEOUT_S - 2 * LANDED_S) * 1000, f"the next grant's key: {left} ms left"
        again.release()
    finally:
        conn.close()


def _redis_py(key: str) -> Callable[[redis.Redis], Any]:
    def make(conn: redis.Redis) -> Any:
        return _TokenFixed(conn.lock(key, timeout=TIMEOUT_S, lock_class=RedisPyLock))

    return make


class _TokenFixed:
    """A redis-py shaped lock whose ``acquire`` takes the test's token (``token=``)."""

    def __init__(self, lock: RedisPyLock) -> None:
        self.lock = lock

    def acquire(self, blocking: bool) -> bool:
        return bool(self.lock.acquire(blocking=blocking, token=TOKEN))

    def release(self) -> None:
        self.lock.release()


def _deleted(lone_server: Server, lock_key: str) -> Callable[[Any], object]:
    def between(lock: Any) -> None:
        with lone_server.client() as direct:
            direct.delete(lock_key)  # the first grant's key ran out (as its stuck release says)

    return between


def test_a_stuck_release_does_not_delete_the_same_tokens_next_grant(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    _stuck_then_granted_again(
        lone_server,
        draining_proxy,
        key,
        _redis_py(key),
        lambda held: held.release(),
        _deleted(lone_server, key),
    )


def test_a_stuck_extend_does_not_cut_the_same_tokens_next_grant(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    _stuck_then_granted_again(
        lone_server,
        draining_proxy,
        key,
        _redis_py(key),
        lambda held: held.lock.extend(2.0, replace_ttl=True),  # would cut the key to 2 s
        lambda held: held.release(),  # on a new connection
    )


def test_python_redis_lock_a_stuck_release_does_not_delete_the_same_ids_next_grant(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    _stuck_then_granted_again(
        lone_server,
        draining_proxy,
        f"lock:{key}",
        lambda conn: RedisLock(conn, key, expire=int(TIMEOUT_S), id=TOKEN),
        lambda held: held.release(),
        _deleted(lone_server, f"lock:{key}"),
    )


def test_asyncio_a_stuck_release_does_not_delete_the_same_tokens_next_grant(
    lone_server: Server, draining_proxy: Proxy, key: str
) -> None:
    async def scenario() -> None:
        conn = redis.asyncio.Redis.from_url(draining_proxy.url)
        try:
            lock = conn.lock(key, timeout=TIMEOUT_S, lock_class=AsyncRedisPyLock)
            assert await lock.acquire(blocking=False, token=TOKEN)
            assert draining_proxy.hold_connections() >= 1
            with pytest.raises(ServersUnavailable):
                await lock.release()
            trusted = await asyncio.to_thread(wait_trusted, [draining_proxy.url], BOUND_S)
            assert trusted, "the server was not trusted again"
            with lone_server.client() as direct:
                direct.delete(key)
            again = conn.lock(key, timeout=TIMEOUT_S, lock_class=AsyncRedisPyLock)
            assert await again.acquire(blocking=False, token=TOKEN)
            draining_proxy.deliver()
            await asyncio.sleep(LANDED_S)
            assert _pttl(lone_server, key) > (TIMEOUT_S - 2 * LANDED_S) * 1000
            assert await again.owned()
            await again.release()
        finally:
            await conn.aclose()

    asyncio.run(scenario())
