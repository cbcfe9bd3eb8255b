"""Issue 21 item 20: during a cluster reshard, TRYAGAIN (and CLUSTERDOWN) is not an answer.

A slot is half-migrated (``SETSLOT MIGRATING/IMPORTING``, some of the lock's keys moved, the
others not): the source node answers a multi-key script with TRYAGAIN, without running it.
A helper thread finishes the migration a little later. The call must be sent again within
its round's deadline (then MOVED to the new owner), and a release that ran out of time must
be repeated by the background until the slot settles, then follow the MOVED. TRYAGAIN used
to be counted as the node's answer: the release failed, its background repeat gave up after
two TRYAGAIN from the old node, and the lock stayed held by a released token until its TTL.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencelock
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.testing import Cluster, ClusterNode

aio = pytest.importorskip("fencelock.asyncio")

FINISH_AFTER_S = 0.5  # the migration ends this long after the fault begins
BOUND = 15.0


@pytest.fixture
def cluster(fencelock_server_binary: str) -> Iterator[Cluster]:
    with Cluster(primaries=3, replicas_per_primary=0, binary=fencelock_server_binary) as c:
        yield c


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


class Migration:
    """Slot of ``name`` half-migrated to another primary: only ``moved`` of its keys go now;
    :meth:`finish_later` moves the others and ends the migration from a thread."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.slot = key_slot(lock_keys(name).lock)
        self.source = cluster.owner(self.slot)
        self.target: ClusterNode = next(
            n for n in cluster.nodes[: cluster.primaries] if n is not self.source
        )
        self.thread: threading.Thread | None = None
        self.error: list[BaseException] = []

    def begin(self, *moved: str) -> None:
        dst, src = self.target.client(), self.source.client()
        dst.execute_command("CLUSTER", "SETSLOT", self.slot, "IMPORTING", self.source.node_id)
        src.execute_command("CLUSTER", "SETSLOT", self.slot, "MIGRATING", self.target.node_id)
        if moved:
            t = self.target
            auth = () if t.password is None else ("AUTH", t.password)
            src.execute_command("MIGRATE", t.host, t.port, "", 0, 5000, *auth, "KEYS", *moved)

    def finish_later(self, after_s: float = FINISH_AFTER_S) -> None:
        def run() -> None:
            try:
                time.sleep(after_s)
                self.cluster.migrate_keys(self.slot, self.source, self.target)
                self.cluster.finish_move(self.slot, self.target)
            except BaseException as exc:
                self.error.append(exc)

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def join(self) -> None:
        if self.thread is not None:
            self.thread.join(BOUND)
            assert not self.thread.is_alive() and not self.error, self.error

    def exists(self, key: str) -> bool:
        """``key`` on either node (ASKING lets the importing one answer for the slot; a
        node that no longer serves it answers MOVED: not there)."""
        for node in (self.source, self.target):
            with contextlib.closing(node.client()) as client:
                pipe = client.pipeline(transaction=False)
                pipe.execute_command("ASKING")
                pipe.exists(key)
                found = pipe.execute(raise_on_error=False)[1]
                if found == 1:
                    return True
        return False


def test_a_release_mid_migration_is_sent_again_until_the_slot_settles_sync(
    cluster: Cluster,
) -> None:
    name = "i20-rel"
    key = lock_keys(name).lock
    lock = fencelock.Lock(cluster.url, name, ttl=60.0, server_timeout=3.0)
    migration = Migration(cluster, name)
    try:
        lease = lock.acquire(wait=0)
        migration.begin(key)  # the lock key moved, its fence register and holder info not
        migration.finish_later()
        lease.release()  # TRYAGAIN, again..., then MOVED: released on the new owner
        migration.join()
        assert not migration.exists(key)
    finally:
        migration.join()
        lock.close()


def test_a_release_mid_migration_is_sent_again_until_the_slot_settles_async(
    cluster: Cluster,
) -> None:
    name = "i20-arel"
    key = lock_keys(name).lock
    migration = Migration(cluster, name)

    async def scenario() -> None:
        lock = aio.Lock(cluster.url, name, ttl=60.0, server_timeout=3.0)
        lease = await lock.acquire(wait=0)
        migration.begin(key)
        migration.finish_later()
        await lease.release()

    try:
        asyncio.run(scenario())
        migration.join()
        assert not migration.exists(key)
    finally:
        migration.join()


def test_an_acquire_mid_migration_is_sent_again_until_the_slot_settles_sync(
    cluster: Cluster,
) -> None:
    name = "i20-acq-sync"
    key = lock_keys(name).lock
    migration = Migration(cluster, name)
    lock = fencelock.Lock(cluster.url, name, ttl=60.0, server_timeout=3.0)
    try:
        lock.acquire(wait=0).release()  # the fence register exists
        migration.begin()  # nothing moved yet: the fence register is on the source
        migration.finish_later()
        lease = lock.acquire(wait=0)  # TRYAGAIN until the slot settles, not a refusal
        assert migration.exists(key)
        lease.release()
        migration.join()
        assert lease.fence > 0
        assert not migration.exists(key)
    finally:
        migration.join()
        lock.close()


def test_an_acquire_mid_migration_is_sent_again_until_the_slot_settles_async(
    cluster: Cluster,
) -> None:
    name = "i20-acq"
    key = lock_keys(name).lock
    migration = Migration(cluster, name)

    async def scenario() -> Any:
        lock = aio.Lock(cluster.url, name, ttl=60.0, server_timeout=3.0)
        await (await lock.acquire(wait=0)).release()  # the fence register exists
        migration.begin()  # nothing moved yet: the fence register is on the source
        migration.finish_later()
        lease = await lock.acquire(wait=0)
        assert migration.exists(key)
        await lease.release()
        return lease

    try:
        lease = asyncio.run(scenario())
        migration.join()
        assert lease.fence > 0
        assert not migration.exists(key)
    finally:
        migration.join()


def test_a_release_that_ran_out_of_time_mid_migration_is_repeated_until_it_lands(
    cluster: Cluster,
) -> None:
    name = "i20-late"
    key = lock_keys(name).lock
    lock = fencelock.Lock(cluster.url, name, ttl=60.0, server_timeout=0.3)
    migration = Migration(cluster, name)
    try:
        lease = lock.acquire(wait=0)
        migration.begin(key)
        migration.finish_later(1.0)  # after the release round's deadline
        with pytest.raises(fencelock.Unavailable):
            lease.release()  # not confirmed within its deadline: repeated in the background
        migration.join()
        wait_until(lambda: not migration.exists(key), "the released lock stayed held")
    finally:
        migration.join()
        lock.close()
