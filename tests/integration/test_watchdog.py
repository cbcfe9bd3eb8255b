"""Renewal that never fails silently: sync and asyncio watchdogs on real servers."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from typing import Any

import pytest

import fencelock.asyncio as flasync
from fencelock import Lease, Lock, LockLost
from fencelock._sync import renewal
from fencelock.testing import Server

KEY_PREFIX = "fencelock:{"


def lock_key(name: str) -> str:
    return f"{KEY_PREFIX}{name}}}"


def wait_until(predicate: Any, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def test_renewal_keeps_a_short_lease_alive_over_many_ttls(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:alive", ttl=0.5)
    rival = Lock(fencelock_server.url, "wd:alive", ttl=0.5)
    with lock.hold(wait=1, renew=True) as lease:
        deadline = time.monotonic() + 2.5  # five TTLs
        refused = 0
        while time.monotonic() < deadline:
            assert rival.try_acquire() is None
            refused += 1
            time.sleep(0.05)
        assert not lease.lost.is_set()
        assert lease.remaining() > 0
        assert refused > 10
    # released at the end of the block
    assert fencelock_server.client().exists(lock_key("wd:alive")) == 0


def test_loss_when_the_key_is_deleted_behind_our_back(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:deleted", ttl=0.6)
    seen: list[Lease] = []
    called = threading.Event()

    def on_lost(lease: Lease) -> None:
        seen.append(lease)
        called.set()

    with pytest.raises(LockLost), lock.hold(wait=1, renew=True, on_lost=on_lost) as lease:
        fencelock_server.client().delete(lock_key("wd:deleted"))
        t0 = time.monotonic()
        assert lease.lost.wait(timeout=0.6 * 3)  # detected within about one renewal period
        detected = time.monotonic() - t0
        assert detected < 0.6 + 0.5
        with pytest.raises(LockLost):
            lease.ensure_valid()
    assert called.wait(1.0)
    assert seen and seen[0] is lease
    assert lease.lost_reason and "extend refused" in lease.lost_reason


def test_loss_when_the_server_is_paused(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:paused", ttl=0.6, server_timeout=0.05)
    lease = lock.acquire(wait=1)
    lease.keep_alive()
    fencelock_server.pause()
    try:
        t0 = time.monotonic()
        assert lease.lost.wait(timeout=3.0)
        assert time.monotonic() - t0 < 0.6 + 1.0  # within about one TTL
        assert "renewal not confirmed" in (lease.lost_reason or "")
    finally:
        fencelock_server.resume()
    # Renewals queued in the paused server's socket may land after SIGCONT and revive the key
    # with our token; releasing must leave nothing behind either way.
    with contextlib.suppress(LockLost):
        lease.release()
    client = fencelock_server.client()
    assert wait_until(lambda: client.exists(lock_key("wd:paused")) == 0, 2.0)


def test_loss_when_the_server_is_killed(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:killed", ttl=0.6, server_timeout=0.05)
    lease = lock.acquire(wait=1)
    lease.keep_alive()
    fencelock_server.kill()
    assert lease.lost.wait(timeout=3.0)
    with pytest.raises(LockLost):
        lease.ensure_valid()


def test_max_hold_stops_renewal_and_reports(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:cap", ttl=0.4)
    client = fencelock_server.client()
    lease = lock.acquire(wait=1)
    t0 = time.monotonic()
    lease.keep_alive(max_hold=0.5)
    assert lease.lost.wait(timeout=3.0)
    elapsed = time.monotonic() - t0
    assert elapsed >= 0.5  # renewed at least until max_hold
    assert "max_hold" in (lease.lost_reason or "")
    # the key ran out on the server by itself
    assert wait_until(lambda: client.exists(lock_key("wd:cap")) == 0, 1.0)


def test_no_renewal_after_release(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:released", ttl=0.3)
    client = fencelock_server.client()
    lease = lock.acquire(wait=1)
    lease.keep_alive(every=0.02)
    time.sleep(0.1)
    lease.release()
    assert client.exists(lock_key("wd:released")) == 0
    # a stale renewal would recreate nothing (compare-and-pexpire), but also must not run:
    before = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    time.sleep(0.3)
    after = int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))
    assert after == before
    assert client.exists(lock_key("wd:released")) == 0
    assert not lease.lost.is_set()


def test_shared_scheduler_handles_hundreds_of_leases(fencelock_server: Server) -> None:
    threads_before = threading.active_count()
    locks = [Lock(fencelock_server.url, f"wd:many:{i}", ttl=1.5) for i in range(300)]
    leases = []
    for lock in locks:
        lease = lock.acquire(wait=1)
        lease.keep_alive()
        leases.append(lease)
    time.sleep(3.5)  # more than two TTLs: every lease must have been renewed
    assert not any(lease.lost.is_set() for lease in leases)
    assert all(lease.remaining() > 0 for lease in leases)
    # one scheduler thread and a bounded pool, not a thread per lease
    assert threading.active_count() - threads_before < 20
    for lease in leases:
        lease.release()
    client = fencelock_server.client()
    assert not [k for k in client.keys("fencelock:{wd:many:*") if not k.endswith(b":fence")]
    for lock in locks:
        lock.close()


def test_a_dropped_lease_stops_renewing(fencelock_server: Server) -> None:
    lock = Lock(fencelock_server.url, "wd:dropped", ttl=0.4)
    lease = lock.acquire(wait=1)
    lease.keep_alive()
    del lease  # held weakly by the watchdog: the key must run out on its own
    client = fencelock_server.client()
    assert wait_until(lambda: client.exists(lock_key("wd:dropped")) == 0, 2.0)
    assert renewal.scheduler() is not None


def test_async_body_is_cancelled_on_loss(fencelock_server: Server) -> None:
    client = fencelock_server.client()

    async def main() -> tuple[bool, float]:
        lock = flasync.Lock(fencelock_server.url, "wd:async", ttl=0.6)
        reached_end = False
        t0 = time.monotonic()
        try:
            async with lock.hold(wait=1, renew=True):
                client.delete(lock_key("wd:async"))
                await asyncio.sleep(10)
                reached_end = True
        except LockLost:
            pass
        finally:
            await lock.aclose()
        return reached_end, time.monotonic() - t0

    reached_end, elapsed = asyncio.run(main())
    assert reached_end is False
    assert elapsed < 0.6 + 1.0  # cancelled within about one TTL, not after the 10 s sleep


def test_async_loss_does_not_leak_cancelled_error(fencelock_server: Server) -> None:
    client = fencelock_server.client()

    async def main() -> str:
        lock = flasync.Lock(fencelock_server.url, "wd:async2", ttl=0.6)
        try:
            async with lock.hold(wait=1, renew=True):
                client.delete(lock_key("wd:async2"))
                await asyncio.sleep(10)
        except LockLost:
            # the task must not still be marked as cancelling: awaiting works normally
            await asyncio.sleep(0.01)
            return "lost"
        finally:
            await lock.aclose()
        return "not lost"

    assert asyncio.run(main()) == "lost"


def test_async_renewal_keeps_lease_alive(fencelock_server: Server) -> None:
    async def main() -> tuple[bool, int]:
        lock = flasync.Lock(fencelock_server.url, "wd:async3", ttl=0.5)
        rival = flasync.Lock(fencelock_server.url, "wd:async3", ttl=0.5)
        refused = 0
        async with lock.hold(wait=1, renew=True) as lease:
            for _ in range(25):  # 2.5 s = five TTLs
                assert await rival.try_acquire() is None
                refused += 1
                await asyncio.sleep(0.1)
            alive = not lease.lost.is_set()
        await lock.aclose()
        await rival.aclose()
        return alive, refused

    alive, refused = asyncio.run(main())
    assert alive and refused == 25


def test_async_max_hold(fencelock_server: Server) -> None:
    async def main() -> str:
        lock = flasync.Lock(fencelock_server.url, "wd:async4", ttl=0.4)
        try:
            async with lock.hold(wait=1, renew=True, max_hold=0.5):
                await asyncio.sleep(5)
        except LockLost as exc:
            return str(exc)
        finally:
            await lock.aclose()
        return ""

    assert "max_hold" in asyncio.run(main())
