"""The semaphore's votes (issue 21, items 13 and 6), on real servers, both front ends.

- restart_delay (item 13): limit 1 over three servers without persistence. Server 2 is
  down while holder H takes the permit on {0, 1}; server 2 comes back empty; server 1 crashes
  and comes back empty. A Lock in that state is refused (its grant on server 1 does not count
  while server 1's uptime is below the ttl); so must a Semaphore be: a permit on {1, 2} would be
  a second valid permit beside H's.
- converging slots (item 6): limit 2 over three servers, one holder granted without server 0,
  the next without server 2. Servers pick a free slot each; when they pick different ones, the
  acquirer must converge on one slot (it proposes the slot most servers may still have free)
  instead of splitting its vote on every retry while capacity exists; and never more than
  ``limit`` permits are valid.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import fencelock
import fencelock.asyncio as aio
from fencelock import NotAcquired
from fencelock.cli.chaos.nemesis import Topology
from fencelock.testing import ServerGroup, refused_url

TTL = 4.0
WAIT = 2.0  # a liveness bound (s) for an acquire that must succeed, never a speed assertion


def _down_then_up_empty(topo: Topology, index: int) -> None:
    topo.servers[index].kill()
    topo.servers[index].restart(wipe=True)


def _restart_causes(exc: NotAcquired) -> list[str]:
    return [
        str(v.cause) for v in exc.votes if v.outcome == "error" and "restart_delay" in str(v.cause)
    ]


def test_a_semaphore_does_not_count_a_restarted_servers_grant() -> None:
    topo = Topology(3, persistence="none").start()
    h = fencelock.Semaphore(topo.lock_urls, "restarted", 1, ttl=TTL, server_timeout=0.2)
    b = fencelock.Semaphore(topo.lock_urls, "restarted", 1, ttl=TTL, server_timeout=0.2)
    try:
        topo.proxies[2].blackhole()
        permit = h.acquire(wait=1.0)  # on {0, 1}
        topo.heal_network()
        _down_then_up_empty(topo, 2)
        _down_then_up_empty(topo, 1)
        with pytest.raises(NotAcquired) as info:
            b.acquire(wait=1.0)  # well inside H's 4 s permit
        assert permit.valid
        assert _restart_causes(info.value)  # refused because server 1's vote was held back
    finally:
        h.close()
        b.close()
        topo.stop()


def test_an_asyncio_semaphore_does_not_count_a_restarted_servers_grant() -> None:
    async def scenario(topo: Topology) -> None:
        h = aio.Semaphore(topo.lock_urls, "restarted-aio", 1, ttl=TTL, server_timeout=0.2)
        b = aio.Semaphore(topo.lock_urls, "restarted-aio", 1, ttl=TTL, server_timeout=0.2)
        try:
            topo.proxies[2].blackhole()
            permit = await h.acquire(wait=1.0)
            topo.heal_network()
            _down_then_up_empty(topo, 2)
            _down_then_up_empty(topo, 1)
            with pytest.raises(NotAcquired) as info:
                await b.acquire(wait=1.0)
            assert permit.valid
            assert _restart_causes(info.value)
        finally:
            await h.aclose()
            await b.aclose()

    topo = Topology(3, persistence="none").start()
    try:
        asyncio.run(scenario(topo))
    finally:
        topo.stop()


def _views(group: ServerGroup) -> tuple[list[str], list[str], list[str]]:
    """The servers as a holder without server 0, one without server 2, and everyone sees them."""
    urls = [server.url for server in group.servers]
    return [refused_url(), *urls[1:]], [*urls[:2], refused_url()], urls


def test_a_split_permit_vote_converges_while_capacity_exists(fencelock_servers: Any) -> None:
    group = fencelock_servers(3)
    without_0, without_2, everyone = _views(group)
    name = f"split-{time.monotonic_ns()}"
    x = fencelock.Semaphore(without_0, name, 3, ttl=30.0)
    y = fencelock.Semaphore(without_2, name, 3, ttl=30.0)
    z = fencelock.Semaphore(everyone, name, 3, ttl=30.0)
    try:
        first = x.acquire(wait=WAIT)  # slot 0 on {1, 2}
        # server 0 has slot 0 free, server 1 slot 1: a vote split between slots 0 and 1
        second = y.acquire(wait=WAIT)
        # server 0 has slots 0 and 2 free, server 1 only 2 (or 0), server 2 slots 1 and 2
        third = z.try_acquire()
        assert third is not None, "refused while a permit was free on every server"
        assert len({first.slot, second.slot, third.slot}) == 3
        assert all(p.valid for p in (first, second, third))
        with pytest.raises(NotAcquired):  # never more than ``limit`` valid permits
            z.acquire(wait=0.5)
        third.release()
        fourth = z.acquire(wait=WAIT)  # the freed capacity is found again
        assert fourth.slot == third.slot
    finally:
        for sem in (x, y, z):
            sem.close()


def test_an_asyncio_split_permit_vote_converges_while_capacity_exists(
    fencelock_servers: Any,
) -> None:
    group = fencelock_servers(3)
    without_0, without_2, everyone = _views(group)
    name = f"split-aio-{time.monotonic_ns()}"

    async def job() -> None:
        x = aio.Semaphore(without_0, name, 3, ttl=30.0)
        y = aio.Semaphore(without_2, name, 3, ttl=30.0)
        z = aio.Semaphore(everyone, name, 3, ttl=30.0)
        try:
            first = await x.acquire(wait=WAIT)
            second = await y.acquire(wait=WAIT)
            third = await z.try_acquire()
            assert third is not None, "refused while a permit was free on every server"
            assert len({first.slot, second.slot, third.slot}) == 3
            assert all(p.valid for p in (first, second, third))
            with pytest.raises(NotAcquired):
                await z.acquire(wait=0.5)
        finally:
            for sem in (x, y, z):
                await sem.aclose()

    asyncio.run(job())
