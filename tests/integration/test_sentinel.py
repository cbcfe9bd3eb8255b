"""Sentinel-managed masters as lock servers: ``redis+sentinel://`` URLs and
``Sentinel.master_for`` clients count as one server; after a failover the new primary is
found (asked of the sentinels again) and new acquires work against it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis.sentinel

import fencelock
from fencelock.testing import ReplicaSet, Server, free_ports

aio = pytest.importorskip("fencelock.asyncio")

#: No operation here may take longer than this (s): a generous bound, never a speed assertion.
BOUND_S = 20.0


@pytest.fixture(scope="module")
def watched(fencelock_server_binary: str) -> Iterator[ReplicaSet]:
    """A primary, two replicas and three sentinels (tests may fail it over: use primary())."""
    with ReplicaSet(2, sentinels=3, binary=fencelock_server_binary) as topology:
        yield topology


def _holds(node: Server, key: str) -> bool:
    conn = node.client()
    try:
        return bool(conn.exists(f"fencelock:{{{key}}}"))
    finally:
        conn.close()


def test_a_lock_via_a_sentinel_url_lands_on_the_primary(watched: ReplicaSet, key: str) -> None:
    lock = fencelock.Lock(watched.sentinel_url, key, ttl=10)
    with lock.acquire(wait=BOUND_S) as lease:
        assert _holds(watched.primary(), key)
        lease.extend()
    assert not _holds(watched.primary(), key)


def test_a_master_for_client_is_the_same_single_server_as_the_url(
    watched: ReplicaSet, key: str
) -> None:
    sentinel = redis.sentinel.Sentinel(
        [(s.host, s.port) for s in watched.sentinels], password=watched.password
    )
    client = sentinel.master_for(watched.service)
    by_client = fencelock.Lock(client, key, ttl=10)
    by_url = fencelock.Lock(watched.sentinel_url, key, ttl=10)
    assert by_client._definition.servers == by_url._definition.servers  # one vote, shared
    with by_client.acquire(wait=BOUND_S) as lease:
        with pytest.raises(fencelock.NotAcquired):
            by_url.acquire(wait=0)
        assert lease.valid
    client.close()


def test_an_unreachable_sentinel_set_is_unavailable_within_bounds(key: str) -> None:
    first, second = free_ports(2)
    url = f"redis+sentinel://127.0.0.1:{first},127.0.0.1:{second}/nobody"
    started = time.monotonic()
    with pytest.raises(fencelock.Unavailable, match="no sentinel named the master"):
        fencelock.Lock(url, key, ttl=5).acquire(wait=0.5)
    assert time.monotonic() - started < BOUND_S


def test_after_a_failover_mid_hold_new_acquires_work_against_the_new_primary(
    watched: ReplicaSet, key: str
) -> None:
    url = watched.sentinel_url
    lease = fencelock.Lock(url, key, ttl=30, replicas=1).acquire(wait=BOUND_S)
    old = watched.primary()
    new = watched.failover()
    assert new is not old
    # the hold was acknowledged by a replica: the promoted node (or the one it syncs) has it
    assert _holds(new, key)
    started = time.monotonic()
    other = f"{key}:after"
    with fencelock.Lock(url, other, ttl=10).acquire(wait=BOUND_S) as after:
        assert _holds(new, other)
        assert after.valid
    assert time.monotonic() - started < BOUND_S
    with pytest.raises(fencelock.NotAcquired):  # the replicated hold survived the failover
        fencelock.Lock(url, key, ttl=10).acquire(wait=0)
    lease.release()


def test_asyncio_follows_a_failover(watched: ReplicaSet, key: str) -> None:
    url = watched.sentinel_url

    async def main() -> None:
        lock = aio.Lock(url, key, ttl=10)
        try:
            async with await lock.acquire(wait=BOUND_S):
                pass
            new = await asyncio.to_thread(watched.failover)
            lease = await lock.acquire(wait=BOUND_S)
            assert _holds(new, key)
            await lease.release()
        finally:
            await lock.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))


SENTINEL_PASSWORD = "s3ntinel-pw"


@pytest.fixture(scope="module")
def guarded(fencelock_server_binary: str) -> Iterator[ReplicaSet]:
    """A primary watched by one sentinel whose default user needs a password (issue 23 #4:
    sentinels were asked over plain TCP without auth)."""
    with ReplicaSet(0, sentinels=1, binary=fencelock_server_binary) as topology:
        (sentinel,) = topology.sentinels
        asker = redis.Redis(host=sentinel.host, port=sentinel.port, socket_timeout=BOUND_S)
        asker.execute_command("ACL", "SETUSER", "default", "resetpass", f">{SENTINEL_PASSWORD}")
        asker.close()
        yield topology


def test_a_sentinel_that_needs_a_password_is_asked_with_the_one_given(
    guarded: ReplicaSet, key: str
) -> None:
    with pytest.raises(fencelock.Unavailable) as info:
        fencelock.Lock(guarded.sentinel_url, key, ttl=10).acquire(wait=0)
    assert "NOAUTH" in str(info.value) or "Authentication" in str(info.value), info.value
    url = f"{guarded.sentinel_url}?sentinel_password={SENTINEL_PASSWORD}"
    with fencelock.Lock(url, key, ttl=10).acquire(wait=BOUND_S) as lease:
        assert lease.fence > 0
        assert _holds(guarded.first_primary, key)  # no failover here
    wrong = f"{guarded.sentinel_url}?sentinel_password=not-it"
    with pytest.raises(fencelock.Unavailable) as refused:
        fencelock.Lock(wrong, key, ttl=10).acquire(wait=0)
    assert "not-it" not in str(refused.value) and "refused AUTH" in str(refused.value)


def test_a_sentinel_client_with_sentinel_kwargs_lends_its_password(
    guarded: ReplicaSet, key: str
) -> None:
    (sentinel,) = guarded.sentinels
    manager = redis.sentinel.Sentinel(
        [(sentinel.host, sentinel.port)],
        sentinel_kwargs={"password": SENTINEL_PASSWORD},
        socket_timeout=BOUND_S,
        password=guarded.password,
    )
    master = manager.master_for(guarded.service)
    with fencelock.Lock(master, key, ttl=10).acquire(wait=BOUND_S) as lease:
        assert lease.fence > 0
    master.close()
