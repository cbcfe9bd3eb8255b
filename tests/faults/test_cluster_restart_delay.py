"""Issue 21: ``restart_delay`` did not apply in Cluster mode. A Cluster is one vote of a
Redlock; when the primary of a slot restarts empty (no persistence, back before any failover,
with its slots: it forgot the leases it granted), that vote could help a second majority form.

What it means now: a cluster whose primary was seen restarting (its run id changed at its
address) does not vote until that node's uptime exceeds the ttl, as a restarted standalone
server. (The whole cluster, not only that primary's slots: a vote is per server; a failover,
a replica promoted, is not a restart and mutes nothing.) Both front ends, a real cluster."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock.asyncio as aio
from fencelock import Lock, NotAcquired, Unavailable
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.testing import Cluster, ServerGroup

TTL = 30.0  # the delay lasts the whole test


@pytest.fixture
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    with Cluster(3, 0, binary=fencelock_server_binary) as c:
        yield c


@pytest.fixture
def pair(fencelock_servers: Any) -> ServerGroup:
    group: ServerGroup = fencelock_servers(2)
    return group


def _restart_the_slots_primary_empty(cluster: Cluster, key: str) -> None:
    """kill -9 the primary of the key's slot and start it again on its own nodes.conf, without
    data (no persistence): the same node, the same slots, none of its keys."""
    owner = cluster.owner(key_slot(lock_keys(key).lock))
    owner.kill()
    owner.restart()
    cluster.wait_ok()


def _cluster_vote(error: BaseException, cluster_name: str) -> str:
    votes = {vote.server: vote for vote in getattr(error, "votes", ())}
    vote = votes[cluster_name]
    return f"{vote.outcome}: {vote.cause}"


def test_a_cluster_whose_primary_restarted_empty_does_not_vote_for_a_ttl(
    cluster: Cluster, pair: ServerGroup, key: str
) -> None:
    urls = [cluster.url, *pair.urls]
    lock = Lock(urls, key, ttl=TTL, restart_delay=True)
    lock.acquire(wait=5).release()  # the cluster's nodes are known
    _restart_the_slots_primary_empty(cluster, key)
    lock.acquire(wait=5).release()  # on the two standalone servers; the restart is seen
    pair.servers[1].stop()  # now the cluster's vote is needed for a majority
    with pytest.raises((NotAcquired, Unavailable)) as info:
        lock.acquire(wait=0)
    assert "restart_delay" in _cluster_vote(info.value, lock.servers[0])


def test_a_cluster_whose_primary_restarted_empty_does_not_vote_for_a_ttl_asyncio(
    cluster: Cluster, pair: ServerGroup, key: str
) -> None:
    urls = [cluster.url, *pair.urls]

    async def main() -> None:
        lock = aio.Lock(urls, key, ttl=TTL, restart_delay=True)
        await (await lock.acquire(wait=5)).release()
        await asyncio.to_thread(_restart_the_slots_primary_empty, cluster, key)
        await (await lock.acquire(wait=5)).release()
        await asyncio.to_thread(pair.servers[1].stop)
        with pytest.raises((NotAcquired, Unavailable)) as info:
            await lock.acquire(wait=0)
        assert "restart_delay" in _cluster_vote(info.value, lock.servers[0])

    asyncio.run(main())


def test_without_restart_delay_the_restarted_cluster_votes(
    cluster: Cluster, pair: ServerGroup, key: str
) -> None:
    """The canary: the same steps with ``restart_delay=False`` are granted."""
    urls = [cluster.url, *pair.urls]
    lock = Lock(urls, key, ttl=TTL, restart_delay=False)
    lock.acquire(wait=5).release()
    _restart_the_slots_primary_empty(cluster, key)
    lock.acquire(wait=5).release()
    pair.servers[1].stop()
    lock.acquire(wait=5).release()


def test_a_failover_and_the_old_primary_rejoining_as_a_replica_mute_nothing(
    fencelock_server_binary: str, pair: ServerGroup, key: str
) -> None:
    """A replica promoted is not a restart (its run id did not change at its address): the
    cluster keeps its vote. The dead primary restarted then comes back as a replica (no slots;
    calls do not go to it, so its new run id is not even seen here): still one vote."""
    with Cluster(3, 1, binary=fencelock_server_binary) as cluster:
        urls = [cluster.url, *pair.urls]
        lock = Lock(urls, key, ttl=TTL, restart_delay=True)
        lock.acquire(wait=5).release()
        primary = cluster.owner(key_slot(lock_keys(key).lock))
        (replica,) = cluster.replicas_of(primary)
        primary.kill()
        cluster.promote(replica)
        pair.servers[1].stop()  # from here the cluster's vote is needed
        lock.acquire(wait=10).release()
        primary.restart()  # its nodes.conf: it rejoins as the promoted node's replica
        cluster.wait_ok(30.0, replicas=1)
        lock.acquire(wait=10).release()
