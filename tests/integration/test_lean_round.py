"""The blocking driver's lean round (standalone servers with a connection that answered
recently) against real servers: whatever it cannot settle itself (NOSCRIPT, a connection the
server closed, a paused minority, the deadline) goes on as the general round would.

Each test checks that the lean round was the one that met the trouble (``Driver._widen`` is
how it hands over), so the behaviour cannot be the general path's by accident.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import redis

import fencelock
from fencelock._core.effects import NOW, Broadcast, Flow
from fencelock._core.quorum import Outcome, Tally
from fencelock._core.replies import classify_release
from fencelock._sync import driver as sync_driver
from fencelock._sync.background import Background
from fencelock.testing import Server
from fencelock.testing.pytest_plugin import ServerGroupFactory


@pytest.fixture
def widened(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the lean rounds handed over to the general path (one entry per hand-over:
    the number of calls still open). Every idle connection counts as recent meanwhile, so a
    slow box does not send the round down the general path before it starts."""
    monkeypatch.setattr(sync_driver, "STALE_CHECK_AFTER_S", 3600.0)
    seen: list[int] = []
    original = sync_driver.Driver._widen

    def spy(self: sync_driver.Driver, effect: Broadcast, deadline: float, open_: Any) -> Any:
        seen.append(len(open_))
        return original(self, effect, deadline, open_)

    monkeypatch.setattr(sync_driver.Driver, "_widen", spy)
    yield seen


#: A script that keeps its server busy for a few ms (ARGV[1] loops; TIME is frozen in a script).
BUSY = "local x = 0 for i = 1, tonumber(ARGV[1]) do x = x + i end return 0"


def warm(lock: fencelock.Lock, cycles: int = 5) -> None:
    for _ in range(cycles):
        lock.acquire(wait=0).release()


def test_a_lean_round_runs_a_flushed_script_in_full(
    fencelock_server: Server, key: str, widened: list[int]
) -> None:
    lock = fencelock.Lock(fencelock_server.url, key, ttl=5.0)
    admin = redis.Redis.from_url(fencelock_server.url)
    try:
        warm(lock)
        admin.script_flush()
        lease = lock.acquire(wait=0)  # EVALSHA -> NOSCRIPT -> EVAL on the same connection
        lease.release()
        assert widened, "the NOSCRIPT was not met by a lean round"
        assert admin.exists(key) == 0
        warm(lock)  # the script is cached again
    finally:
        lock.close()
        admin.close()


def test_a_lean_round_does_not_resend_on_a_dead_reused_connection(
    fencelock_server: Server, key: str, widened: list[int]
) -> None:
    # every idle connection counts as recent (see ``widened``): the lean round takes the one
    # the restart killed. Its request was written before the connection was found dead, so
    # the server may have run it (which a reset after the run looks like too): it is never
    # sent again (DESIGN v0.3, issue 21 item 16); the vote is a failure (the outcome
    # unknown, cleaned up by token), and a later call goes on a new connection
    lock = fencelock.Lock(fencelock_server.url, key, ttl=5.0, server_timeout=0.3)
    try:
        warm(lock)
        fencelock_server.restart()
        started = time.monotonic()
        with pytest.raises(fencelock.Unavailable):
            lock.acquire(wait=0)
        assert time.monotonic() - started < 0.5
        assert widened, "the dead connection was not met by a lean round"
        lease = lock.acquire(wait=5.0)  # once the server is no longer suspect
        lease.release()
        warm(lock)
    finally:
        lock.close()


def test_a_lean_round_decides_without_a_paused_minority_and_marks_it_suspect(
    fencelock_servers: ServerGroupFactory, key: str, widened: list[int]
) -> None:
    group = fencelock_servers(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        lock = fencelock.Lock(group.urls, key, ttl=5.0, server_timeout=0.3)
    try:
        warm(lock)
        group[3].pause()
        group[4].pause()
        try:
            started = time.monotonic()
            lease = lock.acquire(wait=0)
            took_s = time.monotonic() - started
            lease.release()  # waits for the paused two to its deadline: TimeoutError votes
            suspects = [server.health.suspect for server in lock._definition.servers]
        finally:
            group[3].resume()
            group[4].resume()
    finally:
        lock.close()
    assert took_s < 0.15, f"the acquire waited {took_s:.3f} s for a paused minority"
    assert widened, "the paused minority was not met by a lean round"
    assert suspects == [False, False, False, True, True]


def test_a_decided_rounds_stragglers_are_read_by_the_next_round_not_the_background(
    topologies: Any, key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    urls = topologies.urls(3)
    adopted: list[str] = []
    original = Background.adopt

    def adopt(self: Background, server: Any, *args: Any, **kwargs: Any) -> None:
        adopted.append(str(server))
        original(self, server, *args, **kwargs)

    monkeypatch.setattr(Background, "adopt", adopt)
    monkeypatch.setattr(sync_driver, "STALE_CHECK_AFTER_S", 3600.0)  # a slow box stays lean
    lock = fencelock.Lock(urls, key, ttl=5.0)
    plan = lock._definition.plan
    first = Tally(3)

    def flow() -> Flow[Tally]:
        # round 1 stops at its first answer; the other two answer while the flow goes on
        yield Broadcast(
            plan.wiring.release, (0, 1, 2), plan.release_keys, ("not-ours", 1, 1),
            classify_release, lambda tally: len(tally.votes) >= 1, 5.0, first,
        )  # fmt: skip
        # long enough for the busy servers to answer on a loaded machine (~50 ms when idle),
        # well inside round 1's 5 s: their replies wait in the sockets for the next round
        until = (yield NOW) + 1.5
        while (yield NOW) < until:
            pass
        # round 2 goes to the server that answered (as a fence commit goes to the granting
        # ones): its connection is free, the stragglers' are still busy with round 1
        second = Tally(3)
        yield Broadcast(
            plan.wiring.release, tuple(first.votes), plan.release_keys, ("not-ours", 1, 1),
            classify_release, None, 1.0, second,
        )  # fmt: skip
        return second

    # servers 1 and 2 are kept busy for ~50 ms (3M iterations, ~17 ms on Redis 7, ended before
    # round 1 at times), so round 1 stops on server 0's answer
    busy = [redis.Redis.from_url(url) for url in urls[1:]]
    threads = [threading.Thread(target=client.eval, args=(BUSY, 0, 10_000_000)) for client in busy]
    try:
        warm(lock)
        for client in busy:
            client.ping()  # connected before the clock starts
        adopted.clear()
        for thread in threads:
            thread.start()
        time.sleep(0.01)
        second = lock._driver.run(flow())
    finally:
        for thread in threads:
            thread.join(timeout=5.0)
        for client in busy:
            client.close()
        lock.close()
    assert sorted(second.votes) == [0]
    assert second.votes and all(outcome is Outcome.HELD for outcome, _ in second.votes.values())
    # round 1's tally stays as the round ended (a flow's tally changes only when it settles)
    assert sorted(first.votes) == [0]
    assert adopted == [], f"stragglers handed to the background: {adopted}"
    for server in lock._definition.servers[1:]:  # their connections are free again
        assert server.idle and not any(conn.busy for conn in server.idle)
