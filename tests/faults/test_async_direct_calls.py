"""The asyncio driver's direct calls: on a connection that has already answered, a call is
queued on it and its reply resolves the round from ``data_received`` (no task per call).
These are the faults that path must still survive: a server that stops answering (its round
ends at the server timeout), an empty script cache (NOSCRIPT runs the script in full, for
the caller and for a cancelled caller's release alike), and cancellation at every await.
Each test starts its own servers (they are paused or flushed).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redis

import fencelock.asyncio as fasync
from fencelock import Unavailable
from fencelock._core.holder_json import lock_token
from fencelock._core.keys import lock_keys
from fencelock.testing import Server, ServerGroup

TTL = 10.0
SERVER_TIMEOUT = 0.2
MARGIN = 1.5  # seconds of slack for a loaded machine, far below redis-py's retrying
K_MAX = 200


@pytest.fixture
def server() -> Iterator[Server]:
    with Server() as started:
        yield started


def _held(client: redis.Redis, name: str) -> bool:
    return bool(client.exists(lock_keys(name).lock))


async def _freed_within(client: redis.Redis, name: str, seconds: float) -> bool:
    end = time.monotonic() + seconds
    while _held(client, name):
        if time.monotonic() > end:
            return False
        await asyncio.sleep(0.01)
    return True


def test_a_paused_server_ends_a_warm_one_server_round_at_the_server_timeout(
    server: Server,
) -> None:
    async def scenario() -> float:
        lock = fasync.Lock(server.url, "direct:paused", ttl=TTL, server_timeout=SERVER_TIMEOUT)
        await (await lock.acquire(wait=0)).release()  # the connection is established
        server.pause()
        try:
            started = time.monotonic()
            with pytest.raises(Unavailable, match="TimeoutError"):
                await lock.acquire(wait=0)
            return time.monotonic() - started
        finally:
            server.resume()

    assert asyncio.run(scenario()) < SERVER_TIMEOUT + MARGIN


def test_a_paused_minority_server_does_not_hold_up_warm_rounds_and_comes_back() -> None:
    with ServerGroup(3) as group:

        async def scenario() -> None:
            lock = fasync.Lock(
                group.urls, "direct:minority", ttl=TTL, server_timeout=SERVER_TIMEOUT
            )
            await (await lock.acquire(wait=0)).release()
            group[2].pause()
            try:
                for _ in range(3):
                    started = time.monotonic()
                    lease = await lock.acquire(wait=0)
                    await lease.release()
                    assert time.monotonic() - started < SERVER_TIMEOUT + MARGIN
            finally:
                group[2].resume()
            # the straggler calls were bounded: the paused server answers again afterwards
            await asyncio.sleep(SERVER_TIMEOUT * 2)
            lease = await lock.acquire(wait=5.0)
            await lease.release()
            assert not _held(group[2].client(), "direct:minority")

        asyncio.run(scenario())


def test_a_flushed_script_cache_under_a_warm_lock_still_grants_and_releases(
    server: Server,
) -> None:
    client = server.client()

    async def scenario() -> None:
        lock = fasync.Lock(server.url, "direct:noscript", ttl=TTL, server_timeout=SERVER_TIMEOUT)
        await (await lock.acquire(wait=0)).release()
        client.script_flush()
        lease = await lock.acquire(wait=0)
        assert lock_token(client.get(lock_keys("direct:noscript").lock)) == lease.token.encode()
        client.script_flush()
        await lease.release()
        assert not _held(client, "direct:noscript")

    asyncio.run(scenario())


def test_a_release_cancelled_while_the_script_cache_is_empty_still_frees_the_lock(
    server: Server,
) -> None:
    """The release's EVALSHA answers NOSCRIPT after its caller was cancelled: the release
    (the round and its full-script retry) goes on in the background and lands."""
    client = server.client()
    name = "direct:cancel-noscript"

    async def sweep() -> int:
        lock = fasync.Lock(server.url, name, ttl=TTL, server_timeout=SERVER_TIMEOUT)
        for k in range(1, K_MAX):
            lease = await lock.acquire(wait=0)
            client.script_flush()
            task = asyncio.ensure_future(lease.release())
            for _ in range(k):
                await asyncio.sleep(0)
            completed = task.done()
            task.cancel()
            await asyncio.wait({task}, timeout=5.0)
            assert task.done()
            assert await _freed_within(client, name, SERVER_TIMEOUT + MARGIN), f"k={k}"
            if completed:
                return k - 1  # the cancels before this one met the call mid-flight
        raise AssertionError("release never completed")

    assert asyncio.run(sweep()) >= 1


def test_a_warm_acquire_cancelled_at_every_await_leaves_nothing_locked(server: Server) -> None:
    """Also when the script cache was just emptied: the grant may land by the full script
    after the cancel, and its cleanup must follow it."""
    client = server.client()
    name = "direct:cancel-acquire"

    async def sweep(flush: bool) -> int:
        lock = fasync.Lock(server.url, name, ttl=TTL, server_timeout=SERVER_TIMEOUT)
        await (await lock.acquire(wait=0)).release()
        for k in range(1, K_MAX):
            if flush:
                client.script_flush()
            task = asyncio.ensure_future(lock.acquire(wait=0))
            for _ in range(k):
                await asyncio.sleep(0)
            completed = task.done()
            task.cancel()
            await asyncio.wait({task}, timeout=5.0)
            assert task.done()
            if not task.cancelled():
                await task.result().release()
            assert await _freed_within(client, name, SERVER_TIMEOUT + MARGIN), f"k={k}"
            if completed:
                return k - 1  # the cancels before this one met the call mid-flight
        raise AssertionError("acquire never completed")

    assert asyncio.run(sweep(flush=False)) >= 1
    assert asyncio.run(sweep(flush=True)) >= 1


def test_a_release_cancelled_while_its_server_is_paused_lands_once_it_resumes(
    server: Server,
) -> None:
    client = server.client()
    name = "direct:cancel-paused"

    async def scenario() -> None:
        lock = fasync.Lock(server.url, name, ttl=TTL, server_timeout=SERVER_TIMEOUT)
        lease = await lock.acquire(wait=0)
        server.pause()
        try:
            task = asyncio.ensure_future(lease.release())
            await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.wait({task}, timeout=1.0)
            assert task.cancelled()  # the caller is not held up by the paused server
            await asyncio.sleep(SERVER_TIMEOUT * 2)
        finally:
            server.resume()
        # the cancelled release went on in the background (round, timeout, repeat)
        assert await _freed_within(client, name, 3.0)

    asyncio.run(scenario())


def test_a_late_noscript_from_a_paused_server_still_lands_the_grant_there() -> None:
    """Over 3 servers the round is won by two; the third, paused with an empty script cache,
    answers NOSCRIPT after the round was decided: the grant is still made there in full."""
    name = "direct:late-noscript"
    with ServerGroup(3) as group:
        late = group[2]
        client = late.client()

        async def scenario() -> None:
            lock = fasync.Lock(group.urls, name, ttl=TTL, server_timeout=SERVER_TIMEOUT)
            await (await lock.acquire(wait=0)).release()
            client.script_flush()
            late.pause()
            try:
                lease = await lock.acquire(wait=0)
                await asyncio.sleep(0.05)
            finally:
                late.resume()
            end = time.monotonic() + 2.0
            while lock_token(client.get(lock_keys(name).lock)) != lease.token.encode():
                assert time.monotonic() < end, "the late grant never landed"
                await asyncio.sleep(0.01)
            await lease.release()
            assert await _freed_within(client, name, SERVER_TIMEOUT + MARGIN)

        asyncio.run(scenario())


def test_calls_in_flight_on_a_shared_connection_closed_under_them_go_again_on_a_fresh_one(
    server: Server,
) -> None:
    """Another round's timeout closes the shared connection that warm calls are queued on
    (buffered behind a request in flight, not written yet): they are sent again on a new
    connection within their round, not failed."""
    from fencelock._async.driver import shared
    from fencelock._engine.resp import command

    async def scenario() -> None:
        lock = fasync.Lock(server.url, "direct:reconnect", ttl=TTL, server_timeout=1.0)
        await (await lock.acquire(wait=0)).release()
        loop = asyncio.get_running_loop()
        (engine,) = lock._definition.servers
        before = shared(engine, loop)
        # a request in flight first (written at once: alone on the connection), so that the
        # acquire's call is buffered behind it for the loop's next turn
        busy = asyncio.ensure_future(before.request(command("PING"), 1))
        task = asyncio.ensure_future(lock.acquire(wait=0))
        await asyncio.sleep(0)  # the acquire's call is queued on the shared connection
        assert before.pending == 2
        before.close()
        with pytest.raises(ConnectionAbortedError):
            await busy  # written: its outcome is unknown, so it is not sent again
        lease = await asyncio.wait_for(task, 5.0)
        assert shared(engine, loop) is not before
        await lease.release()

    asyncio.run(scenario())


def test_a_request_alone_is_written_at_once_and_one_behind_it_at_the_next_turn(
    server: Server,
) -> None:
    """A request with nothing else in flight on its connection goes out in the turn of the
    loop that makes it (closed right after, it failed as written: the server may have read
    it); one made while another is in flight waits for the loop's next turn, so the requests
    of many tasks go out in one write (closed before that turn, it was never written)."""
    from fencelock._async.connection import AsyncConnection, Unsent
    from fencelock._engine.address import from_url
    from fencelock._engine.resp import command

    async def scenario() -> None:
        conn = AsyncConnection(from_url(server.url))
        assert await conn.request(command("PING"), 1) == [b"PONG"]  # connected, identified
        first = asyncio.ensure_future(conn.request(command("PING"), 1))
        second = asyncio.ensure_future(conn.request(command("PING"), 1))
        await asyncio.sleep(0)  # both tasks ran up to their wait for a reply
        assert conn.pending == 2
        conn.close()
        with pytest.raises(ConnectionAbortedError) as written:
            await first
        assert not isinstance(written.value, Unsent)
        with pytest.raises(Unsent):
            await second

    asyncio.run(scenario())
