"""Network faults through the per-server proxies: minority / majority partition (F11) and a
request applied whose reply is lost (F12)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from fencelock import Lock, Unavailable
from fencelock.cli.chaos.nemesis import Topology
from fencelock.fence import RedisFence

KEY = "partition"
LOCK_KEY = f"fencelock:{{{KEY}}}"


@pytest.fixture()
def topo() -> Iterator[Topology]:
    topology = Topology(5, persistence="none").start()
    try:
        yield topology
    finally:
        topology.stop()


def holders(topo: Topology) -> list[int]:
    """Indexes of the servers holding the lock key (asked directly, not through a proxy)."""
    out = []
    for i, server in enumerate(topo.servers):
        with server.client() as c:
            if c.exists(LOCK_KEY):
                out.append(i)
    return out


def test_minority_partition_still_locks_and_fences(topo: Topology) -> None:
    lock = Lock(topo.lock_urls, KEY, ttl=3.0, server_timeout=0.2)
    store = RedisFence(topo.storage.url)
    try:
        topo.proxies[1].blackhole()
        topo.proxies[3].blackhole()
        lease = lock.acquire(wait=2.0)
        assert holders(topo) == [0, 2, 4]  # granted by exactly the reachable majority
        store.write("partition", lease.fence, b"x")
        lease.release()
        assert holders(topo) == []
    finally:
        topo.heal_network()
        lock.close()
        store.close()


def test_majority_partition_refuses_and_grants_nothing(topo: Topology) -> None:
    lock = Lock(topo.lock_urls, KEY, ttl=3.0, server_timeout=0.2)
    try:
        for i in (0, 2, 4):
            topo.proxies[i].blackhole()
        started = time.monotonic()
        with pytest.raises(Unavailable):
            lock.acquire(wait=1.0)
        assert time.monotonic() - started < 4.0
        # the minority that answered was released again: no grant is left anywhere
        assert holders(topo) == []
        topo.heal_network()
        lock.acquire(wait=3.0).release()  # liveness after heal
    finally:
        topo.heal_network()
        lock.close()


def test_lost_replies_leave_nothing_behind_beyond_the_ttl(topo: Topology) -> None:
    ttl = 1.0
    lock = Lock(topo.lock_urls, KEY, ttl=ttl, server_timeout=0.2)
    try:
        lock.acquire(wait=1.0).release()  # warm connections
        for i in (0, 1, 2):
            topo.proxies[i].drop_replies()
        with pytest.raises(Unavailable):
            lock.acquire(wait=0)
        # the SET NX reached every server (only replies were dropped) ...
        topo.heal_network()
        failed_at = time.monotonic()
        # ... and nothing of it survives the TTL: released by the failed round's cleanup or
        # expired, never an orphan
        deadline = failed_at + ttl + 1.0
        while holders(topo) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holders(topo) == []
        for server in topo.servers:
            with server.client() as c:
                for key in c.keys("fencelock:{partition}*"):
                    if not key.endswith(b":fence"):
                        assert c.pttl(key) != -1, key  # nothing without an expiry
        lock.acquire(wait=ttl).release()
    finally:
        topo.heal_network()
        lock.close()
