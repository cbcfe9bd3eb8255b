"""An extend whose request lands after a later extend's, on real servers (stop 38's 2a).

A holder's ``extend(FIRST_S)`` is stuck in its TCP connections to two of three servers and
times out (its outcome is unknown). The servers are trusted again once a probe on a new
connection answers, and ``extend(SECOND_S)``, longer, is confirmed by all three on new
connections. Then the first request reaches the two servers and cuts their key to
``FIRST_S`` from its landing, a majority. The lease used to take ``SECOND_S`` from its second
extend and stayed valid after that majority's keys had gone, while another client took the
lock: two valid leases. It now counts, per server, the shortest span of an extend that server
did not answer, so its deadline is no later than the keys of a majority.

The stuck requests come from :meth:`fencelock.testing.proxy.Proxy.hold_connections` (the
connections open at that moment only); both front ends.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock.asyncio as fasync
from fencelock import Lock, Unavailable
from fencelock._core.keys import lock_keys
from fencelock.testing import Server, wait_trusted
from fencelock.testing.proxy import Proxy

TTL_S = 10.0
FIRST_S = 4.0  # the extend that is stuck, then lands late
SECOND_S = 8.0  # the later, longer extend, confirmed everywhere first
TIMEOUT_S = 1.0  # server_timeout: the stuck extend gives up after this (room for a loaded machine)
BOUND_S = 15.0  # liveness bound of every wait here (s), never a speed assertion


@pytest.fixture
def servers(topologies: Any) -> list[Server]:
    # the shared three (never paused or stopped here: the faults are in the proxies)
    return list(topologies.group(3).servers)


@pytest.fixture
def proxies(servers: list[Server]) -> Iterator[list[Proxy]]:
    made: list[Proxy] = []
    try:
        for server in servers[:2]:
            # drain: a request written before the client closed its connection still arrives
            proxy = Proxy(
                server.host, server.port, name=f"late->{server.port}",
                password=server.password, drain=True,
            )  # fmt: skip
            made.append(proxy.start())
        yield made
    finally:
        for proxy in made:
            proxy.stop()


def _urls(servers: list[Server], proxies: list[Proxy]) -> list[str]:
    return [proxies[0].url, proxies[1].url, servers[2].url]


def _expiries(servers: list[Server], key: str) -> list[float]:
    """Each server's key expiry, as a lower bound in this process's monotonic clock."""
    found = []
    for server in servers:
        with server.client() as client:
            sent = time.monotonic()
            pttl = client.pttl(lock_keys(key).lock)
        assert pttl > 0, (server.port, pttl)
        found.append(sent + pttl / 1000.0)
    return found


def _granted_everywhere(servers: list[Server], key: str) -> None:
    """Until the grant ran on all three servers (the acquire returns on a majority)."""
    end = time.monotonic() + BOUND_S
    while True:
        pttls = []
        for server in servers:
            with server.client() as client:
                pttls.append(client.pttl(lock_keys(key).lock))
        if all(pttl > 0 for pttl in pttls):
            return
        assert time.monotonic() < end, f"the grant did not run everywhere: {pttls}"
        time.sleep(0.01)


def _landed(servers: list[Server], key: str) -> list[float]:
    """Wait until the stuck extend cut the key on both proxied servers; their expiries."""
    end = time.monotonic() + BOUND_S
    while True:
        expiries = _expiries(servers, key)
        if all(at - time.monotonic() <= FIRST_S + 0.05 for at in expiries[:2]):
            return expiries
        assert time.monotonic() < end, "the stuck extend never landed"
        time.sleep(0.01)


def _check(lease_deadline: float, expiries: list[float]) -> None:
    # a majority (2 of 3) holds the key until the second-latest expiry
    majority_until = sorted(expiries, reverse=True)[1]
    assert lease_deadline <= majority_until, (
        f"the lease is valid {lease_deadline - majority_until:.3f} s after a majority's keys "
        "expire"
    )


def test_sync_an_extend_that_lands_late_does_not_outlive_the_lease(
    servers: list[Server], proxies: list[Proxy], key: str
) -> None:
    urls = _urls(servers, proxies)
    lease = Lock(urls, key, ttl=TTL_S, server_timeout=TIMEOUT_S).acquire()
    _granted_everywhere(servers, key)
    assert all(proxy.hold_connections() >= 1 for proxy in proxies)
    with pytest.raises(Unavailable):
        lease.extend(FIRST_S)
    assert wait_trusted(urls[:2], within_s=BOUND_S), "the servers were not trusted again"
    lease.extend(SECOND_S)  # on new connections, confirmed by all three
    for proxy in proxies:
        proxy.deliver()
    expiries = _landed(servers, key)
    _check(lease.deadline, expiries)
    # and end to end: once another client holds the lock, ours is no longer valid
    other = Lock([s.url for s in servers], key, ttl=TTL_S).acquire(wait=BOUND_S)
    try:
        assert not lease.valid, f"two valid leases; ours has {lease.remaining():.3f} s left"
    finally:
        other.release()


def test_asyncio_an_extend_that_lands_late_does_not_outlive_the_lease(
    servers: list[Server], proxies: list[Proxy], key: str
) -> None:
    urls = _urls(servers, proxies)

    async def scenario() -> None:
        lease = await fasync.Lock(urls, key, ttl=TTL_S, server_timeout=TIMEOUT_S).acquire()
        await asyncio.to_thread(_granted_everywhere, servers, key)
        assert all(proxy.hold_connections() >= 1 for proxy in proxies)
        with pytest.raises(Unavailable):
            await lease.extend(FIRST_S)
        trusted = await asyncio.to_thread(wait_trusted, urls[:2], BOUND_S)
        assert trusted, "the servers were not trusted again"
        await lease.extend(SECOND_S)
        for proxy in proxies:
            proxy.deliver()
        expiries = await asyncio.to_thread(_landed, servers, key)
        _check(lease.deadline, expiries)
        other = await fasync.Lock([s.url for s in servers], key, ttl=TTL_S).acquire(
            wait=BOUND_S
        )
        try:
            assert not lease.valid, f"two valid leases; ours has {lease.remaining():.3f} s left"
        finally:
            await other.release()

    asyncio.run(scenario())
