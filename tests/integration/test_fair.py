"""The fair lock on real servers, both front ends, 1 and 3 servers: grants in arrival order,
fences growing in grant order, no barging past the queue, nothing left behind by a waiter that
gave up (its wait ran out, a cancellation), and only the fence register after release.

Arrival is made deterministic: each waiter starts only once the previous one is seen queued on
every server, with the same ticket everywhere (its arrival is complete)."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
import redis
from api import FENCE_KEPT, our_keys

import fencelock
import fencelock.asyncio as fasync
from fencelock import ConfigError, NotAcquired
from fencelock._core.keys import lock_keys

TOPOLOGIES = [pytest.param(1, id="n1"), pytest.param(3, id="n3")]
WAITERS = 6
JOIN_S = 60.0  # liveness bound for worker threads (never a speed assertion)
QUEUED_S = 20.0  # liveness bound for a waiter to appear in the queue


def queue_key(name: str) -> str:
    return lock_keys(name).lock + ":fair"


def clients(urls: list[str]) -> list[redis.Redis]:
    return [redis.Redis.from_url(url) for url in urls]


def queue(client: redis.Redis, name: str) -> list[tuple[bytes, float]]:
    return list(client.zrange(queue_key(name), 0, -1, withscores=True))


def wait_queued(servers: list[redis.Redis], name: str, count: int) -> None:
    """Until every server queues ``count`` waiters with the same tickets (bounded)."""
    deadline = time.monotonic() + QUEUED_S
    while time.monotonic() < deadline:
        seen = [queue(client, name) for client in servers]
        if all(len(entries) == count for entries in seen) and all(s == seen[0] for s in seen):
            return
        time.sleep(0.005)
    raise AssertionError(f"{count} waiters not queued alike on every server: {seen}")


def only_holder_queued(client: redis.Redis, name: str, token: str) -> bool:
    """Nobody is queued but (perhaps) the holder itself, whose entry the release takes out."""
    ids = {member.decode() for member, _ in queue(client, name)}
    beats = {member.decode() for member in client.zrange(queue_key(name) + ":beats", 0, -1)}
    return ids <= {token[:16]} and beats <= {token[:16]}


def leftovers(servers: list[redis.Redis], name: str) -> list[dict[str, int]]:
    return [our_keys(client, name) for client in servers]


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_threads_are_granted_in_arrival_order_with_growing_fences(
    topologies: Any, key: str, n: int
) -> None:
    urls = topologies.urls(n)
    servers = clients(urls)
    client = fencelock.Client(urls, ttl=10.0)
    first = client.lock(key, fair=True).acquire(wait=0)  # one attempt: it never queues
    grants: list[tuple[int, int]] = []
    errors: list[BaseException] = []

    def waiter(i: int) -> None:
        try:
            lease = client.lock(key, fair=True).acquire(wait=JOIN_S)
            grants.append((i, lease.fence))
            time.sleep(0.01)
            lease.release()
        except BaseException as exc:
            errors.append(exc)

    threads = []
    for i in range(WAITERS):
        thread = threading.Thread(target=waiter, args=(i,))
        thread.start()
        threads.append(thread)
        wait_queued(servers, key, i + 1)
    first.release()
    for thread in threads:
        thread.join(JOIN_S)
    assert not errors
    assert [i for i, _ in grants] == list(range(WAITERS))
    fences = [first.fence] + [fence for _, fence in grants]
    assert fences == sorted(set(fences))
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_concurrent_arrivals_never_overlap_nor_deadlock(topologies: Any, key: str, n: int) -> None:
    """Waiters arriving at the same moment (tickets proposed on each server concurrently) all
    get the lock in turn, one at a time, with fences growing in grant order."""
    urls = topologies.urls(n)
    servers = clients(urls)
    client = fencelock.Client(urls, ttl=10.0)
    guard = threading.Lock()
    inside = [0]
    fences: list[int] = []
    problems: list[object] = []
    start = threading.Barrier(8)

    def worker() -> None:
        try:
            start.wait(JOIN_S)
            for _ in range(3):
                with client.lock(key, fair=True).hold(wait=JOIN_S) as lease:
                    with guard:
                        inside[0] += 1
                        if inside[0] > 1:
                            problems.append("two holders at once")
                        fences.append(lease.fence)
                    time.sleep(0.002)
                    with guard:
                        inside[0] -= 1
        except BaseException as exc:
            problems.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_S)
    assert not problems
    assert len(fences) == 24
    assert fences == sorted(set(fences))
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_asyncio_tasks_are_granted_in_arrival_order(topologies: Any, key: str, n: int) -> None:
    urls = topologies.urls(n)
    servers = clients(urls)

    async def main() -> list[int]:
        async with fasync.Client(urls, ttl=10.0) as client:
            first = await client.lock(key, fair=True).acquire(wait=0)
            order: list[int] = []

            async def waiter(i: int) -> None:
                async with client.lock(key, fair=True).hold(wait=JOIN_S):
                    order.append(i)
                    await asyncio.sleep(0.01)

            tasks = []
            for i in range(WAITERS):
                tasks.append(asyncio.ensure_future(waiter(i)))
                deadline = time.monotonic() + QUEUED_S
                while time.monotonic() < deadline:
                    seen = [queue(c, key) for c in servers]
                    if all(len(s) == i + 1 for s in seen) and all(s == seen[0] for s in seen):
                        break
                    await asyncio.sleep(0.005)
                else:
                    raise AssertionError(f"waiter {i} not queued: {seen}")
            await first.release()
            await asyncio.wait_for(asyncio.gather(*tasks), JOIN_S)
            return order

    assert asyncio.run(main()) == list(range(WAITERS))
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_waiter_whose_wait_ran_out_leaves_no_entry(topologies: Any, key: str, n: int) -> None:
    urls = topologies.urls(n)
    servers = clients(urls)
    holder = fencelock.Lock(urls, key, ttl=10.0, fair=True).acquire()
    with pytest.raises(NotAcquired):
        fencelock.Lock(urls, key, ttl=10.0, fair=True).acquire(wait=0.5)
    # checked at once: without the leave, the entry would live for its heartbeat (3 s); the
    # holder's own entry may still be there (it goes with the release, or its heartbeat)
    for client in servers:
        assert only_holder_queued(client, key, holder.token)
    assert {k for found in leftovers(servers, key) for k in found} <= {
        "<lock>",
        ":holder",
        ":fence",
        ":fair",
        ":fair:beats",
    }
    holder.release()
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_cancelled_async_waiter_leaves_no_entry_at_any_await(
    topologies: Any, key: str, n: int
) -> None:
    from fencelock._async.driver import _background

    urls = topologies.urls(n)
    servers = clients(urls)

    async def main() -> None:
        async with fasync.Client(urls, ttl=10.0) as client:
            holder = await client.lock(key, fair=True).acquire()
            for steps in range(40):
                task = asyncio.ensure_future(client.lock(key, fair=True).acquire(wait=30))
                for _ in range(steps):
                    await asyncio.sleep(0 if steps < 20 else 0.001)
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                # the flow's cleanup runs shielded, in a task of its own: let it end (bounded)
                pending = [t for t in list(_background) if not t.done()]
                if pending:
                    await asyncio.wait(pending, timeout=10.0)
                for server in servers:
                    assert only_holder_queued(server, key, holder.token), steps
                    assert not [k for k in our_keys(server, key) if ":fair:wake" in k], steps
            await holder.release()

    asyncio.run(main())
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_nobody_barges_past_a_queued_waiter(topologies: Any, key: str, n: int) -> None:
    """A live entry ahead (planted with a long heartbeat) stops try_acquire and wait=0, and a
    waiter behind it; an entry whose heartbeat ran out (a waiter that died) is skipped."""
    urls = topologies.urls(n)
    servers = clients(urls)
    lock = fencelock.Lock(urls, key, ttl=10.0, fair=True)
    beats = queue_key(key) + ":beats"
    for client in servers:
        now_ms = int(client.time()[0]) * 1000
        client.zadd(queue_key(key), {"ghost": 1})
        client.zadd(beats, {"ghost": now_ms + 60_000})
    assert lock.try_acquire() is None
    with pytest.raises(NotAcquired):
        lock.acquire(wait=0)
    with pytest.raises(NotAcquired):
        lock.acquire(wait=0.3)
    assert all(queue(client, key) == [(b"ghost", 1.0)] for client in servers)
    # the plain lock ignores the queue: fairness needs every user of the key to be fair
    plain = fencelock.Lock(urls, key, ttl=10.0).try_acquire()
    assert plain is not None
    plain.release()
    for client in servers:
        client.zadd(beats, {"ghost": 1})  # its heartbeat ran out long ago
    lease = lock.try_acquire()
    assert lease is not None
    lease.release()
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


@pytest.mark.parametrize("n", TOPOLOGIES)
def test_a_fair_lease_is_an_ordinary_lease(topologies: Any, key: str, n: int) -> None:
    urls = topologies.urls(n)
    servers = clients(urls)
    lock = fencelock.Lock(urls, key, ttl=1.0, fair=True)
    with lock.hold(wait=5) as lease:
        time.sleep(1.5)  # renewed past its ttl
        assert not lease.lost.is_set()
        assert fencelock.Lock(urls, key, ttl=1.0).try_acquire() is None  # excludes a plain lock
        lease.extend(5.0)
        assert lease.remaining() > 3.0
    other = lock.acquire(wait=1)
    with pytest.raises(fencelock.LockLost):
        lease.extend()  # released: no longer ours
    other.release()
    assert leftovers(servers, key) == [{":fence": FENCE_KEPT}] * n


def test_a_reentrant_fair_lock_reenters_without_queueing(topologies: Any, key: str) -> None:
    urls = topologies.urls(1)
    lock = fencelock.Lock(urls, key, ttl=10.0, fair=True, reentrant=True)
    with lock.hold(wait=5) as outer, lock.hold(wait=0) as inner:
        assert (inner.token, inner.fence) == (outer.token, outer.fence)
    assert our_keys(clients(urls)[0], key) == {":fence": FENCE_KEPT}


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(lambda urls, key: fencelock.Lock(urls, key, fair="yes"), id="lock"),
        pytest.param(lambda urls, key: fencelock.Lock(urls, key, fair=1), id="lock-int"),
        pytest.param(lambda urls, key: fencelock.Client(urls).lock(key, fair=None), id="client"),
        pytest.param(lambda urls, key: fasync.Lock(urls, key, fair="no"), id="async"),
        pytest.param(lambda urls, key: fasync.Client(urls).lock(key, fair=0), id="async-client"),
        pytest.param(
            lambda urls, key: fencelock.Semaphore(urls, key, 2, fair=True), id="semaphore"
        ),
        pytest.param(lambda urls, key: fencelock.RWLock(urls, key, fair=True), id="rwlock"),
        pytest.param(lambda urls, key: fencelock.MultiLock(urls, [key], fair=True), id="multi"),
    ],
)
def test_a_bad_fair_option_is_a_config_error_before_any_io(build: Any, key: str) -> None:
    # a port nothing listens on: any I/O would fail differently
    with pytest.raises(ConfigError, match="fair"):
        build(["redis://127.0.0.1:1"], key)
