"""``replicas=k`` against a real primary and replica: a grant or extend counts only once
``WAIT k`` saw it on k replicas; a replica that cannot acknowledge (paused, or missing) makes
the primary's vote an outage, and what was written there is released."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock
from fencelock._core.holder_json import split_lock_value
from fencelock._core.keys import lock_keys
from fencelock.testing import ReplicaSet

aio = pytest.importorskip("fencelock.asyncio")

#: No acquire here may take longer than this (s): a generous bound, never a speed assertion.
BOUND_S = 15.0


@pytest.fixture(scope="module")
def replica_set(fencelock_server_binary: str) -> Iterator[ReplicaSet]:
    with ReplicaSet(1, binary=fencelock_server_binary) as topology:
        yield topology


@pytest.fixture
def healthy(replica_set: ReplicaSet) -> Iterator[ReplicaSet]:
    """The set with its replica linked before and after the test (a test may pause it)."""
    replica_set.wait_linked(replica_set.replicas[0], 10.0)
    yield replica_set
    replica_set.replicas[0].resume()
    replica_set.wait_linked(replica_set.replicas[0], 10.0)


def _lock_key_on(topology: ReplicaSet, key: str) -> bool:
    conn = topology.first_primary.client()
    try:
        return bool(conn.exists(f"fencelock:{{{key}}}"))
    finally:
        conn.close()


def test_replicas_1_grants_extends_and_the_replica_has_the_lock(
    healthy: ReplicaSet, key: str
) -> None:
    lock = fencelock.Lock(healthy.first_primary.url, key, ttl=10, replicas=1)
    with lock.acquire(wait=BOUND_S) as lease:
        # WAIT returned: the replica already has the key, no polling needed
        replica = healthy.replicas[0].client()
        try:
            assert replica.exists(f"fencelock:{{{key}}}") == 1
        finally:
            replica.close()
        lease.extend()
        assert lease.valid
    assert not _lock_key_on(healthy, key)


def test_replicas_1_works_after_the_scripts_were_flushed(healthy: ReplicaSet, key: str) -> None:
    # the NOSCRIPT answer is followed by the WAIT's: the full script goes out again with its WAIT
    lock = fencelock.Lock(healthy.first_primary.url, key, ttl=10, replicas=1)
    lock.acquire(wait=BOUND_S).release()
    conn = healthy.first_primary.client()
    try:
        conn.script_flush()
    finally:
        conn.close()
    with lock.acquire(wait=BOUND_S) as lease:
        assert lease.valid


def test_a_paused_replica_makes_replicas_1_unavailable_and_leaves_nothing_locked(
    healthy: ReplicaSet, key: str
) -> None:
    url = healthy.first_primary.url
    healthy.replicas[0].pause()
    started = time.monotonic()
    with pytest.raises(fencelock.Unavailable, match="replica"):
        fencelock.Lock(url, key, ttl=10, replicas=1).acquire(wait=0.5)
    assert time.monotonic() - started < BOUND_S
    assert not _lock_key_on(healthy, key)  # released by the failed attempt's clean-up
    # the same key is free at once for a lock that does not ask for replicas
    with fencelock.Lock(url, key, ttl=10).acquire(wait=0) as lease:
        assert lease.valid


def test_more_replicas_than_exist_is_unavailable(healthy: ReplicaSet, key: str) -> None:
    started = time.monotonic()
    with pytest.raises(fencelock.Unavailable, match="1 of 2 replica"):
        fencelock.Lock(healthy.first_primary.url, key, ttl=10, replicas=2).acquire(wait=0)
    assert time.monotonic() - started < BOUND_S
    assert not _lock_key_on(healthy, key)


def test_an_extend_with_the_replica_paused_is_not_confirmed(healthy: ReplicaSet, key: str) -> None:
    lock = fencelock.Lock(healthy.first_primary.url, key, ttl=10, replicas=1)
    lease = lock.acquire(wait=BOUND_S)
    try:
        healthy.replicas[0].pause()
        with pytest.raises(fencelock.Unavailable, match="replica"):
            lease.extend()
    finally:
        healthy.replicas[0].resume()
        lease.release()


def test_the_client_passes_replicas_to_its_locks(healthy: ReplicaSet, key: str) -> None:
    with fencelock.Client(healthy.first_primary.url, ttl=10, replicas=1) as client:
        healthy.replicas[0].pause()
        with pytest.raises(fencelock.Unavailable):
            client.lock(key).acquire(wait=0)
        # replicas=0 for one lock of the same client: the primary's answer is enough
        with client.lock(key, replicas=0).acquire(wait=0) as lease:
            assert lease.valid


def test_asyncio_replicas_1_grants_and_a_paused_replica_is_unavailable(
    healthy: ReplicaSet, key: str
) -> None:
    url = healthy.first_primary.url

    async def main() -> None:
        lock = aio.Lock(url, key, ttl=10, replicas=1)
        try:
            async with await lock.acquire(wait=BOUND_S) as lease:
                await lease.extend()
            conn = healthy.first_primary.client()
            conn.script_flush()  # the NOSCRIPT path with its trailing WAIT
            conn.close()
            lease2: Any = await lock.acquire(wait=BOUND_S)
            await lease2.release()
            healthy.replicas[0].pause()
            started = time.monotonic()
            with pytest.raises(fencelock.Unavailable, match="replica"):
                await lock.acquire(wait=0.5)
            assert time.monotonic() - started < BOUND_S
        finally:
            await lock.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert not _lock_key_on(healthy, key)


def test_a_semaphore_an_rwlock_and_a_fair_lock_of_a_replicas_client_wait_for_the_replica_too(
    healthy: ReplicaSet, key: str
) -> None:
    with fencelock.Client(healthy.first_primary.url, ttl=10, replicas=1) as client:
        sem = client.semaphore(f"{key}:sem", limit=2)
        rw = client.rwlock(f"{key}:rw")
        fair = client.lock(f"{key}:fair", fair=True)
        sem.acquire(wait=BOUND_S).release()
        rw.acquire_write(wait=BOUND_S).release()
        fair.acquire(wait=BOUND_S).release()
        healthy.replicas[0].pause()
        with pytest.raises(fencelock.Unavailable, match="replica"):
            sem.acquire(wait=0)
        with pytest.raises(fencelock.Unavailable, match="replica"):
            rw.acquire_write(wait=0)
        with pytest.raises(fencelock.Unavailable, match="replica"):
            fair.acquire(wait=0)


def _waits(topology: ReplicaSet) -> int:
    """How many WAIT commands the primary has run."""
    conn = topology.first_primary.client()
    try:
        return int(conn.info("commandstats").get("cmdstat_wait", {}).get("calls", 0))
    finally:
        conn.close()


def _leader_on_replica(topology: ReplicaSet, key: str) -> object:
    replica = topology.replicas[0].client()
    try:
        raw = replica.get(lock_keys(key).lock)  # the token, byte 255, the holder info
    finally:
        replica.close()
    info = None if raw is None else split_lock_value(raw)[1]
    return None if info is None else json.loads(info).get("leader")


def test_an_election_names_its_leader_on_the_replicas_before_the_campaign_returns(
    healthy: ReplicaSet, key: str
) -> None:
    """With replicas=1 the announcement (the leader's name beside the term) is followed by
    WAIT as the grant is: a failover keeps the name with the term."""
    election = fencelock.Client(healthy.first_primary.url, ttl=10, replicas=1).election(
        key, name="replicated"
    )
    with election.campaign(wait=BOUND_S):
        pass  # the scripts are loaded: no NOSCRIPT repeat below (it would WAIT again)
    before = _waits(healthy)
    with election.campaign(wait=BOUND_S):
        assert _waits(healthy) - before == 2  # the grant's WAIT and the announcement's
        assert _leader_on_replica(healthy, key) == "replicated"


def test_an_asyncio_election_names_its_leader_on_the_replicas_too(
    healthy: ReplicaSet, key: str
) -> None:
    async def main() -> None:
        client = aio.Client(healthy.first_primary.url, ttl=10, replicas=1)
        election = client.election(key, name="replicated-aio")
        async with election.campaign(wait=BOUND_S):
            pass  # the scripts are loaded: no NOSCRIPT repeat below (it would WAIT again)
        before = _waits(healthy)
        async with election.campaign(wait=BOUND_S):
            assert _waits(healthy) - before == 2
            assert _leader_on_replica(healthy, key) == "replicated-aio"

    asyncio.run(asyncio.wait_for(main(), 60))


def test_a_release_waits_for_the_replica_and_one_it_lacks_is_not_confirmed(
    healthy: ReplicaSet, key: str
) -> None:
    """With replicas=1 a release is followed by WAIT as a grant is: once release() returned,
    a failover cannot bring the lock back; with the replica paused it is not confirmed."""
    lock = fencelock.Lock(healthy.first_primary.url, key, ttl=10, replicas=1)
    lock.acquire(wait=BOUND_S).release()  # the scripts are loaded: no NOSCRIPT repeat below
    lease = lock.acquire(wait=BOUND_S)
    before = _waits(healthy)
    lease.release()
    assert _waits(healthy) - before == 1
    replica = healthy.replicas[0].client()
    try:
        assert replica.exists(f"fencelock:{{{key}}}") == 0  # WAIT returned: already gone there
    finally:
        replica.close()
    lease = lock.acquire(wait=BOUND_S)
    healthy.replicas[0].pause()
    with pytest.raises(fencelock.Unavailable, match="release not confirmed"):
        lease.release()
    assert not _lock_key_on(healthy, key)  # deleted on the primary all the same


def test_an_asyncio_release_the_replica_lacks_is_not_confirmed(
    healthy: ReplicaSet, key: str
) -> None:
    async def main() -> None:
        lock = aio.Lock(healthy.first_primary.url, key, ttl=10, replicas=1)
        try:
            lease = await lock.acquire(wait=BOUND_S)
            healthy.replicas[0].pause()
            with pytest.raises(fencelock.Unavailable, match="release not confirmed"):
                await lease.release()
        finally:
            await lock.aclose()

    asyncio.run(asyncio.wait_for(main(), 60))
    assert not _lock_key_on(healthy, key)
