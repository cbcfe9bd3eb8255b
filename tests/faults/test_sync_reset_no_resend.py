"""Issue 21 item 16: a request whose connection breaks after the server ran it is never sent
again (DESIGN v0.3): its outcome is unknown ("maybe applied"), cleaned up by token.

The fault: a proxy in front of the server forwards the request and drops the reply; once the
server has run the script (seen on the server itself), the proxy resets the connection. The
blocking driver used to send the call once more on a new connection: a release then ran twice
and reported LockLost ("not ours") for a lock it had released; an acquire ran twice, got its
own grant refused and left the key behind for the whole TTL. Both front ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import fencelock
from fencelock import LockLost, NotAcquired, Unavailable
from fencelock._core.keys import lock_keys
from fencelock._engine.cluster import key_slot
from fencelock.testing import Cluster, Server
from fencelock.testing.proxy import Proxy

aio = pytest.importorskip("fencelock.asyncio")

TTL = 60.0  # a ghost key would outlive the test by far
TIMEOUT = 5.0  # the server timeout: the reset, not a timeout, ends the call
BOUND = 10.0  # every wait of the test


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def in_thread(work: Callable[[], Any]) -> tuple[threading.Thread, list[Any]]:
    """Run ``work`` in a thread; the list gets its result or its exception."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(work())
        except BaseException as exc:
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def reset_after_run(proxy: Proxy, ran: Callable[[], bool], work: Callable[[], Any]) -> Any:
    """Run ``work`` with the replies dropped; once ``ran()`` (the server ran the call), reset
    the connection and let later connections through. Returns what ``work`` returned/raised."""
    proxy.drop_replies()
    thread, out = in_thread(work)
    try:
        wait_until(ran, "the server never ran the call")
    finally:
        proxy.heal(reset=True)
    thread.join(BOUND)
    assert not thread.is_alive() and len(out) == 1
    return out[0]


def sync_front(url: str) -> Any:
    return fencelock.Client([url], ttl=TTL, server_timeout=TIMEOUT)


class AsyncFront:
    """The asyncio client, driven from a thread of its own through one loop."""

    def __init__(self, url: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.client = aio.Client([url], ttl=TTL, server_timeout=TIMEOUT)

    def run(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(BOUND)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(BOUND)
        self.loop.close()


@pytest.fixture
def proxied(fencelock_server: Server) -> Any:
    proxy = Proxy(
        fencelock_server.host,
        fencelock_server.port,
        name="reset",
        password=fencelock_server.password,
    ).start()
    try:
        yield fencelock_server, proxy
    finally:
        proxy.stop()


def test_a_release_reset_after_it_ran_is_not_sent_again_sync(proxied: Any) -> None:
    server, proxy = proxied
    client = sync_front(proxy.url)
    try:
        client.lock("i16-warm").acquire(wait=0).release()  # the connection is established
        lease = client.lock("i16-rel").acquire(wait=0)
        key = lock_keys("i16-rel").lock
        outcome = reset_after_run(proxy, lambda: not server.client().exists(key), lease.release)
        # sent again, the release would have found the key gone: "not ours" (LockLost)
        assert not isinstance(outcome, LockLost), outcome
        assert isinstance(outcome, Unavailable), outcome  # the outcome is unknown
        assert not server.client().exists(key)
    finally:
        client.close()


def test_an_acquire_reset_after_it_ran_is_not_sent_again_sync(proxied: Any) -> None:
    server, proxy = proxied
    client = sync_front(proxy.url)
    try:
        client.lock("i16-warm").acquire(wait=0).release()
        key = lock_keys("i16-acq").lock
        lock = client.lock("i16-acq")
        outcome = reset_after_run(
            proxy, lambda: bool(server.client().exists(key)), lambda: lock.acquire(wait=0)
        )
        # sent again, the acquire would have met its own grant: refused (NotAcquired), the key
        # left held by nobody for the TTL
        assert not isinstance(outcome, NotAcquired), outcome
        assert isinstance(outcome, Unavailable), outcome
        # the grant that maybe landed is cleaned up by token
        wait_until(lambda: not server.client().exists(key), "the maybe-granted key stayed")
    finally:
        client.close()


def test_a_release_reset_after_it_ran_is_not_sent_again_async(proxied: Any) -> None:
    server, proxy = proxied
    front = AsyncFront(proxy.url)
    try:

        async def warm_and_take() -> Any:
            await (await front.client.lock("i16-warm").acquire(wait=0)).release()
            return await front.client.lock("i16-arel").acquire(wait=0)

        lease = front.run(warm_and_take())
        key = lock_keys("i16-arel").lock
        outcome = reset_after_run(
            proxy, lambda: not server.client().exists(key), lambda: front.run(lease.release())
        )
        assert not isinstance(outcome, LockLost), outcome
        assert isinstance(outcome, Unavailable), outcome
    finally:
        front.close()


def test_an_acquire_reset_after_it_ran_is_not_sent_again_async(proxied: Any) -> None:
    server, proxy = proxied
    front = AsyncFront(proxy.url)
    try:

        async def warm() -> None:
            await (await front.client.lock("i16-warm").acquire(wait=0)).release()

        front.run(warm())
        key = lock_keys("i16-aacq").lock
        lock = front.client.lock("i16-aacq")
        outcome = reset_after_run(
            proxy,
            lambda: bool(server.client().exists(key)),
            lambda: front.run(lock.acquire(wait=0)),
        )
        assert not isinstance(outcome, NotAcquired), outcome
        assert isinstance(outcome, Unavailable), outcome
        wait_until(lambda: not server.client().exists(key), "the maybe-granted key stayed")
    finally:
        front.close()


@pytest.fixture
def proxied_cluster(fencelock_server_binary: str) -> Any:
    """A cluster whose node owning the slot of ``i16-c*`` is reached through a proxy: it
    announces the proxy's port (CLUSTER SLOTS, MOVED), so every call to it goes through."""
    with Cluster(primaries=3, replicas_per_primary=0, binary=fencelock_server_binary) as cluster:
        slot = key_slot(lock_keys("i16-c").lock)
        owner = cluster.owner(slot)
        proxy = Proxy(owner.host, owner.port, name="reset-node", password=owner.password).start()
        try:
            owner.client().config_set("cluster-announce-port", proxy.port)

            def announced() -> bool:
                for node in cluster.nodes:
                    for entry in node.client().execute_command("CLUSTER", "SLOTS"):
                        covers = int(entry[0]) <= slot <= int(entry[1])
                        if covers and int(entry[2][1]) != proxy.port:
                            return False
                return True

            wait_until(announced, "the nodes never announced the proxy's port")
            yield cluster, owner, proxy
        finally:
            proxy.stop()


def test_a_cluster_release_reset_after_it_ran_is_sent_to_no_other_node_sync(
    proxied_cluster: Any,
) -> None:
    cluster, owner, proxy = proxied_cluster
    client = fencelock.Client([cluster.url], ttl=TTL, server_timeout=TIMEOUT)
    try:
        lease = client.lock("i16-c").acquire(wait=0)  # the slot map is learned meanwhile
        lease.release()
        lease = client.lock("i16-c").acquire(wait=0)
        assert proxy.stats.connections >= 1  # the node is reached through the proxy
        key = lock_keys("i16-c").lock
        outcome = reset_after_run(proxy, lambda: not owner.client().exists(key), lease.release)
        # sent to another node, a MOVED would bring it back to the node that ran it: LockLost
        assert not isinstance(outcome, LockLost), outcome
        assert isinstance(outcome, Unavailable), outcome
    finally:
        client.close()


def test_a_cluster_release_reset_after_it_ran_is_sent_to_no_other_node_async(
    proxied_cluster: Any,
) -> None:
    cluster, owner, proxy = proxied_cluster
    front = AsyncFront(cluster.url)
    try:

        async def take() -> Any:
            await (await front.client.lock("i16-c").acquire(wait=0)).release()
            return await front.client.lock("i16-c").acquire(wait=0)

        lease = front.run(take())
        assert proxy.stats.connections >= 1
        key = lock_keys("i16-c").lock
        outcome = reset_after_run(
            proxy, lambda: not owner.client().exists(key), lambda: front.run(lease.release())
        )
        assert not isinstance(outcome, LockLost), outcome
        assert isinstance(outcome, Unavailable), outcome
    finally:
        front.close()
