"""A renewal always comes before the deadline it protects (issue 21 items 4 and 17, F29):
a MultiLock's earlier keys while a later key is awaited, ``keep_alive()`` started late in a
lease, and ``extend(shorter)`` inside ``hold(renew=True)``; both front ends, healthy servers."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import fencelock.asyncio as fasync
from fencelock import Lock, MultiLock
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock.testing import Server

TTL = 1.0


@pytest.fixture
def server(fencelock_server: Server) -> Iterator[Server]:
    yield fencelock_server


def _holder_of(server: Server, name: str) -> bytes | None:
    with server.client() as client:
        value = client.get(lock_keys(name).lock)  # the token, byte 255, the holder info
        return lock_token(value) if isinstance(value, bytes) else None


def _hold_for(server: Server, name: str, seconds: float) -> threading.Thread:
    """Another client holds ``name`` for ``seconds``, then releases it."""
    lease = Lock(server.url, name, ttl=seconds + 2.0).acquire(wait=1.0)

    def later() -> None:
        time.sleep(seconds)
        lease.release()

    thread = threading.Thread(target=later, daemon=True)
    thread.start()
    return thread


def test_a_multilock_never_returns_a_key_that_ran_out_while_another_was_awaited(
    server: Server, key: str
) -> None:
    a, b = f"{key}:a", f"{key}:b"
    other = _hold_for(server, b, 1.3 * TTL)  # longer than a's whole lease
    multi = MultiLock(server.url, [a, b], ttl=TTL)
    leases = multi.acquire(wait=3.0)
    try:
        other.join(5)
        for lease in leases:
            assert lease.remaining() > 0.0
            assert _holder_of(server, lease.key) == lease.token.encode()
        # nobody else could take key a meanwhile
        assert Lock(server.url, a, ttl=TTL).try_acquire() is None
    finally:
        for lease in leases:
            lease.release()


def test_a_multilock_held_after_a_long_wait_is_not_lost_on_healthy_servers(
    server: Server, key: str
) -> None:
    a, b = f"{key}:a", f"{key}:b"
    other = _hold_for(server, b, 0.8 * TTL)
    multi = MultiLock(server.url, [a, b], ttl=TTL)
    with multi.hold(wait=3.0) as leases:
        time.sleep(2.5 * TTL)
        assert not any(lease.lost.is_set() for lease in leases), [
            lease.lost_reason for lease in leases
        ]
    other.join(5)


def test_keep_alive_started_late_in_a_lease_renews_before_it_runs_out(
    server: Server, key: str
) -> None:
    lease = Lock(server.url, key, ttl=TTL).acquire()
    try:
        time.sleep(0.75 * TTL)
        lease.keep_alive()  # the default period (ttl/3) would come after the deadline
        time.sleep(1.5 * TTL)
        assert not lease.lost.is_set(), lease.lost_reason
        assert _holder_of(server, key) == lease.token.encode()
    finally:
        lease.release()


def test_hold_at_least_without_renewal_keeps_a_lock_whose_block_ran_long(
    server: Server, key: str
) -> None:
    """``hold(at_least=..., renew=False)``: the block ends late in the lease (0.75 ttl), and the
    lock must still be kept (renewed from then on) until ``acquired_at + at_least``; a renewal
    switched on at "now + period" would come after the deadline."""
    lock = Lock(server.url, key, ttl=TTL)
    with lock.hold(renew=False, at_least=2.5 * TTL) as lease:
        time.sleep(0.75 * TTL)
    kept_until = lease.acquired_at + 2.5 * TTL
    while time.monotonic() < kept_until - 0.3 * TTL:  # past the ttl, before at_least
        assert not lease.lost.is_set(), lease.lost_reason
        assert _holder_of(server, key) == lease.token.encode()
        time.sleep(0.05)
    end = time.monotonic() + 5 * TTL
    while _holder_of(server, key) is not None:  # released in the background at at_least
        assert time.monotonic() < end, "not released after at_least"
        time.sleep(0.05)
    assert not lease.lost.is_set(), lease.lost_reason
    lock.close()


def test_asyncio_hold_at_least_without_renewal_keeps_a_lock_whose_block_ran_long(
    server: Server, key: str
) -> None:
    async def scenario() -> None:
        lock = fasync.Lock(server.url, key, ttl=TTL)
        async with lock.hold(renew=False, at_least=2.5 * TTL) as lease:
            await asyncio.sleep(0.75 * TTL)
        kept_until = lease.acquired_at + 2.5 * TTL
        while time.monotonic() < kept_until - 0.3 * TTL:
            assert not lease.lost.is_set(), lease.lost_reason
            assert _holder_of(server, key) == lease.token.encode()
            await asyncio.sleep(0.05)
        end = time.monotonic() + 5 * TTL
        while _holder_of(server, key) is not None:
            assert time.monotonic() < end, "not released after at_least"
            await asyncio.sleep(0.05)
        assert not lease.lost.is_set(), lease.lost_reason
        await lock.aclose()

    asyncio.run(scenario())


def test_extend_shorter_inside_a_renewed_hold_is_renewed_at_the_new_pace(
    server: Server, key: str
) -> None:
    with Lock(server.url, key, ttl=3.0).hold(renew=True) as lease:
        lease.extend(0.6)  # the next renewal was a third of 3 s away: after the new deadline
        time.sleep(1.8)
        assert not lease.lost.is_set(), lease.lost_reason
        assert _holder_of(server, key) == lease.token.encode()


def test_asyncio_multilock_late_keep_alive_and_extend_shorter(server: Server, key: str) -> None:
    async def scenario() -> None:
        a, b = f"{key}:a", f"{key}:b"
        other = _hold_for(server, b, 1.3 * TTL)
        leases = await fasync.MultiLock(server.url, [a, b], ttl=TTL).acquire(wait=3.0)
        for lease in leases:
            assert lease.remaining() > 0.0
            assert _holder_of(server, lease.key) == lease.token.encode()
        for lease in leases:
            await lease.release()
        other.join(5)

        late = await fasync.Lock(server.url, key, ttl=TTL).acquire()
        await asyncio.sleep(0.75 * TTL)
        late.keep_alive()
        await asyncio.sleep(1.5 * TTL)
        assert not late.lost.is_set(), late.lost_reason
        await late.release()

        async with fasync.Lock(server.url, key + ":x", ttl=3.0).hold(renew=True) as held:
            await held.extend(0.6)
            await asyncio.sleep(1.8)
            assert not held.lost.is_set(), held.lost_reason

    asyncio.run(scenario())
