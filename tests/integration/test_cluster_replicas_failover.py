"""Issue 21 item 21: ``replicas=1`` on the documented 3 + 3 Cluster lost the lease at the very
failover it is for. The promoted replica has no replica of its own, so every extend's
``WAIT 1`` answered 0: the lease was reported lost although its key was there.

Now an extend or a release of a lease already granted also counts when every replica the
server has acknowledged it (``ROLE`` follows the ``WAIT``): none, on the promoted node. A new
grant still needs ``replicas`` acknowledgements, so the shard refuses new acquires until a
replica is back (the documented cost). Both front ends, a real 3 + 3 cluster, the slot's
primary SIGKILLed and its replica promoted while the lease is held and renewed."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator

import pytest

import fencelock.asyncio as aio
from fencelock import Lock, Unavailable
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.testing import Cluster, ClusterNode

TTL = 10.0  # renewed every 3.3 s: room for the kill and the promotion (a few seconds)
BOUND_S = 30.0  # liveness bound of every wait (s), never a speed assertion


@pytest.fixture
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    with Cluster(binary=fencelock_server_binary) as c:  # 3 primaries + 3 replicas
        yield c


def _value_on(node: ClusterNode, name: str, *, replica: bool = False) -> bytes | None:
    with contextlib.closing(node.client()) as client:
        if replica:
            client.execute_command("READONLY")
        value = client.get(lock_keys(name).lock)  # the token, byte 255, the holder info
    return lock_token(value) if isinstance(value, bytes) else None


def _fail_over(cluster: Cluster, name: str, token: str) -> tuple[ClusterNode, ClusterNode]:
    """Once the replica has the grant: SIGKILL the slot's primary, promote its replica.
    Returns (the dead primary, the promoted replica)."""
    primary = cluster.owner(key_slot(lock_keys(name).lock))
    (replica,) = cluster.replicas_of(primary)
    deadline = time.monotonic() + BOUND_S
    while _value_on(replica, name, replica=True) != token.encode():
        assert time.monotonic() < deadline, "the grant never reached the replica"
        time.sleep(0.01)
    primary.kill()
    cluster.promote(replica)
    return primary, replica


def _rejoin(cluster: Cluster, old: ClusterNode) -> None:
    """The dead primary comes back (its nodes.conf kept) as a replica of the promoted node."""
    old.restart()
    cluster.wait_ok(BOUND_S, replicas=1)


def test_a_lease_with_replicas_1_survives_the_failover_sync(cluster: Cluster, key: str) -> None:
    lock = Lock(cluster.url, key, ttl=TTL, replicas=1)
    with lock.hold(wait=5) as lease:
        old, promoted = _fail_over(cluster, key, lease.token)
        # past a whole ttl on the promoted node, which has no replica: renewed all along
        time.sleep(TTL + 1.0)
        assert not lease.lost.is_set(), lease.lost_reason
        assert lease.valid
        assert _value_on(promoted, key) == lease.token.encode()
        assert Lock(cluster.url, key, ttl=TTL).try_acquire() is None  # still ours
    assert _value_on(promoted, key) is None  # released (and no error from the release)
    # a new grant still needs a replica's acknowledgement: refused until one is back
    with pytest.raises(Unavailable, match="NotReplicated"):
        lock.acquire(wait=0)
    _rejoin(cluster, old)
    again = lock.acquire(wait=BOUND_S)
    assert again.fence > lease.fence
    again.release()


def test_a_lease_with_replicas_1_survives_the_failover_asyncio(cluster: Cluster, key: str) -> None:
    async def main() -> None:
        lock = aio.Lock(cluster.url, key, ttl=TTL, replicas=1)
        async with lock.hold(wait=5) as lease:
            await asyncio.to_thread(_fail_over, cluster, key, lease.token)
            await asyncio.sleep(TTL + 1.0)  # a loss would cancel this body
            assert not lease.lost.is_set() and lease.valid
            assert await aio.Lock(cluster.url, key, ttl=TTL).try_acquire() is None
        with pytest.raises(Unavailable, match="NotReplicated"):
            await lock.acquire(wait=0)

    asyncio.run(asyncio.wait_for(main(), BOUND_S * 2))
