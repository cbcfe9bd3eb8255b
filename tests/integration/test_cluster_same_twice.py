"""Issue 21: the same Cluster reached through two seed URLs (two of its nodes) counted as two
servers, two votes of a Redlock. Like the same standalone server under two names, it is a
ConfigError before any lock traffic: a cluster's handshake asks its id (the smallest node id
of ``CLUSTER NODES``, the same through every node). Both front ends, a real local cluster."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import pytest
import redis

import fencelock.asyncio as aio
from fencelock import ConfigError, Lock
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.testing import Cluster, Server


@pytest.fixture(scope="module")
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    with Cluster(3, 0, binary=fencelock_server_binary) as c:
        yield c


@pytest.fixture
def standalone(fencelock_server: Server) -> Server:
    return fencelock_server


def _seed_urls(cluster: Cluster) -> list[str]:
    """Two different nodes of the one cluster, each as a cluster URL."""
    auth = f":{cluster.password}@"
    return [f"redis+cluster://{auth}{node.host}:{node.port}" for node in cluster.nodes[:2]]


def _nothing_written(cluster: Cluster, key: str) -> bool:
    owner = cluster.owner(key_slot(lock_keys(key).lock))
    with contextlib.closing(owner.client()) as client:
        return client.get(lock_keys(key).lock) is None


def test_one_cluster_through_two_seeds_is_refused_before_any_lock_traffic(
    cluster: Cluster, standalone: Server, key: str
) -> None:
    urls = [*_seed_urls(cluster), standalone.url]
    lock = Lock(urls, key, ttl=5.0)
    for _ in range(2):  # refused every time, not only the first
        with pytest.raises(ConfigError, match="same server"):
            lock.acquire(wait=0)
    assert _nothing_written(cluster, key)
    with contextlib.closing(redis.Redis.from_url(standalone.url)) as client:
        assert client.get(lock_keys(key).lock) is None


def test_one_cluster_through_two_seeds_is_refused_asyncio(
    cluster: Cluster, standalone: Server, key: str
) -> None:
    urls = [*_seed_urls(cluster), standalone.url]

    async def main() -> None:
        lock = aio.Lock(urls, key, ttl=5.0)
        with pytest.raises(ConfigError, match="same server"):
            await lock.acquire(wait=0)

    asyncio.run(main())
    assert _nothing_written(cluster, key)


def test_two_different_clusters_are_still_two_servers(
    cluster: Cluster, fencelock_server_binary: str, standalone: Server, key: str
) -> None:
    with Cluster(3, 0, binary=fencelock_server_binary) as other:
        lock = Lock([cluster.url, other.url, standalone.url], key, ttl=5.0)
        lease = lock.acquire(wait=5)
        lease.release()
