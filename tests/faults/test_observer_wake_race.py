"""An observer woken by an announcement that ran on one server before it ran on the others.

The announcement goes to every server; an observer blocks on its wake list on one of them and,
woken, reads them all. When its read reaches the servers that hold the new term before the
announcement does there (they are slower, or ran the read first), it sees a term held on a
majority but not yet named: nobody leads, for now. It used to block again on the server that
woke it, whose wake-up it had just taken, and the announcement's own wake-ups landed on the
other servers' lists: it slept through the term until its next poll (seen on CI: an observer
missed a 6 s term). It now blocks on a server where the term is not named yet, and the
announcement landing there wakes it.

Made deterministic here: the campaigner reaches servers 1 and 2 through proxies that delay
each direction by 300 ms, server 0 directly; another token holds server 0, so the announcement
there only wakes the observers, 300 ms before it names the leader on servers 1 and 2. The
observer reads all three directly. Real servers, real proxies, both front ends.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import fencelock
import fencelock.asyncio as flasync
import fencelock.election
from fencelock._core.keys import lock_keys
from fencelock.testing import Server, delayed_proxy
from fencelock.testing.proxy import Proxy

KEY = "observer-wake-race"
DELAY_S = 0.6  # a round trip through a proxy: 300 ms each way
BOUND = 20.0  # liveness bound of every wait (seconds), never a speed assertion
#: observers poll at most this often here (and the observation is shorter): only a wake-up
#: can show them the term
POLL_S = 60.0
OBSERVE_S = 12.0
#: the term is seen within this of the campaign's return: the announcement reaches servers 1
#: and 2 one proxy leg (0.3 s) after server 0; generous for a loaded machine, and well under
#: the poll the old code slept until
SEEN_WITHIN_S = 5.0


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    try:
        for _ in range(3):
            started.append(Server(persistence="none").start())
        yield started
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def proxies(servers: list[Server]) -> Iterator[list[Proxy]]:
    made: list[Proxy] = []
    try:
        for server in servers[1:]:
            made.append(delayed_proxy(server, DELAY_S))
        yield made
    finally:
        for proxy in made:
            proxy.stop()


def _blocked_on(server: Server) -> int:
    with server.client() as direct:
        return sum("b" in c.get("flags", "") for c in direct.client_list())


@pytest.mark.parametrize("front", ["sync", "asyncio"])
def test_an_observer_woken_before_the_term_is_named_elsewhere_still_sees_it(
    servers: list[Server], proxies: list[Proxy], monkeypatch: pytest.MonkeyPatch, front: str
) -> None:
    monkeypatch.setattr(fencelock.election, "OBSERVE_POLL_MAX_S", POLL_S)
    with servers[0].client() as other:
        other.set(lock_keys(KEY).lock, "someone-else", px=60_000)
    direct_urls = [server.url for server in servers]
    campaign_urls = [servers[0].url, *(proxy.url for proxy in proxies)]
    seen: list[tuple[float, fencelock.Leader | None]] = []
    errors: list[BaseException] = []

    def note(leader: fencelock.Leader | None) -> bool:
        seen.append((time.monotonic(), leader))
        return leader is not None

    def watch_sync() -> None:
        election = fencelock.Client(direct_urls, ttl=10.0).election(KEY)
        for leader in election.observe(timeout=OBSERVE_S):
            if note(leader):
                return

    async def watch_async() -> None:
        election = flasync.Client(direct_urls, ttl=10.0).election(KEY)
        async for leader in election.observe(timeout=OBSERVE_S):
            if note(leader):
                return

    def watch() -> None:
        try:
            if front == "sync":
                watch_sync()
            else:
                asyncio.run(watch_async())
        except BaseException as exc:  # shown by the assertions below, not lost
            errors.append(exc)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        # the observer saw nobody lead and blocks on server 0 (the first that answered)
        blocked_by = time.monotonic() + BOUND
        while not (seen and _blocked_on(servers[0]) >= 1):
            assert not errors, errors
            assert time.monotonic() < blocked_by, "the observer never blocked on server 0"
            time.sleep(0.01)
        assert seen == [(seen[0][0], None)]
        election = fencelock.Client(campaign_urls, ttl=10.0).election(KEY, name="a")
        with election.campaign(wait=BOUND) as term:
            began = time.monotonic()
            # the term lasts until the observer saw it, or the bound
            while len(seen) < 2 and time.monotonic() < began + SEEN_WITHIN_S:
                assert not errors, errors
                time.sleep(0.02)
    finally:
        watcher.join(BOUND)
    assert not watcher.is_alive()
    assert not errors, errors
    leaders = [(at, leader) for at, leader in seen if leader is not None]
    assert [(leader.name, leader.fence) for _, leader in leaders] == [("a", term.fence)], seen
    assert leaders[0][0] - began < SEEN_WITHIN_S
