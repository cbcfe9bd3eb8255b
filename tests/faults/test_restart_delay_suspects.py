"""Issue 21: servers that may not vote yet (``restart_delay``) were counted as healthy by
``skip_suspects``, so a round left out a suspect server it needed and failed.

Three real servers: server 0 restarted empty (this process saw its run_id change, so its
grants do not count for a ttl), server 1 is suspect (a recent timeout; it answers now), server
2 is fine. One attempt must ask server 1 too: its grant and server 2's make the majority.
Both front ends."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fencelock.asyncio as fasync
from fencelock import Lock
from fencelock._core.health import skip_suspects
from fencelock._core.quorum import Tally
from fencelock._engine.registry import resolve
from fencelock.testing import ServerGroup

TTL = 30.0  # the restart delay lasts the whole test


@pytest.fixture
def group(fencelock_servers: Any) -> Iterator[ServerGroup]:
    yield fencelock_servers(3)


def _server_0_restarted_and_seen(group: ServerGroup, lock: Lock, key: str) -> None:
    """Restart server 0 empty after this process knew it, and let a round see the new run_id."""
    lock.acquire(wait=5).release()  # identities known
    group.servers[0].kill()
    group.servers[0].restart(wipe=True)
    # the first round after the kill meets server 0's dead pooled connection: what it wrote
    # there is never re-sent (an unknown outcome), so server 0 turns suspect and its new run_id
    # is seen on the next connection, the background probe's or a later round's
    (server_0,) = resolve(group.urls[0])
    deadline = time.monotonic() + 10.0
    while server_0.identity is None or server_0.identity.restarted_at is None:
        assert time.monotonic() < deadline, "server 0's restart was never seen"
        lock.acquire(wait=5).release()  # on {1, 2} while server 0 may not vote
        time.sleep(0.05)


def _mark_server_1_suspect(group: ServerGroup) -> None:
    """As after a timeout: suspect, not asked while the others can make the majority. The
    server itself answers (a background probe would clear it; none is due for a while)."""
    (server_1,) = resolve(group.urls[1])
    server_1.health.failed(time.monotonic(), "timed out (marked by the test)")
    server_1.health.next_probe_at = time.monotonic() + 60.0
    assert server_1.health.suspect


def test_a_server_in_its_restart_delay_does_not_let_a_round_skip_a_suspect_sync(
    group: ServerGroup, key: str
) -> None:
    lock = Lock(group.urls, key, ttl=TTL, restart_delay=True)
    _server_0_restarted_and_seen(group, lock, key)
    _mark_server_1_suspect(group)
    lease = lock.acquire(wait=0)  # one attempt
    lease.release()


def test_a_server_in_its_restart_delay_does_not_let_a_round_skip_a_suspect_async(
    group: ServerGroup, key: str
) -> None:
    _server_0_restarted_and_seen(group, Lock(group.urls, key, ttl=TTL, restart_delay=True), key)

    async def main() -> None:
        lock = fasync.Lock(group.urls, key, ttl=TTL, restart_delay=True)
        lease = await lock.acquire(wait=5)  # this loop's connections see server 0 anew
        await lease.release()
        _mark_server_1_suspect(group)
        lease = await lock.acquire(wait=0)
        await lease.release()

    asyncio.run(main())


def test_skip_suspects_does_not_count_muted_servers() -> None:
    tally = Tally(3)
    suspect = (False, True, False)
    assert skip_suspects(tally, (0, 1, 2), suspect)
    tally.muted = frozenset({0})
    assert not skip_suspects(tally, (0, 1, 2), suspect)
