"""Review of the one-round-trip hand-over: interleavings found to break it, on real servers."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import pytest
import redis
from test_handover import _register_waiter

import fencelock.asyncio as fasync
from fencelock import Lock, NotAcquired, admin
from fencelock._async.driver import AsyncDriver
from fencelock._core.effects import Pause
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock._engine.address import from_url
from fencelock._engine.server import Server as EngineServer
from fencelock.testing import Server
from fencelock.testing.proxy import Proxy

TTL = 10.0
LIVENESS = 3.0


@pytest.mark.parametrize("how", ["force_release", "release"])
def test_an_admin_release_of_a_pending_grant_voids_its_wake_element(
    fencelock_server: Server, how: str
) -> None:
    """A grant still waiting in the wake list is the lock's holder: an admin release (or
    force_release) of it must void the element too, or a waiter that blocks afterwards
    claims a grant whose lock key another caller took meanwhile: two holders."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = f"admin-pending-{how}"
    keys = lock_keys(name)
    window = 2.0  # a long hand-off window, so that the steps below fit in it
    a = Lock(url, name, ttl=TTL, handoff_window=window).acquire()
    _register_waiter(client, name, "gone", patience_ms=100)  # registered for ~200 ms
    a.release()
    pending = client.get(keys.lock)
    assert pending is not None and pending.startswith(b"h")  # handed over, unclaimed
    time.sleep(0.3)  # the registration expired; the grant's element is still in the wake list
    assert client.exists(keys.wake)
    if how == "force_release":
        assert admin.force_release(url, name).servers[0].outcome == "deleted"
    else:
        assert admin.release(url, name, pending.decode()).servers[0].outcome == "released"
    newcomer = Lock(url, name, ttl=TTL).acquire(wait=0)
    assert lock_token(client.get(keys.lock)) == newcomer.token.encode()
    late = Lock(url, name, ttl=TTL, handoff_window=window)
    try:
        second = late.acquire(wait=0.3)
    except NotAcquired:
        second = None
    assert second is None, (
        f"two holders: {newcomer.token[:8]} (fence {newcomer.fence}) and "
        f"{second.token[:8]} (fence {second.fence}); the lock key holds {client.get(keys.lock)!r}"
    )
    newcomer.release()


def test_a_claimed_lease_never_outlives_its_key_when_the_windows_differ(
    fencelock_server: Server,
) -> None:
    """The grant waits in the wake list for the RELEASER's hand-off window: a claimer with a
    shorter window of its own must not count its lease as if the grant were younger than it
    can be (a local deadline after the key's real expiry: two holders)."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = "windows-differ"
    keys = lock_keys(name)
    a = Lock(url, name, ttl=TTL, handoff_window=2.0).acquire()
    _register_waiter(client, name, "slow", patience_ms=60_000)
    a.release()
    assert client.get(keys.lock).startswith(b"h")  # handed over, waiting for a claimer
    time.sleep(1.0)  # the grant ages in the wake list (its window is 2 s)
    lease = Lock(url, name, ttl=TTL).acquire(wait=LIVENESS)  # default window: 50 ms
    remaining = lease.remaining()
    key_left = client.pttl(keys.lock) / 1000.0
    assert lease.token.startswith("h")  # it claimed the aged grant
    assert remaining <= key_left, (
        f"the lease counts {remaining:.3f} s left, its key expires in {key_left:.3f} s"
    )
    lease.release()


def _keys_without_ttl(client: redis.Redis, name: str) -> list[bytes]:
    keys = lock_keys(name)
    found = client.keys(keys.lock.replace("{", "\\{").replace("}", "\\}") + "*")
    return sorted(key for key in found if client.pttl(key) == -1 and key != keys.fence.encode())


def test_a_claim_whose_holder_vanished_leaves_no_key_without_ttl(fencelock_server: Server) -> None:
    """A claimer that never releases (killed) lets its lease expire; once the next holder is
    done, the lock's keys are gone again, as with any other holder (the fence register
    excepted): no claimed list left forever."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = "claimer-vanished"
    a = Lock(url, name, ttl=0.5).acquire()
    _register_waiter(client, name, "x", patience_ms=60_000)
    client.delete(lock_keys(name).waiters)  # (only the claimer below waits)
    got: dict[str, Any] = {}

    def wait() -> None:
        got["lease"] = Lock(url, name, ttl=0.5).acquire(wait=LIVENESS)

    thread = threading.Thread(target=wait)
    thread.start()
    end = time.monotonic() + LIVENESS
    while int(client.info("clients")["blocked_clients"]) < 1:
        assert time.monotonic() < end
        time.sleep(0.005)
    a.release()
    thread.join(LIVENESS)
    claimed = got["lease"]
    assert claimed.token.startswith("h")
    time.sleep(1.6)  # its holder is gone: the lease (and its waiter registration) expired
    nxt = Lock(url, name, ttl=0.5).acquire(wait=LIVENESS)
    nxt.release()
    assert _keys_without_ttl(client, name) == []


def test_a_claim_cancelled_twice_leaks_no_grant(fencelock_server: Server) -> None:
    """A second cancellation while the driver ends an interrupted claim (CLIENT UNBLOCK, then
    the blocked connection's answer) must not drop the element it hears: the grant would be
    held by nobody for the whole ttl (asyncio.wait_for or a TaskGroup cancelling a waiter
    whose own caller is cancelled too)."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = "cancel-twice"

    async def sweep() -> list[int]:
        leaked = []
        for j in range(0, 12):
            holder = await fasync.Lock(url, name, ttl=TTL).acquire()
            waiter = asyncio.ensure_future(fasync.Lock(url, name, ttl=TTL).acquire(wait=5))
            end = time.monotonic() + LIVENESS
            while int(client.info("clients")["blocked_clients"]) < 1:
                assert time.monotonic() < end
                await asyncio.sleep(0.005)
            await holder.release()  # handed over: the server moved the element for the waiter
            waiter.cancel()
            for _ in range(j):
                await asyncio.sleep(0)
            waiter.cancel()
            await asyncio.wait({waiter}, timeout=LIVENESS)
            assert waiter.done()
            if not waiter.cancelled() and waiter.exception() is None:
                await waiter.result().release()
            try:
                nxt = await fasync.Lock(url, name, ttl=TTL).acquire(wait=1.0)
            except NotAcquired:
                leaked.append(j)
                client.delete(*lock_keys(name).script_keys)
                continue
            await nxt.release()
        return leaked

    assert asyncio.run(sweep()) == []


@pytest.mark.parametrize("claim", ["claimed", None])
def test_a_pause_on_a_server_gone_since_its_round_sleeps(claim: str | None) -> None:
    """The server that answered "held" is gone when the waiter blocks on it (restarted,
    crashed): the asyncio pause sleeps out its delay as the sync one does and as a plain
    (BLPOP) pause does; the claim's CLIENT ID must not raise the connection error out of
    acquire()."""
    with socket.socket() as probe:  # a loopback port with nobody listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # its own Server, not the registry's: an earlier test may have used this port for a server it
    # stopped since, and the registry's Server for it would still be suspect (seen in CI)
    server = EngineServer(from_url(f"redis://127.0.0.1:{port}"))
    pause = Pause(0.2, (0, "wake"), claim)
    nothing = None if claim else False
    start = time.monotonic()

    async def run() -> object:
        return await AsyncDriver((server,), timeout_s=0.5)._pause(pause)

    assert not server.health.suspect
    assert asyncio.run(run()) is nothing
    assert time.monotonic() - start < LIVENESS


def test_a_waiter_refused_by_a_grant_awaiting_its_claim_comes_back_after_the_window(
    fencelock_server: Server,
) -> None:
    """A waiter refused while a handed-over grant waits for its claimer (here a dead one) is
    told the window left, not the grant's whole lease: with a round trip longer than what is
    left of the window, its BLMOVE arrives after the element expired, and it must not then
    sleep the lease out while the void grant leaves the lock free."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = "refused-by-pending"
    proxy = Proxy(
        fencelock_server.host, fencelock_server.port, password=fencelock_server.password
    ).start()
    try:
        far = Lock(proxy.url, name, ttl=TTL)
        holder = Lock(url, name, ttl=TTL).acquire()
        _register_waiter(client, name, "dead", patience_ms=60_000)
        far.try_acquire()  # its connection is up (refused: held)
        proxy.latency(30)  # 60 ms round trips against a 50 ms hand-off window
        holder.release()  # handed over to the dead waiter
        start = time.monotonic()
        lease = far.acquire(wait=LIVENESS)
        elapsed = time.monotonic() - start
        lease.release()
    finally:
        proxy.stop()
    assert elapsed < 1.0, f"waited {elapsed:.2f} s for a lock that was free after 50 ms"


def test_at_least_counts_from_the_claim_not_from_the_start_of_the_wait(
    fencelock_server: Server,
) -> None:
    """``hold(at_least=s)`` keeps the lock ``s`` after the acquisition, so a short job does not
    run again within ``s``: a waiter that blocked for a second before it claimed a hand-over
    must still hold the lock ``s`` after it got it (its ``acquired_at`` is not the start of
    its wait)."""
    url = fencelock_server.url
    client = fencelock_server.client()
    name = "at-least"
    holder = Lock(url, name, ttl=TTL).acquire()
    got: dict[str, Any] = {}

    def job() -> None:
        with Lock(url, name, ttl=TTL).hold(wait=LIVENESS, at_least=1.0) as lease:
            got["at"] = time.monotonic()
            got["token"] = lease.token

    thread = threading.Thread(target=job)
    thread.start()
    end = time.monotonic() + LIVENESS
    while int(client.info("clients")["blocked_clients"]) < 1:
        assert time.monotonic() < end
        time.sleep(0.005)
    time.sleep(1.2)  # the job waits behind the holder for longer than its at_least
    holder.release()
    thread.join(LIVENESS)
    assert got["token"].startswith("h")  # it claimed the hand-over
    time.sleep(max(0.0, got["at"] + 0.3 - time.monotonic()))
    assert Lock(url, name, ttl=TTL).try_acquire() is None, "released before at_least"
    time.sleep(max(0.0, got["at"] + 1.3 - time.monotonic()))
    nxt = Lock(url, name, ttl=TTL).try_acquire()
    assert nxt is not None
    nxt.release()


def test_a_multilock_that_gives_up_releases_a_claimed_key_as_its_holder(
    fencelock_server: Server,
) -> None:
    """A multilock claimed key ``a`` from a hand-over, then was cancelled while it waited for
    ``b``: it releases ``a`` still registered as a waiter there unless it says who it is, so
    the release takes it for a live waiter, wakes nobody and makes newcomers step aside (the
    hand-off marker) from a key that is free."""
    url = fencelock_server.url
    client = fencelock_server.client()
    holder_a = Lock(url, "ma", ttl=TTL).acquire()
    holder_b = Lock(url, "mb", ttl=TTL).acquire()
    keys = lock_keys("ma")

    async def scenario() -> None:
        multi = asyncio.ensure_future(fasync.MultiLock(url, ["ma", "mb"], ttl=TTL).acquire(wait=5))
        end = time.monotonic() + LIVENESS
        while int(client.info("clients")["blocked_clients"]) < 1:
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        holder_a.release()  # handed over to the multilock, which then waits for "mb"
        while not client.get(keys.lock) or int(client.info("clients")["blocked_clients"]) < 1:
            assert time.monotonic() < end
            await asyncio.sleep(0.005)
        await asyncio.sleep(0.05)
        multi.cancel()
        await asyncio.wait({multi}, timeout=LIVENESS)
        assert multi.cancelled()

    asyncio.run(scenario())
    # neither held nor the hand-off marker (the lock key's empty value), which would tell
    # newcomers to step aside from a free key
    assert not client.exists(keys.lock), client.get(keys.lock)
    assert not client.zcard(keys.waiters), "the multilock is still registered as a waiter"
    holder_b.release()
