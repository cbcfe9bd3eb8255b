"""F23: asyncio calls cancelled at every await leave nothing locked.

Each test sweeps ``k = 1, 2, 3, ...``: start the call in a task, let the loop run ``k``
iterations (``await asyncio.sleep(0)`` k times), cancel it, and check the servers directly:
the lock key must be gone from every server within one server timeout (plus a margin),
unless the call completed and returned a lease (that lease is then released and the same is
checked). The sweep ends at the first ``k`` where the call had completed before the cancel.
The TTL is far longer than the check window, so an orphan cannot hide by expiring.
(``k = 0`` is left out: a task cancelled before its first step never enters an ``async def``,
so no await point of the call is reached at all.)
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Coroutine
from typing import Any

import pytest
import redis

import fencelock.asyncio as fasync
from fencelock import FencelockError
from fencelock._core.keys import lock_keys

TTL = 10.0
SERVER_TIMEOUT = 0.2
MARGIN = 0.5  # seconds beyond the server timeout for a shielded cleanup to land
CALL_LIMIT = 10.0  # a cancelled call must end within this long (liveness, not speed)
K_MAX = 400  # every sweep is bounded; a call not done after K_MAX loop iterations fails
IN_FLIGHT: list[int] = []  # the k of every call cancelled mid-flight (reset by each sweep)


@pytest.fixture(params=[1, 3], ids=["1-server", "3-servers"])
def n(request: pytest.FixtureRequest) -> int:
    return int(request.param)


def _clients(topologies: Any, n: int) -> list[redis.Redis]:
    return [s.client() for s in topologies.group(n)]


async def _cancel_after(coro: Coroutine[Any, Any, Any], k: int) -> tuple[bool, Any]:
    """Run ``coro`` in a task, cancel it after ``k`` loop iterations. Returns whether it had
    completed before the cancel, and its result (None when it was cancelled). Records in
    ``IN_FLIGHT`` every k whose cancel reached the call mid-flight (Python 3.11 may still lose
    such a cancel inside redis-py, FAULTS.md; then the call completes and returns normally)."""
    task = asyncio.ensure_future(coro)
    for _ in range(k):
        await asyncio.sleep(0)
    completed = task.done()
    task.cancel()
    await asyncio.wait({task}, timeout=CALL_LIMIT)
    assert task.done(), f"k={k}: the cancelled call did not end within {CALL_LIMIT} s"
    if not completed:
        IN_FLIGHT.append(k)
    if task.cancelled():
        return completed, None
    error = task.exception()
    if error is not None:
        raise AssertionError(f"k={k}: the call failed instead of being cancelled") from error
    return completed, task.result()


async def _assert_freed(clients: list[redis.Redis], name: str, what: str) -> None:
    """The lock key must be gone from every server within SERVER_TIMEOUT + MARGIN. Polls with
    asyncio sleeps so that shielded cleanups keep running meanwhile."""
    key = lock_keys(name).lock
    end = time.monotonic() + SERVER_TIMEOUT + MARGIN
    while True:
        held = [i for i, c in enumerate(clients) if c.exists(key)]
        if not held:
            return
        if time.monotonic() > end:
            pttl = [clients[i].pttl(key) for i in held]
            raise AssertionError(f"{what}: servers {held} still hold {name!r} (pttl {pttl} ms)")
        await asyncio.sleep(0.01)


def _lock(urls: list[str], name: str) -> fasync.Lock:
    return fasync.Lock(urls, name, ttl=TTL, server_timeout=SERVER_TIMEOUT)


SWEEPS = 3  # acquire sweeps per test: a cancel racing a straggler's connect is a matter of luck


@pytest.mark.parametrize("warm", [False, True], ids=["first-use", "warm"])
def test_a_cancelled_acquire_leaves_nothing_locked(
    topologies: Any, key: str, n: int, warm: bool
) -> None:
    urls = topologies.urls(n)
    clients = _clients(topologies, n)

    async def sweep(name: str) -> int:
        IN_FLIGHT.clear()
        lock = _lock(urls, name)
        if warm:
            await (await lock.acquire(wait=2.0)).release()
        for k in range(1, K_MAX):
            if not warm:
                lock = _lock(urls, name)  # each cancel meets a Lock's first use
            completed, lease = await _cancel_after(lock.acquire(wait=0), k)
            if lease is not None:
                await lease.release()
            await _assert_freed(clients, name, f"acquire cancelled after {k} iterations")
            if completed:
                return len(IN_FLIGHT)
        raise AssertionError(f"acquire never completed within {K_MAX} loop iterations")

    for number in range(SWEEPS):
        assert asyncio.run(sweep(f"{key}:{number}")) >= 1  # some cancel landed mid-flight


def test_a_cancelled_extend_leaves_a_lease_that_still_releases(
    topologies: Any, key: str, n: int
) -> None:
    urls = topologies.urls(n)
    clients = _clients(topologies, n)

    async def sweep() -> int:
        IN_FLIGHT.clear()
        lock = _lock(urls, key)
        for k in range(1, K_MAX):
            lease = await lock.acquire(wait=2.0)
            completed, _ = await _cancel_after(lease.extend(), k)
            with contextlib.suppress(FencelockError):
                await lease.release()  # whatever it says, the key must be gone (checked next)
            await _assert_freed(clients, key, f"extend cancelled after {k} iterations")
            if completed:
                return len(IN_FLIGHT)
        raise AssertionError(f"extend never completed within {K_MAX} loop iterations")

    assert asyncio.run(sweep()) >= 1  # at least one call was cancelled mid-flight


@pytest.mark.parametrize("renewing", [False, True], ids=["plain", "renewing"])
def test_a_cancelled_release_still_frees_the_lock(
    topologies: Any, key: str, n: int, renewing: bool
) -> None:
    """With renewal running, release first stops the renewal: a cancel landing there must not
    skip the release itself (the v0.1 engine then left the lock held to its TTL)."""
    urls = topologies.urls(n)
    clients = _clients(topologies, n)

    async def sweep() -> int:
        IN_FLIGHT.clear()
        lock = _lock(urls, key)
        for k in range(1, K_MAX):
            lease = await lock.acquire(wait=2.0)
            if renewing:
                lease.keep_alive()
            completed, _ = await _cancel_after(lease.release(), k)
            # no second release: the cancelled one must have freed the lock by itself
            await _assert_freed(clients, key, f"release cancelled after {k} iterations")
            if completed:
                return len(IN_FLIGHT)
        raise AssertionError(f"release never completed within {K_MAX} loop iterations")

    assert asyncio.run(sweep()) >= 1  # at least one call was cancelled mid-flight
