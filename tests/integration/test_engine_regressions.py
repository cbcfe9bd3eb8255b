"""Regressions of the v0.1 engine, each reproduced on real servers: the contracts of DESIGN.md
v0.2 that the rewritten engine must keep.

- an extend whose outcome is unknown leaves the *earlier* of the old and the new deadline (F24);
- the local deadline is ``start + ttl - drift``: a slow round is not counted twice;
- ``lost`` is set by the local deadline (a timer), not when a late failed round ends;
- renewals are not starved by late releases to a paused minority;
- a lease handed out before ``Lock.close()`` / ``Client.close()`` can still be released, or
  fails with a clear FencelockError, never a bare ValueError with its keys left behind.

Written against the public API only; servers are read directly with redis-py. Every test runs
over both front ends (``make_lock`` facade, or the asyncio variant written out with asyncio.run).
"""

# ruff: noqa: F811  (the api fixtures are imported, then named as test parameters)

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import redis
from api import LockFactory, front, lock_value, make_lock  # noqa: F401

import fencelock
import fencelock.asyncio as fasync
from fencelock import FencelockError, LockLost, Unavailable
from fencelock._core.keys import lock_keys
from fencelock.testing import ServerGroup
from fencelock.testing.proxy import Proxy
from fencelock.testing.pytest_plugin import ServerGroupFactory

POLL_S = 0.002  # how often a test samples a lease's state


def drift_s(ttl: float) -> float:
    """The default clock-drift allowance (DESIGN.md: ttl * 0.01 + 0.002 s)."""
    return ttl * 0.01 + 0.002


@dataclass
class Proxied:
    """N fresh servers, each behind its own fault proxy."""

    group: ServerGroup
    proxies: list[Proxy] = field(default_factory=list)

    @property
    def urls(self) -> list[str]:
        return [p.url for p in self.proxies]

    def clients(self) -> list[redis.Redis]:
        return [s.client() for s in self.group]

    def heal(self) -> None:
        for proxy in self.proxies:
            proxy.heal()


@pytest.fixture
def proxied(fencelock_servers: ServerGroupFactory) -> Iterator[Callable[[int], Proxied]]:
    made: list[Proxied] = []

    def make(n: int) -> Proxied:
        topo = Proxied(fencelock_servers(n))
        made.append(topo)
        for server in topo.group:
            topo.proxies.append(Proxy(server.host, server.port, password=server.password).start())
        return topo

    yield make
    for topo in made:
        for proxy in topo.proxies:
            proxy.stop()


def load_scripts(urls: list[str], key: str) -> None:
    """Have every server run the acquire, extend and release scripts once (one single-server
    lock each), so that a fault injected later meets a warm script cache: a reply dropped after
    NOSCRIPT would otherwise mean the command never ran at all."""
    for url in urls:
        lock = fencelock.Lock(url, f"{key}:warm")
        try:
            lease = lock.acquire(wait=2.0)
            lease.extend()
            lease.release()
        finally:
            lock.close()


def free_everywhere(clients: list[redis.Redis], name: str) -> bool:
    return all(lock_value(c, name) is None for c in clients)


# -- F24: an extend whose outcome is unknown ------------------------------------------------------


def test_an_unconfirmed_shorter_extend_shortens_the_local_deadline(
    proxied: Callable[[int], Proxied], make_lock: LockFactory, key: str
) -> None:
    topo = proxied(3)
    clients = topo.clients()
    load_scripts(topo.urls, key)
    lock = make_lock(topo.urls, key, ttl=10.0, server_timeout=0.2)
    lease = lock.acquire(wait=2.0)
    assert lease.remaining() > 9.0
    # servers 0 and 1 apply the PEXPIRE, but their replies never come back
    topo.proxies[0].drop_replies()
    topo.proxies[1].drop_replies()
    try:
        with pytest.raises((Unavailable, LockLost)):
            lease.extend(1.0)
    finally:
        topo.heal()
    # the shorter TTL did land on a majority (the precondition of this test) ...
    landed = [c.pttl(lock_keys(key).lock) for c in clients[:2]]
    assert all(0 < pttl <= 1000 for pttl in landed), landed
    # ... so the lease must not claim more than the shorter TTL (earlier of old and new)
    assert lease.remaining() <= 1.0, f"lease reports {lease.remaining():.3f} s after extend(1.0)"
    # and when another client gets the lock (after the majority's keys expired), the first
    # lease has run out locally: never two valid leases at once
    other = make_lock(topo.urls, key, ttl=10.0, server_timeout=0.2)
    second = other.acquire(wait=3.0)
    try:
        assert lease.remaining() == 0.0, f"first lease still reports {lease.remaining():.3f} s"
    finally:
        second.release()


# -- the local deadline counts a slow round once --------------------------------------------------


@pytest.mark.parametrize("n", [1, 3])
def test_a_slow_round_is_taken_off_the_lease_once(
    proxied: Callable[[int], Proxied], make_lock: LockFactory, key: str, n: int
) -> None:
    ttl = 2.0
    one_way = 0.3 * ttl / 2  # seconds per direction: one round trip is 0.3 * ttl
    topo = proxied(n)
    lock = make_lock(topo.urls, key, ttl=ttl, server_timeout=0.8)
    lock.acquire(wait=2.0).release()  # connections and identity checks done at full speed
    for proxy in topo.proxies:
        proxy.latency(one_way * 1000)
    try:
        before = time.monotonic()
        lease = lock.acquire(wait=0)
        after = time.monotonic()
        deadline = time.monotonic() + lease.remaining()
    finally:
        for proxy in topo.proxies:
            proxy.pass_through()
    try:
        # contract: deadline = start + ttl - drift, start taken before the first byte was sent,
        # so start is in [before, after - one round trip]
        tolerance = 0.05
        lowest = before + ttl - drift_s(ttl) - tolerance
        highest = after - 2 * one_way + ttl - drift_s(ttl) + tolerance
        assert lowest <= deadline <= highest, (
            f"round took {after - before:.3f} s; lease deadline {deadline - before:.3f} s after "
            f"the call began, expected within [{lowest - before:.3f}, {highest - before:.3f}]"
        )
    finally:
        lease.release()


# -- lost is set by the deadline, not by the end of a late round ----------------------------------


def _wait_for_a_renewal(lease: Any, limit_s: float) -> None:
    """Return right after the lease's deadline moved forward (a renewal landed), or after
    ``limit_s`` seconds."""
    end = time.monotonic() + limit_s
    last = time.monotonic() + lease.remaining()
    while time.monotonic() < end:
        time.sleep(POLL_S)
        now_deadline = time.monotonic() + lease.remaining()
        if now_deadline > last + 0.1:
            return
        last = now_deadline


def _watch_until_lost(lease: Any, limit_s: float) -> tuple[float, float | None]:
    """Sample the lease until ``lost`` is set (or ``limit_s``): returns the latest deadline seen
    while it was valid and the time ``lost`` was first seen set (None: never)."""
    deadline = time.monotonic() + lease.remaining()
    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        now = time.monotonic()
        if lease.lost.is_set():
            return deadline, now
        left = lease.remaining()
        if left > 0:
            deadline = max(deadline, now + left)
        time.sleep(POLL_S)
    return deadline, None


def test_lost_is_set_by_the_local_deadline_when_a_majority_stops_answering(
    fencelock_servers: ServerGroupFactory, make_lock: LockFactory, key: str
) -> None:
    group = fencelock_servers(3)
    ttl = 1.0
    lock = make_lock(group.urls, key, ttl=ttl, server_timeout=0.3, renew_every=0.5)
    seen: dict[str, Any] = {}
    try:
        # (the block only records: the asyncio facade turns anything raised in it after the
        # loss into LockLost, so every assertion is made after the block)
        with pytest.raises(LockLost), lock.hold(wait=2.0, renew=True) as lease:
            _wait_for_a_renewal(lease, 3 * ttl)
            seen["lost_before_pause"] = lease.lost.is_set()
            group[0].pause()
            group[1].pause()
            seen["deadline"], seen["lost_at"] = _watch_until_lost(lease, ttl + 2.0)
    finally:
        for server in group:
            server.resume()
    assert seen["lost_before_pause"] is False
    assert seen["lost_at"] is not None, "lost never set after a majority stopped answering"
    late = seen["lost_at"] - seen["deadline"]
    assert late <= 0.05, f"lost set {late * 1000:.0f} ms after the lease's deadline"


# -- renewals are not starved by late releases to a paused minority -------------------------------

LEASES = 20
WORKERS = 4
HOLD_S = 4.0
# each worker paces itself to at most 50 acquire+release cycles a second; a release waits for
# the paused server's timeout, so together they reach roughly 50 cycles a second here (about
# 40 a second was not enough to starve the v0.1 watchdog, 50 starved it every time)
CYCLE_S = 0.02


def test_renewals_keep_healthy_leases_while_one_server_is_paused_under_load(
    fencelock_servers: ServerGroupFactory, key: str
) -> None:
    group = fencelock_servers(3)
    opts: dict[str, Any] = {"ttl": 1.0, "server_timeout": 0.1}
    locks = [fencelock.Lock(group.urls, f"{key}:held{i}", **opts) for i in range(LEASES)]
    leases = [lock.acquire(wait=2.0) for lock in locks]
    for lease in leases:
        lease.keep_alive()
    stop = threading.Event()
    ops = [0] * WORKERS
    errors: list[BaseException] = []

    def churn(index: int) -> None:
        lock = fencelock.Lock(group.urls, f"{key}:churn{index}", **opts)
        while not stop.is_set():
            began = time.monotonic()
            try:
                lock.acquire(wait=1.0).release()
                ops[index] += 1
            except Exception as exc:
                errors.append(exc)
            stop.wait(max(0.0, CYCLE_S - (time.monotonic() - began)))

    threads = [threading.Thread(target=churn, args=(i,), daemon=True) for i in range(WORKERS)]
    group[2].pause()
    try:
        for thread in threads:
            thread.start()
        time.sleep(HOLD_S)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10.0)
        group[2].resume()
    lost = [(i, lease.lost_reason) for i, lease in enumerate(leases) if lease.lost.is_set()]
    try:
        assert lost == [], f"{len(lost)}/{LEASES} healthy leases lost: {lost[:3]}"
        assert sum(ops) >= WORKERS * HOLD_S, f"too little load to mean anything: {ops}"
        assert not any(thread.is_alive() for thread in threads)
    finally:
        for lease in leases:
            with contextlib.suppress(FencelockError):
                lease.release()


def test_async_renewals_keep_healthy_leases_while_one_server_is_paused_under_load(
    fencelock_servers: ServerGroupFactory, key: str
) -> None:
    group = fencelock_servers(3)
    opts: dict[str, Any] = {"ttl": 1.0, "server_timeout": 0.1}

    async def scenario() -> tuple[list[tuple[int, str | None]], list[int], list[BaseException]]:
        locks = [fasync.Lock(group.urls, f"{key}:held{i}", **opts) for i in range(LEASES)]
        leases = [await lock.acquire(wait=2.0) for lock in locks]
        for lease in leases:
            lease.keep_alive()
        ops = [0] * WORKERS
        errors: list[BaseException] = []
        stop = asyncio.Event()

        async def churn(index: int) -> None:
            lock = fasync.Lock(group.urls, f"{key}:churn{index}", **opts)
            while not stop.is_set():
                began = time.monotonic()
                try:
                    await (await lock.acquire(wait=1.0)).release()
                    ops[index] += 1
                except Exception as exc:
                    errors.append(exc)
                await asyncio.sleep(max(0.0, CYCLE_S - (time.monotonic() - began)))

        group[2].pause()
        try:
            workers = [asyncio.create_task(churn(i)) for i in range(WORKERS)]
            await asyncio.sleep(HOLD_S)
            stop.set()
            await asyncio.wait(workers, timeout=10.0)
        finally:
            group[2].resume()
        lost = [(i, lease.lost_reason) for i, lease in enumerate(leases) if lease.lost.is_set()]
        for lease in leases:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(lease.release(), 5.0)
        return lost, ops, errors

    lost, ops, _errors = asyncio.run(scenario())
    assert lost == [], f"{len(lost)}/{LEASES} healthy leases lost: {lost[:3]}"
    assert sum(ops) >= WORKERS * HOLD_S, f"too little load to mean anything: {ops}"


# -- a lease handed out before close() ------------------------------------------------------------


def _check_release_after_close(lease: Any, release: Callable[[], Any], clients: list[redis.Redis],
                               name: str) -> None:  # fmt: skip
    """Either the release works (keys gone on every server) or it raises a FencelockError; a
    bare ValueError is never acceptable, and a lease whose keys are left must not later claim
    to be released."""
    try:
        release()
    except FencelockError:
        if not free_everywhere(clients, name):
            with pytest.raises(FencelockError):
                release()  # still not released: a second try must not pretend it worked
        return
    except ValueError as exc:
        pytest.fail(f"release after close raised a bare {type(exc).__name__}: {exc}")
    held = [i for i, c in enumerate(clients) if lock_value(c, name) is not None]
    assert held == [], f"release() returned but servers {held} still hold {name!r}"


@pytest.mark.parametrize("n", [1, 3])
def test_a_lease_can_be_released_after_its_lock_is_closed(
    topologies: Any, make_lock: LockFactory, key: str, n: int
) -> None:
    urls = topologies.urls(n)
    clients = [s.client() for s in topologies.group(n)]
    lock = make_lock(urls, key, ttl=30.0)
    lease = lock.acquire(wait=2.0)
    lock.close()
    _check_release_after_close(lease, lease.release, clients, key)


@pytest.mark.parametrize("n", [1, 3])
def test_a_lease_can_be_released_after_its_client_is_closed(
    topologies: Any, key: str, n: int
) -> None:
    urls = topologies.urls(n)
    clients = [s.client() for s in topologies.group(n)]
    client = fencelock.Client(urls, ttl=30.0)
    try:
        lease = client.lock(key).acquire(wait=2.0)
    finally:
        client.close()
    _check_release_after_close(lease, lease.release, clients, key)


@pytest.mark.parametrize("n", [1, 3])
def test_an_async_lease_can_be_released_after_its_client_is_closed(
    topologies: Any, key: str, n: int
) -> None:
    urls = topologies.urls(n)
    clients = [s.client() for s in topologies.group(n)]

    async def scenario() -> None:
        client = fasync.Client(urls, ttl=30.0)
        try:
            lease = await client.lock(key).acquire(wait=2.0)
        finally:
            await client.aclose()

        try:
            await lease.release()
        except FencelockError:
            if not free_everywhere(clients, key):
                with pytest.raises(FencelockError):
                    await lease.release()
            return
        except ValueError as exc:
            pytest.fail(f"release after aclose raised a bare {type(exc).__name__}: {exc}")
        held = [i for i, c in enumerate(clients) if lock_value(c, key) is not None]
        assert held == [], f"release() returned but servers {held} still hold {key!r}"

    asyncio.run(scenario())
