"""Issue 21 item 8: the first call after a server hangs does not wait for it.

Five servers with their connections open and idle; one is SIGSTOPped; the lock is held by
someone else everywhere. The first ``try_acquire()`` is decided by the "held" answers of
the others at once: it returns None without waiting for the hung server (its call, and the
release of a grant that may land there, are left to the background). It used to take two
server timeouts: a wait for the straggler, then a release round that waited for it again.
The key held by the other holder is untouched, and a grant of ours that lands on the hung
server once it wakes is released there.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fencelock
from fencelock._core.keys import lock_keys
from fencelock.testing import ServerGroup
from fencelock.testing.pytest_plugin import ServerGroupFactory

aio = pytest.importorskip("fencelock.asyncio")

TIMEOUT = 1.0  # the server timeout
DECIDED_S = 0.5 * TIMEOUT  # a decided round returns well within one server timeout
BOUND = 10.0


def wait_until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + BOUND
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


@pytest.fixture
def group(fencelock_servers: ServerGroupFactory) -> Iterator[ServerGroup]:
    servers = fencelock_servers(5)
    yield servers
    if servers[4].is_running:
        servers[4].resume()


def hold_elsewhere(group: ServerGroup, name: str, *, on_hung: bool) -> bytes:
    """The lock held by another holder on every server (on the hung one too, or not)."""
    key = lock_keys(name).lock
    for index, server in enumerate(group):
        if index < 4 or on_hung:
            server.client().set(key, "someone-else", px=60_000)
    return key.encode() if isinstance(key, str) else key


@pytest.mark.parametrize("on_hung", [True, False], ids=["held-there-too", "free-there"])
def test_the_first_try_acquire_after_a_server_hangs_does_not_wait_for_it_sync(
    group: ServerGroup, on_hung: bool
) -> None:
    name = f"i8-sync-{on_hung}"
    lock = fencelock.Lock(group.urls, name, ttl=20.0, server_timeout=TIMEOUT)
    key = lock_keys(name).lock
    try:
        lock.acquire(wait=0).release()  # connections open and idle, scripts loaded
        hold_elsewhere(group, name, on_hung=on_hung)
        group[4].pause()
        started = time.monotonic()
        got = lock.try_acquire()
        took = time.monotonic() - started
        group[4].resume()
        assert got is None
        assert took < DECIDED_S, f"the decided round waited {took:.3f} s"
        for server in group:  # the other holder's key is untouched
            assert server.client().get(key) in (b"someone-else", None)
        # where the key was free, our grant lands when the server wakes: released there
        hung = group[4].client()
        wait_until(lambda: not _ours(hung.get(key)), "our grant was left on the hung server")
    finally:
        lock.close()


def _ours(value: bytes | None) -> bool:
    return value is not None and value != b"someone-else"


@pytest.mark.parametrize("on_hung", [True, False], ids=["held-there-too", "free-there"])
def test_the_first_try_acquire_after_a_server_hangs_does_not_wait_for_it_async(
    group: ServerGroup, on_hung: bool
) -> None:
    name = f"i8-async-{on_hung}"
    key = lock_keys(name).lock

    async def scenario() -> tuple[Any, float]:
        lock = aio.Lock(group.urls, name, ttl=20.0, server_timeout=TIMEOUT)
        await (await lock.acquire(wait=0)).release()
        hold_elsewhere(group, name, on_hung=on_hung)
        group[4].pause()
        started = time.monotonic()
        try:
            got = await lock.try_acquire()
        finally:
            took = time.monotonic() - started
            group[4].resume()
        await asyncio.sleep(0.5)  # the background's late calls run on this loop's thread too
        return got, took

    got, took = asyncio.run(scenario())
    assert got is None
    assert took < DECIDED_S, f"the decided round waited {took:.3f} s"
    hung = group[4].client()
    wait_until(lambda: not _ours(hung.get(key)), "our grant was left on the hung server")
