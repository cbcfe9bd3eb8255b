"""One round trip per hand-off (one server): a release that finds a waiter grants the lock to
it in the same script; the first waiter blocked on the wake list claims it (BLMOVE).

Checked on real servers: the waiter gets a lease it never asked the server for (a handed-over
token, a larger fence), waiters are granted in the order they blocked, a grant nobody claims
(the waiter died or gave up) is void after the hand-off window, an interrupted claim is never
lost (the driver ends the wait with CLIENT UNBLOCK and hears the answer out), and Redlock
still wakes its waiters.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import redis

import fencelock.asyncio as fasync
from fencelock import Lock
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock._engine.address import from_url
from fencelock._engine.registry import server_for_address
from fencelock._engine.resp import command
from fencelock._engine.wire import CLIENT_ID, client_id
from fencelock._scripts import ACQUIRE
from fencelock._sync.connection import Connection
from fencelock._sync.driver import Driver
from fencelock.admin import status
from fencelock.testing import Server

TTL = 10.0  # far longer than any check here: a grant that leaked would show as a long wait
LIVENESS = 3.0  # a bound on a call that must not hang (not a speed assertion)


def _blocked_clients(client: redis.Redis) -> int:
    return int(client.info("clients")["blocked_clients"])


def _wait_blocked(client: redis.Redis, count: int) -> None:
    end = time.monotonic() + LIVENESS
    while _blocked_clients(client) < count:
        assert time.monotonic() < end, f"fewer than {count} waiters blocked"
        time.sleep(0.005)


def test_a_release_hands_the_lock_to_the_blocked_waiter(fencelock_server: Server) -> None:
    url = fencelock_server.url
    client = fencelock_server.client()
    a = Lock(url, "handed", ttl=TTL).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        lease = Lock(url, "handed", ttl=TTL).acquire(wait=LIVENESS)
        got["lease"], got["at"] = lease, time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_blocked(client, 1)
    a.release()
    released_at = time.monotonic()
    thread.join(LIVENESS)
    lease = got["lease"]
    assert lease.token.startswith("h")  # chosen by the release, not by an acquire
    assert lock_token(client.get(lock_keys("handed").lock)) == lease.token.encode()
    assert lease.fence > a.fence
    assert int(client.get(lock_keys("handed").fence)) == lease.fence
    assert 0 < lease.remaining() <= TTL
    assert got["at"] - released_at < LIVENESS
    assert client.pttl(lock_keys("handed").lock) > (TTL - 1.0) * 1000
    lease.release()
    assert not client.exists(lock_keys("handed").lock)
    assert not client.exists(lock_keys("handed").claimed)  # the claim went with the release


def test_waiters_are_granted_in_the_order_they_blocked(fencelock_server: Server) -> None:
    url = fencelock_server.url
    client = fencelock_server.client()
    holder = Lock(url, "fifo", ttl=TTL).acquire()
    order: list[int] = []
    guard = threading.Lock()

    def wait(index: int) -> None:
        lease = Lock(url, "fifo", ttl=TTL).acquire(wait=LIVENESS * 3)
        with guard:
            order.append(index)
        time.sleep(0.01)
        lease.release()

    threads = []
    for index in range(5):
        thread = threading.Thread(target=wait, args=(index,))
        thread.start()
        threads.append(thread)
        _wait_blocked(client, index + 1)  # the next one blocks behind this one
    holder.release()
    for thread in threads:
        thread.join(LIVENESS * 3)
    assert order == [0, 1, 2, 3, 4]


def _register_waiter(
    client: redis.Redis, name: str, waiter: str, patience_ms: int = 60_000
) -> None:
    """A waiter that asks once (refused, so registered until ``patience_ms`` + 100 ms from
    now), then never blocks: it died or gave up."""
    keys = lock_keys(name)
    client.script_load(ACQUIRE.source)
    reply = client.evalsha(
        ACQUIRE.sha,
        ACQUIRE.numkeys,
        keys.lock,
        keys.fence,
        keys.holder,
        keys.waiters,
        keys.handoff,
        keys.wake,
        keys.claimed,
        "f" * 40,
        int(TTL * 1000),
        "",
        "0",
        waiter,
        patience_ms,
    )
    assert reply[0] == 0  # refused: registered as a waiter


def test_a_grant_no_waiter_claims_is_void_after_the_window(fencelock_server: Server) -> None:
    url = fencelock_server.url
    client = fencelock_server.client()
    client.script_load(ACQUIRE.source)
    keys = lock_keys("orphan")
    a = Lock(url, "orphan", ttl=TTL).acquire()
    _register_waiter(client, "orphan", "dead-waiter")
    a.release()
    # the release granted the lock to the waiters; none is blocked to claim it
    orphan = client.get(keys.lock)
    assert orphan is not None and orphan.startswith(b"h")
    handed_fence = int(client.get(keys.fence))
    assert handed_fence > a.fence
    time.sleep(0.15)  # past the hand-off window (50 ms): the wake element expired unclaimed
    assert not client.exists(keys.wake)
    start = time.monotonic()
    lease = Lock(url, "orphan", ttl=TTL).acquire(wait=LIVENESS)
    assert time.monotonic() - start < LIVENESS  # not the orphan's 10 s lease
    assert not lease.token.startswith("h")  # taken over by its own acquire
    assert lock_token(client.get(keys.lock)) == lease.token.encode()
    assert lease.fence > handed_fence  # the void grant's fence is never reused
    lease.release()


def test_a_claimed_grant_is_not_taken_over(fencelock_server: Server) -> None:
    """After its window a claimed grant stays its claimer's: the claimed list says so."""
    url = fencelock_server.url
    client = fencelock_server.client()
    a = Lock(url, "claimed", ttl=TTL).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        got["lease"] = Lock(url, "claimed", ttl=TTL).acquire(wait=LIVENESS)

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_blocked(client, 1)
    a.release()
    thread.join(LIVENESS)
    lease = got["lease"]
    time.sleep(0.2)  # past the hand-off window (50 ms)
    assert Lock(url, "claimed", ttl=TTL).try_acquire() is None
    assert lock_token(client.get(lock_keys("claimed").lock)) == lease.token.encode()
    lease.release()


def test_a_waiter_cancelled_around_the_release_leaks_no_grant(fencelock_server: Server) -> None:
    """Cancel an asyncio waiter at every await point after the holder's release was sent:
    whether it claimed the grant or not, the next caller gets the lock at once (a leaked
    grant would hold it for the whole ttl)."""
    url = fencelock_server.url
    client = fencelock_server.client()

    async def sweep() -> tuple[int, int]:
        cancelled_mid = completed = 0
        for k in range(1, 200):
            holder = await fasync.Lock(url, "cancel", ttl=TTL).acquire()
            waiter = asyncio.ensure_future(fasync.Lock(url, "cancel", ttl=TTL).acquire(wait=5))
            end = time.monotonic() + LIVENESS
            while _blocked_clients(client) < 1:
                assert time.monotonic() < end
                await asyncio.sleep(0.005)
            release = asyncio.ensure_future(holder.release())
            for _ in range(k):
                await asyncio.sleep(0)
            done_before = waiter.done()
            waiter.cancel()
            await asyncio.wait({waiter, release}, timeout=LIVENESS)
            assert waiter.done() and release.done()
            if not waiter.cancelled():
                await waiter.result().release()
                completed += 1
            else:
                cancelled_mid += 1
            start = time.monotonic()
            try:
                nxt = await fasync.Lock(url, "cancel", ttl=TTL).acquire(wait=LIVENESS)
            except Exception as exc:
                raise AssertionError(f"k={k} (done before the cancel: {done_before})") from exc
            assert time.monotonic() - start < LIVENESS, f"k={k}: a grant leaked"
            await nxt.release()
            if done_before:
                break
        return cancelled_mid, completed

    cancelled_mid, completed = asyncio.run(sweep())
    assert cancelled_mid > 0 and completed > 0  # both sides of the race were reached


def test_redlock_still_wakes_its_waiters(fencelock_servers: Any) -> None:
    group = fencelock_servers(3)
    urls = group.urls
    a = Lock(urls, "red", ttl=TTL).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        got["lease"] = Lock(urls, "red", ttl=TTL).acquire(wait=LIVENESS)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.2)
    a.release()
    thread.join(LIVENESS)
    lease = got["lease"]
    assert not lease.token.startswith("h")  # a majority cannot be handed over by one release
    assert lease.fence > a.fence
    lease.release()


def test_ending_a_claiming_wait_hears_what_the_server_moved(fencelock_server: Server) -> None:
    """The sync driver's recovery of an interrupted claim, on a real server: CLIENT UNBLOCK
    from another connection ends the wait, and the blocked connection's answer is read out:
    the element when the server had moved it, nothing (and nothing moved later) when not."""
    client = fencelock_server.client()
    server = server_for_address(from_url(fencelock_server.url))
    driver = Driver((server,), timeout_s=1.0)

    def blocked_on(source: str, target: str) -> Connection:
        conn = Connection(server.address)
        conn.client_id = client_id(conn.call(CLIENT_ID, 1, LIVENESS)[0])
        assert conn.client_id is not None
        conn.start(command("BLMOVE", source, target, "LEFT", "RIGHT", "5"), 1)
        return conn

    client.rpush("src", b"htok 7 10000")
    conn = blocked_on("src", "dst")
    time.sleep(0.2)  # moved and answered; the caller was interrupted before it read
    assert driver._unblocked(server, conn) == b"htok 7 10000"
    conn.close()
    assert client.lrange("dst", 0, -1) == [b"htok 7 10000"]

    conn = blocked_on("empty", "dst2")
    _wait_blocked(client, 1)
    start = time.monotonic()
    assert driver._unblocked(server, conn) is None
    assert time.monotonic() - start < LIVENESS  # not the 5 s block
    conn.close()
    assert _blocked_clients(client) == 0
    client.rpush("empty", b"late")
    assert client.lrange("empty", 0, -1) == [b"late"]  # nobody was still waiting to move it
    assert not client.exists("dst2")


def test_status_says_a_handed_over_lease_has_no_holder_info(fencelock_server: Server) -> None:
    url = fencelock_server.url
    client = fencelock_server.client()
    a = Lock(url, "status", ttl=TTL).acquire()
    got: dict[str, Any] = {}

    def wait() -> None:
        got["lease"] = Lock(url, "status", ttl=TTL).acquire(wait=LIVENESS)

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_blocked(client, 1)
    a.release()
    thread.join(LIVENESS)
    report = status([url], "status")
    (row,) = report["servers"]
    assert row["held"] and row["token_prefix"] == got["lease"].token[:8]
    assert row["holder"] == {"handed_over": True}
    got["lease"].release()
    (row,) = status([url], "status")["servers"]
    assert not row["held"] and row["holder"] is None
